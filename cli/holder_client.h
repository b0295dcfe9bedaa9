// The verbs that talk to a running holder (status, stats, trim, plan, apply, export, buffer) do
// so only through the C API (include/cupool/client.h): this is its small C++ face for them.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/output.h"
#include "cli/holder_render.h"
#include "cli/verbs.h"
#include "cupool/client.h"

namespace cupool::cli {

// Where a holder listens unless --socket or CUPOOL_SOCKET say otherwise (the config's default
// holder.socket).
inline constexpr const char* kDefaultSocket = "/run/cupool/cupool.sock";

// --socket PATH, twin CUPOOL_SOCKET: the holder's Unix socket.
CLI::Option* add_socket_option(CLI::App* sub, std::string& socket);

// A connection to the holder; closed (and every lease of it freed by the holder) on destruction.
class HolderClient {
 public:
  // Connects to `socket` ("" means CUPOOL_SOCKET, else kDefaultSocket) and says hello as
  // `client_name` (shown in `cupool status`): the command ("cupool buffer create"), which an
  // error that names a request by its protocol name names instead (throw_reply_error). Throws cupool::Error (exit 4)
  // with a message that says what to do, e.g. "no holder is listening on /run/cupool/cupool.sock (is 'cupool hold'
  // running? set --socket or CUPOOL_SOCKET)".
  static HolderClient connect(const std::string& socket, const std::string& client_name);

  HolderClient(HolderClient&& other) noexcept;
  HolderClient& operator=(HolderClient&& other) noexcept;
  HolderClient(const HolderClient&) = delete;
  HolderClient& operator=(const HolderClient&) = delete;
  ~HolderClient();

  // Sends one request (a JSON object without "id") and returns the successful reply. A reply
  // with "ok": false throws throw_reply_error's cupool::Error.
  nlohmann::ordered_json request(const nlohmann::ordered_json& req);
  // The same, but a reply with "ok": false is returned, not thrown (the caller reads "error");
  // only a failure to talk to the holder throws.
  nlohmann::ordered_json request_raw(const nlohmann::ordered_json& req);

  // Opens part `part` of the named buffer in this process (cupool_open_buffer_part); it stays
  // mapped until release().
  cupool_lease* open_buffer(const std::string& name, std::uint32_t part = 0);
  // Copies ranges of the file open at `fd` into `lease` (cupool_load_file_gds); `progress` is told
  // the bytes read so far and the total. Says where the time went, and in `path` how the bytes
  // travelled.
  cupool_load_report load_file(cupool_lease* lease, int fd, const std::vector<cupool_file_range>& ranges,
                               const cupool_load_options& options, cupool_gds gds, cupool_load_path* path,
                               const std::function<void(std::uint64_t, std::uint64_t)>& progress);
  // Unmaps and releases a lease of this connection; never throws (it is for cleanups too).
  void release(cupool_lease* lease) noexcept;

  const std::string& socket() const { return socket_; }

 private:
  // Throws the cupool::Error for a failed call's status, with the library's message.
  [[noreturn]] void throw_status(int status, const std::string& doing);
  HolderClient(cupool_conn* conn, std::string socket, std::string name)
      : conn_(conn), socket_(std::move(socket)), name_(std::move(name)) {}
  cupool_conn* conn_ = nullptr;
  std::string socket_;
  std::string name_;  // the client's name: the command ("cupool buffer create"), which errors name
};

// Throws the cupool::Error for a reply with "ok": false (Error::reported: its exit code is the
// table's for an error a holder reports, core/base/error.cpp); for invalid_config and does_not_fit it first writes
// the reply's rendered findings to stderr. Where the message names the request by its protocol name
// `op` ("buffer_create needs ..."), it names the command `verb` instead ("cupool buffer create
// needs ...").
[[noreturn]] void throw_reply_error(const nlohmann::ordered_json& reply, const std::string& op = "",
                                    const std::string& verb = "");

// The labels of the holder's devices that its replies do not carry (NodeLabels): this host's name,
// and each GPU's name from the node's facts: the holder's profile when it runs on a simulated node
// (its status names it), else this node's driver (attributes only, no context). A GPU whose name
// can't be read has none; nothing here throws.
NodeLabels read_node_labels(HolderClient& holder, const Context& ctx);

// The holder's stats in the Prometheus text format, for a scrape or a textfile collector's file:
// one connection kept (when a request on it fails, the holder restarted: one new connection is
// tried) and the node's labels read again at each new connection. While the holder is down or
// refuses, the build info alone. Either way it ends with cupool_holder_up (1 or 0), and the change
// is logged (a warning when the holder stops answering, info when it answers again).
class HolderMetrics {
 public:
  // `request`: the stats request ({"op": "stats"}, with "reset_peaks" for stats --reset-peaks).
  HolderMetrics(std::string socket, std::string client_name, const Context& ctx, nlohmann::ordered_json request);
  // Asks the holder now.
  std::string scrape();
  bool up() const { return up_; }

 private:
  std::string socket_;
  std::string client_name_;
  const Context& ctx_;
  nlohmann::ordered_json request_;
  std::optional<HolderClient> holder_;
  NodeLabels labels_;
  bool up_ = true;
};

// Prints a successful reply on stdout: `table` renders it for people; json and yaml print the
// reply without its envelope ("id", "ok").
void print_reply(Format format, const nlohmann::ordered_json& reply,
                 const std::function<std::string(const nlohmann::ordered_json&)>& table);

}  // namespace cupool::cli
