// Reconciling (reconciler.h): plan() says what would change; apply() changes it, in order, and only
// what differs.
#include "holder/reconciler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "base/error.h"
#include "base/limits.h"
#include "base/text.h"
#include "base/units.h"
#include "holder/names.h"

namespace cupool {

namespace {

using Action = model::ChangeAction;  // the reconciler's own words for them
using Object = model::ChangeObject;

// Values of a change, as the config writes them and typed (docs/naming.md: no sentinels).
ChangeValue text_value(const std::string& text) { return {text, text}; }
ChangeValue optional_text(const std::string& text) {
  return text.empty() ? ChangeValue{"", nullptr} : text_value(text);
}
ChangeValue size_value(std::uint64_t bytes) { return {exact_size(bytes), bytes}; }
ChangeValue threshold_value(const ReleaseThreshold& t) {
  return {t.text(), t.is_max() ? Json(nullptr) : Json(t.bytes())};
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
  model::ShareValue value{s.users, s.groups, {}};
  if (s.quota_per_client) value.quota_per_client_bytes = s.quota_per_client;
  return {text, model::to_json(value)};
}

}  // namespace

std::vector<Change> Reconciler::plan(const Desired& want) const {
  std::vector<Change> changes;
  plan_holder(want, changes);
  plan_buffers_out(want, changes);
  for (const auto& [key, h] : pools_) plan_pool(key, h, want, changes);
  keep_pools_whole(changes);
  for (const auto& w : want.pools)
    if (!pools_.count({w.name, w.device}))
      changes.push_back({Action::create, Object::pool, w.name, w.device, "", {}, {}, ""});
  for (const auto& w : want.buffers) {
    if (!buffers_.count(w.name)) changes.push_back({Action::create, Object::buffer, w.name, w.device, "", {}, {}, ""});
  }
  return changes;
}

// Why `h` is in use: its leases, by how many clients, and how many of them are cached ("" when none).
std::string Reconciler::lease_note(const HeldPool& h) const {
  const PoolKey key{h.want.name, h.want.device};
  const model::LeaseTotals t = leasing_.book().of(key);
  const std::size_t holders = leasing_.book().clients_of(key);
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
std::vector<std::string> Reconciler::buffers_in(const PoolKey& key, const Desired* keep) const {
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
std::string Reconciler::blocked_reason(const PoolKey& key, const HeldPool& h, const Desired& want) const {
  std::vector<std::string> why;
  const std::string leases = lease_note(h);
  if (!leases.empty()) why.push_back(leases);
  const auto names = buffers_in(key, &want);
  if (!names.empty())
    why.push_back("buffer" + std::string(names.size() == 1 ? " " : "s ") + join(names, ", ") + " in it");
  return join(why, "; ");
}

// The holder section's changes: socket, mode, group.
void Reconciler::plan_holder(const Desired& want, std::vector<Change>& changes) const {
  if (!socket_from_command_line_ && want.holder.socket != holder_.socket)
    changes.push_back({Action::update, Object::holder, "holder", -1, "socket", text_value(holder_.socket),
                       text_value(want.holder.socket), "the socket path changes only when the holder restarts"});
  if (want.holder.mode != holder_.mode) {
    char from[8], to[8];
    std::snprintf(from, sizeof from, "%04o", holder_.mode);
    std::snprintf(to, sizeof to, "%04o", want.holder.mode);
    changes.push_back({Action::update, Object::holder, "holder", -1, "mode", text_value(from), text_value(to), ""});
  }
  if (want.holder.group != holder_.group)
    changes.push_back({Action::update, Object::holder, "holder", -1, "group", optional_text(holder_.group),
                       optional_text(want.holder.group), ""});
}

void Reconciler::plan_buffers_out(const Desired& want, std::vector<Change>& changes) const {
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
      changes.push_back({Action::remove, Object::buffer, name, b.want.device, "", {}, {}, busy});
    } else if (w->pool != b.want.pool || w->device != b.want.device || w->size != b.want.size) {
      changes.push_back({Action::replace, Object::buffer, name, w->device, "size", size_value(b.want.size),
                         size_value(w->size), busy});
    }
  }
}

// The held pool `key` against `want`: removed, replaced (the first property that differs) or
// updated in place.
void Reconciler::plan_pool(const PoolKey& key, const HeldPool& h, const Desired& want,
                           std::vector<Change>& changes) const {
  const PoolWant* w = nullptr;
  for (const auto& pw : want.pools)
    if (pw.name == key.first && pw.device == key.second) w = &pw;
  if (!w) {
    changes.push_back({Action::remove, Object::pool, key.first, key.second, "", {}, {}, blocked_reason(key, h, want)});
    return;
  }
  const PoolProps& a = h.want.props;
  const PoolProps& b = w->props;
  auto replace = [&](const char* field, const ChangeValue& from, const ChangeValue& to) {
    changes.push_back(
        {Action::replace, Object::pool, key.first, key.second, field, from, to, blocked_reason(key, h, want)});
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
      changes.push_back({Action::update, Object::pool, key.first, key.second, field, from, to, ""});
    };
    for (const SettingChange& ch : diff_settings(h.want.settings, w->settings)) {
      // The threshold as the files wrote it ("75%"), not only its bytes.
      if (ch.field == "release_threshold")
        update("release_threshold", threshold_value(h.want.settings.release_threshold),
               threshold_value(w->settings.release_threshold));
      else  // the reuse flags
        update(ch.field.c_str(), {ch.from, ch.from == "true"}, {ch.to, ch.to == "true"});
    }
    if (h.want.access != w->access) {
      // Access can be given but not taken back from memory already handed out.
      bool revokes = false;
      for (int peer : h.want.access)
        if (std::find(w->access.begin(), w->access.end(), peer) == w->access.end()) revokes = true;
      changes.push_back({Action::update, Object::pool, key.first, key.second, "access", access_value(h.want.access),
                         access_value(w->access),
                         revokes ? "peer access is not revoked from a live pool; remove and recreate the pool" : ""});
    }
    if (!(h.want.share == w->share)) update("share", share_value(h.want.share), share_value(w->share));
    if (h.want.reserve != w->reserve) update("reserve", size_value(h.want.reserve), size_value(w->reserve));
  }
}

