// The simulated node, Pools, ProcessPools and GraphMemory: pools with the driver's measured rules.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <utility>

#include "base/error.h"
#include "base/fd.h"
#include "device/sim/helpers.h"
#include "device/sim_backend.h"

namespace cupool {

using sim::invalid_value;
using sim::round_up;
using sim::system_error;

PoolHandle SimBackend::create_pool(int dev, const PoolProps& props) {
  enter("create_pool", std::to_string(dev));
  const DeviceReport& d = device(dev, "cuMemPoolCreate");
  if (!d.info.memory_pools)
    throw CudaError("cuMemPoolCreate", 801, "CUDA_ERROR_NOT_SUPPORTED", "the device has no memory pools");
  if ((props.handle_types & ~d.info.pool_handle_types) != 0)
    throw CudaError("cuMemPoolCreate", 801, "CUDA_ERROR_NOT_SUPPORTED", "handle type not supported");
  if (props.location == PoolProps::Location::host && props.handle_types != 0)
    throw CudaError("cuMemPoolCreate", 1, "CUDA_ERROR_INVALID_VALUE", "host pools are not IPC capable");
  std::uint64_t arena = props.max_size;
  if (arena == 0 && props.location == PoolProps::Location::device) arena = d.info.total_memory;
  if (arena == 0) arena = kDefaultArena;
  Pool p;
  p.device = dev;
  p.props = props;
  p.created = true;
  p.settings.release_threshold = 0;
  p.arena = Arena(std::min(round_up(arena, kGranule), kMaxArena));
  if (props.handle_types & static_cast<std::uint32_t>(HandleType::posix_fd)) {
    p.memfd = ::memfd_create("cupool-sim-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (p.memfd < 0) throw system_error("cuMemPoolCreate", "memfd_create", errno, "CUDA_ERROR_OUT_OF_MEMORY");
    if (::ftruncate(p.memfd, static_cast<off_t>(p.arena.size)) != 0) {
      const int code = errno;
      ::close(p.memfd);
      throw system_error("cuMemPoolCreate", "ftruncate of the pool's memfd", code, "CUDA_ERROR_OUT_OF_MEMORY");
    }
    // Importers get this descriptor: none of them may shrink the pool under the others' mappings
    // (they would die of SIGBUS), or grow it. A real pool's shareable handle can't be resized either.
    if (::fcntl(p.memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      const int code = errno;
      ::close(p.memfd);
      throw system_error("cuMemPoolCreate", "sealing the pool's memfd", code, "CUDA_ERROR_OUT_OF_MEMORY");
    }
  }
  pools_[++last_pool_] = std::move(p);
  return last_pool_;
}

void SimBackend::destroy_pool(PoolHandle handle) {
  enter("destroy_pool", std::to_string(handle));
  if (pool(handle, "cuMemPoolDestroy").borrowed)
    throw invalid_value("cuMemPoolDestroy", "a device's default pool is not destroyed");
  for (const auto& [dev, current] : current_pools_)
    if (current == handle)
      throw invalid_value("cuMemPoolDestroy", "the pool is device " + std::to_string(dev) + "'s current pool");
  unmap(pool(handle, "cuMemPoolDestroy"));
  pools_.erase(handle);
}

void SimBackend::set_pool_settings(PoolHandle handle, const PoolSettings& settings) {
  enter("set_pool_settings", std::to_string(handle));
  pool(handle, "cuMemPoolSetAttribute").settings = settings;
}

PoolSettings SimBackend::pool_settings(PoolHandle handle) {
  enter("pool_settings", std::to_string(handle));
  return pool(handle, "cuMemPoolGetAttribute").settings;
}

PoolUsage SimBackend::pool_usage(PoolHandle handle) {
  enter("pool_usage", std::to_string(handle));
  return pool(handle, "cuMemPoolGetAttribute").usage;
}

void SimBackend::reset_pool_peaks(PoolHandle handle) {
  enter("reset_pool_peaks", std::to_string(handle));
  PoolUsage& u = pool(handle, "cuMemPoolSetAttribute").usage;
  u.reserved_peak_bytes = u.reserved_bytes;
  u.used_peak_bytes = u.used_bytes;
}

void SimBackend::set_pool_access(PoolHandle handle, int peer) {
  enter("set_pool_access", std::to_string(handle) + "," + std::to_string(peer));
  Pool& p = pool(handle, "cuMemPoolSetAccess");
  // An importer's profile may know nothing of the devices (import paths don't need one); it is
  // only consulted where it does.
  const bool known = profile_.device(peer) && profile_.device(p.device);
  if (p.imported && !known) {
    if (peer < 0) throw CudaError("cuMemPoolSetAccess", 101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal");
  } else {
    device(peer, "cuMemPoolSetAccess");
    if (peer != p.device && !profile_.peer_access[static_cast<std::size_t>(peer)][static_cast<std::size_t>(p.device)])
      throw CudaError("cuMemPoolSetAccess", 1, "CUDA_ERROR_INVALID_VALUE", "peer access is not possible");
  }
  p.peers.push_back(peer);
}

std::uint64_t SimBackend::allocate(PoolHandle handle, std::uint64_t bytes) {
  enter("allocate", std::to_string(handle) + "," + std::to_string(bytes));
  return take(handle, own_pool(handle, "cuMemAllocFromPoolAsync"), bytes, false, "cuMemAllocFromPoolAsync");
}

void SimBackend::free(PoolHandle handle, std::uint64_t address) {
  enter("free", std::to_string(handle));
  Pool& p = pool(handle, "cuMemFreeAsync");
  release(p, address, false, "cuMemFreeAsync");
  settle(p);
}

void SimBackend::trim_pool(PoolHandle handle, std::uint64_t keep) {
  enter("trim_pool", std::to_string(handle) + "," + std::to_string(keep));
  Pool& p = pool(handle, "cuMemPoolTrimTo");
  const std::uint64_t floor = round_up(p.usage.used_bytes, kGranule);
  p.usage.reserved_bytes = std::min(p.usage.reserved_bytes, std::max(floor, round_up(keep, kTrimChunk)));
}

GraphMemUsage SimBackend::graph_mem_usage(int dev) {
  enter("graph_mem_usage", std::to_string(dev));
  device(dev, "cuDeviceGetGraphMemAttribute");
  return GraphMemUsage{};
}

void SimBackend::trim_graph_mem(int dev) {
  enter("trim_graph_mem", std::to_string(dev));
  device(dev, "cuDeviceGraphMemTrim");
}

void SimBackend::reset_graph_mem_peaks(int dev) {
  enter("reset_graph_mem_peaks", std::to_string(dev));
  device(dev, "cuDeviceSetGraphMemAttribute");
}

PoolHandle SimBackend::default_pool(int dev) {
  enter("default_pool", std::to_string(dev));
  device(dev, "cuDeviceGetDefaultMemPool");
  auto it = default_pools_.find(dev);
  if (it != default_pools_.end()) return it->second;
  Pool p;
  p.device = dev;
  p.props.location_id = dev;
  p.borrowed = true;
  p.settings.release_threshold = 0;
  pools_[++last_pool_] = std::move(p);
  default_pools_[dev] = last_pool_;
  return last_pool_;
}

PoolHandle SimBackend::current_pool(int dev) {
  enter("current_pool", std::to_string(dev));
  device(dev, "cuDeviceGetMemPool");
  if (auto c = current_pools_.find(dev); c != current_pools_.end()) return c->second;
  auto it = default_pools_.find(dev);
  if (it != default_pools_.end()) return it->second;
  const std::size_t before = calls_.size();
  const PoolHandle h = default_pool(dev);
  calls_.resize(before);  // one call, as the driver's
  return h;
}

void SimBackend::set_current_pool(int dev, PoolHandle handle) {
  enter("set_current_pool", std::to_string(dev) + "," + std::to_string(handle));
  device(dev, "cuDeviceSetMemPool");
  const Pool& p = pool(handle, "cuDeviceSetMemPool");
  auto def = default_pools_.find(dev);
  if (def != default_pools_.end() && def->second == handle) {
    current_pools_.erase(dev);
    return;
  }
  if (!p.created || p.device != dev || p.props.location != PoolProps::Location::device || p.props.location_id != dev)
    throw invalid_value("cuDeviceSetMemPool", "only a device pool created on device " + std::to_string(dev) +
                                                  ", or its default pool, can be made current there");
  current_pools_[dev] = handle;
}

PoolHandle SimBackend::application_sets_current_pool(int dev) {
  const std::size_t before = calls_.size();
  PoolProps props;
  props.location_id = dev;
  const PoolHandle handle = create_pool(dev, props);
  pools_[handle].created = false;
  current_pools_[dev] = handle;
  calls_.resize(before);  // not cupool's calls
  return handle;
}

std::optional<PoolProps> SimBackend::created_props(PoolHandle handle) {
  enter("created_props", std::to_string(handle));
  const Pool& p = pool(handle, "cupool pool lookup");
  if (!p.created) return std::nullopt;
  return p.props;
}

bool SimBackend::pool_access(PoolHandle handle, int peer) {
  enter("pool_access", std::to_string(handle) + "," + std::to_string(peer));
  const Pool& p = pool(handle, "cuMemPoolGetAccess");
  if (peer == p.device) return true;
  return std::find(p.peers.begin(), p.peers.end(), peer) != p.peers.end();
}

bool SimBackend::context_active(int dev) {
  enter("context_active", std::to_string(dev));
  device(dev, "cuDevicePrimaryCtxGetState");
  for (const auto& [h, p] : pools_)
    if (p.device == dev) return true;
  return false;
}

}  // namespace cupool
