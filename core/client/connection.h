// A connection to the holder, as the C API's opaque cupool_conn (include/cupool/client.h): the
// requests on it, the pools imported through it and the leases mapped in this process.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/devices.h"
#include "base/fd.h"
#include "cupool/client.h"
#include "device/backend.h"
#include "protocol/messages.h"

namespace cupool::client {

using Json = nlohmann::ordered_json;

// A failure with its C status (cupool_status).
struct Failure {
  int status;
  std::string message;
};

// The holder's ready event can't be opened in this process (measured: cuIpcOpenEventHandle
// answers CUDA_ERROR_MAP_FAILED when the client runs as another user than the holder).
struct EventUnusable {
  std::string message;
};

// A reply or notice read through its typed reader (protocol/messages.h); a malformed one is
// CUPOOL_E_PROTOCOL naming what it lacks.
template <typename Reader>
auto read_typed(const char* what, Reader reader, const Json& body) {
  try {
    return reader(body);
  } catch (const std::invalid_argument& e) {
    throw Failure{CUPOOL_E_PROTOCOL, std::string("the holder's ") + what + " is malformed: " + e.what()};
  }
}

// A number no other connection of this process had: tells a connection from a later one at the
// same address.
std::uint64_t next_serial();

}  // namespace cupool::client

// An allocation (or an opened buffer) mapped in this process.
struct cupool_lease {
  std::uint64_t id = 0;  // holder lease id; 0 for a buffer
  bool buffer = false;
  std::string name;  // buffer name
  std::string pool;
  cupool::HolderDevice holder_device;  // where the holder holds it, in the holder's numbering
  cupool::ProcessDevice local_device;  // where this process uses it
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  cupool::PoolHandle imported = 0;
  bool exported = false;      // an exported allocation (a buffer of a protocol 3 holder), mapped whole
  std::uint64_t session = 0;  // the connection's session it came from (an older one: the holder is gone)
};

struct cupool_conn {
  cupool::Fd fd;            // the socket; none once lost or closed
  std::string path;         // the holder's socket
  std::string client_name;  // what hello names this client
  // Counts the connections made to the holder (one, plus one for each time it reconnected after
  // the holder went away); leases remember theirs.
  std::uint64_t session = 0;
  std::atomic<bool> lost{false};  // the holder closed the socket (or it was lost)
  // A call returned CUPOOL_E_UNREACHABLE for it: the application was told, and the next call that
  // talks to the holder connects again. Never before: leases the holder freed must not be hidden.
  std::atomic<bool> told_lost{false};
  std::mutex reconnect_mu;  // one thread stops the old watcher
  mutable std::mutex mu;
  int protocol = 1;  // what hello agreed on: 2 has cached blocks and quiet requests
  const std::uint64_t serial = cupool::client::next_serial();
  std::string last_error;
  std::string backend_kind;
  std::uint64_t next_id = 1;
  bool draining = false;
  // alloc with "synchronize": the holder waits for the allocation before it answers, so this
  // process never waits on the holder's IPC event. Always, since issue 26's A/B on the H100: a
  // write after a wait on an IPC event (cuEventSynchronize or cuStreamWaitEvent) cost 145-260 us,
  // after the holder's synchronize (5.5 us there) 9-12 us (tests/gpu/RESULTS.md, 2026-11-27).
  bool holder_waits = true;
  std::unique_ptr<cupool::Backend> importer;
  struct Imported {
    cupool::PoolHandle handle = 0;
    cupool::ProcessDevice local_device;
    std::uint64_t generation = 0;  // the holder's pool it came from (a replaced pool has another)
  };
  std::map<std::pair<std::string, cupool::HolderDevice>, Imported> pools;  // by (pool, holder device)
  std::vector<cupool::PoolHandle> retired;  // imports of pools the holder no longer holds, still mapped
  std::set<cupool_lease*> leases;

