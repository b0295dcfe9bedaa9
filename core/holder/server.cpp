#include "holder/server.h"

#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <set>
#include <thread>

#include "base/error.h"
#include "base/fd.h"
#include "base/text.h"
#include "config/load.h"
#include "custody/custody.h"
#include "device/query.h"
#include "holder/closer.h"
#include "holder/conversation.h"
#include "holder/driver_start.h"
#include "holder/holder.h"
#include "holder/names.h"
#include "holder/peer.h"
#include "holder/socket_file.h"
#include "holder/start.h"
#include "protocol/messages.h"
#include "protocol/protocol.h"

namespace cupool {

namespace {

using Clock = std::chrono::steady_clock;
// SO_PASSRIGHTS (Linux 6.16): whether a socket takes SCM_RIGHTS. Older headers lack the name.
constexpr int kSoPassRights = 83;
// SCM_MAX_FD: the most descriptors one message carries.
constexpr std::size_t kMaxFdsPerMessage = 253;
// Descriptors of one user still being closed, past which its new connections are refused. A user
// that never sends descriptors has at most the sockets of connections it just closed.
constexpr std::size_t kMaxPendingClosesPerUser = 16;
using proto::Json;

std::int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

// A connected client: its socket, who it is, and its conversation with the holder.
struct Connection {
  Connection(Fd socket, Holder& holder, std::uint64_t client, uid_t peer_uid, bool is_admin)
      : fd(std::move(socket)), talk(holder, client), uid(peer_uid), admin(is_admin) {}
  Fd fd;
  Conversation talk;
  uid_t uid;
  bool admin;
  bool peer_gone = false;  // the peer closed its end: serve what it sent, then drop it
  Clock::time_point frame_started{};
  Clock::time_point last_progress{};  // the last byte sent, or when the queue stopped being empty
  bool sending = false;               // replies were waiting after the last pump
  bool dead = false;
};

class Server {
 public:
  Server(Backend& backend, const ServerOptions& options) : backend_(backend), options_(options) {}

  int run();

 private:
  // The steps of run(): the start (signals, open files, config, custody, pools and buffers, the
  // socket), one turn of the loop after another until drained, then the stop.
  // The start before listening: custody asked, the node report (custody's, or the driver's), the
  // config checked, custody's buffers adopted, the socket; then the driver's part on its thread.
  void start();
  // The driver's part is over (its thread's eventfd): the node as the driver reports it, the adopted
  // buffers as the driver mapped them, the pools made; requests that waited are served.
  void finish_start();
  // Adopts or forgets what custody kept (`kept`, withdrawn before the holder existed).
  void take_custody(std::vector<custody::Kept> kept, const Desired& want);
  // Where the holder's notices and deferred replies go: the connections' queues.
  void wire_holder();
  // One turn: poll, take signals, connections and bytes, serve requests, audit custody, enforce
  // deadlines, let dead connections go.
  void turn(const Fd& signals, std::vector<pollfd>& fds);
  // Fills `fds` with what to poll; returns whether requests wait to be served.
  bool watch(const Fd& signals, std::vector<pollfd>& fds);
  int poll_timeout(bool work_waiting) const;
  void read_signals(const Fd& signals);
  void on_connection_event(const pollfd& p);
  void audit_custody_when_due();
  void enforce_deadlines();
  void stop();
  void accept_clients();
  // Hands a socket of a peer of `uid` to the closer (it may hold descriptors the peer sent).
  void let_go(uid_t uid, Fd fd);
  // Whether to read from the connection now: it wants input, and its user has no descriptors
  // waiting to be closed (a user that sent descriptors is read again once they are closed).
  bool reading(const Connection& c) const;
  void read_from(Connection& c);
  // Handles waiting requests, one per user and round, until none is left or the turn's time is up.
  void serve_requests();
  // The users whose unread replies take more than max_queued_bytes_per_user: not served for now.
  std::set<uid_t> users_waiting_to_read() const;
  void queue(Connection& c, const Json& body, proto::Kind kind = proto::Kind::reply);
  // Sends what the conversation queued as far as the socket takes it; drops a peer that has more
  // than max_queued_bytes unread between the reply being sent and the newest.
  void pump(Connection& c);
  void flush(Connection& c);
  void drop(Connection& c, const std::string& why);
  void reload();
  void start_drain(const char* why);
  // Whether stopping now would take something from the peer (Holder::needs_holder, or a request
  // of it that waits for cached blocks).
  bool needs_holder(const Connection& c) const;
  // Draining, and no client needs the holder any more (or the drain timeout passed).
  bool drained() const;
  void update_identity();

