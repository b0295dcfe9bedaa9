#include "process/process.h"

#include <algorithm>
#include <functional>

#include "base/units.h"
#include "device/query.h"
#include "spec/check.h"
#include "spec/config.h"
#include "spec/diagnostics.h"

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

namespace {

// Changes made so far, undone in reverse order unless committed: a configure that fails half way
// leaves the process as it found it (peer access aside: the backend can grant it, not take it
// back, so it is granted last, after everything else has succeeded).
class Undo {
 public:
  Undo() = default;
  Undo(const Undo&) = delete;
  Undo& operator=(const Undo&) = delete;
  ~Undo() {
    if (committed_) return;
    for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) try {
        (*it)();
      } catch (...) {
        // Best effort: the error that started the undo is the one reported.
      }
  }
  void push(std::function<void()> step) { steps_.push_back(std::move(step)); }
  void commit() { committed_ = true; }

 private:
  std::vector<std::function<void()>> steps_;
  bool committed_ = false;
};

struct Grant {
  PoolHandle pool;
  int device;
  int peer;
  std::string field;
};

class Applier {
 public:
  Applier(Backend& backend, const NodeReport& node, ConfigureResult& result) : b_(backend), node_(node), r_(result) {}

  void default_pool(int device, const DefaultPoolSpec& want) {
    const PoolHandle pool = b_.default_pool(device);
    settings(device, pool, "", want.release_threshold, want.reuse);
    if (want.access) grants(device, pool, *want.access, "access");
  }

  void current_pool(int device, const CurrentPoolSpec& want) {
    const PoolHandle def = b_.default_pool(device);
    const PoolHandle cur = b_.current_pool(device);
    PoolHandle pool = cur;
    const bool create = cur == def;
    if (!create) {
      const std::optional<PoolProps> made = b_.created_props(cur);
      if (!made) {
        warn("device " + std::to_string(device) +
             ": the application made a pool of its own current; cupool leaves it and applies no current_pool there");
        return;
      }
      // Made by an earlier call in this process: only its settings can still change.
      if (want.max_size.set && made->max_size != want.max_size.value)
        warn("device " + std::to_string(device) + ": the current pool keeps max_size " + size_text(made->max_size) +
             " (fixed when this process created it); the file asks for " + format_bytes(want.max_size.value));
    } else {
      PoolProps props;
      props.location = PoolProps::Location::device;
      props.location_id = device;
      props.max_size = want.max_size.set ? want.max_size.value : 0;
      pool = b_.create_pool(device, props);
      undo_.push([this, pool] { b_.destroy_pool(pool); });
    }
    settings(device, pool, "current_pool.", want.release_threshold, want.reuse);
    if (create) {
      if (want.reserve.set && want.reserve.value > 0) b_.free(pool, b_.allocate(pool, want.reserve.value));
      b_.set_current_pool(device, pool);
      undo_.push([this, device, def] { b_.set_current_pool(device, def); });
      std::string made = "a new pool (max_size " + size_text(props_max(want)) + ")";
      if (want.reserve.set && want.reserve.value > 0) made += ", " + format_bytes(want.reserve.value) + " reserved";
      r_.changes.push_back({device, "current_pool", "the default pool", made});
    }
    if (want.access) grants(device, pool, *want.access, "current_pool.access");
  }

  // Peer access last; then nothing is undone any more.
  void finish() {
    for (const Grant& g : grants_) {
      if (b_.pool_access(g.pool, g.peer)) continue;
      b_.set_pool_access(g.pool, g.peer);
      r_.changes.push_back({g.device, g.field, "", "device " + std::to_string(g.peer) + " read-write"});
    }
    undo_.commit();
  }

 private:
  static std::string size_text(std::uint64_t max_size) { return max_size ? format_bytes(max_size) : "the driver's default"; }
  static std::uint64_t props_max(const CurrentPoolSpec& want) { return want.max_size.set ? want.max_size.value : 0; }

  void warn(const std::string& text) { r_.warnings += "warning: " + text + "\n"; }

  // Sets the threshold and reuse policies the file asks for, changing only what differs.
  void settings(int device, PoolHandle pool, const std::string& prefix, const At<Threshold>& threshold,
                const std::optional<Reuse>& reuse) {
    const PoolSettings now = b_.pool_settings(pool);
    PoolSettings next = now;
    if (threshold.set) {
      const std::uint64_t memory = node_.device(device) ? node_.device(device)->info.total_memory : 0;
      next.release_threshold = threshold.value.resolve(memory);
    }
    if (reuse) {
      if (reuse->follow_event_dependencies.set) next.follow_event_dependencies = reuse->follow_event_dependencies.value;
      if (reuse->allow_opportunistic.set) next.allow_opportunistic = reuse->allow_opportunistic.value;
      if (reuse->allow_internal_dependencies.set) next.allow_internal_dependencies = reuse->allow_internal_dependencies.value;
    }
    auto note = [&](const char* field, const std::string& from, const std::string& to) {
      if (from != to) r_.changes.push_back({device, prefix + field, from, to});
    };
    note("release_threshold", threshold_text(now.release_threshold), threshold_text(next.release_threshold));
    note("reuse.follow_event_dependencies", bool_text(now.follow_event_dependencies), bool_text(next.follow_event_dependencies));
    note("reuse.allow_opportunistic", bool_text(now.allow_opportunistic), bool_text(next.allow_opportunistic));
    note("reuse.allow_internal_dependencies", bool_text(now.allow_internal_dependencies),
         bool_text(next.allow_internal_dependencies));
    if (now.release_threshold == next.release_threshold && now.follow_event_dependencies == next.follow_event_dependencies &&
        now.allow_opportunistic == next.allow_opportunistic &&
        now.allow_internal_dependencies == next.allow_internal_dependencies)
      return;
    b_.set_pool_settings(pool, next);
    undo_.push([this, pool, now] { b_.set_pool_settings(pool, now); });
  }

  void grants(int device, PoolHandle pool, const DeviceList& access, const std::string& field) {
    for (int peer : resolve(node_, access))
      if (peer != device) grants_.push_back({pool, device, peer, field});
  }

  Backend& b_;
  const NodeReport& node_;
  ConfigureResult& r_;
  std::vector<Grant> grants_;
  Undo undo_;  // last member: runs (when not committed) before the others go
};

}  // namespace

ConfigureResult configure_process(Backend& backend, const std::string& text, const std::string& path) {
  const Checked checked = check_section(backend, text, path);
  const Config& config = checked.config;
  const NodeReport& node = checked.node;
  ConfigureResult result;
  result.warnings = checked.warnings;
  if (!config.process) return result;
  const ProcessSpec& spec = *config.process;
  result.devices = resolve(node, spec.devices);
  Applier apply(backend, node, result);
  for (int device : result.devices) {
    if (spec.default_pool) apply.default_pool(device, *spec.default_pool);
    if (spec.current_pool) apply.current_pool(device, *spec.current_pool);
  }
  apply.finish();
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
