// What the holder says about its state: status, stats, trim (with the bytes really released) and
// the live state as a config file (export).
#include <algorithm>
#include <set>

#include "base/error.h"
#include "base/output.h"
#include "base/text.h"
#include "holder/holder.h"
#include "holder/names.h"

namespace cupool {

std::optional<model::AppliedConfig> Holder::forget_applied() {
  std::optional<model::AppliedConfig> out = std::move(applied_config_);
  applied_config_.reset();
  return out;
}

model::Status Holder::status() const {
  model::Status out;
  out.source = source_of(node_.source);
  out.holder = identity_;
  out.holder.apply_count = apply_count_;
  out.holder.applied_config = applied_config_;
  out.holder.draining = draining_;
  out.holder.uptime_seconds = now_s() - created_at_;
  for (const auto& [key, p] : pools_) {
    model::PoolStatus v;
    v.pool = pool_info(key, p);
    v.release_threshold = model::Threshold::written(p.want.threshold_text, p.want.settings.release_threshold);
    v.leases = leases_.of(key);
    for (const auto& [name, b] : buffers_)
      if (b.want.pool == key.first && b.want.device == key.second) {
        ++v.buffer_count;
        v.buffer_bytes += b.want.size;
      }
    out.pools.push_back(std::move(v));
  }
  for (const auto& [name, b] : buffers_) out.buffers.push_back(buffer_view(name, b));
  out.custody = custody_status();
  const std::int64_t now = now_s();
  for (const auto& [id, c] : clients_) {
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
      const Lease& lease = leases_.at(l);
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

model::PoolInfo Holder::pool_info(const PoolKey& key, const HeldPool& p) const {
  model::PoolInfo v;
  v.name = key.first;
  v.id = device_id(key.second);
  v.location = location_text(p.want.props);
  v.handle_types = handle_type_names(p.want.props.handle_types);
  if (p.want.props.max_size) v.max_size_bytes = p.want.props.max_size;
  return v;
}

model::BufferInfo Holder::buffer_view(const std::string& name, const HeldBuffer& b) const {
  model::BufferInfo v;
  v.name = name;
  v.pool = b.want.pool;
  v.id = device_id(b.want.device);
  v.size_bytes = b.want.size;
  v.part_count = b.parts.size();
  v.open_count = b.opens;
  v.state = b.loading ? "loading" : "ready";
  if (b.index) v.tensor_count = b.index->tensors.size();
  v.allocation = b.exported ? "exported" : "pool";
  v.kept = b.exported && !b.loading && custody_ != nullptr;
  v.adopted = b.adopted;
  return v;
}

model::Stats Holder::stats(bool reset_peaks) {
  std::set<int> devices;
  for (const auto& [key, p] : pools_) devices.insert(key.second);
  for (int d : devices) backend_.synchronize(d);
  model::Stats out;
  for (const auto& [key, p] : pools_) {
    const PoolUsage u = backend_.pool_usage(p.handle);
    if (reset_peaks) backend_.reset_pool_peaks(p.handle);
    model::PoolStats v;
    v.name = key.first;
    v.id = device_id(key.second);
    v.usage = u;
    v.release_threshold = model::Threshold::written(p.want.threshold_text, p.want.settings.release_threshold);
    v.leases = leases_.of(key);
    out.pools.push_back(std::move(v));
  }
  out.dropped_bytes = dropped_bytes_;
  for (int d : devices) {
    const GraphMemUsage g = backend_.graph_mem_usage(d);
    if (reset_peaks) backend_.reset_graph_mem_peaks(d);
    out.devices.push_back({device_id(d), g});
  }
  return out;
}

model::Trim Holder::trim(std::uint64_t keep, const std::optional<std::string>& pool, bool graph) {
  if (pool) {
    bool any = false;
    for (const auto& [key, p] : pools_) any = any || key.first == *pool;
    if (!any) throw Error(Errc::not_found, "no pool named \"" + valid_utf8(*pool) + "\"");
  }
  std::set<int> devices;
  for (const auto& [key, p] : pools_)
    if (!pool || key.first == *pool) devices.insert(key.second);
  for (int d : devices) backend_.synchronize(d);
  model::Trim out;
  for (const auto& [key, p] : pools_) {
    if (pool && key.first != *pool) continue;
    const std::uint64_t before = backend_.pool_usage(p.handle).reserved_bytes;
    backend_.trim_pool(p.handle, keep);
    backend_.synchronize(key.second);
    const std::uint64_t after = backend_.pool_usage(p.handle).reserved_bytes;
    const std::uint64_t released = before > after ? before - after : 0;
    out.released_bytes += released;
    out.pools.push_back({key.first, device_id(key.second), before, after, released});
  }
  if (graph)
    for (int d : devices) {
      const std::uint64_t before = backend_.graph_mem_usage(d).reserved_bytes;
      backend_.trim_graph_mem(d);
      const std::uint64_t after = backend_.graph_mem_usage(d).reserved_bytes;
      const std::uint64_t released = before > after ? before - after : 0;
      out.released_bytes += released;
      out.devices.push_back({device_id(d), before, after, released});
    }
  return out;
}

std::string Holder::export_config() const {
  Json doc;
  doc["version"] = 1;
  Json holder;
  holder["socket"] = holder_.socket;
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", holder_.mode);
  holder["mode"] = mode;
  if (!holder_.group.empty()) holder["group"] = holder_.group;
  doc["holder"] = holder;
  Json pools = Json::array();
  std::vector<std::string> order;
  for (const auto& [key, p] : pools_)
    if (std::find(order.begin(), order.end(), key.first) == order.end()) order.push_back(key.first);
  for (const auto& name : order) {
    Json devices = Json::array();
    std::set<int> access;
    const HeldPool* first = nullptr;
    for (const auto& [key, p] : pools_) {
      if (key.first != name) continue;
      if (!first) first = &p;
      devices.push_back(device_uuid(key.second));
      access.insert(p.want.access.begin(), p.want.access.end());
    }
    const PoolWant& w = first->want;
    Json j;
    j["name"] = name;
    j["devices"] = devices;
    j["location"] = w.props.location == PoolProps::Location::device ? "device" : location_text(w.props);
    j["alloc_type"] = w.props.managed ? "managed" : "pinned";
    Json handles = handle_type_names(w.props.handle_types);
    if (handles.empty()) handles.push_back("none");  // the config's word for no IPC handle
    j["handle_types"] = handles;
    if (w.props.max_size) j["max_size"] = exact_size(w.props.max_size);
    j["release_threshold"] = w.threshold_text;
    if (w.reserve) j["reserve"] = exact_size(w.reserve);
    j["reuse"] = {{"follow_event_dependencies", w.settings.follow_event_dependencies},
                  {"allow_opportunistic", w.settings.allow_opportunistic},
                  {"allow_internal_dependencies", w.settings.allow_internal_dependencies}};
    if (!access.empty()) {
      Json a = Json::array();
      for (int peer : access) a.push_back(device_uuid(peer));
      j["access"] = a;
    }
    if (w.share.set) {
      Json s;
      if (!w.share.users.empty()) s["users"] = w.share.users;
      if (!w.share.groups.empty()) s["groups"] = w.share.groups;
      if (w.share.quota_per_client) s["quota_per_client"] = exact_size(w.share.quota_per_client);
      j["share"] = s;
    }
    pools.push_back(j);
  }
  if (!pools.empty()) doc["pools"] = pools;
  Json buffers = Json::array();
  std::vector<std::string> loaded;
  for (const auto& [name, b] : buffers_)
    if (b.index)
      loaded.push_back(name);  // its contents come from a file, not from a config
    else
      buffers.push_back({{"name", name},
                         {"pool", b.want.pool},
                         {"device", device_uuid(b.want.device)},
                         {"size", exact_size(b.want.size)}});
  if (!buffers.empty()) doc["buffers"] = buffers;
  std::string note;
  for (const std::string& name : loaded)
    note += "# Not here: buffer " + name + ", a tensor set made by 'cupool buffer load' (load it again).\n";
  return "# The live state of a cupool holder, written by 'cupool export'.\n" + note + to_yaml(doc);
}
}  // namespace cupool
