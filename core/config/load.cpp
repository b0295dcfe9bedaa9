#include "config/load.h"

namespace cupool {

Judged judge_config(const SourceFile& file, const std::function<NodeReport()>& node, Scope scope,
                    const CheckOptions& options) {
  Judged out;
  out.config = parse_config(file, out.diags);
  // A file with schema errors is still judged on the node for what could be read, so one run
  // reports every finding; one that is not a version 1 config at all (YAML errors, an empty
  // file, another version) is not.
  if (!out.diags.has_invalid_input()) {
    out.node = node();
  } else {
    if (!(out.config.version.set && out.config.version.value == 1)) return out;
    try {
      out.node = node();
    } catch (const Error&) {
      return out;  // no node to judge on (no driver, a bad profile): the file's own errors stand
    }
  }
  Config judged;
  if (scope == Scope::process) {
    judged.version = out.config.version;
    judged.process = out.config.process;
  }
  const Config& config = scope == Scope::all ? out.config : judged;
  out.desired = resolve(config, *out.node);
  check_config(config, *out.desired, *out.node, out.diags, options);
  return out;
}

ConfigRejected rejection(const Diagnostics& diags, const SourceFile& file) {
  nlohmann::ordered_json findings = nlohmann::ordered_json::array();
  for (const auto& d : diags.sorted()) findings.push_back(to_json(d, file.path()));
  return ConfigRejected(file.path() + ": " + summary_line(diags), findings, render_text(diags, file),
                        diags.has_invalid_input());
}

namespace {

Loaded load_judged(const SourceFile& file, const std::function<NodeReport()>& node, Scope scope,
                   const CheckOptions& options) {
  Judged judged = judge_config(file, node, scope, options);
  if (judged.rejected()) throw rejection(judged.diags, file);
  Loaded out;
  out.config = std::move(judged.config);
  out.node = std::move(*judged.node);
  out.desired = std::move(*judged.desired);
  if (!judged.diags.all().empty()) out.warnings = render_text(judged.diags, file);
  for (const Diagnostic& d : judged.diags.sorted()) out.warning_findings.push_back(view(d, file.path()));
  return out;
}

}  // namespace

Loaded load_config(const SourceFile& file, const std::function<NodeReport()>& node, Scope scope) {
  return load_judged(file, node, scope, {});
}

Loaded load_config(const SourceFile& file, const NodeReport& node, Scope scope, const CheckOptions& options) {
  return load_judged(
      file, [&node] { return node; }, scope, options);
}

}  // namespace cupool
