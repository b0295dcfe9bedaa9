// The config's `process:` section applied inside an application (cupool_configure, cupool exec),
// and the application's own pool figures (cupool_stats, cupool exec --report). Pools, their
// attributes and the current pool are per process, so this runs in the application's process.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "device/backend.h"
#include "model/model.h"

namespace cupool {

// One change on one device: a default-pool attribute ("release_threshold", "reuse.allow_opportunistic",
// "access"), the current pool made ("current_pool") or one of its attributes ("current_pool.release_threshold").
struct ProcessChange {
  model::ProcessDeviceId id;  // the device as this process numbers it, its UUID and PCI bus id
  std::string field;
  std::string from;
  std::string to;
};

// cupool_configure's report (schemas/cupool-configure-v1.schema.json; fields in process/report.h).
struct ConfigureResult {
  std::vector<int> devices;  // the selected devices (this process's ordinals), in order
  std::vector<ProcessChange> changes;
  std::vector<model::Finding> findings;  // the section's warnings and notes, as `cupool check` has them
  std::string warnings_rendered;         // the same, compiler style, then "warning: ..." lines ("" when none)
  // The release thresholds the file set, per pool, as it wrote them (75%): for process_stats,
  // whose driver holds only bytes. Not in the report.
  std::map<PoolHandle, ReleaseThreshold> thresholds;
  nlohmann::ordered_json to_json() const;
};

// Parses the config, checks its process section against this node (pools and buffers are the
// holder's and are not judged here) and applies it on each selected device: the default pool's
// release threshold, reuse policies and peer access; with current_pool, a pool created with the
// file's max_size, settings, reserve and access and made the device's current pool (a current
// pool made by an earlier call is kept and its settings brought in line; one the application set
// itself is left alone, with a warning). Changes only what differs: a second call changes
// nothing. Touches no device that is not selected; creates no context unless current_pool asks
// for a pool (creating one retains the device's primary context). All or nothing: when the driver
// refuses a step, what was changed is put back (peer access already granted aside) and CudaError
// is thrown. Throws ConfigRejected for a file with errors.
ConfigureResult configure_process(Backend& backend, const std::string& text, const std::string& path);

// The parse and check half of configure_process: throws ConfigRejected, changes nothing.
// Returns the warnings' text ("" when none).
std::string configure_process_check(Backend& backend, const std::string& text, const std::string& path);

// A threshold the driver holds (its bytes, nothing written), for people: "max", a size whole in its
// unit ("8GiB"), or one rounded to a tenth ("59.4GiB"); one with a written text stays as written.
ReleaseThreshold readable_threshold(const ReleaseThreshold& held);

// This process's pools: per device with an active context, the default pool (and the current
// pool when it is another) with settings and usage, and the device's graph memory. A release
// threshold is written as `written` has it where the driver still holds those bytes (what
// configure_process set: 75% stays 75%), else in a readable unit (59.4GiB; its bytes beside it).
nlohmann::ordered_json process_stats(Backend& backend, const std::map<PoolHandle, ReleaseThreshold>& written = {});

}  // namespace cupool