  Backend& backend_;
  ServerOptions options_;
  // The start (start(), finish_start()): when the holder's work began, the config as read and
  // checked, the node's fingerprint, where the time went, the driver's part while it runs.
  Clock::time_point run_started_{};
  std::optional<SourceFile> file_;
  Desired want_;
  std::string fingerprint_;
  bool node_from_custody_ = false;
  model::HolderStart start_;
  std::unique_ptr<DriverStart> driver_start_;
  Clock::time_point start_deadline_{};
  bool reload_pending_ = false;                // a SIGHUP while starting: reloaded once started
  std::unique_ptr<custody::Custody> custody_;  // outlives holder_, which uses it
  std::unique_ptr<Holder> holder_;
  std::unique_ptr<SocketFile> socket_;
  Closer closer_;
  std::map<int, Connection> connections_;  // by fd
  std::map<uid_t, int> next_of_user_;      // the fd whose request is served next for each user
  bool draining_ = false;
  Clock::time_point drain_deadline_{};
  // accept() failing for want of descriptors (EMFILE, ENFILE): the listener stays readable, so it
  // is left out of poll() for a moment instead of being retried (and logged) in a busy loop.
  Clock::time_point accept_paused_until_{};
  bool accept_failing_ = false;
  int exit_code_ = 0;
  int reloads_ = 0;
  std::optional<model::ReloadOutcome> last_reload_;  // status says it: a rejected file leaves a trace
  Clock::time_point next_audit_{};                   // when custody is next asked what it keeps
  std::string started_;
};

void Server::update_identity() {
  model::HolderInfo id;
  id.pid = ::getpid();
  id.version = std::string("cupool ") + CUPOOL_VERSION;
  id.config = options_.config_path;
  id.socket = socket_->path();
  id.started = started_;
  id.reload_count = static_cast<std::uint64_t>(reloads_);
  id.last_reload = last_reload_;
  id.start = start_;
  holder_->set_identity(id);
}

void Server::queue(Connection& c, const Json& body, proto::Kind kind) {
  c.talk.queue(body, kind);
  pump(c);
}

void Server::pump(Connection& c) {
  if (!c.sending) c.last_progress = Clock::now();
  flush(c);
  c.sending = !c.talk.out().empty();
  // A reply may be long (up to kMaxReply): the one being sent and the newest are not counted, so a
  // client that reads one long reply at a time is never dropped for it; what waits between them is
  // what the peer asked for without reading.
  const auto& out = c.talk.out();
  std::size_t waiting = c.talk.queued_bytes();
  if (!out.empty()) waiting -= out.front().bytes.size() - out.front().sent;
  if (out.size() > 1) waiting -= out.back().bytes.size();
  if (!c.dead && waiting > options_.max_queued_bytes) drop(c, "it does not read its replies (over 1 MiB queued)");
}

void Server::flush(Connection& c) {
  while (!c.dead && !c.talk.out().empty()) {
    OutFrame& f = c.talk.out().front();
    iovec iov{f.bytes.data() + f.sent, f.bytes.size() - f.sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (f.sent == 0 && f.fd) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      cmsghdr* cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      const int fd = f.fd.get();
      std::memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    }
    const ssize_t n = ::sendmsg(c.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EPIPE || errno == ECONNRESET) {
        spdlog::debug("client {} left before reading its reply", c.talk.client());
        drop(c, "");
      } else {
        drop(c, std::string("sending failed: ") + errno_text());
      }
      return;
    }
    c.talk.sent(static_cast<std::size_t>(n));
    c.last_progress = Clock::now();
  }
  if (!c.dead && c.talk.out().empty() && c.talk.closing()) drop(c, "");
}

void Server::drop(Connection& c, const std::string& why) {
  if (c.dead) return;
  c.dead = true;
  if (!why.empty()) spdlog::warn("dropping client {}: {}", c.talk.client(), why);
  holder_->disconnect(c.talk.client());
}

void Server::let_go(uid_t uid, Fd fd) { closer_.close(uid, fd.release()); }

bool Server::reading(const Connection& c) const {
  return !c.dead && !c.peer_gone && c.talk.wants_input() && (c.admin || closer_.pending(c.uid) == 0);
}

void Server::accept_clients() {
  for (int i = 0; i < 64; ++i) {
    Fd fd(::accept4(socket_->fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        // Said once per episode; new connections wait in the backlog until a descriptor is free.
        if (!accept_failing_)
          spdlog::warn("accept: {} ({} clients connected); new connections wait until some leave", errno_text(),
                       connections_.size());
        accept_failing_ = true;
        accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
      }
      return;
    }
    if (accept_failing_) {
      spdlog::info("accepting connections again ({} clients connected)", connections_.size());
      accept_failing_ = false;
    }
    // The kernel refuses descriptors sent to this socket (Linux 6.16 and later): nothing a peer
    // sends can then make closing it wait. Older kernels answer ENOPROTOOPT: the closer covers them.
    if (options_.refuse_descriptors_in_kernel) {
      const int off = 0;
      (void)::setsockopt(fd.get(), SOL_SOCKET, kSoPassRights, &off, sizeof off);
    }
    std::uint64_t client = 0;
    uid_t uid = 0;
    bool admin = false;
    try {
      const Peer peer = peer_of(fd.get());
      uid = peer.uid;
      admin = peer.uid == 0 || peer.uid == ::geteuid();
      // A user whose earlier descriptors are still being closed gets no new connections: each
      // could bring more.
      if (!admin && closer_.pending(uid) > kMaxPendingClosesPerUser)
        throw Error(Errc::limit_exceeded, "the descriptors user " + peer.user + " (uid " + std::to_string(uid) +
                                              ") sent are still being closed; try again later");
      client = holder_->connect(peer);
      spdlog::debug("client {} connected: pid {}, uid {} ({})", client, peer.pid, peer.uid, peer.user);
    } catch (const Error& e) {
      // Over a limit: say so and close.
      const std::string bytes = proto::encode(proto::Kind::reply, error_body(Json(), e.wire_code(), e.what()));
      (void)!::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      spdlog::warn("refused a connection: {}", e.what());
      let_go(uid, std::move(fd));
      continue;
    } catch (const std::exception& e) {
      spdlog::warn("refused a connection: {}", e.what());
      let_go(uid, std::move(fd));
      continue;
    }
    const int key = fd.get();
    Connection& c = connections_
                        .emplace(std::piecewise_construct, std::forward_as_tuple(key),
                                 std::forward_as_tuple(std::move(fd), *holder_, client, uid, admin))
                        .first->second;
    if (draining_) {
      c.talk.close_after_sending();  // it holds nothing yet: told, and let go
      queue(c, proto::to_json(proto::Draining{"the holder is stopping; connect again when a holder is back"}),
            proto::Kind::notice);
    }
  }
}

void Server::read_from(Connection& c) {
  char buf[16384];
  // Room for as many descriptors as one message can carry (SCM_MAX_FD): descriptors that do not fit
  // would be dropped by the kernel, which closes them in this thread, where a close may wait.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  // Read at most a few buffers per wake-up, and only while the conversation wants more.
  for (int round = 0; round < 4 && reading(c); ++round) {
    iovec iov{buf, sizeof buf};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(c.fd.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      drop(c, std::string("receive failed: ") + errno_text());
      return;
    }
    bool got_fds = (msg.msg_flags & MSG_CTRUNC) != 0;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      got_fds = true;
      const std::size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
        // Never closed here: a socket is made quick to close, and all of them go to the closer.
        Closer::make_close_quick(fd);
        closer_.close(c.uid, fd);
      }
    }
    if (got_fds) {
      c.talk.refuse("clients may not send file descriptors");
      pump(c);
      return;
    }
    if (n == 0) {
      c.peer_gone = true;
      return;
    }
    const bool was_mid = c.talk.mid_frame();
    c.talk.deliver(buf, static_cast<std::size_t>(n));
    if (!was_mid && c.talk.mid_frame()) c.frame_started = Clock::now();
    if (c.talk.closing()) {
      pump(c);
      return;
    }
    if (static_cast<std::size_t>(n) < sizeof buf) return;
  }
}

