#include "custody/keeper.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/lock_file.h"
#include "base/text.h"
#include "custody/fields.h"
#include "protocol/protocol.h"

namespace cupool::custody {

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

constexpr std::size_t kMaxInbox = std::size_t{64} << 10;  // received bytes kept before reading stops
constexpr std::size_t kMaxWaitingFds = 4;                 // received descriptors whose frames are not handled yet

Json error_reply(const Json& id, Errc code, const std::string& message) {
  return model::write_json(KeeperReplyHead{id, false, model::ErrorInfo{errc_info(code).wire, message, {}, {}}});
}

}  // namespace

// (Named, not anonymous: Keeper::Impl holds these.)
namespace keeper_parts {

// The keeper's place in the file system: SOCKET.lock (base/lock_file.h: flock'ed for as long as
// the keeper runs, holding its pid, removed when it stops), and the listening socket.
class Place {
 public:
  Place(const std::string& path, unsigned mode) : path_(path) {
    sockaddr_un addr{};
    if (path.empty() || path.size() >= sizeof addr.sun_path)
      throw Error(Errc::invalid_input, "socket path " + path + " is empty or longer than " +
                                           std::to_string(sizeof addr.sun_path - 1) + " bytes");
    if (const auto slash = path.rfind('/'); slash != std::string::npos && slash > 0) {
      const std::string dir = path.substr(0, slash);
      if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
        throw Error(Errc::unreachable,
                    "can't make the directory " + dir + ": " + errno_text() + " (make it, or choose another --socket)");
    }
    // The holder gives whoever listens here every held buffer's descriptor, and checks that it is
    // its own user: a path that another user could take first is refused here too, naming what is
    // in the way, so that the keeper never runs where it can be locked out or impersonated.
    const uid_t self = ::geteuid();
    const auto refuse = [&](const std::string& why) {
      throw Error(Errc::unreachable, "can't keep descriptors at " + path + ": " + why +
                                         "; choose a --socket in a directory only this user can write (" +
                                         kDefaultKeeperSocket + " as root, else $XDG_RUNTIME_DIR/cupool/keeper.sock)");
    };
    if (const std::string why = unsafe_keeper_path(path, self); !why.empty()) refuse(why);
    for (const std::string& file : {path + ".lock", path}) {
      struct stat st {};
      if (::lstat(file.c_str(), &st) == 0 && st.st_uid != self)
        refuse(file + " belongs to " + describe_uid(st.st_uid) + ", not to the keeper's user (" + describe_uid(self) +
               "); remove it if it is not another keeper's");
    }
    lock_ = std::make_unique<LockFile>(path + ".lock", "keeper", path, 0600);
    if (!lock_->pid_error().empty()) spdlog::warn("can't write the pid into {}.lock: {}", path, lock_->pid_error());
    // Ours now: a socket here is one a keeper left when it died.
    struct stat old {};
    if (::lstat(path.c_str(), &old) == 0) {
      if (!S_ISSOCK(old.st_mode)) throw Error(Errc::unreachable, path + " exists and is not a socket; remove it");
      spdlog::info("replacing the socket {} of a keeper that did not stop cleanly", path);
      if (::unlink(path.c_str()) != 0) refuse("the socket a keeper left there can't be removed: " + errno_text());
    }
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    const mode_t umask_before = ::umask(0177);  // nobody else may connect before the mode is set
    const bool bound = listener_ && ::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
    const int bind_errno = errno;
    ::umask(umask_before);
    if (!bound) throw Error(Errc::unreachable, "can't make the socket " + path + ": " + std::strerror(bind_errno));
    struct stat made {};
    if (::lstat(path.c_str(), &made) == 0) inode_ = made.st_ino;
    if ((mode & 0777) != 0600 && ::chmod(path.c_str(), mode & 0777) != 0)
      throw Error(Errc::unreachable, "can't set the mode of " + path + ": " + errno_text());
    if (::listen(listener_.get(), 64) != 0) throw Error(Errc::unreachable, "listen on " + path + ": " + errno_text());
  }
  Place(const Place&) = delete;
  Place& operator=(const Place&) = delete;
  ~Place() {
    // Only our own socket file goes, not whatever another process put at the path since.
    struct stat now {};
    if (::lstat(path_.c_str(), &now) == 0 && now.st_ino == inode_) ::unlink(path_.c_str());
  }
  int fd() const { return listener_.get(); }

