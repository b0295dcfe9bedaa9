// `cupool check`: judges a parsed config against a node, every finding at once, nothing created.
#pragma once

#include "config/config.h"
#include "config/diagnostics.h"
#include "config/resolve.h"
#include "device/node.h"

namespace cupool {

struct CheckOptions {
  // The node's report came with --deep probes: judge fabric export by the probe, not the attribute.
  bool deep = false;
};

// Adds a finding to `diags` for every rule the config breaks on `node`; `desired` is what
// resolve(config, node) made of it (config/load.h does both).
void check_config(const Config& config, const Desired& desired, const NodeReport& node, Diagnostics& diags,
                  const CheckOptions& options = {});

}  // namespace cupool
