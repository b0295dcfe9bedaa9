// The one loader of config files: parse, resolve on a node, check, and reject a file with errors.
// `cupool check`, the holder (hold, reload, plan, apply) and the in-process apply (cupool_configure,
// exec) all load through it, so a file means the same to each of them.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "config/check.h"
#include "config/config.h"
#include "config/diagnostics.h"
#include "config/resolve.h"
#include "device/node.h"

namespace cupool {

// What is judged: every section (check, the holder), or only the process: section (inside an
// application, where the holder's pools and buffers are not its business and the memory `check`
// counts may well be the holder's).
enum class Scope { all, process };

// A file parsed, resolved and judged. `node` and `desired` are missing when the file did not parse.
struct Judged {
  Config config;
  std::optional<NodeReport> node;
  std::optional<Desired> desired;
  Diagnostics diags;
  bool rejected() const { return diags.has_invalid_input() || diags.has_errors(); }
};

// Parses `file`; when it reads as a version 1 config (schema errors allowed: what could be read is
// judged too), asks `node` for the node (only then: it may query the driver), resolves the file on
// it and checks the sections of `scope`. Every finding is in `diags`.
Judged judge_config(const SourceFile& file, const std::function<NodeReport()>& node, Scope scope,
                    const CheckOptions& options = {});

// A config that can be used.
struct Loaded {
  Config config;
  NodeReport node;
  Desired desired;
  std::string warnings;                          // compiler-style findings that are not errors; "" when none
  std::vector<model::Finding> warning_findings;  // the same findings, typed
};

// judge_config, then: throws ConfigRejected with every finding when the file has errors.
Loaded load_config(const SourceFile& file, const std::function<NodeReport()>& node, Scope scope);
// The same for a node already known, judged with `options` (the holder's bounded account lookups).
Loaded load_config(const SourceFile& file, const NodeReport& node, Scope scope, const CheckOptions& options = {});

// The ConfigRejected for findings with errors.
ConfigRejected rejection(const Diagnostics& diags, const SourceFile& file);

}  // namespace cupool