 private:
  std::string path_;
  std::unique_ptr<LockFile> lock_;
  Fd listener_;
  ino_t inode_ = 0;
};

struct OutFrame {
  std::string bytes;
  std::size_t sent = 0;
  Fd fd;  // rides with the first byte
};

// One peer. Requests are served in order, one at a time: while a reply waits to be sent, nothing
// more is read or handled (a peer that does not read holds only its own reply).
struct Connection {
  Fd fd;
  pid_t pid = 0;
  uid_t uid = 0;
  proto::FrameDecoder decoder{proto::Kind::request, /*request_fds=*/true};
  std::string inbox;
  std::deque<Fd> fds;  // received with frames not handled yet, oldest first
  std::deque<OutFrame> out;
  Clock::time_point last_active{};    // the last byte received or sent
  Clock::time_point frame_started{};  // when the frame being received began
  Clock::time_point waiting_since{};  // the last progress sending, while replies wait
  bool in_frame = false;
  bool greeted = false;
  bool closing = false;  // send what is queued, then close
  bool dead = false;

  bool idle() const { return out.empty() && inbox.empty() && fds.empty() && !decoder.mid_frame(); }
  std::string who() const { return "pid " + std::to_string(pid) + " (uid " + std::to_string(uid) + ")"; }
};

}  // namespace keeper_parts

using keeper_parts::Connection;
using keeper_parts::OutFrame;
using keeper_parts::Place;

struct Keeper::Impl {
  Impl(const KeeperOptions& o)
      : options(o),
        user(o.user == static_cast<uid_t>(-1) ? ::geteuid() : o.user),
        place(o.socket, o.mode),
        started(iso_utc_now()),
        started_at(Clock::now()) {}

  void accept_peers();
  void read_from(Connection& c);
  // Handles what the inbox holds, as far as replies can be sent.
  void process(Connection& c);
  void answer(Connection& c, const std::string& payload, Fd fd);
  Json handle(Connection& c, const Json& request, Fd fd, Fd& reply_fd);
  void queue(Connection& c, const Json& body, Fd fd = Fd());
  void flush(Connection& c);
  // Sends an error with "id": null and closes the connection once it is sent.
  void refuse(Connection& c, Errc code, const std::string& why);
  void drop(Connection& c, const std::string& why);
  void timeouts();
  KeeperStatusReply status() const;

  KeeperOptions options;
  uid_t user;
  Place place;
  std::string started;
  Clock::time_point started_at;
  std::map<std::string, Fd> kept;
  std::map<int, Connection> connections;  // by socket
  Clock::time_point accept_paused_until{};
};

void Keeper::Impl::accept_peers() {
  for (int i = 0; i < 16; ++i) {
    Fd fd(::accept4(place.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
        spdlog::warn("accept: {}; new connections wait", errno_text());
        accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
      }
      return;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) continue;
    const auto say = [&](Errc code, const std::string& why) {
      const std::string bytes = proto::encode(proto::Kind::reply, error_reply(Json(), code, why));
      (void)!::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    };
    if (cred.uid != user && cred.uid != 0) {
      spdlog::warn("refused pid {} (uid {}): only uid {} and root may use the keeper", cred.pid, cred.uid, user);
      say(Errc::not_permitted, "only uid " + std::to_string(user) + " (the keeper's user) and root may use the keeper");
      continue;
    }
    std::size_t live = 0;
    Connection* oldest_idle = nullptr;
    for (auto& [key, c] : connections) {
      if (c.dead) continue;
      ++live;
      if (c.idle() && (!oldest_idle || c.last_active < oldest_idle->last_active)) oldest_idle = &c;
    }
    if (live >= options.max_connections) {
      if (!oldest_idle) {
        say(Errc::limit_exceeded, "the keeper serves " + std::to_string(options.max_connections) +
                                      " connections at once, all busy; try again");
        continue;
      }
      spdlog::info("closing the idle connection of {} to make room", oldest_idle->who());
      oldest_idle->dead = true;
    }
    const int key = fd.get();
    Connection& c = connections[key];
    c.fd = std::move(fd);
    c.pid = cred.pid;
    c.uid = cred.uid;
    c.last_active = Clock::now();
    spdlog::debug("connected: {}", c.who());
  }
}

