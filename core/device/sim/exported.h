// The simulated node's ExportedMemory (exported.cpp): held buffers as memfds of their rounded size.
#pragma once

#include "device/sim/state.h"

namespace cupool::sim {

// Exported allocations are memfds too: the allocation's bytes, then one page that says what it
// is (bytes 0..9 "CUPOOLVMM1", 16..23 the device ordinal, 24..31 the size), sealed against
// growing and shrinking. Their address here is where the memfd is mapped; create_exported
// counts them as the device's used memory (an allocation that would pass the profile's free
// memory fails with OUT_OF_MEMORY), map_exported checks the page against what it is asked.
class SimExportedMemory : public virtual ExportedMemory, protected SimRole {
 public:
  explicit SimExportedMemory(SimState& state) : SimRole(state) {}

  std::uint64_t allocation_granularity(int device) override;
  ExportedAllocation create_exported(int device, std::uint64_t bytes) override;
  std::uint64_t map_exported(int device, int fd, std::uint64_t size, const std::vector<int>& peers) override;
  void grant_exported_access(std::uint64_t address, int peer) override;
  void unmap_exported(std::uint64_t address) override;
};

}  // namespace cupool::sim
