// The config's `process:` section applied inside an application (cupool_configure, cupool exec),
// and the application's own pool figures (cupool_stats, cupool exec --report). Pools, their
// attributes and the current pool are per process, so this runs in the application's process.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/backend.h"

namespace cupool {

// One attribute changed on one device's default pool.
struct ProcessChange {
  int device = 0;
  std::string field;  // release_threshold, reuse.allow_opportunistic, access
  std::string from;
  std::string to;
};

struct ConfigureResult {
  std::vector<int> devices;  // the selected devices, in order
  std::vector<ProcessChange> changes;
  std::string warnings;      // compiler-style text of the section's warnings ("" when none)
  nlohmann::ordered_json to_json() const;
};

// Parses the config, checks its process section against this node (pools and buffers are the
// holder's and are not judged here) and sets the default pool's release threshold, reuse policies
// and peer access on each selected device, changing only what differs: a second call changes
// nothing. Touches no device that is not selected and creates no context. Throws ConfigRejected
// for a file with errors, CudaError when the driver refuses a setting.
ConfigureResult configure_process(Backend& backend, const std::string& text, const std::string& path);

// The parse and check half of configure_process: throws ConfigRejected, changes nothing.
// Returns the warnings' text ("" when none).
std::string configure_process_check(Backend& backend, const std::string& text, const std::string& path);

// This process's pools: per device with an active context, the default pool (and the current
// pool when it is another) with settings and usage, and the device's graph memory.
nlohmann::ordered_json process_stats(Backend& backend);

}  // namespace cupool
