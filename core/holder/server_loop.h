// The holder's serving loop as a class (server.cpp: the connections, the loop, the drain;
// server_start.cpp: the start, the config read again, what the holder says of itself). Private
// to core/holder: `cupool hold` reaches it through run_holder (server.h).
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/fd.h"
#include "config/load.h"
#include "config/resolve.h"
#include "custody/custody.h"
#include "device/backend.h"
#include "holder/closer.h"
#include "holder/conversation.h"
#include "holder/driver_start.h"
#include "holder/holder.h"
#include "holder/server.h"
#include "holder/socket_file.h"
#include "model/model.h"
#include "protocol/protocol.h"

namespace cupool::serving {

using Clock = std::chrono::steady_clock;
// SO_PASSRIGHTS (Linux 6.16): whether a socket takes SCM_RIGHTS. Older headers lack the name.
constexpr int kSoPassRights = 83;
// SCM_MAX_FD: the most descriptors one message carries.
constexpr std::size_t kMaxFdsPerMessage = 253;
// Descriptors of one user still being closed, past which its new connections are refused. A user
// that never sends descriptors has at most the sockets of connections it just closed.
constexpr std::size_t kMaxPendingClosesPerUser = 16;
using proto::Json;

inline std::int64_t steady_ms() {
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

}  // namespace cupool::serving
