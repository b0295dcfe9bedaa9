// `cupool check`: judges a parsed config against a node, every finding at once, nothing created.
#pragma once

#include <functional>
#include <string>

#include "config/config.h"
#include "config/diagnostics.h"
#include "config/resolve.h"
#include "device/node.h"

namespace cupool {

// The most users and groups one check looks up (each lookup may ask a directory service).
constexpr std::size_t kMaxAccountLookups = 64;

struct CheckOptions {
  // The node's report came with --deep probes: judge fabric export by the probe, not the attribute.
  bool deep = false;
  // Whether a user / a group of a name exists, for holder.group and the share lists (unset: this
  // machine's name service, base/accounts.h; tests give their own).
  std::function<bool(const std::string&)> user_exists;
  std::function<bool(const std::string&)> group_exists;
  // The accounts looked up are those of the machine the file is for (hold, check of this node),
  // so a missing holder.group is an error. False when judging against a recorded node (check
  // --profile): this machine's accounts say nothing certain about that one, so it is a warning.
  bool accounts_here = true;
};

// Adds a finding to `diags` for every rule the config breaks on `node`; `desired` is what
// resolve(config, node) made of it (config/load.h does both).
void check_config(const Config& config, const Desired& desired, const NodeReport& node, Diagnostics& diags,
                  const CheckOptions& options = {});

}  // namespace cupool
