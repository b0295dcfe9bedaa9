// The process: section applied inside an application: judged on this node (config/load.h), then
// changed on each selected device, only where it differs, all or nothing.
#include <algorithm>
#include <functional>
#include <utility>

#include "base/output.h"
#include "base/units.h"
#include "config/load.h"
#include "device/query.h"
#include "process/process.h"
#include "process/report.h"

namespace cupool {

nlohmann::ordered_json ConfigureResult::to_json() const { return versioned(model::write_json(*this)); }

namespace {

// The file, judged on this node for its process: section (attributes only: build_report creates no
// context). Throws ConfigRejected.
Loaded load_process_section(Backend& backend, const std::string& text, const std::string& path) {
  return load_config(
      SourceFile(path, text), [&backend] { return build_report(backend); }, Scope::process);
}

}  // namespace

std::string configure_process_check(Backend& backend, const std::string& text, const std::string& path) {
  return load_process_section(backend, text, path).warnings;
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
  Applier(Backend& backend, const NodeReport& node, std::string path, ConfigureResult& result)
      : b_(backend), node_(node), path_(std::move(path)), r_(result) {}

  void default_pool(int device, const ProcessDeviceWant::DefaultPool& want) {
    const PoolHandle pool = b_.default_pool(device);
    settings(device, pool, "", want.settings);
    grants(device, pool, want.access, "access");
  }

  void current_pool(int device, const ProcessDeviceWant::CurrentPool& want) {
    const PoolHandle def = b_.default_pool(device);
    const PoolHandle cur = b_.current_pool(device);
    PoolHandle pool = cur;
    const bool create = cur == def;
    if (!create) {
      const std::optional<PoolProps> made = b_.created_props(cur);
      if (!made) {
        warn(
            "process-current-pool",
            "device " + std::to_string(device) +
                ": the application made a pool of its own current; cupool leaves it and applies no current_pool there");
        return;
      }
      // Made by an earlier call in this process: only its settings can still change.
      if (want.max_size && made->max_size != want.max_size)
        warn("process-current-pool",
             "device " + std::to_string(device) + ": the current pool keeps max_size " + size_text(made->max_size) +
                 " (fixed when this process created it); the file asks for " + format_bytes(want.max_size));
    } else {
      PoolProps props;
      props.location = PoolProps::Location::device;
      props.location_id = device;
      props.max_size = want.max_size;
      pool = b_.create_pool(device, props);
      undo_.push([this, pool] { b_.destroy_pool(pool); });
    }
    settings(device, pool, "current_pool.", want.settings);
    if (create) {
      if (want.reserve > 0) b_.free(pool, b_.allocate(pool, want.reserve));
      b_.set_current_pool(device, pool);
      undo_.push([this, device, def] { b_.set_current_pool(device, def); });
      std::string made = "a new pool (max_size " + size_text(want.max_size) + ")";
      if (want.reserve > 0) made += ", " + format_bytes(want.reserve) + " reserved";
      r_.changes.push_back({id(device), "current_pool", "the default pool", made});
    }
    grants(device, pool, want.access, "current_pool.access");
  }

  // Peer access last; then nothing is undone any more.
  void finish() {
    for (const Grant& g : grants_) {
      if (b_.pool_access(g.pool, g.peer)) continue;
      b_.set_pool_access(g.pool, g.peer);
      r_.changes.push_back({id(g.device), g.field, "", "device " + std::to_string(g.peer) + " read-write"});
    }
    undo_.commit();
  }

 private:
  static std::string size_text(std::uint64_t max_size) {
    return max_size ? format_bytes(max_size) : "the driver's default";
  }

  // A warning of the applier's own (the file's come from the check): `code` names it as a rule does.
  void warn(const char* code, const std::string& text) {
    r_.warnings_rendered += "warning: " + text + "\n";
    model::Finding f;
    f.file = path_;
    f.severity = "warning";
    f.code = code;
    f.message = text;
    r_.findings.push_back(std::move(f));
  }

  // The device as this process numbers it, with its UUID and PCI bus id from the node's report.
  model::ProcessDeviceId id(int device) const {
    model::ProcessDeviceId out;
    out.process_device = device;
    if (const DeviceReport* d = node_.device(device)) {
      out.uuid = d->info.uuid;
      out.pci_bus_id = d->info.pci_bus_id;
    }
    return out;
  }

  // Sets the threshold and reuse policies the file asks for, changing only what differs.
  void settings(int device, PoolHandle pool, const std::string& prefix, const SettingsPatch& want) {
    const PoolSettings now = b_.pool_settings(pool);
    const PoolSettings next = want.over(now);
    if (want.release_threshold) r_.thresholds[pool] = *want.release_threshold;
    if (next == now) return;
    for (SettingChange ch : diff_settings(now, next)) {
      // The threshold as the file wrote it (75% stays 75%), the one before readable.
      if (ch.field == "release_threshold") {
        ch.from = readable_threshold(now.release_threshold).text();
        ch.to = next.release_threshold.text();
      }
      r_.changes.push_back({id(device), prefix + ch.field, ch.from, ch.to});
    }
    b_.set_pool_settings(pool, next);
    undo_.push([this, pool, now] { b_.set_pool_settings(pool, now); });
  }

  void grants(int device, PoolHandle pool, const std::vector<int>& peers, const std::string& field) {
    for (int peer : peers) grants_.push_back({pool, device, peer, field});
  }

  Backend& b_;
  const NodeReport& node_;
  std::string path_;
  ConfigureResult& r_;
  std::vector<Grant> grants_;
  Undo undo_;  // last member: runs (when not committed) before the others go
};

}  // namespace

ConfigureResult configure_process(Backend& backend, const std::string& text, const std::string& path) {
  const Loaded loaded = load_process_section(backend, text, path);
  ConfigureResult result;
  result.findings = loaded.warning_findings;
  result.warnings_rendered = loaded.warnings;
  Applier apply(backend, loaded.node, path, result);
  for (const ProcessDeviceWant& want : loaded.desired.process) {
    result.devices.push_back(want.device);
    if (want.default_pool) apply.default_pool(want.device, *want.default_pool);
    if (want.current_pool) apply.current_pool(want.device, *want.current_pool);
  }
  apply.finish();
  return result;
}

}  // namespace cupool
