// The simulated node, DeviceUsage: NVML's figures for a device, from the profile and this process.
#include "device/sim/usage.h"

#include <unistd.h>

#include <algorithm>
#include <string>

namespace cupool::sim {

DeviceUsageReport SimDeviceUsage::device_usage(int dev) {
  s_.enter("device_usage", std::to_string(dev));
  const DeviceReport& d = s_.device(dev, "nvmlDeviceGetHandleByUUID");
  DeviceUsageReport report;
  report.source = "simulated";
  report.total_bytes = d.info.total_memory;
  report.reserved_bytes = std::min(kDriverReserve, report.total_bytes);
  std::uint64_t used = 0;  // the reserve is outside it, as driver 580 answers (backend.h)
  if (s_.has_context(dev)) {
    GpuProcess self;
    self.pid = static_cast<std::uint32_t>(::getpid());
    self.used_bytes = kContextBytes + s_.reserved_on(dev);
    used += *self.used_bytes;
    report.processes.push_back(self);
  }
  for (const GpuProcess& p : s_.strangers()[dev]) {
    used += p.used_bytes.value_or(0);
    report.processes.push_back(p);
  }
  report.processes_listed = true;
  report.used_bytes = std::min(used, report.total_bytes - report.reserved_bytes);
  report.free_bytes = report.total_bytes - report.reserved_bytes - report.used_bytes;
  return report;
}

}  // namespace cupool::sim
