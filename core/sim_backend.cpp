#include "core/sim_backend.h"

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

}  // namespace cupool