void Reconciler::keep_pools_whole(std::vector<Change>& changes) {
  // A pool name is one unit: if its replacement is blocked on one device, it is kept on all of
  // them, so the pool's devices never end up with different properties (export writes one entry).
  for (Change& c : changes) {
    if (c.object != Object::pool || c.action != Action::replace || !c.blocked.empty()) continue;
    for (const Change& other : changes)
      if (other.object == Object::pool && other.action == Action::replace && other.name == c.name &&
          !other.blocked.empty()) {
        c.blocked = "pool " + c.name + " is replaced on all its devices or on none; on device " +
                    std::to_string(other.device) + ": " + other.blocked;
        break;
      }
  }
}

std::vector<Change> Reconciler::apply(const Desired& want) {
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
    if (c.object == Object::holder && c.blocked.empty() && (c.field == "mode" || c.field == "group"))
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
    if (c.object == Object::buffer && (c.action == Action::remove || c.action == Action::replace) && c.blocked.empty())
      buffers_.destroy(c.name);
  for (const Change& c : changes) {
    if (c.object != Object::pool || !c.blocked.empty()) continue;
    const PoolKey key{c.name, c.device};
    if (c.action == Action::remove) {
      // Buffers the new config no longer wants in this pool were removed above; any left are kept
      // only if wanted, and then the pool is blocked (plan says so).
      destroy_pool(key);
    } else if (c.action == Action::replace) {
      destroy_pool(key);
      pools_.create(*find_want(c.name, c.device));
    }
  }
  for (const Change& c : changes)
    if (c.object == Object::pool && c.action == Action::create) pools_.create(*find_want(c.name, c.device));
  std::set<PoolKey> updated;
  for (const Change& c : changes)
    if (c.object == Object::pool && c.action == Action::update && c.blocked.empty() &&
        updated.insert({c.name, c.device}).second)
      pools_.update(pools_.at({c.name, c.device}), *find_want(c.name, c.device));
  for (const auto& w : want.buffers)
    if (!buffers_.count(w.name)) {
      bool blocked = false;
      for (const Change& c : changes)
        if (c.object == Object::buffer && c.name == w.name && !c.blocked.empty()) blocked = true;
      if (!blocked) buffers_.create(w);
    }
  return changes;
}

void Reconciler::destroy_pool(const PoolKey& key) {
  if (!pools_.find(key)) return;
  // Buffers that remain in it go first (apply only gets here when none is open).
  for (const auto& n : buffers_.in_pool(key)) buffers_.destroy(n);
  const std::uint64_t generation = pools_.destroy(key);
  // Clients that imported it must not go on using their import: tell them (their next import_pool
  // of the name gets whatever is held then).
  for (auto& [id, c] : clients_) {
    auto imp = c.imported.find(key);
    if (imp == c.imported.end() || imp->second != generation) continue;
    c.imported.erase(imp);
    leasing_.notify(id,
                    proto::to_json(proto::PoolGone{key.first, pools_.device_id(key.second), generation,
                                                   "pool " + key.first + " on device " + std::to_string(key.second) +
                                                       " was replaced or removed: drop your import of it"}));
  }
}

std::set<std::uint64_t> Reconciler::ask_drops_for(const Desired& want) {
  // A pool name is replaced on all its devices or none (plan()): every device of a blocked pool.
  std::set<std::string> names;
  for (const Change& ch : plan(want))
    if (ch.object == Object::pool && (ch.action == Action::remove || ch.action == Action::replace) &&
        !ch.blocked.empty())
      names.insert(ch.name);
  std::set<PoolKey> keys;
  for (const auto& [key, p] : pools_) {
    const model::LeaseTotals t = leasing_.book().of(key);
    if (names.count(key.first) && t.cached_count && t.cached_count == t.lease_count) keys.insert(key);
  }
  if (keys.empty()) return {};
  return leasing_.ask_drops([&](const Lease& l) { return keys.count({l.pool, l.device}) > 0; }, UINT64_MAX, "apply");
}

model::PlanChange change_view(const Change& c, const NodeReport& node) {
  model::PlanChange out;
  out.action = model::change_word(c.action);
  out.object = model::change_word(c.object);
  out.name = c.name;
  if (c.device >= 0) out.id = device_id(node, c.device);
  if (!c.field.empty()) {
    out.field = c.field;
    out.from = c.from.text;
    out.to = c.to.text;
    out.from_value = c.from.value;
    out.to_value = c.to.value;
  }
  if (!c.blocked.empty()) out.blocked = c.blocked;
  return out;
}

}  // namespace cupool