std::set<uid_t> Server::users_waiting_to_read() const {
  std::map<uid_t, std::size_t> queued;
  for (const auto& [fd, c] : connections_)
    if (!c.dead && !c.peer_gone) queued[c.uid] += c.talk.queued_bytes();  // a gone peer is dropped soon
  std::set<uid_t> over;
  for (const auto& [uid, bytes] : queued)
    if (bytes > options_.max_queued_bytes_per_user) over.insert(uid);
  return over;
}

void Server::serve_requests() {
  // Round robin over users, not connections: a user with 256 connections gets one request served
  // per round, like a user with one. A round ends early only when the turn's time is up. A user
  // whose unread replies are over its budget is not served until its peers read some.
  const auto deadline = Clock::now() + std::chrono::milliseconds(20);
  while (Clock::now() < deadline) {
    const std::set<uid_t> waiting = users_waiting_to_read();
    std::map<uid_t, std::vector<Connection*>> ready;
    for (auto& [fd, c] : connections_)
      if (!c.dead && c.talk.has_work() && !waiting.count(c.uid)) ready[c.uid].push_back(&c);
    if (ready.empty()) return;
    for (auto& [uid, list] : ready) {
      // This user's next connection after the one served last.
      const int after = next_of_user_.count(uid) ? next_of_user_[uid] : -1;
      Connection* pick = list.front();
      for (Connection* c : list)
        if (c->fd.get() > after) {
          pick = c;
          break;
        }
      next_of_user_[uid] = pick->fd.get();
      const bool was_mid = pick->talk.mid_frame();
      pick->talk.work();
      if (!was_mid && pick->talk.mid_frame()) pick->frame_started = Clock::now();
      if (!pick->talk.out().empty()) pump(*pick);
    }
  }
}

