#include "core/sim_backend.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace cupool {

int cuda_error_code(const std::string& name) {
  static const std::map<std::string, int> codes = {
      {"CUDA_SUCCESS", 0},
      {"CUDA_ERROR_INVALID_VALUE", 1},
      {"CUDA_ERROR_OUT_OF_MEMORY", 2},
      {"CUDA_ERROR_NOT_INITIALIZED", 3},
      {"CUDA_ERROR_NO_DEVICE", 100},
      {"CUDA_ERROR_INVALID_DEVICE", 101},
      {"CUDA_ERROR_NOT_PERMITTED", 800},
      {"CUDA_ERROR_NOT_SUPPORTED", 801},
      {"CUDA_ERROR_UNKNOWN", 999},
  };
  auto it = codes.find(name);
  return it == codes.end() ? 999 : it->second;
}

SimBackend::SimBackend(NodeReport profile) : profile_(std::move(profile)) {}

std::string SimBackend::describe() const {
  return "simulated node (" + (profile_.source.profile_path.empty() ? std::string("in memory") : profile_.source.profile_path) +
         ")";
}

void SimBackend::fail(const std::string& call, const std::string& error_name) { failures_[call] = error_name; }

void SimBackend::enter(const std::string& call, const std::string& args) {
  calls_.push_back(call + "(" + args + ")");
  auto it = failures_.find(call);
  if (it == failures_.end()) return;
  if (call == "init") {
    if (it->second == "CUDA_ERROR_NO_DEVICE") throw NoDriverError("the NVIDIA driver is loaded but reports no CUDA device");
    throw NoDriverError("the NVIDIA driver could not be initialised: cuInit failed with " + it->second);
  }
  throw CudaError("simulated " + call, cuda_error_code(it->second), it->second, "injected failure");
}

