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

Json Holder::status() const {
  Json out;
  out["holder"] = identity_;
  out["holder"]["backend"] = backend_.simulated() ? "simulated" : "cuda";
  out["holder"]["draining"] = draining_;
  out["holder"]["uptime_s"] = now_s() - created_at_;
  out["pools"] = Json::array();
  for (const auto& [key, p] : pools_) {
    std::uint64_t buffers = 0, buffer_bytes = 0;
    for (const auto& [name, b] : buffers_)
      if (b.want.pool == key.first && b.want.device == key.second) {
        ++buffers;
        buffer_bytes += b.want.size;
      }
    out["pools"].push_back({{"name", key.first},
                            {"device", key.second},
                            {"uuid", device_uuid(key.second)},
                            {"location", location_text(p.want.props)},
                            {"handle_types", handle_names_json(p.want.props.handle_types)},
                            {"max_size", p.want.props.max_size},
                            {"release_threshold", p.want.settings.release_threshold},
                            {"leases", p.leases},
                            {"leased_bytes", p.leased_bytes},
                            {"cached", p.cached},
                            {"cached_bytes", p.cached_bytes},
                            {"buffers", buffers},
                            {"buffer_bytes", buffer_bytes}});
  }
  out["buffers"] = Json::array();
  for (const auto& [name, b] : buffers_)
    out["buffers"].push_back({{"name", name},
                              {"pool", b.want.pool},
                              {"device", b.want.device},
                              {"uuid", device_uuid(b.want.device)},
                              {"size", b.want.size},
                              {"parts", b.parts.size()},
                              {"opens", b.opens},
                              {"state", b.loading ? "loading" : "ready"},
                              {"tensors", b.index ? Json(b.index->tensors.size()) : Json()},
                              {"memory", b.exported ? "exported" : "pool"},
                              {"kept", b.exported && !b.loading && custody_ != nullptr},
                              {"adopted", b.adopted}});
  out["custody"] = custody_status();
  out["clients"] = Json::array();
  out["clients_total"] = clients_.size();
  const std::int64_t now = now_s();
  for (const auto& [id, c] : clients_) {
    std::uint64_t bytes = 0;
    for (const auto& [k, v] : c.bytes_in_pool) bytes += v;
    std::uint64_t opens = 0;
    for (const auto& [k, v] : c.open_buffers) opens += v;
    std::uint64_t cached = 0, cached_bytes = 0, asked = 0;
    for (std::uint64_t l : c.leases) {
      const Lease& lease = leases_.at(l);
      if (!lease.cached) continue;
      ++cached;
      cached_bytes += lease.size;
      if (lease.ask) ++asked;
    }
    out["clients"].push_back({{"id", id},
                              {"pid", c.peer.pid},
                              {"uid", c.peer.uid},
                              {"user", c.peer.user},
                              {"name", c.name},
                              {"leases", c.leases.size()},
                              {"leased_bytes", bytes},
                              {"cached", cached},
                              {"cached_bytes", cached_bytes},
                              {"asked_to_drop", asked},
                              {"protocol", c.protocol},
                              {"open_buffers", opens},
                              {"connected_s", now - c.connected_at}});
  }
  return out;
}

Json Holder::stats(bool reset_peaks) {
  std::set<int> devices;
  for (const auto& [key, p] : pools_) devices.insert(key.second);
  for (int d : devices) backend_.synchronize(d);
  Json out;
  out["pools"] = Json::array();
  for (const auto& [key, p] : pools_) {
    const PoolUsage u = backend_.pool_usage(p.handle);
    if (reset_peaks) backend_.reset_pool_peaks(p.handle);
    out["pools"].push_back({{"name", key.first},
                            {"device", key.second},
                            {"uuid", device_uuid(key.second)},
                            {"pci_bus_id", device_pci_bus_id(key.second)},
                            {"reserved_current", u.reserved_current},
                            {"reserved_high", u.reserved_high},
                            {"used_current", u.used_current},
                            {"used_high", u.used_high},
                            {"release_threshold", p.want.settings.release_threshold},
                            {"leases", p.leases},
                            {"leased_bytes", p.leased_bytes},
                            {"cached", p.cached},
                            {"cached_bytes", p.cached_bytes}});
  }
  out["dropped_bytes"] = dropped_bytes_;
  out["devices"] = Json::array();
  for (int d : devices) {
    const GraphMemUsage g = backend_.graph_mem_usage(d);
    if (reset_peaks) backend_.reset_graph_mem_peaks(d);
    out["devices"].push_back({{"device", d},
                              {"uuid", device_uuid(d)},
                              {"pci_bus_id", device_pci_bus_id(d)},
                              {"graph_reserved_current", g.reserved_current},
                              {"graph_reserved_high", g.reserved_high},
                              {"graph_used_current", g.used_current},
                              {"graph_used_high", g.used_high}});
  }
  return out;
}

Json Holder::trim(std::uint64_t keep, const std::optional<std::string>& pool, bool graph) {
  if (pool) {
    bool any = false;
    for (const auto& [key, p] : pools_) any = any || key.first == *pool;
    if (!any) throw Error(Errc::not_found, "no pool named \"" + valid_utf8(*pool) + "\"");
  }
  std::set<int> devices;
  for (const auto& [key, p] : pools_)
    if (!pool || key.first == *pool) devices.insert(key.second);
  for (int d : devices) backend_.synchronize(d);
  Json out;
  std::uint64_t total = 0;
  out["released"] = 0;
  out["pools"] = Json::array();
  for (const auto& [key, p] : pools_) {
    if (pool && key.first != *pool) continue;
    const std::uint64_t before = backend_.pool_usage(p.handle).reserved_current;
    backend_.trim_pool(p.handle, keep);
    backend_.synchronize(key.second);
    const std::uint64_t after = backend_.pool_usage(p.handle).reserved_current;
    const std::uint64_t released = before > after ? before - after : 0;
    total += released;
    out["pools"].push_back({{"name", key.first},
                            {"device", key.second},
                            {"reserved_before", before},
                            {"reserved_after", after},
                            {"released", released}});
  }
  out["devices"] = Json::array();
  if (graph)
    for (int d : devices) {
      const std::uint64_t before = backend_.graph_mem_usage(d).reserved_current;
      backend_.trim_graph_mem(d);
      const std::uint64_t after = backend_.graph_mem_usage(d).reserved_current;
      const std::uint64_t released = before > after ? before - after : 0;
      total += released;
      out["devices"].push_back({{"device", d},
                                {"uuid", device_uuid(d)},
                                {"graph_reserved_before", before},
                                {"graph_reserved_after", after},
                                {"released", released}});
    }
  out["released"] = total;
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
    Json handles = handle_names_json(w.props.handle_types);
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