void Server::reload() {
  spdlog::info("SIGHUP: reloading {}", options_.config_path);
  sd_notify_state(
      "RELOADING=1\nMONOTONIC_USEC=" +
      std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count()));
  try {
    const SourceFile file = SourceFile::read_regular(options_.config_path, kMaxConfigBytes);
    const Loaded loaded = load_config(
        file, [this] { return build_report(backend_); }, Scope::all);
    if (!loaded.warnings.empty()) spdlog::warn("{}:\n{}", options_.config_path, loaded.warnings);
    const bool waits = holder_->apply_after_drops(loaded.desired, [this](const std::vector<Change>& changes) {
      ++reloads_;
      std::size_t blocked = 0;
      for (const Change& ch : changes)
        if (!ch.blocked.empty()) ++blocked;
      std::string said = changes.empty()
                             ? "no changes"
                             : std::to_string(changes.size()) + (changes.size() == 1 ? " change" : " changes");
      if (blocked) said += ", " + std::to_string(blocked) + " not done (see 'cupool plan')";
      last_reload_ = model::ReloadOutcome{iso_now(), true, said};
      update_identity();
      // What `cupool apply` made is replaced by the file: said, not silently undone.
      if (auto applied = holder_->forget_applied())
        spdlog::warn("reload: {} replaces what 'cupool apply' made from {} at {}", options_.config_path, applied->path,
                     applied->since);
      if (changes.empty()) spdlog::info("reload: no changes");
      for (const Change& ch : changes)
        spdlog::info("reload: {} {} {}{}{}", model::change_word(ch.action), model::change_word(ch.object), ch.name,
                     ch.field.empty() ? "" : " " + ch.field + ": " + ch.from.text + " -> " + ch.to.text,
                     ch.blocked.empty() ? "" : " (not done: " + ch.blocked + ")");
    });
    if (waits)
      spdlog::info("reload: waiting for clients to give back cached blocks first (at most {} ms)",
                   options_.drop_timeout_ms);
  } catch (const ConfigRejected& e) {
    spdlog::error("reload: {} was not applied; the holder keeps its state.\n{}", options_.config_path, e.rendered());
    last_reload_ =
        model::ReloadOutcome{iso_now(), false, e.what() + std::string(" (the holder's log has each finding)")};
    update_identity();
  } catch (const std::exception& e) {
    spdlog::error("reload: {} was not applied: {}", options_.config_path, e.what());
    last_reload_ = model::ReloadOutcome{iso_now(), false, e.what()};
    update_identity();
  }
  sd_notify_state("READY=1\nSTATUS=holding " + std::to_string(holder_->lease_count()) + " leases");
}

