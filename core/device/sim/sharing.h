// The simulated node's PoolExport and PoolImport (sharing.cpp): pools shared through memfds.
#pragma once

#include "device/sim/state.h"

namespace cupool::sim {

// Sharing follows the stream-ordered rules: allocate_shared accounts like allocate; free_shared
// lowers `used` but releases nothing until synchronize(device) settles the device's pools. The
// ready event is a token (there is no asynchronous work to wait for; wait_ready only checks that
// it is one).
//
// Export data (Blob64), little-endian:
//   bytes  0..9   "CUPOOLSIM1"
//   bytes 16..23  the pool's arena size (the size of its memfd)
//   bytes 24..31  the allocation's offset in the arena
//   bytes 32..39  the allocation's size in bytes
//   other bytes   zero
// Ready event (Blob64): bytes 0..9 "CUPOOLEVT1", bytes 16..23 the device ordinal.
//
// The importing side never consults the profile: import_pool_fd maps the whole memfd
// (MAP_SHARED), import_pointer checks the export data against it and returns the host address,
// write/read copy within an imported pointer's range; destroy_pool unmaps.
class SimSharing : public virtual PoolExport, public virtual PoolImport, protected SimRole {
 public:
  explicit SimSharing(SimState& state) : SimRole(state) {}

  // PoolExport
  int export_pool_fd(PoolHandle pool) override;
  SharedAllocation allocate_shared(PoolHandle pool, std::uint64_t bytes, Readiness readiness) override;
  Blob64 ready_event(int device) override;
  void free_shared(PoolHandle pool, std::uint64_t address) override;
  void synchronize(int device) override;

  // PoolImport
  PoolHandle import_pool_fd(int device, int fd) override;
  std::uint64_t import_pointer(PoolHandle imported, const Blob64& export_data) override;
  void wait_ready(int device, const Blob64& event) override;
  void free_imported(PoolHandle imported, std::uint64_t address) override;
};

}  // namespace cupool::sim
