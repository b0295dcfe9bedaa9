// The real backend's NodeQuery (node.cpp): the driver, the devices and what they support.
#pragma once

#include "device/cuda/driver.h"

namespace cupool::cuda {

class CudaNodeQuery : public virtual NodeQuery, protected DriverRole {
 public:
  explicit CudaNodeQuery(Driver& driver) : DriverRole(driver) {}

  ReportSource source() const override;
  void init() override;
  std::string fingerprint() override;  // this_node_fingerprint(): no driver call
  int driver_version() override;
  std::string kernel_driver_version() override;
  int device_count() override;
  DeviceInfo device_info(int ordinal) override;
  std::optional<MemoryInfo> memory_info(int ordinal) override;
  bool can_access_peer(int device_ordinal, int peer_ordinal) override;
  std::vector<int> host_numa_nodes() override;
  GdsReport gds_report() override;
  ExportProbe probe_export(int ordinal, HandleType type) override;

 private:
  // The driver's answer alone; build_report (query.cpp) says in words what it means.
  ExportProbe failed(ExportProbe probe, const char* api, CUresult r);
  int attribute(CUdevice dev, CUdevice_attribute attr);
  // Attributes newer than some drivers: an older driver answers INVALID_VALUE, which means "no".
  int attribute_or(CUdevice dev, CUdevice_attribute attr, int fallback);
  int attribute_or_zero(CUdevice dev, CUdevice_attribute attr) { return attribute_or(dev, attr, 0); }
};

}  // namespace cupool::cuda
