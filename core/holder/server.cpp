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
#include "holder/server_loop.h"
#include "holder/socket_file.h"
#include "holder/start.h"
#include "protocol/messages.h"
#include "protocol/protocol.h"

namespace cupool::serving {

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

}  // namespace cupool::serving

namespace cupool {

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
  serving::Server server(backend, options);
  return server.run();
}

}  // namespace cupool
