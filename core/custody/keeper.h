// `cupool keeper`: a small process that keeps descriptors by name for the holder, so that the
// memory of held buffers outlives a holder that restarts or crashes where there is no systemd
// file-descriptor store (a Kubernetes pod: the keeper is a second container). It never loads CUDA.
// It speaks the holder protocol's framing (docs/protocol.md, "The keeper") on its own socket; only
// its own user and root may use it.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>

#include "custody/custody.h"

namespace cupool::custody {

struct KeeperOptions {
  std::string socket = kDefaultKeeperSocket;
  unsigned mode = 0600;                // of the socket file
  std::size_t max_kept = kMaxKept;     // descriptors kept at once
  std::size_t max_connections = 16;    // at once; when full, the oldest idle one makes room
  int frame_timeout_ms = 5000;         // a frame must be complete this long after its first byte
  int write_stall_timeout_ms = 30000;  // a reply may wait this long for a peer that doesn't read
  // Who may use the keeper besides root; (uid_t)-1: the keeper's own user. (Tests name another.)
  uid_t user = static_cast<uid_t>(-1);
  // Waits this long before each answer: a keeper that answers late (tests of the holder's bound on
  // what custody may cost it; `keeper --reply-delay`, not shown in --help).
  int reply_delay_ms = 0;
};

class Keeper {
 public:
  // Takes the socket's lock (SOCKET.lock: one keeper per socket; the directory is made when
  // missing), replaces a socket left by a keeper that died, and listens. Throws Error(unreachable)
  // when another keeper serves the socket or it can't be made.
  explicit Keeper(const KeeperOptions& options);
  // Closes every descriptor kept and removes the socket file.
  ~Keeper();
  Keeper(const Keeper&) = delete;
  Keeper& operator=(const Keeper&) = delete;

  // Serves peers until `stop` (a signalfd; an eventfd or pipe in tests) is readable; reads nothing
  // from it. May be called again.
  void serve(int stop);
  // Descriptors kept now.
  std::size_t kept() const;
  const std::string& socket() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs a keeper until SIGTERM (exit 0) or SIGINT (130); SIGHUP is ignored. Every descriptor kept is
// closed at exit (a warning says how many). Throws Error(unreachable) when the socket is taken or
// can't be made (exit 4).
int run_keeper(const KeeperOptions& options);

}  // namespace cupool::custody
