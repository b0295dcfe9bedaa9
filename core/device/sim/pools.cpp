// The simulated node, Pools and ProcessPools: pools with the driver's measured rules.
#include "device/sim/pools.h"

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

namespace cupool::sim {

void SimPools::open_device(int dev) {
  s_.enter("open_device", std::to_string(dev));
  (void)s_.device(dev, "cuDevicePrimaryCtxRetain");
}

PoolHandle SimPools::create_pool(int dev, const PoolProps& props) {
  s_.enter("create_pool", std::to_string(dev));
  const DeviceReport& d = s_.device(dev, "cuMemPoolCreate");
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
  p.settings.release_threshold = ReleaseThreshold(0);
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
  return s_.add_pool(std::move(p));
}

void SimPools::destroy_pool(PoolHandle handle) {
  s_.enter("destroy_pool", std::to_string(handle));
  if (s_.pool(handle, "cuMemPoolDestroy").borrowed)
    throw invalid_value("cuMemPoolDestroy", "a device's default pool is not destroyed");
  for (const auto& [dev, current] : s_.current_pools())
    if (current == handle)
      throw invalid_value("cuMemPoolDestroy", "the pool is device " + std::to_string(dev) + "'s current pool");
  s_.unmap(s_.pool(handle, "cuMemPoolDestroy"));
  s_.pools().erase(handle);
}

void SimPools::set_pool_settings(PoolHandle handle, const PoolSettings& settings) {
  s_.enter("set_pool_settings", std::to_string(handle));
  PoolSettings& kept = s_.pool(handle, "cuMemPoolSetAttribute").settings = settings;
  kept.release_threshold = ReleaseThreshold(settings.release_threshold.bytes());  // a driver keeps the bytes only
}

PoolSettings SimPools::pool_settings(PoolHandle handle) {
  s_.enter("pool_settings", std::to_string(handle));
  return s_.pool(handle, "cuMemPoolGetAttribute").settings;
}

PoolUsage SimPools::pool_usage(PoolHandle handle) {
  s_.enter("pool_usage", std::to_string(handle));
  return s_.pool(handle, "cuMemPoolGetAttribute").usage;
}

void SimPools::reset_pool_peaks(PoolHandle handle) {
  s_.enter("reset_pool_peaks", std::to_string(handle));
  PoolUsage& u = s_.pool(handle, "cuMemPoolSetAttribute").usage;
  u.reserved_peak_bytes = u.reserved_bytes;
  u.used_peak_bytes = u.used_bytes;
}

void SimPools::reset_pool_used_peak(PoolHandle handle) {
  s_.enter("reset_pool_used_peak", std::to_string(handle));
  PoolUsage& u = s_.pool(handle, "cuMemPoolSetAttribute").usage;
  u.used_peak_bytes = u.used_bytes;
}

void SimPools::set_pool_access(PoolHandle handle, int peer) {
  s_.enter("set_pool_access", std::to_string(handle) + "," + std::to_string(peer));
  Pool& p = s_.pool(handle, "cuMemPoolSetAccess");
  // An importer's profile may know nothing of the devices (import paths don't need one); it is
  // only consulted where it does.
  const bool known = s_.profile().device(peer) && s_.profile().device(p.device);
  if (p.imported && !known) {
    if (peer < 0) throw CudaError("cuMemPoolSetAccess", 101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal");
  } else {
    s_.device(peer, "cuMemPoolSetAccess");
    if (peer != p.device &&
        !s_.profile().peer_access[static_cast<std::size_t>(peer)][static_cast<std::size_t>(p.device)])
      throw CudaError("cuMemPoolSetAccess", 1, "CUDA_ERROR_INVALID_VALUE", "peer access is not possible");
  }
  p.peers.push_back(peer);
}

std::uint64_t SimPools::allocate(PoolHandle handle, std::uint64_t bytes) {
  s_.enter("allocate", std::to_string(handle) + "," + std::to_string(bytes));
  return s_.take(handle, s_.own_pool(handle, "cuMemAllocFromPoolAsync"), bytes, false, "cuMemAllocFromPoolAsync");
}

void SimPools::free(PoolHandle handle, std::uint64_t address) {
  s_.enter("free", std::to_string(handle));
  Pool& p = s_.pool(handle, "cuMemFreeAsync");
  s_.release(p, address, false, "cuMemFreeAsync");
  s_.settle(p);
}

void SimPools::trim_pool(PoolHandle handle, std::uint64_t keep) {
  s_.enter("trim_pool", std::to_string(handle) + "," + std::to_string(keep));
  Pool& p = s_.pool(handle, "cuMemPoolTrimTo");
  const std::uint64_t floor = round_up(p.usage.used_bytes, kGranule);
  p.usage.reserved_bytes = std::min(p.usage.reserved_bytes, std::max(floor, round_up(keep, kTrimChunk)));
}

PoolHandle SimPools::default_pool(int dev) {
  s_.enter("default_pool", std::to_string(dev));
  s_.device(dev, "cuDeviceGetDefaultMemPool");
  auto it = s_.default_pools().find(dev);
  if (it != s_.default_pools().end()) return it->second;
  Pool p;
  p.device = dev;
  p.props.location_id = dev;
  p.borrowed = true;
  p.settings.release_threshold = ReleaseThreshold(0);
  const PoolHandle handle = s_.add_pool(std::move(p));
  s_.default_pools()[dev] = handle;
  return handle;
}

PoolHandle SimPools::current_pool(int dev) {
  s_.enter("current_pool", std::to_string(dev));
  s_.device(dev, "cuDeviceGetMemPool");
  if (auto c = s_.current_pools().find(dev); c != s_.current_pools().end()) return c->second;
  auto it = s_.default_pools().find(dev);
  if (it != s_.default_pools().end()) return it->second;
  const std::size_t before = s_.calls().size();
  const PoolHandle h = default_pool(dev);
  s_.keep_calls(before);  // one call, as the driver's
  return h;
}

void SimPools::set_current_pool(int dev, PoolHandle handle) {
  s_.enter("set_current_pool", std::to_string(dev) + "," + std::to_string(handle));
  s_.device(dev, "cuDeviceSetMemPool");
  const Pool& p = s_.pool(handle, "cuDeviceSetMemPool");
  auto def = s_.default_pools().find(dev);
  if (def != s_.default_pools().end() && def->second == handle) {
    s_.current_pools().erase(dev);
    return;
  }
  if (!p.created || p.device != dev || p.props.location != PoolProps::Location::device || p.props.location_id != dev)
    throw invalid_value("cuDeviceSetMemPool", "only a device pool created on device " + std::to_string(dev) +
                                                  ", or its default pool, can be made current there");
  s_.current_pools()[dev] = handle;
}

PoolHandle SimPools::application_sets_current_pool(int dev) {
  const std::size_t before = s_.calls().size();
  PoolProps props;
  props.location_id = dev;
  const PoolHandle handle = create_pool(dev, props);
  s_.pools()[handle].created = false;
  s_.current_pools()[dev] = handle;
  s_.keep_calls(before);  // not cupool's calls
  return handle;
}

std::optional<PoolProps> SimPools::created_props(PoolHandle handle) {
  s_.enter("created_props", std::to_string(handle));
  const Pool& p = s_.pool(handle, "cupool pool lookup");
  if (!p.created) return std::nullopt;
  return p.props;
}

bool SimPools::pool_access(PoolHandle handle, int peer) {
  s_.enter("pool_access", std::to_string(handle) + "," + std::to_string(peer));
  const Pool& p = s_.pool(handle, "cuMemPoolGetAccess");
  if (peer == p.device) return true;
  return std::find(p.peers.begin(), p.peers.end(), peer) != p.peers.end();
}

bool SimPools::context_active(int dev) {
  s_.enter("context_active", std::to_string(dev));
  s_.device(dev, "cuDevicePrimaryCtxGetState");
  return s_.has_context(dev);
}

}  // namespace cupool::sim
