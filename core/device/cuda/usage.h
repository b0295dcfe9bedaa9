// The real backend's DeviceUsage (usage.cpp): a device's memory and the processes on it, from NVML.
#pragma once

#include "device/cuda/driver.h"

namespace cupool::cuda {

class CudaDeviceUsage : public virtual DeviceUsage, protected DriverRole {
 public:
  explicit CudaDeviceUsage(Driver& driver) : DriverRole(driver) {}

  DeviceUsageReport device_usage(int ordinal) override;

 private:
  // Appends the processes of one of NVML's lists not listed yet; returns NVML's result.
  int read_processes(NvmlProcessList list, NvmlDevice device, std::vector<GpuProcess>& into);
};

}  // namespace cupool::cuda
