// The simulated node's Transfers (transfers.cpp): copies into the simulated memory.
#pragma once

#include "device/sim/state.h"

namespace cupool::sim {

class SimTransfers : public virtual Transfers, protected SimRole {
 public:
  explicit SimTransfers(SimState& state) : SimRole(state) {}

  void write(int device, std::uint64_t address, const void* source, std::uint64_t bytes) override;
  LoadReport load_file(int device, int fd, const std::vector<FileRange>& ranges, const LoadOptions& options,
                       const std::function<void(std::uint64_t)>& progress) override;
  void read(int device, std::uint64_t address, void* target, std::uint64_t bytes) override;

 private:
  // `bytes` at `address` in this process's memory: an exported allocation mapped here, an
  // imported pointer, or an allocation of an own pool (whose arena is mapped on first use).
  std::uint8_t* host_view(std::uint64_t address, std::uint64_t bytes, const char* api);
};

}  // namespace cupool::sim
