#include "core/process.h"

#include <algorithm>

#include "core/check.h"
#include "core/config.h"
#include "core/holder.h"
#include "core/query.h"
#include "core/units.h"

namespace cupool {

namespace {

std::string threshold_text(std::uint64_t bytes) { return bytes == UINT64_MAX ? "max" : format_bytes(bytes); }
std::string bool_text(bool b) { return b ? "true" : "false"; }

std::vector<int> resolve(const NodeReport& node, const DeviceList& list) {
  std::vector<int> out;
  if (list.all || (list.items.empty() && !list.loc.line)) {
    for (const auto& d : node.devices) out.push_back(d.info.ordinal);
    return out;
  }
  for (const auto& s : list.items)
    if (auto o = resolve_device(node, s.value); o && std::find(out.begin(), out.end(), *o) == out.end()) out.push_back(*o);
  return out;
}

}  // namespace

nlohmann::ordered_json ConfigureResult::to_json() const {
  nlohmann::ordered_json j;
  j["devices"] = devices;
  j["changes"] = nlohmann::ordered_json::array();
  for (const auto& c : changes)
    j["changes"].push_back({{"device", c.device}, {"field", c.field}, {"from", c.from}, {"to", c.to}});
  j["warnings"] = warnings;
  return j;
}

namespace {

struct Checked {
  Config config;
  NodeReport node;
  std::string warnings;
};

Checked check_section(Backend& backend, const std::string& text, const std::string& path) {
  const SourceFile file(path, text);
  Diagnostics diags;
  Checked out;
  Config& config = out.config;
  config = parse_config(file, diags);
  // Attributes only: build_report creates no context.
  if (!diags.has_invalid_input()) out.node = build_report(backend);
  const NodeReport& node = out.node;
  if (!diags.has_invalid_input()) {
    // The holder's pools and buffers are judged by `check` and `hold`, not inside applications
    // (an application may well run while the holder has taken the memory `check` counts).
    Config process_only;
    process_only.version = config.version;
    process_only.process = config.process;
    check_config(process_only, node, diags);
  }
  if (diags.has_errors() || diags.has_invalid_input()) {
    nlohmann::ordered_json findings = nlohmann::ordered_json::array();
    for (const auto& d : diags.sorted()) findings.push_back(to_json(d, path));
    throw ConfigRejected(path + ": " + summary_line(diags), findings, render_text(diags, file), diags.has_invalid_input());
  }
  if (!diags.all().empty()) out.warnings = render_text(diags, file);
  return out;
}

}  // namespace

std::string configure_process_check(Backend& backend, const std::string& text, const std::string& path) {
  return check_section(backend, text, path).warnings;
}

ConfigureResult configure_process(Backend& backend, const std::string& text, const std::string& path) {
  const Checked checked = check_section(backend, text, path);
  const Config& config = checked.config;
  const NodeReport& node = checked.node;
  ConfigureResult result;
  result.warnings = checked.warnings;
  if (!config.process) return result;
  const ProcessSpec& spec = *config.process;
  result.devices = resolve(node, spec.devices);
  if (!spec.default_pool) return result;
  const DefaultPoolSpec& want = *spec.default_pool;

  for (int device : result.devices) {
    const PoolHandle pool = backend.default_pool(device);
    const PoolSettings now = backend.pool_settings(pool);
    PoolSettings next = now;
    if (want.release_threshold.set) {
      const std::uint64_t memory = node.device(device) ? node.device(device)->info.total_memory : 0;
      next.release_threshold = want.release_threshold.value.resolve(memory);
    }
    if (want.reuse) {
      if (want.reuse->follow_event_dependencies.set) next.follow_event_dependencies = want.reuse->follow_event_dependencies.value;
      if (want.reuse->allow_opportunistic.set) next.allow_opportunistic = want.reuse->allow_opportunistic.value;
      if (want.reuse->allow_internal_dependencies.set)
        next.allow_internal_dependencies = want.reuse->allow_internal_dependencies.value;
    }
    auto note = [&](const char* field, const std::string& from, const std::string& to) {
      if (from != to) result.changes.push_back({device, field, from, to});
    };
    note("release_threshold", threshold_text(now.release_threshold), threshold_text(next.release_threshold));
    note("reuse.follow_event_dependencies", bool_text(now.follow_event_dependencies), bool_text(next.follow_event_dependencies));
    note("reuse.allow_opportunistic", bool_text(now.allow_opportunistic), bool_text(next.allow_opportunistic));
    note("reuse.allow_internal_dependencies", bool_text(now.allow_internal_dependencies),
         bool_text(next.allow_internal_dependencies));
    if (now.release_threshold != next.release_threshold || now.follow_event_dependencies != next.follow_event_dependencies ||
        now.allow_opportunistic != next.allow_opportunistic ||
        now.allow_internal_dependencies != next.allow_internal_dependencies)
      backend.set_pool_settings(pool, next);
    if (want.access)
      for (int peer : resolve(node, *want.access)) {
        if (peer == device || backend.pool_access(pool, peer)) continue;
        backend.set_pool_access(pool, peer);
        result.changes.push_back({device, "access", "", "device " + std::to_string(peer) + " read-write"});
      }
  }
  return result;
}

nlohmann::ordered_json process_stats(Backend& backend) {
  nlohmann::ordered_json out;
  out["devices"] = nlohmann::ordered_json::array();
  const int count = backend.device_count();
  for (int device = 0; device < count; ++device) {
    // A device this process never used holds nothing of it; asking would create a context.
    if (!backend.context_active(device)) continue;
    nlohmann::ordered_json d;
    d["device"] = device;
    d["uuid"] = backend.device_info(device).uuid;
    nlohmann::ordered_json pools = nlohmann::ordered_json::array();
    const PoolHandle def = backend.default_pool(device);
    const PoolHandle cur = backend.current_pool(device);
    for (PoolHandle h : {def, cur}) {
      if (h == cur && cur == def && !pools.empty()) break;
      const PoolSettings s = backend.pool_settings(h);
      const PoolUsage u = backend.pool_usage(h);
      pools.push_back({{"pool", h == def ? "default" : "current"},
                       {"release_threshold", s.release_threshold},
                       {"reuse",
                        {{"follow_event_dependencies", s.follow_event_dependencies},
                         {"allow_opportunistic", s.allow_opportunistic},
                         {"allow_internal_dependencies", s.allow_internal_dependencies}}},
                       {"reserved_current", u.reserved_current},
                       {"reserved_high", u.reserved_high},
                       {"used_current", u.used_current},
                       {"used_high", u.used_high}});
    }
    d["pools"] = pools;
    const GraphMemUsage g = backend.graph_mem_usage(device);
    d["graph"] = {{"reserved_current", g.reserved_current},
                  {"reserved_high", g.reserved_high},
                  {"used_current", g.used_current},
                  {"used_high", g.used_high}};
    out["devices"].push_back(d);
  }
  return out;
}

}  // namespace cupool