void Keeper::Impl::read_from(Connection& c) {
  char buf[16384];
  std::vector<int> got;
  bool truncated = false;
  const ssize_t n = proto::receive_some(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT, got, truncated);
  for (int fd : got) c.fds.emplace_back(fd);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) drop(c, "receiving failed: " + errno_text());
    return;
  }
  if (truncated) {
    rlimit files{};
    ::getrlimit(RLIMIT_NOFILE, &files);
    return refuse(c, Errc::limit_exceeded,
                  "a descriptor sent to the keeper was lost: it has no room for more (open-files limit " +
                      std::to_string(files.rlim_cur) + ")");
  }
  if (c.fds.size() > kMaxWaitingFds)
    return refuse(c, Errc::bad_frame, "more descriptors came than the frames that carry them");
  if (n == 0) {  // the peer is done sending: answer what it sent, then close
    process(c);
    c.closing = true;
    flush(c);
    return;
  }
  c.last_active = Clock::now();
  c.inbox.append(buf, static_cast<std::size_t>(n));
  process(c);
}

void Keeper::Impl::process(Connection& c) {
  try {
    while (!c.closing && !c.dead) {
      if (!c.out.empty()) {
        flush(c);
        if (!c.out.empty()) return;
      }
      std::size_t used = 0;
      while (!c.decoder.ready() && used < c.inbox.size())
        used += c.decoder.feed(c.inbox.data() + used, c.inbox.size() - used);
      c.inbox.erase(0, used);
      if (!c.decoder.ready()) break;
      auto [header, payload] = c.decoder.take();
      if (header.kind == proto::Kind::part)
        throw Error(Errc::bad_frame, "a request to the keeper fits one frame (" + std::to_string(proto::kMaxPayload) +
                                         " bytes); parts are not taken");
      // Its descriptor came with its first byte: one still waiting when nothing follows this frame
      // came with this frame, which does not say so.
      if (header.fds == 0 && !c.fds.empty() && c.inbox.empty())
        throw Error(Errc::bad_frame, "a descriptor came with a frame that does not carry one (\"fds\" 0)");
      Fd fd;
      if (header.fds == 1) {
        if (c.fds.empty())
          throw Error(Errc::bad_frame, "the frame says it carries a descriptor, and none came with it");
        fd = std::move(c.fds.front());
        c.fds.pop_front();
      }
      answer(c, payload, std::move(fd));
    }
    // A descriptor comes with its frame's first byte: one left over when every byte is handled came
    // with a frame that did not say so.
    if (!c.closing && c.inbox.empty() && !c.decoder.mid_frame() && !c.fds.empty())
      throw Error(Errc::bad_frame, "a descriptor came with a frame that does not carry one (\"fds\" 0)");
  } catch (const Error& e) {
    refuse(c, e.code(), e.what());
    return;
  }
  if (c.decoder.mid_frame() && !c.in_frame) c.frame_started = Clock::now();
  c.in_frame = c.decoder.mid_frame();
}

