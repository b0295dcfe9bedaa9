// The simulated node's Pools and ProcessPools (pools.cpp): pools with the driver's measured rules.
#pragma once

#include "device/sim/state.h"

namespace cupool::sim {

// Pools follow the driver's rules as measured on real GPUs (tests/gpu/RESULTS.md): memory is
// reserved in 2 MiB granules and kept up to the release threshold at each synchronize (measured
// for thresholds 0 and max); a trim releases whole 32 MiB chunks and keeps at least `keep`
// (measured on an H100, driver 580: 64 MiB reserved, trim to 16 MiB keeps 32 MiB).
//
// Each pool has an address range (its arena) of max_size bytes, or the device's total memory
// when max_size is 0 (capped at kMaxArena; kDefaultArena for host pools), handed out first-fit
// in 2 MiB granules; when it has no free range large enough, allocating fails with
// OUT_OF_MEMORY even if the accounting above would allow it. A holder-side address is
// (pool << kAddressBits) | offset; write/read map the arena into this process when first used
// (a memfd for posix_fd pools, anonymous memory for the others).
class SimPools : public virtual Pools, public virtual ProcessPools, protected SimRole {
 public:
  explicit SimPools(SimState& state) : SimRole(state) {}

  // Pools
  PoolHandle create_pool(int device, const PoolProps& props) override;
  void open_device(int device) override;  // checks the ordinal; there is no context to make
  void destroy_pool(PoolHandle pool) override;
  void set_pool_settings(PoolHandle pool, const PoolSettings& settings) override;
  PoolSettings pool_settings(PoolHandle pool) override;
  PoolUsage pool_usage(PoolHandle pool) override;
  void reset_pool_peaks(PoolHandle pool) override;
  void reset_pool_used_peak(PoolHandle pool) override;
  void set_pool_access(PoolHandle pool, int peer) override;
  bool pool_access(PoolHandle pool, int peer) override;
  std::uint64_t allocate(PoolHandle pool, std::uint64_t bytes) override;
  void free(PoolHandle pool, std::uint64_t address) override;
  void trim_pool(PoolHandle pool, std::uint64_t keep) override;

  // ProcessPools
  // The device's default pool: threshold 0 and all reuse policies on, as the driver's.
  PoolHandle default_pool(int device) override;
  // The default pool unless set_current_pool made another current.
  PoolHandle current_pool(int device) override;
  void set_current_pool(int device, PoolHandle pool) override;
  std::optional<PoolProps> created_props(PoolHandle pool) override;
  bool context_active(int device) override;

  // Test hook: the application makes a pool of its own the device's current pool, through its own
  // runtime (cudaMemPoolCreate + cudaDeviceSetMemPool), so created_props knows nothing of it.
  PoolHandle application_sets_current_pool(int device);
};

}  // namespace cupool::sim
