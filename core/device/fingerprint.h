// What identifies a node's driver and devices without loading the driver: the holder keeps the
// node report it checked its config against with this fingerprint, and at its next start uses the
// kept report instead of asking the driver (cuInit alone took 184-249 ms on an H200) while the
// fingerprint is the same. The holder still asks the driver once it runs and checks the two agree.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace cupool {

// The environment variables that change which devices CUDA shows and in which order.
inline constexpr const char* kDeviceEnvironment[] = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
                                                     "CUDA_MPS_PIPE_DIRECTORY"};

// "sha256:<hex>" over: this boot (/proc/sys/kernel/random/boot_id), the NVIDIA kernel module's
// version (/sys/module/nvidia/version, or /proc/driver/nvidia/version), each GPU's
// /proc/driver/nvidia/gpus/<bus>/information, the names under /proc/driver/nvidia/capabilities
// (MIG instances appear there), the variables of kDeviceEnvironment (read with `env`), and
// `build` (cupool's version: another version may report differently). Paths are under `root`
// ("/" on a node; a directory in the tests). "" when it can't be told: no boot id, no module
// version, or no GPU listed. Reads at most 64 KiB of each file and 4096 names.
std::string node_fingerprint(const std::string& root, const std::function<std::optional<std::string>(const char*)>& env,
                             const std::string& build);

// node_fingerprint of this node, with this process's environment and cupool's version.
std::string this_node_fingerprint();

}  // namespace cupool
