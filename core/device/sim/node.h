// The simulated node's NodeQuery (node.cpp): what the profile says the node is.
#pragma once

#include "device/sim/state.h"

namespace cupool::sim {

class SimNodeQuery : public virtual NodeQuery, protected SimRole {
 public:
  explicit SimNodeQuery(SimState& state) : SimRole(state) {}

  // The profile's source: its path and how it was recorded.
  ReportSource source() const override;
  void init() override;
  // "simulated:" and the digest of the profile's recorded node: the same profile, the same node.
  std::string fingerprint() override;
  int driver_version() override;
  std::string kernel_driver_version() override;
  int device_count() override;
  DeviceInfo device_info(int ordinal) override;
  std::optional<MemoryInfo> memory_info(int ordinal) override;
  bool can_access_peer(int device, int peer) override;
  std::vector<int> host_numa_nodes() override;
  ExportProbe probe_export(int ordinal, HandleType type) override;
  // The profile's `gds` (a deep query recorded it), else unavailable.
  GdsReport gds_report() override;
};

}  // namespace cupool::sim