void Server::start_drain(const char* why) {
  if (draining_) {
    spdlog::warn("{} again: stopping now", why);
    drain_deadline_ = Clock::now();
    return;
  }
  draining_ = true;
  holder_->set_draining(true);
  sd_notify_state("STOPPING=1");
  drain_deadline_ = Clock::now() + std::chrono::milliseconds(options_.drain_timeout_ms);
  // New clients can't come in; those here are told. Only a client that would lose something is
  // waited for (leases in use, a buffer it loads): the others (exporters, watchers, engines that
  // only map held sets, which their own descriptors keep) are let go once told.
  socket_->close();
  std::size_t waited = 0, told = 0;
  for (auto& [fd, c] : connections_) {
    if (c.dead) continue;
    const std::string stopping = std::string("the holder is stopping (") + why + ")";
    if (needs_holder(c)) {
      ++waited;
      queue(c, proto::to_json(proto::Draining{stopping + "; release your leases"}), proto::Kind::notice);
    } else {
      ++told;
      c.talk.close_after_sending();
      queue(c, proto::to_json(proto::Draining{stopping + "; connect again when a holder is back"}),
            proto::Kind::notice);
    }
  }
  if (waited)
    spdlog::info("{}: draining: waiting up to {} ms for {} client{} with leases ({} leases; {} other client{} told)",
                 why, options_.drain_timeout_ms, waited, waited == 1 ? "" : "s", holder_->lease_count(), told,
                 told == 1 ? "" : "s");
  else
    spdlog::info("{}: stopping ({} client{} told; none holds a lease)", why, told, told == 1 ? "" : "s");
}

bool Server::needs_holder(const Connection& c) const {
  return !c.dead && (c.talk.waiting() || holder_->needs_holder(c.talk.client()));
}

bool Server::drained() const {
  if (!draining_ || driver_start_) return false;  // the driver's part can't be cut short: it ends first
  if (Clock::now() >= drain_deadline_) return true;
  for (const auto& [fd, c] : connections_)
    if (needs_holder(c)) return false;
  return true;
}

int Server::run() {
  started_ = iso_now();
  const Fd signals = take_signals();
  raise_file_limit();
  start();
  std::vector<pollfd> fds;
  while (!drained()) turn(signals, fds);
  stop();
  return exit_code_;
}

void Server::start() {
  // How long each step of the start takes (the log and status say it).
  run_started_ = Clock::now();
  auto at = run_started_;
  auto step = [&at] {
    const auto now = Clock::now();
    const double s = std::chrono::duration<double>(now - at).count();
    at = now;
    return s;
  };
  file_ = SourceFile::read_regular(options_.config_path, kMaxConfigBytes);
  custody_ = choose_custody(options_);
  std::vector<custody::Kept> kept;
  if (custody_) kept = withdraw_from_custody(*custody_, options_.keeper_wait_ms);
  start_.custody_seconds = step();
  // The node: as custody kept it, when this node's fingerprint is the one it was kept with (no
  // driver call: cuInit alone takes 184-249 ms on an H200), else asked of the driver now.
  fingerprint_ = backend_.fingerprint();
  std::string why_not;
  std::optional<NodeReport> node = custody_ ? kept_node_report(kept, fingerprint_, why_not) : std::nullopt;
  node_from_custody_ = node.has_value();
  if (node) node->source = backend_.source();  // what answers: the driver (or the profile), as the report it kept says
  if (!node) {
    if (custody_) spdlog::info("node report: asking the driver ({})", why_not);
    node = build_report(backend_);
  }
  start_.node_report = node_from_custody_ ? "custody" : "driver";
  start_.node_report_seconds = step();
  want_ = load_held_config(*file_, *node);
  if (!options_.socket.empty()) want_.holder.socket = options_.socket;

  socket_ = std::make_unique<SocketFile>(want_.holder.socket);
  HolderLimits limits;
  limits.max_clients_per_user = options_.max_clients_per_user;
  holder_ = std::make_unique<Holder>(backend_, std::move(*node), ::geteuid(), limits);
  holder_->adopt_holder_settings(want_.holder);
  if (!options_.socket.empty()) holder_->keep_socket_from_command_line();
  if (custody_) {
    holder_->attach_custody(custody_.get());
    holder_->set_custody_budget_ms(std::max(options_.keeper_wait_ms, Holder::kCustodyBudgetMs));
  }
  take_custody(std::move(kept), want_);
  holder_->declare_pools(want_);
  holder_->set_starting(true);
  start_.config_seconds = step();
  // Serving from here: custody may hold the serving thread up only this long.
  holder_->set_custody_budget_ms(Holder::kCustodyBudgetMs);
  if (auto* keeper = dynamic_cast<custody::KeeperClient*>(custody_.get())) keeper->set_timeout_ms(kKeeperTimeoutMs);
  socket_->listen(holder_->holder_settings());
  holder_->attach_socket(socket_.get());
  wire_holder();
  start_.state = "starting";
  start_.listening_seconds = std::chrono::duration<double>(Clock::now() - run_started_).count();
  update_identity();
  const model::Status held = holder_->status();
  spdlog::info(
      "listening on {} {:.0f} ms after the start of the holder's work (custody {:.0f} ms, node report {:.0f} "
      "ms from {}, config and adoption {:.0f} ms): serving {} buffer{} from custody while the driver "
      "starts",
      socket_->path(), start_.listening_seconds * 1000, start_.custody_seconds * 1000,
      start_.node_report_seconds * 1000, node_from_custody_ ? "custody" : "the driver", start_.config_seconds * 1000,
      held.buffers.size(), held.buffers.size() == 1 ? "" : "s");
  sd_notify_state("READY=1\nSTATUS=listening on " + socket_->path() +
                  "; the driver is starting\nMAINPID=" + std::to_string(::getpid()));
  std::set<int> devices;
  for (const PoolWant& p : want_.pools) devices.insert(p.device);
  driver_start_ = std::make_unique<DriverStart>(backend_, node_from_custody_, holder_->unverified(),
                                                std::vector<int>(devices.begin(), devices.end()));
  start_deadline_ = Clock::now() + std::chrono::milliseconds(options_.start_timeout_ms);
}

