// The real backend's Pools and ProcessPools (pools.cpp): pools this process makes or finds.
#pragma once

#include "device/cuda/driver.h"

namespace cupool::cuda {

class CudaPools : public virtual Pools, public virtual ProcessPools, protected DriverRole {
 public:
  explicit CudaPools(Driver& driver) : DriverRole(driver) {}

  // Pools
  PoolHandle create_pool(int ordinal, const PoolProps& props) override;
  void open_device(int ordinal) override;
  void destroy_pool(PoolHandle handle) override;
  void set_pool_settings(PoolHandle handle, const PoolSettings& s) override;
  PoolSettings pool_settings(PoolHandle handle) override;
  PoolUsage pool_usage(PoolHandle handle) override;
  void reset_pool_peaks(PoolHandle handle) override;
  void reset_pool_used_peak(PoolHandle handle) override;
  void set_pool_access(PoolHandle handle, int peer) override;
  bool pool_access(PoolHandle handle, int peer) override;
  std::uint64_t allocate(PoolHandle handle, std::uint64_t bytes) override;
  void free(PoolHandle handle, std::uint64_t address) override;
  void trim_pool(PoolHandle handle, std::uint64_t keep) override;

  // ProcessPools
  PoolHandle default_pool(int ordinal) override;
  PoolHandle current_pool(int ordinal) override;
  void set_current_pool(int ordinal, PoolHandle handle) override;
  std::optional<PoolProps> created_props(PoolHandle handle) override;
  bool context_active(int ordinal) override;
};

}  // namespace cupool::cuda