  // ---- the cache (protocol 2): leases released here and still mapped, to be given out again ----
  std::uint64_t cache_limit = UINT64_MAX;  // bytes kept cached at most (0: no cache)
  std::uint64_t cached_bytes = 0;
  std::vector<cupool_lease*> cache;  // in the order they were released (a request takes the newest fit)
  std::string quiet_failure;         // the last quiet request the holder refused (it should never)
  // Answers the holder's drop notices while the application makes no call (started with the first
  // cached block): it reads the socket only when no call holds `mu`.
  // A forked child inherits none of it: only the process that started the watcher signals, joins
  // or shuts down under it (watcher_here()).
  pthread_t watcher{};
  std::atomic<bool> watching{false};  // read without `mu` by a call that reconnects
  pid_t watcher_pid = 0;
  int watched_fd = -1;
  cupool::Fd watcher_wake;  // an eventfd that stops it
  cupool::Fd lost_fd;       // the socket, shut down but kept open until the watcher has stopped

  ~cupool_conn();
  // Connects to `path` and says hello (the newest protocol the holder speaks). Throws Failure.
  void open();
  // After the holder went away: forgets what the old holder held for this connection (cached
  // blocks are unmapped, imported pools retired), keeps what is mapped, and opens a new session.
  // Call with `mu` held and the watcher stopped.
  void reconnect();
  // One request, its reply (notices in between are noted). Throws Failure on transport errors.
  cupool::client::Json request(cupool::client::Json body, int* fd_out = nullptr);
  // A request whose reply must be ok; a holder error becomes a Failure.
  cupool::client::Json call(cupool::client::Json body, int* fd_out = nullptr);
  void close_socket();
  // Sends a quiet request (no reply unless it fails; a failure is read later and kept in
  // quiet_failure). Throws Failure on transport errors.
  void tell(cupool::client::Json body);
  // A notice from the holder: draining, pool_gone, drop.
  void on_notice(cupool::client::Json notice);
  // Reads one frame when one is waiting and no call is reading (the watcher's turn).
  void read_waiting_frame();
  void start_watcher();
  bool watcher_here() const;
  static void* watch(void* self);
  // Stops the watcher (call without holding `mu`).
  void stop_watcher();
  // A cached lease for (pool, device, size), taken out of the cache and in use again; null when none.
  std::unique_ptr<cupool_lease> reuse(const std::string& pool, cupool::HolderDevice device, std::uint64_t size);
  // Unmaps cached leases (the oldest first) until at most `keep` bytes are cached, and tells the holder.
  void shrink_cache(std::uint64_t keep);
  // The error reply a holder sent before it closed the connection, if one is waiting.
  std::optional<cupool::client::Failure> closing_reason();
  // The backend that imports here: the driver, or a simulated importer when the holder runs on a
  // simulated node (made on first use).
  cupool::Backend& backend();
  // This process's ordinal of the device with `uuid` (the holder's ordinal on a simulated node).
  cupool::ProcessDevice local_device(const std::string& uuid, cupool::HolderDevice holder_device);
  // The pool imported through this connection (asked of the holder the first time; -1: its first device).
  Imported& import_pool(const std::string& pool, cupool::HolderDevice device);
  // Forgets the import of a pool the holder replaced or removed: released now, or at disconnect
  // when a lease still maps memory through it.
  void retire(const std::pair<std::string, cupool::HolderDevice>& key);
  // Imports an allocation of the lease's pool (its export data; `generation`: of the pool it is
  // in, when the holder said) and waits until it is ready (unless the holder did: `ready`).
  void map(cupool_lease& lease, const cupool::proto::Bytes64& export_data, std::optional<std::uint64_t> generation,
           bool ready, const cupool::proto::Bytes64& ready_event);
  // Maps an exported allocation (a buffer_open reply of protocol 3 and its descriptor) for this
  // process's device `device` (-1: where it is held).
  void map_exported(cupool_lease& lease, const cupool::proto::BufferOpenReply& reply, int fd,
                    std::optional<cupool::ProcessDevice> device);
  // Unmaps a lease here (an import of a pool's allocation, or an exported allocation).
  void unmap(const cupool_lease& lease);
  // Allocates and maps a lease; when the ready event can't be used here, asks the holder to
  // wait for its allocations instead (from then on, for this connection).
  std::unique_ptr<cupool_lease> alloc(const std::string& pool, cupool::HolderDevice device, std::uint64_t size);
  // Frees the mapping here, then tells the holder.
  void release(cupool_lease* lease);
};
