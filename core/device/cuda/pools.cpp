// The real backend, Pools, ProcessPools and GraphMemory: pools this process makes or finds, and graph memory.
#include "device/cuda/driver.h"

namespace cupool::cuda {

PoolHandle CudaBackend::create_pool(int ordinal, const PoolProps& props) {
  ContextScope scope(api_, context(ordinal));
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
  const PoolHandle handle = add_pool(pool, ordinal, false);
  pools_[handle].props = props;
  return handle;
}

void CudaBackend::destroy_pool(PoolHandle handle) {
  Pool& pool = find(handle);
  if (pool.borrowed || pool.current)
    throw CudaError("cuMemPoolDestroy", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                    "a device's default or current pool is not destroyed by cupool");
  ContextScope scope(api_, context(pool.device));
  // An imported pool's pointers are unmapped first, so none outlives the record of it.
  if (!pool.imported_pointers.empty()) {
    CUstream stream = device_stream(pool.device);
    while (!pool.imported_pointers.empty()) {
      check(api_.cuMemFreeAsync(*pool.imported_pointers.begin(), stream), "cuMemFreeAsync");
      pool.imported_pointers.erase(pool.imported_pointers.begin());
    }
    check(api_.cuStreamSynchronize(stream), "cuStreamSynchronize");
  }
  check(api_.cuMemPoolDestroy(pool.pool), "cuMemPoolDestroy");
  pools_.erase(handle);
}

void CudaBackend::set_pool_settings(PoolHandle handle, const PoolSettings& s) {
  CUmemoryPool pool = find(handle).pool;
  set_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, s.release_threshold);
  set_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, s.follow_event_dependencies);
  set_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, s.allow_opportunistic);
  set_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, s.allow_internal_dependencies);
}

PoolSettings CudaBackend::pool_settings(PoolHandle handle) {
  CUmemoryPool pool = find(handle).pool;
  PoolSettings s;
  s.release_threshold = get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
  s.follow_event_dependencies = get_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES) != 0;
  s.allow_opportunistic = get_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC) != 0;
  s.allow_internal_dependencies = get_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES) != 0;
  return s;
}

PoolUsage CudaBackend::pool_usage(PoolHandle handle) {
  CUmemoryPool pool = find(handle).pool;
  PoolUsage u;
  u.reserved_bytes = get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  u.reserved_peak_bytes = get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
  u.used_bytes = get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  u.used_peak_bytes = get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH);
  return u;
}

void CudaBackend::reset_pool_peaks(PoolHandle handle) {
  CUmemoryPool pool = find(handle).pool;
  // 0 is the only value these accept: "reset to the current value".
  set_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0);
  set_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0);
}

void CudaBackend::set_pool_access(PoolHandle handle, int peer) {
  CUmemAccessDesc desc;
  std::memset(&desc, 0, sizeof desc);
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = peer;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(api_.cuMemPoolSetAccess(find(handle).pool, &desc, 1), "cuMemPoolSetAccess");
}

std::uint64_t CudaBackend::allocate(PoolHandle handle, std::uint64_t bytes) {
  Pool& pool = find(handle);
  ContextScope scope(api_, context(pool.device));
  CUdeviceptr ptr = 0;
  check(api_.cuMemAllocFromPoolAsync(&ptr, static_cast<size_t>(bytes), pool.pool, nullptr), "cuMemAllocFromPoolAsync");
  pool.allocations.insert(ptr);
  check(api_.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
  return ptr;
}

void CudaBackend::free(PoolHandle handle, std::uint64_t address) {
  Pool& pool = find(handle);
  auto it = pool.allocations.find(static_cast<CUdeviceptr>(address));
  if (it == pool.allocations.end())
    throw CudaError("cuMemFreeAsync", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                    "not an allocation of this pool");
  ContextScope scope(api_, context(pool.device));
  check(api_.cuMemFreeAsync(*it, nullptr), "cuMemFreeAsync");
  pool.allocations.erase(it);
  check(api_.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
}

void CudaBackend::trim_pool(PoolHandle handle, std::uint64_t keep) {
  check(api_.cuMemPoolTrimTo(find(handle).pool, static_cast<size_t>(keep)), "cuMemPoolTrimTo");
}

PoolHandle CudaBackend::default_pool(int ordinal) { return borrow(driver_default_pool(ordinal), ordinal); }

PoolHandle CudaBackend::current_pool(int ordinal) {
  CUmemoryPool pool = nullptr;
  check(api_.cuDeviceGetMemPool(&pool, device(ordinal)), "cuDeviceGetMemPool");
  for (const auto& [handle, p] : pools_)
    if (p.pool == pool) return handle;  // one of ours, or already borrowed
  return borrow(pool, ordinal);
}

void CudaBackend::set_current_pool(int ordinal, PoolHandle handle) {
  Pool& pool = find(handle);
  const bool is_default = pool.borrowed && pool.pool == driver_default_pool(ordinal);
  const bool own_here = pool.props && pool.device == ordinal && pool.props->location == PoolProps::Location::device &&
                        pool.props->location_id == ordinal;
  if (!is_default && !own_here)
    throw CudaError("cuDeviceSetMemPool", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                    "only a device pool cupool created on device " + std::to_string(ordinal) +
                        ", or the device's default pool, is made current there");
  check(api_.cuDeviceSetMemPool(device(ordinal), pool.pool), "cuDeviceSetMemPool");
  for (auto& [h, p] : pools_)
    if (p.device == ordinal) p.current = false;
  pool.current = !is_default;
}

std::optional<PoolProps> CudaBackend::created_props(PoolHandle handle) { return find(handle).props; }

bool CudaBackend::pool_access(PoolHandle handle, int peer) {
  CUmemLocation location;
  std::memset(&location, 0, sizeof location);
  location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  location.id = peer;
  CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  check(api_.cuMemPoolGetAccess(&flags, find(handle).pool, &location), "cuMemPoolGetAccess");
  return flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

bool CudaBackend::context_active(int ordinal) {
  unsigned int flags = 0;
  int active = 0;
  check(api_.cuDevicePrimaryCtxGetState(device(ordinal), &flags, &active), "cuDevicePrimaryCtxGetState");
  return active != 0;
}

GraphMemUsage CudaBackend::graph_mem_usage(int ordinal) {
  const CUdevice dev = device(ordinal);
  ContextScope scope(api_, context(ordinal));
  GraphMemUsage u;
  u.reserved_bytes = graph_attribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
  u.reserved_peak_bytes = graph_attribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH);
  u.used_bytes = graph_attribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
  u.used_peak_bytes = graph_attribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH);
  return u;
}

void CudaBackend::trim_graph_mem(int ordinal) {
  const CUdevice dev = device(ordinal);
  ContextScope scope(api_, context(ordinal));
  check(api_.cuDeviceGraphMemTrim(dev), "cuDeviceGraphMemTrim");
}

void CudaBackend::reset_graph_mem_peaks(int ordinal) {
  const CUdevice dev = device(ordinal);
  ContextScope scope(api_, context(ordinal));
  // 0 is the only value these accept: "reset to the current value".
  cuuint64_t zero = 0;
  check(api_.cuDeviceSetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero), "cuDeviceSetGraphMemAttribute");
  zero = 0;
  check(api_.cuDeviceSetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &zero),
        "cuDeviceSetGraphMemAttribute");
}

}  // namespace cupool::cuda
