// The simulated node's DeviceUsage (usage.cpp): NVML's view of a device, made up from the profile
// and what this process holds there.
#pragma once

#include <cstdint>

#include "device/sim/state.h"

namespace cupool::sim {

class SimDeviceUsage : public virtual DeviceUsage, protected SimRole {
 public:
  // What the simulated driver keeps for itself on every device (NVML's reserved): a plausible figure
  // of the order nvidia-smi -q lists as Reserved on a data-centre GPU, not a measurement.
  static constexpr std::uint64_t kDriverReserve = 512ULL << 20;
  // What NVML counts for a process with a context on the device beyond its allocations: a python3
  // process with a bare context showed 612 MiB in nvidia-smi on an H200 (tests/gpu/RESULTS.md,
  // 2026-11-21, "device memory").
  static constexpr std::uint64_t kContextBytes = 612ULL << 20;

  explicit SimDeviceUsage(SimState& state) : SimRole(state) {}

  // total: the profile's device total; used: kDriverReserve, this process's pools' reserves and
  // exported allocations (SimState::reserved_on), kContextBytes while it has a context there, and
  // the strangers' bytes (at most total); processes: this one (getpid) while it has a context, then
  // the strangers (SimBackend::add_gpu_process).
  DeviceUsageReport device_usage(int device) override;
};

}  // namespace cupool::sim