void Keeper::Impl::answer(Connection& c, const std::string& payload, Fd fd) {
  const Json request = proto::parse_payload(payload);  // bad_frame goes up
  if (options.reply_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(options.reply_delay_ms));
  Json id;
  if (const auto it = request.find("id");
      it != request.end() && it->is_number_integer() && it->get<std::int64_t>() >= 0)
    id = *it;
  Fd reply_fd;
  Json reply;
  try {
    Json body = handle(c, request, std::move(fd), reply_fd);
    reply = model::write_json(KeeperReplyHead{id, true, std::nullopt});
    for (auto& [key, value] : body.items()) reply[key] = std::move(value);
  } catch (const Error& e) {
    reply = error_reply(id, e.code(), e.what());
    reply_fd.reset();
  }
  queue(c, reply, std::move(reply_fd));
}

Json Keeper::Impl::handle(Connection& c, const Json& request, Fd fd, Fd& reply_fd) {
  proto::Args args(request);
  const std::string op = args.string("op", 32);
  // (A descriptor a peer sent is closed here when it is not kept: only the keeper's own user and
  // root get this far.)
  if (fd && op != "deposit")
    throw Error(Errc::bad_request, "only deposit carries a descriptor, not " + safe_for_display(op));
  if (!c.greeted && op != "hello")
    throw Error(Errc::hello_required, "the first request is hello: {\"op\": \"hello\", \"keeper\": 1}");
  const auto name_argument = [&] {
    std::string name = args.string("name", kMaxNameLength);
    if (!valid_fd_name(name))
      throw Error(Errc::bad_request, "\"name\" must be 1 to " + std::to_string(kMaxNameLength) +
                                         " characters of [A-Za-z0-9._-], not \"" + safe_for_display(name) + "\"");
    return name;
  };
  if (op == "hello") {
    const Json* version = args.value("keeper");
    args.finish();
    if (!version || !version->is_number_integer() || version->get<std::int64_t>() != kKeeperProtocolVersion)
      throw Error(Errc::unsupported_protocol, "this keeper speaks version " + std::to_string(kKeeperProtocolVersion) +
                                                  " of the keeper protocol (\"keeper\": 1)");
    c.greeted = true;
    return model::write_json(KeeperHelloReply{kKeeperProtocolVersion, ::getpid(), kept.size()});
  }
  if (op == "deposit") {
    const std::string name = name_argument();
    args.finish();
    if (!fd) throw Error(Errc::bad_request, "deposit carries the descriptor to keep (SCM_RIGHTS; \"fds\": 1)");
    const auto it = kept.find(name);
    if (it == kept.end() && kept.size() >= options.max_kept)
      throw Error(Errc::limit_exceeded,
                  "the keeper keeps at most " + std::to_string(options.max_kept) + " descriptors; remove some first");
    const bool replaced = it != kept.end();
    kept[name] = std::move(fd);
    spdlog::debug("{} kept {}{}", c.who(), name, replaced ? " (replacing the one before)" : "");
    return model::write_json(KeeperDepositReply{name, replaced, kept.size()});
  }
  if (op == "remove") {
    const std::string name = name_argument();
    args.finish();
    const bool removed = kept.erase(name) > 0;
    return model::write_json(KeeperRemoveReply{name, removed, kept.size()});
  }
  if (op == "withdraw") {
    const std::string name = name_argument();
    args.finish();
    const auto it = kept.find(name);
    if (it == kept.end()) throw Error(Errc::not_found, "nothing is kept under " + name);
    reply_fd.reset(::fcntl(it->second.get(), F_DUPFD_CLOEXEC, 3));
    if (!reply_fd) throw Error(Errc::limit_exceeded, "can't pass " + name + " on: " + errno_text());
    return model::write_json(KeeperWithdrawReply{name});
  }
  if (op == "list") {
    args.finish();
    KeeperNamesReply list;
    for (const auto& [name, kept_fd] : kept) list.names.push_back(name);
    return model::write_json(list);
  }
  if (op == "release") {
    args.finish();
    const std::size_t released = kept.size();
    kept.clear();
    spdlog::warn(
        "released {} descriptor{} at the request of {}: the memory they held is gone unless another "
        "process holds them",
        released, released == 1 ? "" : "s", c.who());
    return model::write_json(KeeperReleaseReply{released});
  }
  if (op == "status") {
    args.finish();
    return model::write_json(status());
  }
  throw Error(Errc::unknown_op, "unknown operation \"" + safe_for_display(op) +
                                    "\" (the keeper has hello, deposit, remove, list, withdraw, release, status)");
}

