// The custodians as the holder sees them: systemd's file-descriptor store (notify socket and
// $LISTEN_FDS) and a keeper's client (docs/protocol.md, "The keeper").
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>
#include <system_error>

#include "base/error.h"
#include "base/text.h"
#include "custody/custody.h"
#include "custody/fields.h"
#include "protocol/protocol.h"

namespace cupool::custody {

namespace {

using Json = nlohmann::ordered_json;

// SD_LISTEN_FDS_START: the first descriptor systemd passes.
constexpr int kListenFdsStart = 3;
// More than systemd's store takes (FileDescriptorStoreMax= is at most 65536 there too).
constexpr std::size_t kMaxListenFds = 65536;

void check_name(const std::string& name) {
  if (!valid_fd_name(name))
    throw Error(Errc::invalid_input, "\"" + safe_for_display(utf8_prefix(name, 64)) +
                                         "\" is not a name for custody ([A-Za-z0-9._-], 1 to " +
                                         std::to_string(kMaxNameLength) + " characters)");
}

class SystemdStore final : public Custody {
 public:
  explicit SystemdStore(std::string socket) : socket_(std::move(socket)) {}
  const char* kind() const override { return "systemd"; }
  std::string where() const override { return "systemd's file-descriptor store"; }

  std::vector<Kept> withdraw() override {
    if (withdrawn_) return {};
    withdrawn_ = true;
    ListenEnv env;
    for (auto [name, into] :
         {std::pair{"LISTEN_PID", &env.pid}, {"LISTEN_FDS", &env.fds}, {"LISTEN_FDNAMES", &env.names}}) {
      if (const char* v = std::getenv(name)) *into = v;
      ::unsetenv(name);
    }
    std::vector<Kept> kept = adopt_listen_fds(env, ::getpid(), kListenFdsStart);
    for (const Kept& k : kept) stored_.insert(k.name);
    return kept;
  }

  void deposit(const std::string& name, int fd) override {
    check_name(name);
    if (fd < 0) throw Error(Errc::invalid_input, "no descriptor to keep under " + name);
    // The store keeps every descriptor sent under a name: the old one goes first. Before withdraw()
    // nothing says what the store holds.
    if (!withdrawn_ || stored_.count(name)) send("FDSTOREREMOVE=1\nFDNAME=" + name, -1);
    send("FDSTORE=1\nFDNAME=" + name + "\nFDPOLL=0", fd);
    stored_.insert(name);
  }

  void remove(const std::string& name) override {
    check_name(name);
    send("FDSTOREREMOVE=1\nFDNAME=" + name, -1);
    stored_.erase(name);
  }

 private:
  // One datagram to the notify socket, `fd` with it when >= 0 (sd_pid_notify_with_fds).
  void send(const std::string& state, int fd) const {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if ((socket_[0] != '/' && socket_[0] != '@') || socket_.size() >= sizeof addr.sun_path)
      throw Error(Errc::unreachable, "NOTIFY_SOCKET=" + socket_ +
                                         " is not a socket path or an abstract socket (@name) this holder can use");
    std::memcpy(addr.sun_path, socket_.data(), socket_.size());
    if (socket_[0] == '@') addr.sun_path[0] = '\0';
    const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_.size());
    const Fd s(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!s || ::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), length) != 0)
      throw Error(Errc::unreachable, "can't reach systemd's notify socket " + socket_ + ": " + errno_text());
    ssize_t n = 0;
    do {
      n = proto::send_some(s.get(), state, fd, 0);
    } while (n < 0 && errno == EINTR);
    if (n != static_cast<ssize_t>(state.size()))
      throw Error(Errc::unreachable, "can't send to systemd's notify socket " + socket_ + ": " +
                                         (n < 0 ? errno_text() : std::string("the message was cut")));
  }

  std::string socket_;
  bool withdrawn_ = false;
  std::set<std::string> stored_;  // the names in the store, as far as this process knows
};

// A request failed for want of the keeper (it went away, or does not answer): worth one new connection.
class Lost : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace

