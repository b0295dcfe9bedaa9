// The simulated node, NodeQuery: what the profile says the node is.
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

ReportSource SimBackend::source() const {
  ReportSource s = profile_.source;
  s.simulated = true;
  s.description = "simulated node (" + (s.profile_path.empty() ? std::string("in memory") : s.profile_path) + ")";
  return s;
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
  if (!d.info.memory_pools || (type != HandleType::none && (d.info.pool_handle_types & bit) == 0)) {
    probe.api = "cuMemPoolCreate";
    probe.error = "CUDA_ERROR_NOT_SUPPORTED";
    probe.description = "operation not supported";
  } else {
    probe.ok = true;
  }
  return probe;
}

GdsReport SimBackend::gds_report() {
  enter("gds_report");
  if (profile_.gds) return *profile_.gds;
  GdsReport none;
  none.reason =
      "the simulated node's profile records no GPUDirect Storage (a profile recorded with "
      "'query --deep --profile-out' on a node keeps what it had)";
  return none;
}

}  // namespace cupool
