// The verbs that talk to a running holder (status, stats, trim, plan, apply, export, buffer) do
// so only through the C API (include/cupool/client.h): this is its small C++ face for them.
#pragma once

#include <functional>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/output.h"

struct cupool_conn;

namespace cupool::cli {

// Where a holder listens unless --socket or CUPOOL_SOCKET say otherwise (the config's default
// holder.socket).
inline constexpr const char* kDefaultSocket = "/run/cupool/cupool.sock";

// --socket PATH, twin CUPOOL_SOCKET: the holder's Unix socket.
CLI::Option* add_socket_option(CLI::App* sub, std::string& socket);

// How a failed reply's error code maps to an exit code (the mapping is part of the interface):
//
//   4 holder_unreachable  the holder can't be reached or refused: no socket / nobody listening /
//                         connection lost (CUPOOL_E_UNREACHABLE), not_permitted, draining,
//                         limit_exceeded, and every protocol failure (bad_frame, unknown_op,
//                         unsupported_protocol, hello_required, a reply that isn't JSON)
//   2 invalid_input       the request itself is wrong: bad_request, invalid_config
//   1 does_not_fit        the holder can't do it in its current state: not_found, exists, busy,
//                         quota_exceeded, out_of_memory, cuda_error, internal, and codes this
//                         version does not know
ExitCode exit_code_for(const std::string& error_code);

// A connection to the holder; closed (and every lease of it freed by the holder) on destruction.
class HolderClient {
 public:
  // Connects to `socket` ("" means CUPOOL_SOCKET, else kDefaultSocket) and says hello as
  // `client_name` (shown in `cupool status`). Throws cupool::Error (exit 4) with a message that
  // says what to do, e.g. "no holder is listening on /run/cupool/cupool.sock (is 'cupool hold'
  // running? set --socket or CUPOOL_SOCKET)".
  static HolderClient connect(const std::string& socket, const std::string& client_name);

  HolderClient(HolderClient&& other) noexcept;
  HolderClient& operator=(HolderClient&& other) noexcept;
  HolderClient(const HolderClient&) = delete;
  HolderClient& operator=(const HolderClient&) = delete;
  ~HolderClient();

  // Sends one request (a JSON object without "id") and returns the successful reply. A reply
  // with "ok": false throws cupool::Error carrying the holder's message and the exit code of
  // exit_code_for(); for invalid_config the holder's rendered findings go to stderr first.
  nlohmann::ordered_json request(const nlohmann::ordered_json& req);
  // The same, but a reply with "ok": false is returned, not thrown (the caller reads "error");
  // only a failure to talk to the holder throws.
  nlohmann::ordered_json request_raw(const nlohmann::ordered_json& req);

  const std::string& socket() const { return socket_; }

 private:
  HolderClient(cupool_conn* conn, std::string socket) : conn_(conn), socket_(std::move(socket)) {}
  cupool_conn* conn_ = nullptr;
  std::string socket_;
};

// Throws the cupool::Error for a reply with "ok": false (see exit_code_for); for invalid_config
// it first writes the reply's rendered findings to stderr.
[[noreturn]] void throw_reply_error(const nlohmann::ordered_json& reply);

// Prints a successful reply on stdout: `table` renders it for people; json and yaml print the
// reply without its envelope ("id", "ok").
void print_reply(Format format, const nlohmann::ordered_json& reply,
                 const std::function<std::string(const nlohmann::ordered_json&)>& table);

}  // namespace cupool::cli
