// What the holder says about its state: status, stats, trim (with the bytes really released) and
// the live state as a config file (export).
#include <algorithm>
#include <map>
#include <set>

#include "base/error.h"
#include "base/output.h"
#include "base/text.h"
#include "holder/admin_requests.h"
#include "holder/names.h"

namespace cupool {

namespace {
// The buffers held in pool `key`: how many and their bytes (status's and stats' counts).
model::BufferTotals buffers_in(const BufferStore& buffers, const PoolTable::PoolKey& key) {
  model::BufferTotals out;
  for (const auto& [name, b] : buffers)
    if (b.want.pool == key.first && b.want.device == key.second) {
      ++out.buffer_count;
      out.buffer_bytes += b.want.size;
    }
  return out;
}
}  // namespace

std::optional<model::AppliedConfig> AdminRequests::forget_applied() {
  std::optional<model::AppliedConfig> out = std::move(applied_config_);
  applied_config_.reset();
  return out;
}

model::Status AdminRequests::status() const {
  model::Status out;
  out.source = source_of(units_.node.source);
  out.holder = units_.identity;
  out.holder.apply_count = apply_count_;
  out.holder.applied_config = applied_config_;
  out.holder.draining = units_.draining;
  out.holder.uptime_seconds = now_s() - created_at_;
  for (const auto& [key, p] : units_.pools) {
    model::PoolStatus v;
    v.pool = units_.pools.info(key, p);
    v.release_threshold = p.want.settings.release_threshold;
    v.leases = units_.leasing.book().of(key);
    v.buffers = buffers_in(units_.buffers, key);
    out.pools.push_back(std::move(v));
  }
  for (const auto& [name, b] : units_.buffers) out.buffers.push_back(units_.buffers.view(name, b));
  out.custody = units_.buffers.custody_status();
  const std::int64_t now = now_s();
  for (const auto& [id, c] : units_.clients) {
    model::ClientInfo v;
    v.id = id;
    v.pid = c.peer.pid;
    v.uid = c.peer.uid;
    if (!c.peer.user.empty()) v.user = c.peer.user;
    if (!c.name.empty()) v.name = c.name;
    v.leases.lease_count = c.leases.size();
    for (const auto& [k, bytes] : c.bytes_in_pool) v.leases.leased_bytes += bytes;
    for (const auto& [k, opens] : c.open_buffers) v.open_buffer_count += opens;
    for (std::uint64_t l : c.leases) {
      const Lease& lease = units_.leasing.book().at(l);
      if (!lease.cached) continue;
      ++v.leases.cached_count;
      v.leases.cached_bytes += lease.size;
      if (lease.ask) ++v.asked_to_drop_count;
    }
    if (c.protocol > 0) v.protocol = c.protocol;
    v.connected_seconds = now - c.connected_at;
    out.clients.push_back(std::move(v));
  }
  return out;
}

model::Stats AdminRequests::stats(bool reset_peaks) {
  std::set<int> devices;
  for (const auto& [key, p] : units_.pools) devices.insert(key.second);
  for (int d : devices) units_.backend.synchronize(d);
  model::Stats out;
  std::map<int, model::BufferTotals> on_device;
  for (auto& [key, p] : units_.pools) {
    PoolUsage u = units_.backend.pool_usage(p.handle);
    // What clients used: the mark from before the holder mapped its reserve, or the driver's since.
    u.used_peak_bytes = std::max(u.used_peak_bytes, p.used_peak_before_reserve);
    if (reset_peaks) {
      units_.backend.reset_pool_peaks(p.handle);
      p.used_peak_before_reserve = 0;
    }
    model::PoolStats v;
    v.name = key.first;
    v.id = units_.pools.device_id(key.second);
    v.usage = u;
    v.release_threshold = p.want.settings.release_threshold;
    v.leases = units_.leasing.book().of(key);
    // Held buffers are exported allocations (a device pool's), outside the pool's usage above.
    v.buffers = buffers_in(units_.buffers, key);
    on_device[key.second].buffer_count += v.buffers.buffer_count;
    on_device[key.second].buffer_bytes += v.buffers.buffer_bytes;
    out.pools.push_back(std::move(v));
  }
  out.dropped_bytes = units_.leasing.dropped_bytes();
  for (int d : devices) {
    const GraphMemUsage g = units_.backend.graph_mem_usage(d);
    if (reset_peaks) units_.backend.reset_graph_mem_peaks(d);
    out.devices.push_back({units_.pools.device_id(d), g, on_device[d]});
  }
  out.ledger = units_.budgets.ledger();
  return out;
}

model::Trim AdminRequests::trim(std::uint64_t keep, const std::optional<std::string>& pool, bool graph) {
  if (pool) {
    bool any = false;
    for (const auto& [key, p] : units_.pools) any = any || key.first == *pool;
    if (!any) throw units_.pools.no_such_pool(*pool);
  }
  std::set<int> devices;
  for (const auto& [key, p] : units_.pools)
    if (!pool || key.first == *pool) devices.insert(key.second);
  for (int d : devices) units_.backend.synchronize(d);
  model::Trim out;
  for (const auto& [key, p] : units_.pools) {
    if (pool && key.first != *pool) continue;
    const std::uint64_t before = units_.backend.pool_usage(p.handle).reserved_bytes;
    units_.backend.trim_pool(p.handle, keep);
    units_.backend.synchronize(key.second);
    const std::uint64_t after = units_.backend.pool_usage(p.handle).reserved_bytes;
    const std::uint64_t released = before > after ? before - after : 0;
    out.released_bytes += released;
    out.pools.push_back({key.first, units_.pools.device_id(key.second), before, after, released});
  }
  if (graph)
    for (int d : devices) {
      const std::uint64_t before = units_.backend.graph_mem_usage(d).reserved_bytes;
      units_.backend.trim_graph_mem(d);
      const std::uint64_t after = units_.backend.graph_mem_usage(d).reserved_bytes;
      const std::uint64_t released = before > after ? before - after : 0;
      out.released_bytes += released;
      out.devices.push_back({units_.pools.device_id(d), before, after, released});
    }
  return out;
}

std::string AdminRequests::export_config() const {
  model::ExportedConfig doc;
  doc.holder.socket = units_.reconciler.settings().socket;
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", units_.reconciler.settings().mode);
  doc.holder.mode = mode;
  if (!units_.reconciler.settings().group.empty()) doc.holder.group = units_.reconciler.settings().group;
  std::vector<model::ExportedPool> pools;
  std::vector<std::string> order;
  for (const auto& [key, p] : units_.pools)
    if (std::find(order.begin(), order.end(), key.first) == order.end()) order.push_back(key.first);
  for (const auto& name : order) {
    model::ExportedPool j;
    std::set<int> access;
    const HeldPool* first = nullptr;
    for (const auto& [key, p] : units_.pools) {
      if (key.first != name) continue;
      if (!first) first = &p;
      j.devices.push_back(device_uuid(units_.node, key.second));
      access.insert(p.want.access.begin(), p.want.access.end());
    }
    const PoolWant& w = first->want;
    j.name = name;
    j.location = w.props.location == PoolProps::Location::device ? "device" : location_text(w.props);
    j.alloc_type = w.props.managed ? "managed" : "pinned";
    j.handle_types = handle_type_names(w.props.handle_types);
    if (j.handle_types.empty()) j.handle_types.push_back("none");  // the config's word for no IPC handle
    if (w.props.max_size) j.max_size = exact_size(w.props.max_size);
    // As the file wrote it, to the letter (text() says max for a size of 2^64-1 bytes); unset: 0B.
    const ReleaseThreshold& threshold = w.settings.release_threshold;
    j.release_threshold = threshold.written().empty() ? threshold.text() : threshold.written();
    if (w.reserve) j.reserve = exact_size(w.reserve);
    j.reuse = {w.settings.follow_event_dependencies, w.settings.allow_opportunistic,
               w.settings.allow_internal_dependencies};
    if (!access.empty()) {
      j.access.emplace();
      for (int peer : access) j.access->push_back(device_uuid(units_.node, peer));
    }
    if (w.share.set) {
      model::ExportedShare& s = j.share.emplace();
      if (!w.share.users.empty()) s.users = w.share.users;
      if (!w.share.groups.empty()) s.groups = w.share.groups;
      if (w.share.quota_per_client) s.quota_per_client = exact_size(w.share.quota_per_client);
    }
    pools.push_back(std::move(j));
  }
  if (!pools.empty()) doc.pools = std::move(pools);
  std::vector<model::ExportedBuffer> buffers;
  std::vector<std::string> loaded;
  for (const auto& [name, b] : units_.buffers)
    if (b.index)
      loaded.push_back(name);  // its contents come from a file, not from a config
    else
      buffers.push_back({name, b.want.pool, device_uuid(units_.node, b.want.device), exact_size(b.want.size)});
  if (!buffers.empty()) doc.buffers = std::move(buffers);
  // A config's process: section is applied by `cupool exec` in each process it starts; the holder
  // holds nothing of it, so it can't be exported: said, not dropped silently.
  std::string note =
      "# Not here: a process: section (cupool exec applies it in each process it starts; the holder holds\n"
      "# nothing of it): copy it from the config file the holder was started with, if that had one.\n";
  for (const std::string& name : loaded)
    note += "# Not here: buffer " + name + ", a tensor set made by 'cupool buffer load' (load it again).\n";
  return "# The live state of a cupool holder, written by 'cupool export'.\n" + note + to_yaml(model::to_json(doc));
}
}  // namespace cupool
