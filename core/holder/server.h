// `cupool hold`: the holder's process. Takes the socket's lock, creates the pools, listens on the
// socket and serves the protocol (docs/protocol.md) from one thread; SIGHUP reloads the file,
// SIGTERM drains and frees in order. Tells systemd (Type=notify) when it is ready.
#pragma once

#include <string>

#include "device/backend.h"

namespace cupool {

struct ServerOptions {
  std::string config_path;
  std::string socket;                  // overrides the config's holder.socket when set
  int drain_timeout_ms = 30000;        // how long SIGTERM waits for clients to leave
  int frame_timeout_ms = 5000;         // a frame must be complete this long after its first byte
  int write_stall_timeout_ms = 30000;  // a reply may wait this long for a peer that doesn't read
  std::size_t max_queued_bytes =
      1 << 20;  // unread replies per peer (besides the one being sent and the newest) before it is dropped
  // Unread replies of one user, all its connections together: past it, that user's requests wait
  // (they are served once its peers read), so its replies take at most this plus one reply.
  std::size_t max_queued_bytes_per_user = 16 << 20;
  std::size_t max_clients_per_user = 256;  // connections of one non-admin user (HolderLimits)
  // How long a client has to answer a `drop` notice (give back cached blocks) before its
  // connection is closed and its leases freed.
  int drop_timeout_ms = 5000;
  // Ask the kernel to refuse descriptors sent to the holder (SO_PASSRIGHTS, Linux 6.16+). Off only
  // in tests of what the holder does without it (cupool hold --no-kernel-descriptor-refusal).
  bool refuse_descriptors_in_kernel = true;
  // Custody of the held buffers' descriptors (they outlive the holder): a keeper at this socket
  // (`cupool keeper`); empty: systemd's file-descriptor store when $NOTIFY_SOCKET is set, else none.
  std::string keeper;
  int keeper_wait_ms = 30000;  // how long the start waits for the keeper to answer
  // How long the driver may take to come up after the holder listens (requests that need it wait
  // that long at most); past it the holder exits 3 (custody keeps the held buffers).
  int start_timeout_ms = 120000;
  // Start from nothing: drop what custody kept instead of adopting it (the memory goes).
  bool fresh = false;
};

// Runs the holder until SIGTERM or SIGINT. Returns the exit code (0 after SIGTERM, 130 after
// SIGINT). Throws cupool::Error for a config that can't be held (exit 1 or 2), a socket that is
// taken or can't be made (exit 4), and CudaError when the driver refuses a pool.
int run_holder(Backend& backend, const ServerOptions& options);

// Sends `state` ("READY=1", "STOPPING=1", ...) to systemd when $NOTIFY_SOCKET is set.
// Returns false when there is no such socket or sending failed.
bool sd_notify_state(const std::string& state);

}  // namespace cupool
