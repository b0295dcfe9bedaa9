// The simulated node, NodeQuery: what the profile says the node is.
#include "device/sim/node.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <thread>
#include <utility>

#include "base/error.h"
#include "base/fd.h"
#include "base/sha256.h"
#include "device/node.h"
#include "device/sim/helpers.h"

namespace cupool::sim {

ReportSource SimNodeQuery::source() const {
  ReportSource s = s_.profile().source;
  s.simulated = true;
  s.description = "simulated node (" + (s.profile_path.empty() ? std::string("in memory") : s.profile_path) + ")";
  return s;
}

void SimNodeQuery::init() {
  s_.enter("init");
  if (s_.profile().devices.empty()) throw NoDriverError("the simulated node has no CUDA device");
  // cuInit's time on the node the tests stand in for (184-249 ms on an H200), when a test asks
  // for it: the holder's start is tested with a driver that is slow to come up.
  if (const char* ms = std::getenv("CUPOOL_SIM_INIT_MS"); ms && !s_.initialised()) {
    const long wait = std::strtol(ms, nullptr, 10);
    if (wait > 0 && wait <= 600000) std::this_thread::sleep_for(std::chrono::milliseconds(wait));
  }
  s_.set_initialised();
}

std::string SimNodeQuery::fingerprint() { return "simulated:sha256:" + sha256_hex(to_json(s_.profile()).dump()); }

int SimNodeQuery::driver_version() {
  s_.enter("driver_version");
  return s_.profile().driver_version;
}

std::string SimNodeQuery::kernel_driver_version() {
  s_.enter("kernel_driver_version");
  return s_.profile().kernel_driver_version;
}

int SimNodeQuery::device_count() {
  s_.enter("device_count");
  return static_cast<int>(s_.profile().devices.size());
}

DeviceInfo SimNodeQuery::device_info(int ordinal) {
  s_.enter("device_info", std::to_string(ordinal));
  return s_.device(ordinal, "cuDeviceGet").info;
}

std::optional<MemoryInfo> SimNodeQuery::memory_info(int ordinal) {
  s_.enter("memory_info", std::to_string(ordinal));
  return s_.device(ordinal, "cuDeviceGet").memory;
}

bool SimNodeQuery::can_access_peer(int dev, int peer) {
  s_.enter("can_access_peer", std::to_string(dev) + "," + std::to_string(peer));
  s_.device(dev, "cuDeviceCanAccessPeer");
  s_.device(peer, "cuDeviceCanAccessPeer");
  return s_.profile().peer_access[static_cast<std::size_t>(dev)][static_cast<std::size_t>(peer)];
}

std::vector<int> SimNodeQuery::host_numa_nodes() {
  s_.enter("host_numa_nodes");
  return s_.profile().host_numa_nodes;
}

ExportProbe SimNodeQuery::probe_export(int ordinal, HandleType type) {
  s_.enter("probe_export", std::to_string(ordinal) + "," + handle_type_name(type));
  const DeviceReport& d = s_.device(ordinal, "cuDeviceGet");
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

GdsReport SimNodeQuery::gds_report() {
  s_.enter("gds_report");
  if (s_.profile().gds) return *s_.profile().gds;
  GdsReport none;
  none.reason =
      "the simulated node's profile records no GPUDirect Storage (a profile recorded with "
      "'query --deep --profile-out' on a node keeps what it had)";
  return none;
}

}  // namespace cupool::sim