void Server::finish_start() {
  DriverStarted done = driver_start_->take();
  driver_start_.reset();
  if (done.failure) {
    spdlog::error("the driver did not start; the holder stops (custody keeps the held buffers)");
    std::rethrow_exception(done.failure);
  }
  start_.driver_seconds = done.init_ms / 1000;
  start_.driver_report_seconds = done.node_ms / 1000;
  start_.mapping_seconds = done.adopt_ms / 1000;
  start_.devices_seconds = done.devices_ms / 1000;
  // Custody gets this node's report for the next start: one asked before listening, or the driver's
  // where it differs from what custody kept (--fresh dropped custody's).
  bool keep = !node_from_custody_ || options_.fresh;
  if (done.node) {
    keep = keep || node_identity(holder_->node()) != node_identity(*done.node);
    want_ = recheck_held_config(*file_, want_, holder_->node(), *done.node);
    if (!options_.socket.empty()) want_.holder.socket = options_.socket;
    holder_->update_node(std::move(*done.node));
  }
  holder_->settle_adoption(done.checks);
  const auto at = Clock::now();
  if (!draining_) holder_->apply(want_);
  start_.pools_seconds = std::chrono::duration<double>(Clock::now() - at).count();
  if (custody_ && keep && !fingerprint_.empty()) holder_->keep_node({fingerprint_, to_json(holder_->node()), ""});
  holder_->set_starting(false);
  start_.state = "ready";
  start_.ready_seconds = std::chrono::duration<double>(Clock::now() - run_started_).count();
  update_identity();
  const model::Status held = holder_->status();
  spdlog::info(
      "holding {} pool{} and {} buffer{} from {}; ready {:.0f} ms after the start of the holder's work "
      "(listening at {:.0f} ms; then the driver {:.0f} ms, its node report {:.0f} ms, adopted buffers "
      "mapped {:.0f} ms, devices opened {:.0f} ms, pools and buffers {:.0f} ms)",
      held.pools.size(), held.pools.size() == 1 ? "" : "s", held.buffers.size(), held.buffers.size() == 1 ? "" : "s",
      options_.config_path, *start_.ready_seconds * 1000, start_.listening_seconds * 1000, start_.driver_seconds * 1000,
      start_.driver_report_seconds * 1000, start_.mapping_seconds * 1000, start_.devices_seconds * 1000,
      start_.pools_seconds * 1000);
  sd_notify_state("STATUS=listening on " + socket_->path());
  if (reload_pending_ && !draining_) {
    reload_pending_ = false;
    reload();
  }
}

