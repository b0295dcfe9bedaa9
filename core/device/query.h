// `cupool query`: what this node supports, asked of a Backend (attributes only, unless deep).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "device/backend.h"
#include "device/node.h"
#include "model/model.h"

namespace cupool {

struct QueryOptions {
  std::vector<DeviceSelector> devices;  // empty: all
  bool deep = false;                    // create and export a small pool per handle type
  bool gds = true;                      // with deep: ask cuFile about GPUDirect Storage (query; not check)
  // Ask this host's kernel about its dmem cgroup controller, at this cgroup v2 root (query; not
  // check): also for a simulated node, whose kernel is this host's.
  std::optional<std::string> cgroup_root;
};

// Asks the backend everything `query` reports. Creates no context unless `deep`.
// Throws NoDriverError, CudaError, or InputError for a selector that names no device.
NodeReport build_report(NodeQuery& backend, const QueryOptions& options = {});

// What `query` reports where no driver or device answers (`why`, from build_report): where the
// answer was sought, the host and its kernel's dmem controller, and why; no driver, no devices.
model::QueryFailure query_failure(NodeQuery& backend, const QueryOptions& options, const Error& why);

// A failed probe in plain words: what the driver's answer means here and what would fix it.
std::string explain_probe(const ExportProbe& probe);

}  // namespace cupool
