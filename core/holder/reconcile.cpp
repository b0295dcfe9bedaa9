// Reconciling: what a config asks for (config/resolve.h) against what the holder holds. plan() says
// what would change; apply() changes it, in order, and only what differs.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "base/error.h"
#include "base/limits.h"
#include "base/text.h"
#include "base/units.h"
#include "holder/holder.h"
#include "holder/names.h"

namespace cupool {

namespace {

// Values of a change, as the config writes them and typed (docs/naming.md: no sentinels).
ChangeValue text_value(const std::string& text) { return {text, text}; }
ChangeValue optional_text(const std::string& text) {
  return text.empty() ? ChangeValue{"", nullptr} : text_value(text);
}
ChangeValue size_value(std::uint64_t bytes) { return {exact_size(bytes), bytes}; }
ChangeValue threshold_value(const PoolWant& w) {
  const model::Threshold t = model::Threshold::written(w.threshold_text, w.settings.release_threshold);
  return {t.text, t.bytes ? Json(*t.bytes) : Json(nullptr)};
}
ChangeValue handles_value(std::uint32_t mask) {
  const std::vector<std::string> names = handle_type_names(mask);
  return {"[" + join(names, ", ") + "]", names};
}
ChangeValue access_value(const std::vector<int>& peers) { return {list_text(peers), peers}; }
ChangeValue share_value(const ShareRule& s) {
  if (!s.set) return {"", nullptr};
  std::string text = "{users: [" + join(s.users, ", ") + "], groups: [" + join(s.groups, ", ") + "]";
  if (s.quota_per_client) text += ", quota_per_client: " + exact_size(s.quota_per_client);
  text += "}";
  return {text,
          {{"users", s.users},
           {"groups", s.groups},
           {"quota_per_client_bytes", s.quota_per_client ? Json(s.quota_per_client) : Json(nullptr)}}};
}

}  // namespace

std::vector<Change> Holder::plan(const Desired& want) const {
  std::vector<Change> changes;
  plan_holder(want, changes);
  plan_buffers_out(want, changes);
  for (const auto& [key, h] : pools_) plan_pool(key, h, want, changes);
  keep_pools_whole(changes);
  for (const auto& w : want.pools)
    if (!pools_.count({w.name, w.device})) changes.push_back({"create", "pool", w.name, w.device, "", {}, {}, ""});
  for (const auto& w : want.buffers) {
    auto it = buffers_.find(w.name);
    if (it == buffers_.end()) changes.push_back({"create", "buffer", w.name, w.device, "", {}, {}, ""});
  }
  return changes;
}

// Why `h` is in use: its leases, by how many clients, and how many of them are cached ("" when none).
std::string Holder::lease_note(const HeldPool& h) const {
  const PoolKey key{h.want.name, h.want.device};
  const model::LeaseTotals t = leases_.of(key);
  const std::size_t holders = leases_.clients_of(key);
  std::string why;
  if (t.lease_count)
    why = std::to_string(t.lease_count) + (t.lease_count == 1 ? " lease" : " leases") + " held by " +
          std::to_string(holders) + (holders == 1 ? " client" : " clients");
  if (t.cached_count == t.lease_count && t.cached_count)
    why += " (all cached: apply asks for them back first)";
  else if (t.cached_count)
    why += " (" + std::to_string(t.cached_count) + " of them cached)";
  return why;
}

// The buffers in the pool `key` that keep it: those `keep` keeps or that are in use, a client's or
// a tensor set (all of them without `keep`).
std::vector<std::string> Holder::buffers_in(const PoolKey& key, const Desired* keep) const {
  std::vector<std::string> names;
  for (const auto& [name, b] : buffers_) {
    if (b.want.pool != key.first || b.want.device != key.second) continue;
    // A buffer the new config drops (and nobody has open) goes before its pool does.
    bool kept = false;
    if (keep)
      for (const auto& bw : keep->buffers)
        if (bw.name == name && bw.pool == b.want.pool && bw.device == b.want.device && bw.size == b.want.size)
          kept = true;
    if (kept || b.opens > 0 || b.index || !b.from_config || !keep) names.push_back(name);
  }
  return names;
}

// Why the pool `key` can't be replaced or removed for `want` ("" when it can).
std::string Holder::blocked_reason(const PoolKey& key, const HeldPool& h, const Desired& want) const {
  std::vector<std::string> why;
  const std::string leases = lease_note(h);
  if (!leases.empty()) why.push_back(leases);
  const auto names = buffers_in(key, &want);
  if (!names.empty())
    why.push_back("buffer" + std::string(names.size() == 1 ? " " : "s ") + join(names, ", ") + " in it");
  return join(why, "; ");
}

// The holder section's changes: socket, mode, group.
void Holder::plan_holder(const Desired& want, std::vector<Change>& changes) const {
  if (!socket_from_command_line_ && want.holder.socket != holder_.socket)
    changes.push_back({"update", "holder", "holder", -1, "socket", text_value(holder_.socket),
                       text_value(want.holder.socket), "the socket path changes only when the holder restarts"});
  if (want.holder.mode != holder_.mode) {
    char from[8], to[8];
    std::snprintf(from, sizeof from, "%04o", holder_.mode);
    std::snprintf(to, sizeof to, "%04o", want.holder.mode);
    changes.push_back({"update", "holder", "holder", -1, "mode", text_value(from), text_value(to), ""});
  }
  if (want.holder.group != holder_.group)
    changes.push_back({"update", "holder", "holder", -1, "group", optional_text(holder_.group),
                       optional_text(want.holder.group), ""});
}

void Holder::plan_buffers_out(const Desired& want, std::vector<Change>& changes) const {
  // Buffers that go away or change (before pools, so their pools can go).
  for (const auto& [name, b] : buffers_) {
    // A held tensor set (`cupool buffer load`), or any buffer a client made (`cupool buffer
    // create`), is not the config's: apply and a reload leave it alone, and its pool stays while it
    // is there (blocked_reason).
    if (b.index || !b.from_config) continue;
    const BufferWant* w = nullptr;
    for (const auto& bw : want.buffers)
      if (bw.name == name) w = &bw;
    const std::string busy = b.opens ? std::to_string(b.opens) + " open handle" + (b.opens == 1 ? "" : "s") : "";
    if (!w) {
      changes.push_back({"remove", "buffer", name, b.want.device, "", {}, {}, busy});
    } else if (w->pool != b.want.pool || w->device != b.want.device || w->size != b.want.size) {
      changes.push_back(
          {"replace", "buffer", name, w->device, "size", size_value(b.want.size), size_value(w->size), busy});
    }
  }
}

// The held pool `key` against `want`: removed, replaced (the first property that differs) or
// updated in place.
void Holder::plan_pool(const PoolKey& key, const HeldPool& h, const Desired& want, std::vector<Change>& changes) const {
  const PoolWant* w = nullptr;
  for (const auto& pw : want.pools)
    if (pw.name == key.first && pw.device == key.second) w = &pw;
  if (!w) {
    changes.push_back({"remove", "pool", key.first, key.second, "", {}, {}, blocked_reason(key, h, want)});
    return;
  }
  const PoolProps& a = h.want.props;
  const PoolProps& b = w->props;
  auto replace = [&](const char* field, const ChangeValue& from, const ChangeValue& to) {
    changes.push_back({"replace", "pool", key.first, key.second, field, from, to, blocked_reason(key, h, want)});
  };
  if (a.location != b.location || a.location_id != b.location_id)
    replace("location", text_value(location_text(a)), text_value(location_text(b)));
  else if (a.managed != b.managed)
    replace("alloc_type", text_value(a.managed ? "managed" : "pinned"), text_value(b.managed ? "managed" : "pinned"));
  else if (a.handle_types != b.handle_types)
    replace("handle_types", handles_value(a.handle_types), handles_value(b.handle_types));
  else if (a.max_size != b.max_size)
    replace("max_size", a.max_size ? size_value(a.max_size) : ChangeValue{"", nullptr},
            b.max_size ? size_value(b.max_size) : ChangeValue{"", nullptr});
  else {
    auto update = [&](const char* field, const ChangeValue& from, const ChangeValue& to) {
      changes.push_back({"update", "pool", key.first, key.second, field, from, to, ""});
    };
    for (const SettingChange& ch : diff_settings(h.want.settings, w->settings)) {
      // The threshold as the files wrote it ("75%"), not only its bytes.
      if (ch.field == "release_threshold")
        update("release_threshold", threshold_value(h.want), threshold_value(*w));
      else  // the reuse flags
        update(ch.field.c_str(), {ch.from, ch.from == "true"}, {ch.to, ch.to == "true"});
    }
    if (h.want.access != w->access) {
      // Access can be given but not taken back from memory already handed out.
      bool revokes = false;
      for (int peer : h.want.access)
        if (std::find(w->access.begin(), w->access.end(), peer) == w->access.end()) revokes = true;
      changes.push_back({"update", "pool", key.first, key.second, "access", access_value(h.want.access),
                         access_value(w->access),
                         revokes ? "peer access is not revoked from a live pool; remove and recreate the pool" : ""});
    }
    if (!(h.want.share == w->share)) update("share", share_value(h.want.share), share_value(w->share));
    if (h.want.reserve != w->reserve) update("reserve", size_value(h.want.reserve), size_value(w->reserve));
  }
}

void Holder::keep_pools_whole(std::vector<Change>& changes) {
  // A pool name is one unit: if its replacement is blocked on one device, it is kept on all of
  // them, so the pool's devices never end up with different properties (export writes one entry).
  for (Change& c : changes) {
    if (c.object != "pool" || c.action != "replace" || !c.blocked.empty()) continue;
    for (const Change& other : changes)
      if (other.object == "pool" && other.action == "replace" && other.name == c.name && !other.blocked.empty()) {
        c.blocked = "pool " + c.name + " is replaced on all its devices or on none; on device " +
                    std::to_string(other.device) + ": " + other.blocked;
        break;
      }
  }
}

std::vector<Change> Holder::apply(const Desired& want) {
  return then_sync_custody([&] { return make_changes(want); });
}

std::vector<Change> Holder::make_changes(const Desired& want) {
  std::vector<Change> changes = plan(want);
  auto find_want = [&](const std::string& name, int device) -> const PoolWant* {
    for (const auto& pw : want.pools)
      if (pw.name == name && pw.device == device) return &pw;
    return nullptr;
  };
  // 1. holder settings, 2. buffers out, 3. pools out or replaced, 4. pools in, 5. updates, 6. buffers in.
  // Mode and group are made true on the socket and read back before they count as applied; what
  // could not be done is reported as blocked, with why.
  std::vector<Change*> socket_changes;
  for (Change& c : changes)
    if (c.object == "holder" && c.blocked.empty() && (c.field == "mode" || c.field == "group"))
      socket_changes.push_back(&c);
  if (!socket_changes.empty()) {
    try {
      if (socket_) socket_->set(want.holder.mode, want.holder.group);
      holder_.mode = want.holder.mode;
      holder_.group = want.holder.group;
    } catch (const Error& e) {
      for (Change* c : socket_changes) c->blocked = std::string("not applied: ") + e.what();
    }
  }
  for (const Change& c : changes)
    if (c.object == "buffer" && (c.action == "remove" || c.action == "replace") && c.blocked.empty())
      destroy_buffer(c.name);
  for (const Change& c : changes) {
    if (c.object != "pool" || !c.blocked.empty()) continue;
    const PoolKey key{c.name, c.device};
    if (c.action == "remove") {
      // Buffers the new config no longer wants in this pool were removed above; any left are kept
      // only if wanted, and then the pool is blocked (plan says so).
      destroy_pool(key);
    } else if (c.action == "replace") {
      destroy_pool(key);
      create_pool(*find_want(c.name, c.device));
    }
  }
  for (const Change& c : changes)
    if (c.object == "pool" && c.action == "create") create_pool(*find_want(c.name, c.device));
  std::set<PoolKey> updated;
  for (const Change& c : changes)
    if (c.object == "pool" && c.action == "update" && c.blocked.empty() && updated.insert({c.name, c.device}).second)
      update_pool(pools_.at({c.name, c.device}), *find_want(c.name, c.device));
  for (const auto& w : want.buffers)
    if (!buffers_.count(w.name)) {
      bool blocked = false;
      for (const Change& c : changes)
        if (c.object == "buffer" && c.name == w.name && !c.blocked.empty()) blocked = true;
      if (!blocked) create_buffer(w);
    }
  return changes;
}

void Holder::create_pool(const PoolWant& w) {
  HeldPool held;
  held.want = w;
  held.handle = backend_.create_pool(w.device, w.props);
  held.generation = ++next_generation_;
  PoolKey key{w.name, w.device};
  try {
    backend_.set_pool_settings(held.handle, w.settings);
    for (int peer : w.access) backend_.set_pool_access(held.handle, peer);
    if (w.reserve > 0) {
      // Map the reserve and give it back to the pool: it stays reserved because the release
      // threshold is at least the reserve (check enforces it). Read back what really stayed.
      const std::uint64_t address = backend_.allocate(held.handle, w.reserve);
      backend_.free(held.handle, address);
      held.reserved_after_reserve = backend_.pool_usage(held.handle).reserved_bytes;
      if (held.reserved_after_reserve < w.reserve)
        spdlog::warn("pool {} on device {}: reserved {} but only {} stayed reserved after a synchronize", w.name,
                     w.device, format_bytes(w.reserve), format_bytes(held.reserved_after_reserve));
    }
  } catch (...) {
    try {
      backend_.destroy_pool(held.handle);
    } catch (...) {
    }
    throw;
  }
  pools_[key] = std::move(held);
  spdlog::info("created pool {} on device {}", w.name, w.device);
}

void Holder::update_pool(HeldPool& held, const PoolWant& w) {
  if (held.want.settings != w.settings) {
    backend_.set_pool_settings(held.handle, w.settings);
    held.want.settings = w.settings;
    held.want.threshold_text = w.threshold_text;
  }
  for (int peer : w.access)
    if (std::find(held.want.access.begin(), held.want.access.end(), peer) == held.want.access.end()) {
      backend_.set_pool_access(held.handle, peer);
      held.want.access.push_back(peer);
    }
  std::sort(held.want.access.begin(), held.want.access.end());
  held.want.share = w.share;
  if (w.reserve > held.want.reserve) {
    const std::uint64_t address = backend_.allocate(held.handle, w.reserve);
    backend_.free(held.handle, address);
    held.reserved_after_reserve = backend_.pool_usage(held.handle).reserved_bytes;
  }
  held.want.reserve = w.reserve;
}

void Holder::destroy_pool(const PoolKey& key) {
  auto it = pools_.find(key);
  if (it == pools_.end()) return;
  // Buffers that remain in it go first (apply only gets here when none is open).
  std::vector<std::string> names;
  for (const auto& [name, b] : buffers_)
    if (b.want.pool == key.first && b.want.device == key.second) names.push_back(name);
  for (const auto& n : names) destroy_buffer(n);
  backend_.synchronize(key.second);
  backend_.destroy_pool(it->second.handle);
  // Clients that imported it must not go on using their import: tell them (their next import_pool
  // of the name gets whatever is held then).
  const std::uint64_t generation = it->second.generation;
  for (auto& [id, c] : clients_) {
    auto imp = c.imported.find(key);
    if (imp == c.imported.end() || imp->second != generation) continue;
    c.imported.erase(imp);
    notify(id, proto::to_json(proto::PoolGone{key.first, device_id(key.second), generation,
                                              "pool " + key.first + " on device " + std::to_string(key.second) +
                                                  " was replaced or removed: drop your import of it"}));
  }
  pools_.erase(it);
  spdlog::info("removed pool {} on device {}", key.first, key.second);
}

void Holder::create_buffer(const BufferWant& w, const std::vector<std::uint64_t>& part_sizes) {
  auto it = pools_.find({w.pool, w.device});
  if (it == pools_.end()) throw Error(Errc::not_found, "no pool " + w.pool + " on device " + std::to_string(w.device));
  const HeldPool& held = it->second;
  const PoolHandle pool = held.handle;
  HeldBuffer b;
  b.want = w;
  // A buffer in a pool without an IPC handle type is only kept (check warns about it).
  b.shared = (held.want.props.handle_types & static_cast<std::uint32_t>(HandleType::posix_fd)) != 0;
  // A device pool's buffers are exported allocations charged to the pool: they outlive the holder.
  b.exported = held.want.props.location == PoolProps::Location::device;
  const std::vector<std::uint64_t> sizes = part_sizes.empty() ? std::vector<std::uint64_t>{w.size} : part_sizes;
  // What custody's manifest records and a new holder adopts: one bound for all (base/limits.h).
  if (sizes.size() > kMaxBufferParts)
    throw Error(Errc::invalid_input, "buffer " + w.name + " would have " + std::to_string(sizes.size()) +
                                         " parts; a buffer has at most " + std::to_string(kMaxBufferParts));
  if (b.exported && held.want.props.max_size) {
    const std::uint64_t granularity = backend_.allocation_granularity(w.device);
    std::uint64_t need = 0;
    for (const std::uint64_t size : sizes) need += (size + granularity - 1) / granularity * granularity;
    const std::uint64_t charged = buffer_bytes(w.pool, w.device);
    const std::uint64_t reserved = backend_.pool_usage(pool).reserved_bytes;
    if (charged + reserved + need > held.want.props.max_size)
      throw CudaError("cuMemCreate", 2, "CUDA_ERROR_OUT_OF_MEMORY",
                      "pool " + w.pool + " has max_size " + format_bytes(held.want.props.max_size) + ": " +
                          format_bytes(charged) + " in buffers and " + format_bytes(reserved) +
                          " reserved leave no room for " + format_bytes(need));
  }
  auto free_part = [&](const HeldBuffer::Part& part) noexcept {
    try {
      if (b.exported)
        backend_.unmap_exported(part.allocation.address);
      else if (b.shared)
        backend_.free_shared(pool, part.allocation.address);
      else
        backend_.free(pool, part.allocation.address);
    } catch (const std::exception& e) {
      spdlog::error("freeing a part of buffer {} failed: {}", w.name, e.what());
    }
  };
  try {
    for (const std::uint64_t size : sizes) {
      HeldBuffer::Part part;
      part.size = size;
      if (b.exported) {
        const ExportedAllocation a = backend_.create_exported(w.device, size);
        part.fd = Fd(a.fd);
        part.allocation.address = a.address;
        part.mapped = a.size;
      } else if (b.shared) {
        part.allocation = backend_.allocate_shared(pool, size, Backend::Readiness::event);
      } else {
        part.allocation.address = backend_.allocate(pool, size);
      }
      b.parts.push_back(std::move(part));
    }
    // Buffers are opened long after: make them ready now, so opening one needs no event.
    if (b.shared && !b.exported) backend_.synchronize(w.device);
  } catch (...) {
    for (const auto& part : b.parts) free_part(part);
    throw;
  }
  const std::size_t count = b.parts.size();
  b.owner = self_uid_;
  buffers_[w.name] = std::move(b);
  deposit_parts(w.name);
  if (count == 1)
    spdlog::info("created buffer {} ({}) in pool {} on device {}", w.name, format_bytes(w.size), w.pool, w.device);
  else
    spdlog::info("created buffer {} ({} in {} parts) in pool {} on device {}", w.name, format_bytes(w.size), count,
                 w.pool, w.device);
}

void Holder::destroy_buffer(const std::string& name) {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) return;
  const HeldBuffer& b = it->second;
  auto p = pools_.find({b.want.pool, b.want.device});
  if (b.exported && custody_) {
    // Out of custody once a manifest without it is in (sync_custody).
    for (std::size_t i = 0; i < b.parts.size(); ++i) custody_removals_.push_back(custody::part_fd_name(name, i));
    manifest_stale_ = true;
  }
  for (const auto& part : b.parts) {
    if (b.exported)
      backend_.unmap_exported(part.allocation.address);
    else if (p == pools_.end())
      continue;
    else if (b.shared)
      backend_.free_shared(p->second.handle, part.allocation.address);
    else
      backend_.free(p->second.handle, part.allocation.address);
  }
  buffers_.erase(it);
  spdlog::info("removed buffer {}", name);
}

std::uint64_t Holder::buffer_bytes(const std::string& pool, int device) const {
  std::uint64_t total = 0;
  for (const auto& [name, b] : buffers_)
    if (b.exported && b.want.pool == pool && b.want.device == device)
      for (const auto& part : b.parts) total += part.mapped;
  return total;
}
}  // namespace cupool