void Server::take_custody(std::vector<custody::Kept> kept, const Desired& want) {
  if (!custody_) return;
  if (options_.fresh) {
    const std::size_t dropped = holder_->forget_custody(std::move(kept));
    spdlog::warn("--fresh: dropped {} descriptor{} that {} kept; their memory is freed", dropped,
                 dropped == 1 ? "" : "s", custody_->where());
  } else if (!kept.empty()) {
    const model::Adoption report = holder_->adopt(std::move(kept), want);
    spdlog::info("custody: adopted {} buffer{} from {} (manifest {}); {} refused, {} descriptor{} released",
                 report.buffers.size(), report.buffers.size() == 1 ? "" : "s", custody_->where(),
                 report.manifest_sequence ? std::to_string(*report.manifest_sequence) : std::string("none"),
                 report.refused.size(), report.released_count, report.released_count == 1 ? "" : "s");
  } else {
    holder_->adopt({}, want);
  }
}

void Server::wire_holder() {
  // Notices come from inside a request (apply, reload): they are only queued here, never sent or
  // dropped on the spot, which could disconnect a client while the holder walks its clients.
  holder_->on_notice([this](std::uint64_t client, const Json& notice) {
    for (auto& [fd, c] : connections_)
      if (c.talk.client() == client && !c.dead) {
        c.talk.queue(notice, proto::Kind::notice);
        if (!c.sending) c.last_progress = Clock::now();
        c.sending = true;
      }
  });
  // The reply of a request that waited for cached blocks: queued the same way (sent by the loop).
  holder_->set_drop_timeout_ms(options_.drop_timeout_ms);
  holder_->on_deferred([this](std::uint64_t client, const Json& reply) {
    for (auto& [fd, c] : connections_)
      if (c.talk.client() == client && !c.dead) {
        c.talk.answer(reply);
        if (!c.sending) c.last_progress = Clock::now();
        c.sending = true;
      }
  });
}

