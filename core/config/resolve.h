// The one place where a config's words become a node's numbers: device selectors become ordinals,
// release thresholds become bytes, reuse policies become PoolSettings, and each pool entry becomes
// one PoolWant per device. `check` judges what this makes; the holder holds it; the in-process
// apply applies its process part. Nothing else resolves a device list or a threshold.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "device/backend.h"
#include "device/node.h"

namespace cupool {

// ---- devices ----

// What a device list selects on a node: the ordinals in the order written, each once (`all`:
// every device), and the selectors that name no device or one already listed.
struct DeviceSelection {
  std::vector<int> ordinals;
  std::vector<const At<DeviceSelector>*> unknown;
  std::vector<std::pair<const At<DeviceSelector>*, int>> repeated;  // the selector and its ordinal
};
// `list` must outlive the result (it points at its selectors).
DeviceSelection select_devices(const DeviceList& list, const NodeReport& node);

// ---- settings ----

// The settings a config entry sets, resolved for one device; what the file leaves out is unset.
struct SettingsPatch {
  std::optional<ReleaseThreshold> release_threshold;  // as the file wrote it
  std::optional<bool> follow_event_dependencies;
  std::optional<bool> allow_opportunistic;
  std::optional<bool> allow_internal_dependencies;
  // `base` (the driver's defaults for a new pool, or a pool's settings now) with what the file sets.
  PoolSettings over(PoolSettings base) const;
};
// The release threshold (a percentage is of `device_memory`) and the reuse policies of one entry.
SettingsPatch resolve_settings(const At<Threshold>& threshold, const std::optional<Reuse>& reuse,
                               std::uint64_t device_memory);

// ---- what a config asks for ----

// A pool's share list: who besides the holder's own user and root may use it.
struct ShareRule {
  bool set = false;
  std::vector<std::string> users;
  std::vector<std::string> groups;
  std::uint64_t quota_per_client = 0;  // 0: no quota
  bool operator==(const ShareRule& o) const {
    return set == o.set && users == o.users && groups == o.groups && quota_per_client == o.quota_per_client;
  }
};

// One pool on one device, as a config asks for it.
struct PoolWant {
  std::string name;
  int device = 0;
  PoolProps props;
  PoolSettings settings;    // unset fields at the driver's defaults; the threshold as the file wrote it
  std::vector<int> access;  // peers other than `device`, ascending
  ShareRule share;
  std::uint64_t reserve = 0;
  std::size_t entry = 0;  // its index in Config::pools (where findings point); 0 for a pool not from a file
};

struct BufferWant {
  std::string name;
  std::string pool;
  int device = 0;  // the buffer's device, else its pool's first device
  std::uint64_t size = 0;
};

struct HolderWant {
  std::string socket = kDefaultSocket;
  unsigned mode = 0660;
  std::string group;
};

// The process: section on one device.
struct ProcessDeviceWant {
  int device = 0;
  struct DefaultPool {
    SettingsPatch settings;   // over the pool's settings now: what the file leaves out is left alone
    std::vector<int> access;  // peers other than `device`
  };
  struct CurrentPool {
    std::uint64_t max_size = 0;  // 0: the driver's default
    SettingsPatch settings;      // over a new pool's (the driver's defaults)
    std::uint64_t reserve = 0;
    std::vector<int> access;
  };
  std::optional<DefaultPool> default_pool;
  std::optional<CurrentPool> current_pool;
  std::optional<std::uint64_t> budget_bytes;  // process.budget on this device
};

// What a config file asks for on a node.
struct Desired {
  HolderWant holder;
  std::vector<PoolWant> pools;  // per entry, per device, in the file's order
  std::vector<BufferWant> buffers;
  std::vector<ProcessDeviceWant> process;  // per selected device; empty without a process: section
};

// Resolves a parsed config on `node`. Selectors that name no device are left out (check reports
// them), and so is everything on them.
Desired resolve(const Config& config, const NodeReport& node);

}  // namespace cupool