KeeperStatusReply Keeper::Impl::status() const {
  KeeperStatusReply out;
  out.pid = ::getpid();
  out.socket = options.socket;
  out.started = started;
  out.uptime_seconds = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - started_at).count();
  out.kept_count = kept.size();
  out.max_kept_count = options.max_kept;
  for (const auto& [key, c] : connections) out.connection_count += c.dead ? 0 : 1;
  out.max_connection_count = options.max_connections;
  for (const auto& [name, fd] : kept) out.names.push_back(name);
  return out;
}

void Keeper::Impl::queue(Connection& c, const Json& body, Fd fd) {
  OutFrame f;
  f.fd = std::move(fd);
  try {
    f.bytes = proto::encode(proto::Kind::reply, body, f.fd ? 1 : 0);
  } catch (const Error& e) {
    f.fd.reset();
    f.bytes = proto::encode(proto::Kind::reply, error_reply(body.value("id", Json()), Errc::internal, e.what()));
  }
  if (c.out.empty()) c.waiting_since = Clock::now();
  c.out.push_back(std::move(f));
}

void Keeper::Impl::flush(Connection& c) {
  while (!c.dead && !c.out.empty()) {
    OutFrame& f = c.out.front();
    const ssize_t n = proto::send_some(c.fd.get(), std::string_view(f.bytes).substr(f.sent),
                                       f.sent == 0 ? f.fd.get() : -1, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      drop(c, errno == EPIPE || errno == ECONNRESET ? "" : "sending failed: " + errno_text());
      return;
    }
    f.fd.reset();  // it went with the first byte
    f.sent += static_cast<std::size_t>(n);
    c.last_active = c.waiting_since = Clock::now();
    if (f.sent == f.bytes.size()) c.out.pop_front();
  }
  if (c.out.empty() && c.closing) c.dead = true;
}

void Keeper::Impl::refuse(Connection& c, Errc code, const std::string& why) {
  spdlog::warn("closing the connection of {}: {}", c.who(), why);
  c.inbox.clear();
  c.fds.clear();
  // Replies not begun go; one half sent is finished first, so the error comes as a frame of its own.
  while (!c.out.empty() && c.out.size() > (c.out.front().sent > 0 ? 1U : 0U)) c.out.pop_back();
  queue(c, error_reply(Json(), code, why));
  c.closing = true;
  flush(c);
}

void Keeper::Impl::drop(Connection& c, const std::string& why) {
  if (!why.empty()) spdlog::warn("dropping the connection of {}: {}", c.who(), why);
  c.dead = true;
}

void Keeper::Impl::timeouts() {
  const auto now = Clock::now();
  for (auto& [key, c] : connections) {
    if (c.dead) continue;
    if (c.in_frame && now - c.frame_started > std::chrono::milliseconds(options.frame_timeout_ms))
      drop(c, "a frame was not completed within " + std::to_string(options.frame_timeout_ms) + " ms");
    else if (!c.out.empty() && now - c.waiting_since > std::chrono::milliseconds(options.write_stall_timeout_ms))
      drop(c, "it did not read its replies for " + std::to_string(options.write_stall_timeout_ms) + " ms");
  }
}

Keeper::Keeper(const KeeperOptions& options) : impl_(std::make_unique<Impl>(options)) {}
Keeper::~Keeper() = default;
std::size_t Keeper::kept() const { return impl_->kept.size(); }
const std::string& Keeper::socket() const { return impl_->options.socket; }

