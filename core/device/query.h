// `cupool query`: what this node supports, asked of a Backend (attributes only, unless deep).
#pragma once

#include <string>
#include <vector>

#include "device/backend.h"
#include "device/node.h"

namespace cupool {

struct QueryOptions {
  std::vector<DeviceSelector> devices;  // empty: all
  bool deep = false;                    // create and export a small pool per handle type
  bool gds = true;                      // with deep: ask cuFile about GPUDirect Storage (query; not check)
};

// Asks the backend everything `query` reports. Creates no context unless `deep`.
// Throws NoDriverError, CudaError, or InputError for a selector that names no device.
NodeReport build_report(NodeQuery& backend, const QueryOptions& options = {});

// A failed probe in plain words: what the driver's answer means here and what would fix it.
std::string explain_probe(const ExportProbe& probe);

}  // namespace cupool
