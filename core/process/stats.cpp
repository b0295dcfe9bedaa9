// This process's own pools as JSON (cupool_stats, cupool exec --report).
#include <algorithm>
#include <utility>

#include "base/units.h"
#include "model/model.h"
#include "process/process.h"

namespace cupool {

ReleaseThreshold readable_threshold(const ReleaseThreshold& held) {
  if (held.is_max() || !held.written().empty()) return held;
  std::string text = format_bytes(held.bytes());
  text.erase(std::remove(text.begin(), text.end(), ' '), text.end());  // "8 GiB": a config's spelling, 8GiB
  return ReleaseThreshold(held.bytes(), text);
}

namespace {

// As the file wrote it where the driver still holds those bytes, else readable_threshold.
ReleaseThreshold shown(const ReleaseThreshold& held, const std::map<PoolHandle, ReleaseThreshold>& written,
                       PoolHandle pool) {
  if (const auto it = written.find(pool); it != written.end() && it->second.bytes() == held.bytes()) return it->second;
  return readable_threshold(held);
}

}  // namespace

nlohmann::ordered_json process_stats(Backend& backend, const std::map<PoolHandle, ReleaseThreshold>& written) {
  model::ProcessStats out;
  const int count = backend.device_count();
  for (int device = 0; device < count; ++device) {
    // A device this process never used holds nothing of it; asking would create a context.
    if (!backend.context_active(device)) continue;
    const DeviceInfo info = backend.device_info(device);
    model::ProcessDevice d;
    d.id = {device, info.uuid, info.pci_bus_id};
    const PoolHandle def = backend.default_pool(device);
    const PoolHandle cur = backend.current_pool(device);
    for (PoolHandle h : {def, cur}) {
      if (h == cur && cur == def && !d.pools.empty()) break;
      const PoolSettings s = backend.pool_settings(h);
      const PoolUsage u = backend.pool_usage(h);
      d.pools.push_back({h == def ? "default" : "current",
                         shown(s.release_threshold, written, h),
                         {s.follow_event_dependencies, s.allow_opportunistic, s.allow_internal_dependencies},
                         u});
    }
    const GraphMemUsage g = backend.graph_mem_usage(device);
    d.graph = g;
    out.devices.push_back(std::move(d));
  }
  return model::to_json(out);
}

}  // namespace cupool
