// The real backend, Pools and ProcessPools: pools this process makes or finds.
#include "device/cuda/pools.h"

namespace cupool::cuda {

void CudaPools::open_device(int ordinal) { (void)d_.context(ordinal); }

PoolHandle CudaPools::create_pool(int ordinal, const PoolProps& props) {
  ContextScope scope(api_, d_.context(ordinal));
  CUmemPoolProps p;
  std::memset(&p, 0, sizeof p);
  p.allocType = props.managed ? CU_MEM_ALLOCATION_TYPE_MANAGED : CU_MEM_ALLOCATION_TYPE_PINNED;
  p.handleTypes = static_cast<CUmemAllocationHandleType>(props.handle_types);
  switch (props.location) {
    case PoolProps::Location::device:
      p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      p.location.id = props.location_id;
      break;
    case PoolProps::Location::host: p.location.type = CU_MEM_LOCATION_TYPE_HOST; break;
    case PoolProps::Location::host_numa:
      p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
      p.location.id = props.location_id;
      break;
  }
  p.maxSize = static_cast<size_t>(props.max_size);
  CUmemoryPool pool = nullptr;
  check(api_.cuMemPoolCreate(&pool, &p), "cuMemPoolCreate");
  const PoolHandle handle = d_.add_pool(pool, ordinal, false);
  d_.pools()[handle].props = props;
  return handle;
}

void CudaPools::destroy_pool(PoolHandle handle) {
  Pool& pool = d_.find(handle);
  if (pool.borrowed || pool.current)
    throw CudaError("cuMemPoolDestroy", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                    "a device's default or current pool is not destroyed by cupool");
  ContextScope scope(api_, d_.context(pool.device));
  // An imported pool's pointers are unmapped first, so none outlives the record of it.
  if (!pool.imported_pointers.empty()) {
    CUstream stream = d_.device_stream(pool.device);
    while (!pool.imported_pointers.empty()) {
      check(api_.cuMemFreeAsync(*pool.imported_pointers.begin(), stream), "cuMemFreeAsync");
      pool.imported_pointers.erase(pool.imported_pointers.begin());
    }
    check(api_.cuStreamSynchronize(stream), "cuStreamSynchronize");
  }
  check(api_.cuMemPoolDestroy(pool.pool), "cuMemPoolDestroy");
  d_.pools().erase(handle);
}

void CudaPools::set_pool_settings(PoolHandle handle, const PoolSettings& s) {
  CUmemoryPool pool = d_.find(handle).pool;
  d_.set_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, s.release_threshold.bytes());
  d_.set_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, s.follow_event_dependencies);
  d_.set_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, s.allow_opportunistic);
  d_.set_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, s.allow_internal_dependencies);
}

PoolSettings CudaPools::pool_settings(PoolHandle handle) {
  CUmemoryPool pool = d_.find(handle).pool;
  PoolSettings s;
  s.release_threshold = ReleaseThreshold(d_.get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD));
  s.follow_event_dependencies = d_.get_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES) != 0;
  s.allow_opportunistic = d_.get_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC) != 0;
  s.allow_internal_dependencies = d_.get_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES) != 0;
  return s;
}

PoolUsage CudaPools::pool_usage(PoolHandle handle) {
  CUmemoryPool pool = d_.find(handle).pool;
  PoolUsage u;
  u.reserved_bytes = d_.get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  u.reserved_peak_bytes = d_.get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
  u.used_bytes = d_.get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  u.used_peak_bytes = d_.get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH);
  return u;
}

void CudaPools::reset_pool_peaks(PoolHandle handle) {
  CUmemoryPool pool = d_.find(handle).pool;
  // 0 is the only value these accept: "reset to the current value".
  d_.set_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0);
  d_.set_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0);
}

void CudaPools::reset_pool_used_peak(PoolHandle handle) {
  d_.set_attribute<cuuint64_t>(d_.find(handle).pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0);
}

void CudaPools::set_pool_access(PoolHandle handle, int peer) {
  CUmemAccessDesc desc;
  std::memset(&desc, 0, sizeof desc);
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = peer;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(api_.cuMemPoolSetAccess(d_.find(handle).pool, &desc, 1), "cuMemPoolSetAccess");
}

std::uint64_t CudaPools::allocate(PoolHandle handle, std::uint64_t bytes) {
  Pool& pool = d_.find(handle);
  ContextScope scope(api_, d_.context(pool.device));
  CUdeviceptr ptr = 0;
  check(api_.cuMemAllocFromPoolAsync(&ptr, static_cast<size_t>(bytes), pool.pool, nullptr), "cuMemAllocFromPoolAsync");
  pool.allocations.insert(ptr);
  check(api_.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
  return ptr;
}

void CudaPools::free(PoolHandle handle, std::uint64_t address) {
  Pool& pool = d_.find(handle);
  auto it = pool.allocations.find(static_cast<CUdeviceptr>(address));
  if (it == pool.allocations.end())
    throw CudaError("cuMemFreeAsync", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                    "not an allocation of this pool");
  ContextScope scope(api_, d_.context(pool.device));
  check(api_.cuMemFreeAsync(*it, nullptr), "cuMemFreeAsync");
  pool.allocations.erase(it);
  check(api_.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
}

void CudaPools::trim_pool(PoolHandle handle, std::uint64_t keep) {
  check(api_.cuMemPoolTrimTo(d_.find(handle).pool, static_cast<size_t>(keep)), "cuMemPoolTrimTo");
}

PoolHandle CudaPools::default_pool(int ordinal) { return d_.borrow(d_.driver_default_pool(ordinal), ordinal); }

PoolHandle CudaPools::current_pool(int ordinal) {
  CUmemoryPool pool = nullptr;
  check(api_.cuDeviceGetMemPool(&pool, d_.device(ordinal)), "cuDeviceGetMemPool");
  for (const auto& [handle, p] : d_.pools())
    if (p.pool == pool) return handle;  // one of ours, or already borrowed
  return d_.borrow(pool, ordinal);
}

void CudaPools::set_current_pool(int ordinal, PoolHandle handle) {
  Pool& pool = d_.find(handle);
  const bool is_default = pool.borrowed && pool.pool == d_.driver_default_pool(ordinal);
  const bool own_here = pool.props && pool.device == ordinal && pool.props->location == PoolProps::Location::device &&
                        pool.props->location_id == ordinal;
  if (!is_default && !own_here)
    throw CudaError("cuDeviceSetMemPool", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                    "only a device pool cupool created on device " + std::to_string(ordinal) +
                        ", or the device's default pool, is made current there");
  check(api_.cuDeviceSetMemPool(d_.device(ordinal), pool.pool), "cuDeviceSetMemPool");
  for (auto& [h, p] : d_.pools())
    if (p.device == ordinal) p.current = false;
  pool.current = !is_default;
}

std::optional<PoolProps> CudaPools::created_props(PoolHandle handle) { return d_.find(handle).props; }

bool CudaPools::pool_access(PoolHandle handle, int peer) {
  CUmemLocation location;
  std::memset(&location, 0, sizeof location);
  location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  location.id = peer;
  CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  check(api_.cuMemPoolGetAccess(&flags, d_.find(handle).pool, &location), "cuMemPoolGetAccess");
  return flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

bool CudaPools::context_active(int ordinal) {
  unsigned int flags = 0;
  int active = 0;
  check(api_.cuDevicePrimaryCtxGetState(d_.device(ordinal), &flags, &active), "cuDevicePrimaryCtxGetState");
  return active != 0;
}
}  // namespace cupool::cuda