void Server::turn(const Fd& signals, std::vector<pollfd>& fds) {
  const bool work_waiting = watch(signals, fds);
  const int n = ::poll(fds.data(), fds.size(), poll_timeout(work_waiting));
  if (n < 0 && errno != EINTR) throw std::runtime_error("poll: " + errno_text());
  for (const pollfd& p : fds) {
    if (p.revents == 0) continue;
    if (p.fd == signals.get())
      read_signals(signals);
    else if (driver_start_ && p.fd == driver_start_->fd())
      continue;  // below, once this turn's events are taken
    else if (socket_->listening() && p.fd == socket_->fd())
      accept_clients();
    else
      on_connection_event(p);
  }
  if (driver_start_ && driver_start_->done()) finish_start();
  if (driver_start_ && Clock::now() >= start_deadline_) {
    // A driver that hangs in cuInit can't be interrupted, and nothing is lost by leaving: custody
    // keeps the held buffers, and the requests that waited are answered by the connection's end.
    spdlog::critical(
        "the driver did not start within {} s (--start-timeout); the holder exits, custody keeps the held "
        "buffers",
        options_.start_timeout_ms / 1000);
    spdlog::shutdown();
    std::_Exit(static_cast<int>(ExitCode::no_driver));
  }
  serve_requests();
  audit_custody_when_due();
  enforce_deadlines();
  holder_->expire_budgets();
  for (auto& [fd, c] : connections_)
    if (c.peer_gone && !c.dead && !c.talk.has_work()) drop(c, "");
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->second.dead) {
      let_go(it->second.uid, std::move(it->second.fd));
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Server::watch(const Fd& signals, std::vector<pollfd>& fds) {
  fds.clear();
  fds.push_back({signals.get(), POLLIN, 0});
  if (driver_start_) fds.push_back({driver_start_->fd(), POLLIN, 0});
  if (socket_->listening() && Clock::now() >= accept_paused_until_) fds.push_back({socket_->fd(), POLLIN, 0});
  bool work_waiting = false;
  const std::set<uid_t> over_budget = users_waiting_to_read();  // their requests wait for POLLOUT
  for (auto& [fd, c] : connections_) {
    // POLLIN only while the connection is read: one that is not (closing after a malformed frame,
    // its inbox full, its user's descriptors still closing) would wake the loop for every byte.
    fds.push_back({fd, static_cast<short>((reading(c) ? POLLIN : 0) | (c.talk.out().empty() ? 0 : POLLOUT)), 0});
    work_waiting = work_waiting || (c.talk.has_work() && !over_budget.count(c.uid)) || (c.peer_gone && !c.dead);
  }
  return work_waiting;
}

int Server::poll_timeout(bool work_waiting) const {
  // Requests already received and a user's closes to wait for: look again soon. Drop notices
  // have deadlines.
  int timeout = work_waiting ? 0 : closer_.pending() > 0 ? 50 : 250;
  if (const auto due = holder_->next_deadline()) {
    const auto left = *due - steady_ms() + 1;
    timeout = static_cast<int>(std::max<std::int64_t>(0, std::min<std::int64_t>(timeout, left)));
  }
  return timeout;
}

void Server::read_signals(const Fd& signals) {
  signalfd_siginfo si{};
  while (::read(signals.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    if (si.ssi_signo == SIGHUP) {
      if (driver_start_)
        reload_pending_ = true;  // the driver is starting: reloaded once it has
      else if (!draining_)
        reload();
    } else {
      if (si.ssi_signo == SIGINT) exit_code_ = static_cast<int>(ExitCode::interrupted);
      start_drain(si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
    }
  }
}

void Server::on_connection_event(const pollfd& p) {
  auto it = connections_.find(p.fd);
  if (it == connections_.end()) return;
  Connection& c = it->second;
  if (p.revents & POLLOUT) pump(c);
  if (c.talk.closing()) {
    if (p.revents & (POLLHUP | POLLERR)) drop(c, "");  // it will never read the rest
  } else if (p.revents & POLLIN) {
    read_from(c);
  } else if (p.revents & (POLLHUP | POLLERR)) {
    c.peer_gone = true;  // serve what it sent (a last "free"), then drop it
  }
}

void Server::audit_custody_when_due() {
  if (!custody_ || Clock::now() < next_audit_) return;
  // Once a second; custody that failed is asked again only after 10 s, so that a keeper that
  // hangs or answers late costs the serving thread at most Holder::kCustodyBudgetMs every 10 s.
  const bool answered = holder_->audit_custody();
  next_audit_ = Clock::now() + std::chrono::milliseconds(answered ? 1000 : Holder::kCustodyRetryMs);
}

void Server::enforce_deadlines() {
  // Timeouts: a drop notice not answered in time; a frame started and not finished; replies
  // nobody reads.
  for (std::uint64_t late : holder_->overdue(steady_ms()))
    for (auto& [fd, c] : connections_)
      if (c.talk.client() == late && !c.dead) {
        const std::string why = "it did not answer the holder's request to drop cached blocks within " +
                                std::to_string(options_.drop_timeout_ms) + " ms";
        c.talk.queue(error_body(Json(), errc_info(Errc::limit_exceeded).wire,
                                "the holder closed this connection: " + why + "; its leases are freed"));
        flush(c);
        drop(c, why);
      }
  const auto now = Clock::now();
  for (auto& [fd, c] : connections_) {
    if (!c.dead && c.talk.mid_frame() && now - c.frame_started > std::chrono::milliseconds(options_.frame_timeout_ms))
      drop(c, "a frame was not completed within " + std::to_string(options_.frame_timeout_ms / 1000) + " s");
    if (!c.dead && !c.talk.out().empty() &&
        now - c.last_progress > std::chrono::milliseconds(options_.write_stall_timeout_ms))
      drop(c, "it did not read its replies for " + std::to_string(options_.write_stall_timeout_ms / 1000) + " s");
  }
}

void Server::stop() {
  // Drained (or timed out): free what is left in order, then the pools.
  const std::size_t left = holder_->lease_count() - holder_->cached_count();  // cached ones are nobody's loss
  for (auto& [fd, c] : connections_) {
    holder_->disconnect(c.talk.client());
    let_go(c.uid, std::move(c.fd));
  }
  connections_.clear();
  if (left) spdlog::warn("freed {} lease{} of clients that did not leave in time", left, left == 1 ? "" : "s");
  holder_->shutdown();
  holder_.reset();
  socket_->close();
  spdlog::info("stopped");
}

}  // namespace

bool sd_notify_state(const std::string& state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (!path || !*path) return false;
  sockaddr_un addr{};
  const std::size_t len = std::strlen(path);
  if (len >= sizeof addr.sun_path || (path[0] != '/' && path[0] != '@')) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path, len);
  if (path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  Fd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) return false;
  const auto addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  return ::sendto(fd.get(), state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr),
                  addr_len) == static_cast<ssize_t>(state.size());
}

int run_holder(Backend& backend, const ServerOptions& options) {
  Server server(backend, options);
  return server.run();
}

}  // namespace cupool