const DeviceReport& SimBackend::device(int ordinal, const char* api) const {
  const DeviceReport* d = profile_.device(ordinal);
  if (!d) throw CudaError(api, 101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal");
  return *d;
}

void SimBackend::init() {
  enter("init");
  if (profile_.devices.empty()) throw NoDriverError("the simulated node has no CUDA device");
}

int SimBackend::driver_version() {
  enter("driver_version");
  return profile_.driver_version;
}

std::string SimBackend::kernel_driver_version() {
  enter("kernel_driver_version");
  return profile_.kernel_driver_version;
}

int SimBackend::device_count() {
  enter("device_count");
  return static_cast<int>(profile_.devices.size());
}

DeviceInfo SimBackend::device_info(int ordinal) {
  enter("device_info", std::to_string(ordinal));
  return device(ordinal, "cuDeviceGet").info;
}

std::optional<MemoryInfo> SimBackend::memory_info(int ordinal) {
  enter("memory_info", std::to_string(ordinal));
  return device(ordinal, "cuDeviceGet").memory;
}

bool SimBackend::can_access_peer(int dev, int peer) {
  enter("can_access_peer", std::to_string(dev) + "," + std::to_string(peer));
  device(dev, "cuDeviceCanAccessPeer");
  device(peer, "cuDeviceCanAccessPeer");
  return profile_.peer_access[static_cast<std::size_t>(dev)][static_cast<std::size_t>(peer)];
}

std::vector<int> SimBackend::host_numa_nodes() {
  enter("host_numa_nodes");
  return profile_.host_numa_nodes;
}

ExportProbe SimBackend::probe_export(int ordinal, HandleType type) {
  enter("probe_export", std::to_string(ordinal) + "," + handle_type_name(type));
  const DeviceReport& d = device(ordinal, "cuDeviceGet");
  // A recorded probe is the node's real answer.
  for (const auto& p : d.probes)
    if (p.handle_type == type) return p;
  ExportProbe probe;
  probe.handle_type = type;
  const auto bit = static_cast<std::uint32_t>(type);
  if (!d.info.memory_pools) {
    probe.api = "cuMemPoolCreate";
    probe.error = "CUDA_ERROR_NOT_SUPPORTED";
    probe.reason = "the device does not support memory pools";
  } else if (type != HandleType::none && (d.info.pool_handle_types & bit) == 0) {
    probe.api = "cuMemPoolCreate";
    probe.error = "CUDA_ERROR_NOT_SUPPORTED";
    probe.reason = std::string("the driver does not support ") + handle_type_name(type) +
                   " handles for memory pools on this device";
  } else {
    probe.ok = true;
  }
  return probe;
}

// ---- pools ----

namespace {
// Rounds up to a multiple of `granule`, saturating instead of wrapping near 2^64.
std::uint64_t round_up(std::uint64_t bytes, std::uint64_t granule) {
  const std::uint64_t rest = bytes % granule;
  if (rest == 0) return bytes;
  return bytes > UINT64_MAX - (granule - rest) ? UINT64_MAX : bytes + (granule - rest);
}
}  // namespace

SimBackend::Pool& SimBackend::pool(PoolHandle handle, const char* api) {
  auto it = pools_.find(handle);
  if (it == pools_.end()) throw CudaError(api, 400, "CUDA_ERROR_INVALID_HANDLE", "no such pool");
  return it->second;
}

std::uint64_t SimBackend::reserved_on(int dev) const {
  std::uint64_t total = 0;
  for (const auto& [h, p] : pools_)
    if (p.device == dev && p.props.location == PoolProps::Location::device) total += p.usage.reserved_current;
  return total;
}

void SimBackend::settle(Pool& p) {
  if (p.usage.reserved_current <= p.settings.release_threshold) return;
  const std::uint64_t floor = round_up(p.usage.used_current, kGranule);
  p.usage.reserved_current = std::max(floor, round_up(p.settings.release_threshold, kGranule));
}

PoolHandle SimBackend::create_pool(int dev, const PoolProps& props) {
  enter("create_pool", std::to_string(dev));
  const DeviceReport& d = device(dev, "cuMemPoolCreate");
  if (!d.info.memory_pools) throw CudaError("cuMemPoolCreate", 801, "CUDA_ERROR_NOT_SUPPORTED", "the device has no memory pools");
  if ((props.handle_types & ~d.info.pool_handle_types) != 0)
    throw CudaError("cuMemPoolCreate", 801, "CUDA_ERROR_NOT_SUPPORTED", "handle type not supported");
  if (props.location == PoolProps::Location::host && props.handle_types != 0)
    throw CudaError("cuMemPoolCreate", 1, "CUDA_ERROR_INVALID_VALUE", "host pools are not IPC capable");
  Pool p;
  p.device = dev;
  p.props = props;
  p.settings.release_threshold = 0;
  pools_[++last_pool_] = p;
  return last_pool_;
}

void SimBackend::destroy_pool(PoolHandle handle) {
  enter("destroy_pool", std::to_string(handle));
  pool(handle, "cuMemPoolDestroy");
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
  u.reserved_high = u.reserved_current;
  u.used_high = u.used_current;
}

void SimBackend::set_pool_access(PoolHandle handle, int peer) {
  enter("set_pool_access", std::to_string(handle) + "," + std::to_string(peer));
  Pool& p = pool(handle, "cuMemPoolSetAccess");
  device(peer, "cuMemPoolSetAccess");
  if (peer != p.device && !profile_.peer_access[static_cast<std::size_t>(peer)][static_cast<std::size_t>(p.device)])
    throw CudaError("cuMemPoolSetAccess", 1, "CUDA_ERROR_INVALID_VALUE", "peer access is not possible");
  p.peers.push_back(peer);
}

std::uint64_t SimBackend::allocate(PoolHandle handle, std::uint64_t bytes) {
  enter("allocate", std::to_string(handle) + "," + std::to_string(bytes));
  Pool& p = pool(handle, "cuMemAllocFromPoolAsync");
  if (bytes == 0) throw CudaError("cuMemAllocFromPoolAsync", 1, "CUDA_ERROR_INVALID_VALUE", "zero bytes");
  PoolUsage& u = p.usage;
  const std::uint64_t need = bytes > UINT64_MAX - u.used_current ? UINT64_MAX : round_up(u.used_current + bytes, kGranule);
  if (p.props.max_size && need > p.props.max_size)
    throw CudaError("cuMemAllocFromPoolAsync", 2, "CUDA_ERROR_OUT_OF_MEMORY", "the pool is at its max_size");
  if (need > u.reserved_current) {
    const std::uint64_t grow = need - u.reserved_current;
    const DeviceReport& d = device(p.device, "cuMemAllocFromPoolAsync");
    const std::uint64_t free = d.memory ? d.memory->free : d.info.total_memory;
    if (p.props.location == PoolProps::Location::device && reserved_on(p.device) + grow > free)
      throw CudaError("cuMemAllocFromPoolAsync", 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of device memory");
    u.reserved_current = need;
  }
  u.used_current += bytes;
  u.used_high = std::max(u.used_high, u.used_current);
  u.reserved_high = std::max(u.reserved_high, u.reserved_current);
  const std::uint64_t address = next_address_;
  next_address_ += round_up(bytes, kGranule);
  p.allocations[address] = bytes;
  return address;
}

void SimBackend::free(PoolHandle handle, std::uint64_t address) {
  enter("free", std::to_string(handle));
  Pool& p = pool(handle, "cuMemFreeAsync");
  auto it = p.allocations.find(address);
  if (it == p.allocations.end())
    throw CudaError("cuMemFreeAsync", 1, "CUDA_ERROR_INVALID_VALUE", "not an allocation of this pool");
  p.usage.used_current -= it->second;
  p.allocations.erase(it);
  settle(p);
}

void SimBackend::trim_pool(PoolHandle handle, std::uint64_t keep) {
  enter("trim_pool", std::to_string(handle) + "," + std::to_string(keep));
  Pool& p = pool(handle, "cuMemPoolTrimTo");
  const std::uint64_t floor = round_up(p.usage.used_current, kGranule);
  p.usage.reserved_current = std::min(p.usage.reserved_current, std::max(floor, round_up(keep, kTrimChunk)));
}

}  // namespace cupool
