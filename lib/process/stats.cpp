// This process's own pools as JSON (cupool_stats, cupool exec --report).
#include "process/process.h"

namespace cupool {

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
