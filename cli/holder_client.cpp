#include "cli/holder_client.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <utility>

#include "cli/holder_render.h"
#include "cupool/client.h"
#include "device/node.h"
#include "device/query.h"
#include "model/fields.h"
#include "model/model.h"
#include "protocol/messages.h"

namespace cupool::cli {

using json = nlohmann::ordered_json;

namespace {

const char* const kHint = "(is 'cupool hold' running? set --socket or CUPOOL_SOCKET)";

// Why cupool_connect failed, in words that say what to do.
std::string connect_failure(const std::string& socket, int status, const std::string& detail) {
  const std::string said = detail.empty() ? std::string(cupool_status_name(status)) : detail;
  switch (status) {
    case CUPOOL_E_UNREACHABLE: {
      struct stat st {};
      if (::stat(socket.c_str(), &st) != 0) {
        if (errno == EACCES)
          return "may not reach the holder's socket " + socket + ": permission denied on its directory";
        return "no holder is listening on " + socket + " " + kHint;
      }
      if (!S_ISSOCK(st.st_mode)) return socket + " is not a socket " + kHint;
      if (::access(socket.c_str(), R_OK | W_OK) != 0)
        return "may not connect to the holder at " + socket +
               ": permission denied (the config's holder.mode and holder.group decide who may; ask an admin to add "
               "you to that group)";
      // The file is there but nobody answers: a holder that died and left its socket behind.
      return "no holder is listening on " + socket + " " + kHint;
    }
    case CUPOOL_E_REFUSED:
      // The library's message names the socket and the reason (e.g. its mode and group).
      return detail.empty() ? "the holder at " + socket + " refused the connection" : detail;
    case CUPOOL_E_PROTOCOL:
      return "could not talk to the holder at " + socket +
             " (not a cupool holder, or another protocol version): " + said;
    case CUPOOL_E_BUSY: return "the holder at " + socket + " takes no new connections: " + said;
    default: return "could not connect to the holder at " + socket + ": " + said;
  }
}

}  // namespace

CLI::Option* add_socket_option(CLI::App* sub, std::string& socket) {
  return sub->add_option("--socket,-s", socket, "The holder's Unix socket")
      ->envname("CUPOOL_SOCKET")
      ->capture_default_str();
}

namespace {

// `message` with the holder's name for request `op`, where it starts the message or stands as a
// word in it ("buffer_create needs ...", "takes no new buffer_create requests"), said as the
// command the user typed, `verb`, instead.
std::string in_verbs(std::string message, const std::string& op, const std::string& verb) {
  if (op.empty() || verb.empty()) return message;
  // The holder's words for a stats request that resets the peaks, and the option that sends it.
  const bool stats = op == "stats";
  const std::string words = stats ? "stats with reset_peaks" : op;
  const auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (std::size_t at = message.find(words); at != std::string::npos; at = message.find(words, at + 1)) {
    const std::size_t end = at + words.size();
    if ((at > 0 && word(message[at - 1])) || (end < message.size() && word(message[end]))) continue;
    return message.replace(at, words.size(), stats ? verb + " --reset-peaks" : verb);
  }
  return message;
}

}  // namespace

void throw_reply_error(const json& reply, const std::string& op, const std::string& verb) {
  // The one error object (model::ErrorInfo), read for what it has: a reply without one is still a
  // refusal.
  model::Refusal refusal;
  model::Seen seen;
  model::read_json_lenient(reply, refusal, seen);
  const std::string code = refusal.error.code;
  std::string message = in_verbs(refusal.error.message, op, verb);
  if (message.empty()) message = "the holder refused the request" + (code.empty() ? "" : " (" + code + ")");

  if ((code == "invalid_config" || code == "does_not_fit") && refusal.rendered && !refusal.rendered->empty()) {
    const std::string& text = *refusal.rendered;
    std::cerr << text << (text.back() == '\n' ? "" : "\n");
  }
  throw Error::reported(code, message);
}

HolderClient HolderClient::connect(const std::string& socket_arg, const std::string& client_name) {
  std::string socket = socket_arg;
  if (socket.empty()) {
    const char* env = std::getenv("CUPOOL_SOCKET");
    socket = env && *env ? env : kDefaultSocket;
  }
  cupool_conn* conn = nullptr;
  const int status = cupool_connect(socket.c_str(), client_name.c_str(), &conn);
  if (status == CUPOOL_OK && conn) return HolderClient(conn, socket, client_name);
  const char* detail = cupool_last_error(nullptr);
  spdlog::debug("cupool_connect({}): {}: {}", socket, cupool_status_name(status), detail ? detail : "");
  if (conn) cupool_disconnect(conn);
  throw Error(Errc::unreachable,
              connect_failure(socket, status == CUPOOL_OK ? CUPOOL_E_INTERNAL : status, detail ? detail : ""));
}

HolderClient::HolderClient(HolderClient&& other) noexcept
    : conn_(std::exchange(other.conn_, nullptr)), socket_(std::move(other.socket_)), name_(std::move(other.name_)) {}

HolderClient& HolderClient::operator=(HolderClient&& other) noexcept {
  if (this != &other) {
    cupool_disconnect(conn_);
    conn_ = std::exchange(other.conn_, nullptr);
    socket_ = std::move(other.socket_);
    name_ = std::move(other.name_);
  }
  return *this;
}

HolderClient::~HolderClient() { cupool_disconnect(conn_); }

void HolderClient::throw_status(int status, const std::string& doing) {
  const char* last = cupool_last_error(conn_);
  const std::string detail = last && *last ? last : cupool_status_name(status);
  const Errc errc = errc_from_c_status(status);
  switch (status) {
    case CUPOOL_E_UNREACHABLE:
      throw Error(errc, "lost the connection to the holder at " + socket_ + ": " + detail, Origin::holder);
    case CUPOOL_E_REFUSED:
    case CUPOOL_E_PROTOCOL:
    case CUPOOL_E_BUSY: throw Error(errc, "the holder at " + socket_ + " did not answer: " + detail, Origin::holder);
    case CUPOOL_E_INVALID: throw Error(errc, detail, Origin::holder);
    default: throw Error(errc, doing + " to the holder at " + socket_ + " failed: " + detail, Origin::holder);
  }
}

cupool_lease* HolderClient::open_buffer(const std::string& name, std::uint32_t part) {
  cupool_lease* lease = nullptr;
  const int status = cupool_open_buffer_part(conn_, name.c_str(), part, &lease);
  if (status != CUPOOL_OK)
    throw_status(status, "opening buffer " + name + (part ? " part " + std::to_string(part) : std::string()));
  return lease;
}

cupool_load_report HolderClient::load_file(cupool_lease* lease, int fd, const std::vector<cupool_file_range>& ranges,
                                           const cupool_load_options& options, cupool_gds gds, cupool_load_path* path,
                                           const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  const cupool_progress_fn told = [](std::uint64_t done, std::uint64_t total, void* arg) {
    (*static_cast<const std::function<void(std::uint64_t, std::uint64_t)>*>(arg))(done, total);
  };
  cupool_load_report report{};
  const int status = cupool_load_file_gds(conn_, lease, fd, ranges.data(), ranges.size(), &options, gds, &report, path,
                                          progress ? told : nullptr,
                                          const_cast<std::function<void(std::uint64_t, std::uint64_t)>*>(&progress));
  if (status != CUPOOL_OK) throw_status(status, "loading the file");
  return report;
}

void HolderClient::release(cupool_lease* lease) noexcept { cupool_release(conn_, lease); }

json HolderClient::request_raw(const json& req) {
  const std::string text = req.dump(-1, ' ', false, json::error_handler_t::replace);
  char* raw = nullptr;
  const int status = cupool_request(conn_, text.c_str(), &raw);
  std::unique_ptr<char, void (*)(char*)> reply(raw, cupool_free_string);
  if (status != CUPOOL_OK) throw_status(status, "the request");
  if (!reply) throw Error(Errc::unreachable, "the holder at " + socket_ + " sent no reply");
  json parsed = json::parse(reply.get(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object())
    throw Error(Errc::unreachable, "the holder at " + socket_ + " sent a reply that is not a JSON object");
  if (!proto::ok_of(parsed))
    throw Error(Errc::unreachable, "the holder at " + socket_ + " sent a reply without \"ok\"");
  return parsed;
}

json HolderClient::request(const json& req) {
  json reply = request_raw(req);
  if (proto::error_of_reply(reply)) throw_reply_error(reply, proto::request_head(req).op.value_or(""), name_);
  return reply;
}

NodeLabels read_node_labels(HolderClient& holder, const Context& ctx) {
  NodeLabels labels;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) labels.hostname = host;
  try {
    model::Status status;
    model::Seen seen;
    model::read_json_lenient(holder.request(proto::to_json(proto::Status{})), status, seen);
    const bool simulated = status.source.simulated;
    const std::string profile = simulated ? status.source.profile.value_or("") : std::string();
    if (simulated && profile.empty()) return labels;
    const NodeReport node = simulated ? load_profile(profile) : build_report(*ctx.make_backend(""));
    for (const DeviceReport& d : node.devices) {
      std::string uuid = d.info.uuid;
      for (char& c : uuid) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      labels.model_names[uuid] = d.info.name;
    }
  } catch (const std::exception& e) {
    spdlog::debug("the GPUs' names (modelName) are not known: {}", e.what());
  }
  return labels;
}

HolderMetrics::HolderMetrics(std::string socket, std::string client_name, const Context& ctx, json request)
    : socket_(std::move(socket)), client_name_(std::move(client_name)), ctx_(ctx), request_(std::move(request)) {}

std::string HolderMetrics::scrape() {
  std::string text;
  bool up = false;
  std::string why;
  for (int attempt = 0; attempt < 2 && !up; ++attempt) {
    try {
      if (!holder_) {
        holder_.emplace(HolderClient::connect(socket_, client_name_));
        labels_ = read_node_labels(*holder_, ctx_);
      }
      text = render_stats_prometheus(holder_->request(request_), labels_);
      up = true;
    } catch (const Error& e) {
      holder_.reset();
      why = e.what();
    }
  }
  if (!up) {
    if (up_) spdlog::warn("the holder did not answer: {} (cupool_holder_up is 0 until it does)", why);
    text = prometheus_build_info();
  }
  if (up && !up_) spdlog::info("the holder answers");
  up_ = up;
  return text +
         "# HELP cupool_holder_up 1 when the holder answered this scrape, 0 when it is down or refused.\n"
         "# TYPE cupool_holder_up gauge\n"
         "cupool_holder_up " +
         std::string(up ? "1" : "0") + "\n";
}

void print_reply(Format format, const json& reply, const std::function<std::string(const json&)>& table) {
  switch (format) {
    case Format::table: std::cout << table(reply); break;
    case Format::json: std::cout << dump_json(reply_body(reply)) << "\n"; break;
    case Format::yaml: std::cout << to_yaml(reply_body(reply)); break;
  }
  std::cout.flush();
}

}  // namespace cupool::cli