std::vector<Kept> adopt_listen_fds(const ListenEnv& env, pid_t self, int first_fd) {
  if (env.pid.empty() || env.pid != std::to_string(self)) return {};
  if (env.fds.empty() || env.fds.size() > 6 || env.fds.find_first_not_of("0123456789") != std::string::npos) return {};
  const std::size_t count = std::min<std::size_t>(std::stoul(env.fds), kMaxListenFds);
  std::vector<std::string> names;
  for (std::size_t at = 0; at <= env.names.size() && !env.names.empty();) {
    const std::size_t colon = std::min(env.names.find(':', at), env.names.size());
    names.push_back(env.names.substr(at, colon - at));
    at = colon + 1;
  }
  std::vector<Kept> out;
  for (std::size_t i = 0; i < count; ++i) {
    const int fd = first_fd + static_cast<int>(i);
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags < 0) continue;
    (void)::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
    out.push_back({i < names.size() && !names[i].empty() ? names[i] : "unknown", Fd(fd)});
  }
  return out;
}

std::unique_ptr<Custody> systemd_store() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  if (!socket || !*socket) return nullptr;
  return std::make_unique<SystemdStore>(socket);
}

// ---- the keeper's client ----

KeeperClient::KeeperClient(std::string socket_path, int timeout_ms)
    : path_(std::move(socket_path)), timeout_ms_(timeout_ms) {}

void KeeperClient::connect() {
  sockaddr_un addr{};
  if (path_.empty() || path_.size() >= sizeof addr.sun_path)
    throw Error(Errc::invalid_input, "the keeper's socket path " + path_ + " is empty or longer than " +
                                         std::to_string(sizeof addr.sun_path - 1) + " bytes");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  // Custody gives the keeper every held buffer's descriptor and adopts what it hands back: only a
  // keeper of this user (or root) at a path nobody else can take will do.
  const uid_t self = ::geteuid();
  if (const std::string why = unsafe_keeper_path(path_, self); !why.empty())
    throw Error(Errc::not_permitted, "the keeper's socket " + path_ + " can't be trusted: " + why +
                                         "; give the keeper a socket in a directory only this user can write (" +
                                         kDefaultKeeperSocket + ", or $XDG_RUNTIME_DIR/cupool/keeper.sock)");
  Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) throw Error(Errc::unreachable, "socket: " + errno_text());
  arm(s.get());
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    throw Error(Errc::unreachable, "no keeper is listening at " + path_ + ": " + errno_text() +
                                       " (start one with 'cupool keeper --socket " + path_ + "')");
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(s.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    throw Error(Errc::unreachable, "can't tell who listens at " + path_ + ": " + errno_text());
  if (cred.uid != self && cred.uid != 0)
    throw Error(Errc::not_permitted, "the process listening at " + path_ + " (pid " + std::to_string(cred.pid) +
                                         ") runs as " + describe_uid(cred.uid) + ", not as this user (" +
                                         describe_uid(self) +
                                         ") or root: it is not this holder's keeper, and "
                                         "is given nothing");
  socket_ = std::move(s);
}