void Keeper::serve(int stop) {
  Impl& k = *impl_;
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({stop, POLLIN, 0});
    const bool accepting = Clock::now() >= k.accept_paused_until;
    if (accepting) fds.push_back({k.place.fd(), POLLIN, 0});
    bool timed = !accepting;  // something has a deadline: look again soon; else sleep until a peer stirs
    for (auto& [key, c] : k.connections) {
      const bool reading = !c.closing && c.out.empty() && c.inbox.size() < kMaxInbox;
      fds.push_back({key, static_cast<short>((reading ? POLLIN : 0) | (c.out.empty() ? 0 : POLLOUT)), 0});
      timed = timed || c.in_frame || !c.out.empty();
    }
    if (::poll(fds.data(), fds.size(), timed ? 100 : -1) < 0 && errno != EINTR)
      throw Error(Errc::internal, "poll: " + errno_text());
    if (fds[0].revents) return;
    for (std::size_t i = 1; i < fds.size(); ++i) {
      const pollfd& p = fds[i];
      if (p.revents == 0) continue;
      if (p.fd == k.place.fd()) {
        k.accept_peers();
        continue;
      }
      const auto it = k.connections.find(p.fd);
      if (it == k.connections.end() || it->second.dead) continue;
      Connection& c = it->second;
      if (p.revents & POLLOUT) {
        if (c.closing) {
          k.flush(c);
        } else {
          k.process(c);  // sends what waits, then handles the requests it held back
        }
      }
      if (p.revents & POLLIN) {
        k.read_from(c);
      } else if (p.revents & (POLLHUP | POLLERR)) {
        k.drop(c, "");
      }
    }
    k.timeouts();
    for (auto it = k.connections.begin(); it != k.connections.end();)
      it = it->second.dead ? k.connections.erase(it) : std::next(it);
  }
}

int run_keeper(const KeeperOptions& options) {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  if (::sigprocmask(SIG_BLOCK, &mask, nullptr) != 0) throw Error(Errc::internal, "sigprocmask: " + errno_text());
  const Fd signals(::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signals) throw Error(Errc::internal, "signalfd: " + errno_text());
  ::signal(SIGPIPE, SIG_IGN);
  // Every descriptor kept counts against RLIMIT_NOFILE (usually 1024): ask for room for all of them.
  const rlim_t wanted = options.max_kept + options.max_connections + 64;
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < wanted) {
    files.rlim_cur = files.rlim_max == RLIM_INFINITY ? wanted : std::min(wanted, files.rlim_max);
    (void)::setrlimit(RLIMIT_NOFILE, &files);
    if (files.rlim_cur < wanted)
      spdlog::warn(
          "the open-files limit ({}) is below what the keeper may keep ({} descriptors); deposits past it "
          "fail",
          files.rlim_cur, options.max_kept);
  }
  Keeper keeper(options);
  spdlog::info("keeping descriptors for the holder at {} (at most {}; uid {} and root may use it)", keeper.socket(),
               options.max_kept, options.user == static_cast<uid_t>(-1) ? ::geteuid() : options.user);
  int signal = 0;
  while (signal != SIGTERM && signal != SIGINT) {
    keeper.serve(signals.get());
    signalfd_siginfo si{};
    while (::read(signals.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
      if (si.ssi_signo == SIGHUP) {
        spdlog::info("SIGHUP: ignored (the keeper has nothing to reload)");
      } else if (signal == 0) {
        signal = static_cast<int>(si.ssi_signo);
      }
    }
  }
  const char* name = signal == SIGINT ? "SIGINT" : "SIGTERM";
  if (const std::size_t n = keeper.kept())
    spdlog::warn(
        "{}: stopping with {} descriptor{} kept; closing them frees the memory they hold (the buffers of a "
        "holder that is not running are lost)",
        name, n, n == 1 ? "" : "s");
  else
    spdlog::info("{}: stopping", name);
  return signal == SIGINT ? static_cast<int>(ExitCode::interrupted) : static_cast<int>(ExitCode::ok);
}

}  // namespace cupool::custody