void KeeperClient::arm(int socket) {
  auto wait = std::chrono::milliseconds(timeout_ms_);
  if (deadline_) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline_ - Clock::now());
    if (left.count() <= 0)
      throw Error(Errc::unreachable, "the keeper at " + path_ + " did not finish in the time custody has");
    wait = std::min(wait, left);
  }
  const timeval tv{static_cast<time_t>(wait.count() / 1000), static_cast<suseconds_t>((wait.count() % 1000) * 1000)};
  (void)::setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)::setsockopt(socket, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

Json KeeperClient::exchange(KeeperRequest request, int fd, Fd* received) {
  request.id = next_id_++;
  try {
    arm(socket_.get());
  } catch (const Error& e) {
    throw Lost(e.what());
  }
  // A keeper that refuses this peer says why and closes at once, perhaps before the request went:
  // its reply is read all the same.
  std::string unsent;
  try {
    proto::send_all(socket_.get(), proto::encode(proto::Kind::request, model::write_json(request), fd >= 0 ? 1 : 0),
                    fd);
  } catch (const std::system_error& e) {
    unsent = std::string("sending failed: ") + std::strerror(e.code().value());
  }
  int got = -1;
  std::pair<proto::Header, Json> frame;
  try {
    frame = proto::receive_frame(socket_.get(), got);
  } catch (const std::system_error& e) {
    const int code = e.code().value();
    if (!unsent.empty()) throw Lost(unsent);
    throw Lost(code == EAGAIN || code == EWOULDBLOCK ? "it did not answer within " + std::to_string(timeout_ms_) + " ms"
                                                     : std::string("receiving failed: ") + std::strerror(code));
  } catch (const Error& e) {
    if (!unsent.empty()) throw Lost(unsent);
    throw Lost(e.code() == Errc::unreachable ? "it closed the connection" : e.what());
  }
  Fd in(got);
  const Json& reply = frame.second;
  KeeperReplyHead head;
  model::Seen seen;
  model::read_json_lenient(reply, head, seen);
  if (!head.ok) {
    const model::ErrorInfo e = head.error.value_or(model::ErrorInfo{});
    throw Error::reported(e.code, "the keeper at " + path_ + " refused: " + safe_for_display(e.message));
  }
  if (!unsent.empty()) throw Lost(unsent);
  if (frame.first.kind != proto::Kind::reply || !seen.has(head.id) || head.id != Json(request.id))
    throw Lost("it answered out of turn");
  if (received) *received = std::move(in);
  return reply;
}

Json KeeperClient::call(const KeeperRequest& request, int fd, Fd* received) {
  const bool had_connection = static_cast<bool>(socket_);
  for (int attempt = 0;; ++attempt) {
    try {
      if (!socket_) {
        connect();
        try {
          (void)exchange(KeeperRequest{0, "hello", kKeeperProtocolVersion, std::nullopt}, -1, nullptr);
        } catch (...) {
          socket_.reset();  // refused or lost: the next call connects again
          throw;
        }
      }
      return exchange(request, fd, received);
    } catch (const Lost& e) {
      socket_.reset();
      if (attempt > 0 || !had_connection) throw Error(Errc::unreachable, "the keeper at " + path_ + ": " + e.what());
    }
  }
}

std::vector<std::string> KeeperClient::names() {
  KeeperNamesReply list;
  model::Seen seen;
  model::read_json_lenient(call(KeeperRequest{0, "list", std::nullopt, std::nullopt}), list, seen);
  return list.names;
}

std::size_t KeeperClient::release() {
  KeeperReleaseReply released;
  model::Seen seen;
  model::read_json_lenient(call(KeeperRequest{0, "release", std::nullopt, std::nullopt}), released, seen);
  return released.released_count;
}

KeeperStatusReply KeeperClient::status() {
  return model::read_json<KeeperStatusReply>(call(KeeperRequest{0, "status", std::nullopt, std::nullopt}));
}

std::vector<Kept> KeeperClient::withdraw() {
  std::vector<Kept> out;
  for (const std::string& name : names()) {
    Fd fd;
    try {
      (void)call(KeeperRequest{0, "withdraw", std::nullopt, name}, -1, &fd);
    } catch (const Error& e) {
      if (e.code() == Errc::not_found) continue;  // removed since the list
      throw;
    }
    if (!fd) throw Error(Errc::unreachable, "the keeper at " + path_ + " sent no descriptor for " + name);
    out.push_back({name, std::move(fd)});
  }
  return out;
}

void KeeperClient::deposit(const std::string& name, int fd) {
  check_name(name);
  if (fd < 0) throw Error(Errc::invalid_input, "no descriptor to keep under " + name);
  (void)call(KeeperRequest{0, "deposit", std::nullopt, name}, fd);
}

void KeeperClient::remove(const std::string& name) {
  check_name(name);
  (void)call(KeeperRequest{0, "remove", std::nullopt, name});
}

std::unique_ptr<Custody> keeper_at(const std::string& socket_path) {
  return std::make_unique<KeeperClient>(socket_path);
}

}  // namespace cupool::custody
