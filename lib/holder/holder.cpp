#include "holder/holder.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include <spdlog/spdlog.h>

#include "base/error.h"
#include "base/output.h"
#include "base/text.h"
#include "base/units.h"
#include "spec/load.h"

namespace cupool {


namespace {

constexpr std::size_t kMaxName = 64;
constexpr std::uint64_t kMaxAllocation = 1ULL << 48;
constexpr std::size_t kStatusClients = 256;  // clients listed in a status reply

std::int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void fail(Errc code, const std::string& message) { throw Error(code, message); }

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > kMaxName) return false;
  auto lower_digit = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!lower_digit(s[0])) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return lower_digit(c) || c == '.' || c == '_' || c == '-'; });
}

// "32GiB" when exact in a binary unit, else "<n>B": what a config file accepts and means exactly.
std::string exact_size(std::uint64_t bytes) {
  static const char* units[] = {"TiB", "GiB", "MiB", "KiB"};
  static const int shifts[] = {40, 30, 20, 10};
  for (int i = 0; i < 4; ++i) {
    const std::uint64_t unit = 1ULL << shifts[i];
    if (bytes >= unit && bytes % unit == 0) return std::to_string(bytes / unit) + units[i];
  }
  return std::to_string(bytes) + "B";
}

std::string location_text(const PoolProps& p) {
  switch (p.location) {
    case PoolProps::Location::device: return "device";
    case PoolProps::Location::host: return "host";
    case PoolProps::Location::host_numa: return "host_numa:" + std::to_string(p.location_id);
  }
  return "device";
}

Json handle_names_json(std::uint32_t mask) {
  Json out = Json::array();
  if (mask & static_cast<std::uint32_t>(HandleType::posix_fd)) out.push_back("posix_fd");
  if (mask & static_cast<std::uint32_t>(HandleType::fabric)) out.push_back("fabric");
  if (out.empty()) out.push_back("none");
  return out;
}

std::string list_text(const std::vector<int>& v) {
  std::vector<std::string> parts;
  for (int i : v) parts.push_back(std::to_string(i));
  return "[" + join(parts, ", ") + "]";
}

std::string share_text(const ShareRule& s) {
  if (!s.set) return "none";
  return "users [" + join(s.users, ", ") + "], groups [" + join(s.groups, ", ") + "], quota " +
         (s.quota_per_client ? format_bytes(s.quota_per_client) : "none");
}

}  // namespace

Json Change::to_json() const {
  Json j;
  j["action"] = action;
  j["object"] = object;
  j["name"] = name;
  if (device >= 0) j["device"] = device;
  if (!field.empty()) {
    j["field"] = field;
    j["from"] = from;
    j["to"] = to;
  }
  if (!blocked.empty()) j["blocked"] = blocked;
  return j;
}

// ---- Holder ----

Holder::Holder(Backend& backend, NodeReport node, std::uint32_t self_uid, Limits limits)
    : backend_(backend), node_(std::move(node)), self_uid_(self_uid), limits_(limits), created_at_(now_s()) {}

Holder::~Holder() { shutdown(); }

std::string Holder::device_uuid(int device) const {
  const DeviceReport* d = node_.device(device);
  return d ? d->info.uuid : "";
}

std::vector<Change> Holder::plan(const Desired& want) const {
  std::vector<Change> changes;
  auto lease_note = [&](const HeldPool& h) {
    std::set<std::uint64_t> holders;
    for (const auto& [id, l] : leases_)
      if (l.pool == h.want.name && l.device == h.want.device) holders.insert(l.client);
    std::string why;
    if (h.leases)
      why = std::to_string(h.leases) + (h.leases == 1 ? " lease" : " leases") + " held by " + std::to_string(holders.size()) +
            (holders.size() == 1 ? " client" : " clients");
    return why;
  };
  auto buffers_in = [&](const PoolKey& key, const Desired* keep) {
    std::vector<std::string> names;
    for (const auto& [name, b] : buffers_) {
      if (b.want.pool != key.first || b.want.device != key.second) continue;
      // A buffer the new config drops (and nobody has open) goes before its pool does.
      bool kept = false;
      if (keep)
        for (const auto& bw : keep->buffers)
          if (bw.name == name && bw.pool == b.want.pool && bw.device == b.want.device && bw.size == b.want.size) kept = true;
      if (kept || b.opens > 0 || !keep) names.push_back(name);
    }
    return names;
  };
  auto blocked_reason = [&](const PoolKey& key, const HeldPool& h) {
    std::vector<std::string> why;
    const std::string leases = lease_note(h);
    if (!leases.empty()) why.push_back(leases);
    const auto names = buffers_in(key, &want);
    if (!names.empty()) why.push_back("buffer" + std::string(names.size() == 1 ? " " : "s ") + join(names, ", ") + " in it");
    return join(why, "; ");
  };

  if (want.holder.socket != holder_.socket)
    changes.push_back({"update", "holder", "holder", -1, "socket", holder_.socket, want.holder.socket,
                       "the socket path changes only when the holder restarts"});
  if (want.holder.mode != holder_.mode) {
    char from[8], to[8];
    std::snprintf(from, sizeof from, "%04o", holder_.mode);
    std::snprintf(to, sizeof to, "%04o", want.holder.mode);
    changes.push_back({"update", "holder", "holder", -1, "mode", from, to, ""});
  }
  if (want.holder.group != holder_.group)
    changes.push_back({"update", "holder", "holder", -1, "group", holder_.group.empty() ? "(none)" : holder_.group,
                       want.holder.group.empty() ? "(none)" : want.holder.group, ""});

  // Buffers that go away or change (before pools, so their pools can go).
  for (const auto& [name, b] : buffers_) {
    const BufferWant* w = nullptr;
    for (const auto& bw : want.buffers)
      if (bw.name == name) w = &bw;
    const std::string busy = b.opens ? std::to_string(b.opens) + " open handle" + (b.opens == 1 ? "" : "s") : "";
    if (!w) {
      changes.push_back({"remove", "buffer", name, b.want.device, "", "", "", busy});
    } else if (w->pool != b.want.pool || w->device != b.want.device || w->size != b.want.size) {
      changes.push_back({"replace", "buffer", name, w->device, "size", format_bytes(b.want.size), format_bytes(w->size), busy});
    }
  }

  for (const auto& entry : pools_) {
    // Named references, not a structured binding: the lambdas below capture them (C++17 doesn't
    // allow capturing structured bindings; clang refuses it).
    const PoolKey& key = entry.first;
    const HeldPool& h = entry.second;
    const PoolWant* w = nullptr;
    for (const auto& pw : want.pools)
      if (pw.name == key.first && pw.device == key.second) w = &pw;
    if (!w) {
      changes.push_back({"remove", "pool", key.first, key.second, "", "", "", blocked_reason(key, h)});
      continue;
    }
    const PoolProps& a = h.want.props;
    const PoolProps& b = w->props;
    auto replace = [&](const char* field, const std::string& from, const std::string& to) {
      changes.push_back({"replace", "pool", key.first, key.second, field, from, to, blocked_reason(key, h)});
    };
    if (a.location != b.location || a.location_id != b.location_id) replace("location", location_text(a), location_text(b));
    else if (a.managed != b.managed) replace("alloc_type", a.managed ? "managed" : "pinned", b.managed ? "managed" : "pinned");
    else if (a.handle_types != b.handle_types)
      replace("handle_types", handle_names_json(a.handle_types).dump(), handle_names_json(b.handle_types).dump());
    else if (a.max_size != b.max_size)
      replace("max_size", a.max_size ? format_bytes(a.max_size) : "default", b.max_size ? format_bytes(b.max_size) : "default");
    else {
      auto update = [&](const char* field, const std::string& from, const std::string& to) {
        changes.push_back({"update", "pool", key.first, key.second, field, from, to, ""});
      };
      for (const SettingChange& ch : diff_settings(h.want.settings, w->settings)) {
        // The threshold as the files wrote it ("75%"), not only its bytes.
        if (ch.field == "release_threshold") update("release_threshold", h.want.threshold_text, w->threshold_text);
        else update(ch.field.c_str(), ch.from, ch.to);
      }
      if (h.want.access != w->access) {
        // Access can be given but not taken back from memory already handed out.
        bool revokes = false;
        for (int peer : h.want.access)
          if (std::find(w->access.begin(), w->access.end(), peer) == w->access.end()) revokes = true;
        changes.push_back({"update", "pool", key.first, key.second, "access", list_text(h.want.access), list_text(w->access),
                           revokes ? "peer access is not revoked from a live pool; remove and recreate the pool" : ""});
      }
      if (!(h.want.share == w->share)) update("share", share_text(h.want.share), share_text(w->share));
      if (h.want.reserve != w->reserve)
        update("reserve", format_bytes(h.want.reserve), format_bytes(w->reserve));
    }
  }
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
  for (const auto& w : want.pools)
    if (!pools_.count({w.name, w.device})) changes.push_back({"create", "pool", w.name, w.device, "", "", "", ""});
  for (const auto& w : want.buffers) {
    auto it = buffers_.find(w.name);
    if (it == buffers_.end()) changes.push_back({"create", "buffer", w.name, w.device, "", "", "", ""});
  }
  return changes;
}

std::vector<Change> Holder::apply(const Desired& want) {
  std::vector<Change> changes = plan(want);
  auto find_want = [&](const std::string& name, int device) -> const PoolWant* {
    for (const auto& pw : want.pools)
      if (pw.name == name && pw.device == device) return &pw;
    return nullptr;
  };
  // 1. holder settings, 2. buffers out, 3. pools out or replaced, 4. pools in, 5. updates, 6. buffers in.
  for (const Change& c : changes) {
    if (c.object != "holder" || !c.blocked.empty()) continue;
    if (c.field == "mode") holder_.mode = want.holder.mode;
    if (c.field == "group") holder_.group = want.holder.group;
  }
  for (const Change& c : changes)
    if (c.object == "buffer" && (c.action == "remove" || c.action == "replace") && c.blocked.empty()) destroy_buffer(c.name);
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
  PoolKey key{w.name, w.device};
  try {
    backend_.set_pool_settings(held.handle, w.settings);
    for (int peer : w.access) backend_.set_pool_access(held.handle, peer);
    if (w.reserve > 0) {
      // Map the reserve and give it back to the pool: it stays reserved because the release
      // threshold is at least the reserve (check enforces it). Read back what really stayed.
      const std::uint64_t address = backend_.allocate(held.handle, w.reserve);
      backend_.free(held.handle, address);
      held.reserved_after_reserve = backend_.pool_usage(held.handle).reserved_current;
      if (held.reserved_after_reserve < w.reserve)
        spdlog::warn("pool {} on device {}: reserved {} but only {} stayed reserved after a synchronize", w.name, w.device,
                     format_bytes(w.reserve), format_bytes(held.reserved_after_reserve));
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
    held.reserved_after_reserve = backend_.pool_usage(held.handle).reserved_current;
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
  pools_.erase(it);
  spdlog::info("removed pool {} on device {}", key.first, key.second);
}

void Holder::create_buffer(const BufferWant& w) {
  auto it = pools_.find({w.pool, w.device});
  if (it == pools_.end()) fail(Errc::not_found, "no pool " + w.pool + " on device " + std::to_string(w.device));
  HeldBuffer b;
  b.want = w;
  // A buffer in a pool without an IPC handle type is only kept (check warns about it).
  b.shared = (it->second.want.props.handle_types & static_cast<std::uint32_t>(HandleType::posix_fd)) != 0;
  if (b.shared) {
    b.allocation = backend_.allocate_shared(it->second.handle, w.size);
    // Buffers are opened long after: make them ready now, so opening one needs no event.
    backend_.synchronize(w.device);
  } else {
    b.allocation.address = backend_.allocate(it->second.handle, w.size);
  }
  buffers_[w.name] = b;
  spdlog::info("created buffer {} ({}) in pool {} on device {}", w.name, format_bytes(w.size), w.pool, w.device);
}

void Holder::destroy_buffer(const std::string& name) {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) return;
  auto p = pools_.find({it->second.want.pool, it->second.want.device});
  if (p != pools_.end()) {
    if (it->second.shared) backend_.free_shared(p->second.handle, it->second.allocation.address);
    else backend_.free(p->second.handle, it->second.allocation.address);
  }
  buffers_.erase(it);
  spdlog::info("removed buffer {}", name);
}

// ---- clients ----

std::uint64_t Holder::connect(const Peer& peer) {
  const bool admin = peer.uid == 0 || peer.uid == self_uid_;
  if (clients_.size() >= limits_.max_clients + (admin ? limits_.admin_reserve : 0))
    fail(Errc::limit_exceeded, "the holder serves at most " + std::to_string(limits_.max_clients) + " connections" +
                               (admin ? " (and " + std::to_string(limits_.admin_reserve) + " more for admins)" : ""));
  if (!admin) {
    const auto same_user = std::count_if(clients_.begin(), clients_.end(),
                                         [&](const auto& kv) { return kv.second.peer.uid == peer.uid; });
    if (static_cast<std::size_t>(same_user) >= limits_.max_clients_per_user)
      fail(Errc::limit_exceeded, "the holder serves at most " + std::to_string(limits_.max_clients_per_user) +
                                 " connections per user, and user " + peer.user + " (uid " + std::to_string(peer.uid) +
                                 ") has them all");
  }
  Client c;
  c.peer = peer;
  c.admin = admin;
  c.connected_at = now_s();
  clients_[++next_client_] = std::move(c);
  return next_client_;
}

void Holder::disconnect(std::uint64_t id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  const std::set<std::uint64_t> leases = it->second.leases;
  for (std::uint64_t l : leases) free_lease(l);
  for (const auto& [name, opens] : it->second.open_buffers) {
    auto b = buffers_.find(name);
    if (b != buffers_.end()) b->second.opens -= std::min(b->second.opens, opens);
  }
  if (!leases.empty())
    spdlog::info("client {} (pid {}) left; freed {} lease{}", id, it->second.peer.pid, leases.size(), leases.size() == 1 ? "" : "s");
  clients_.erase(it);
}

void Holder::free_lease(std::uint64_t id) noexcept {
  auto it = leases_.find(id);
  if (it == leases_.end()) return;
  const Lease l = it->second;
  leases_.erase(it);
  auto p = pools_.find({l.pool, l.device});
  if (p != pools_.end()) {
    try {
      backend_.free_shared(p->second.handle, l.address);
    } catch (const std::exception& e) {
      spdlog::error("freeing lease {} in pool {}: {}", id, l.pool, e.what());
    }
    p->second.leases -= 1;
    p->second.leased_bytes -= l.size;
  }
  auto c = clients_.find(l.client);
  if (c != clients_.end()) {
    c->second.leases.erase(id);
    auto& bytes = c->second.bytes_in_pool[{l.pool, l.device}];
    bytes -= std::min(bytes, l.size);
  }
}

Holder::Client& Holder::client(std::uint64_t id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) fail(Errc::internal, "unknown connection");
  return it->second;
}

bool Holder::permitted(const Client& c, const HeldPool& p) const {
  if (c.admin) return true;
  if (!p.want.share.set) return false;
  const auto& s = p.want.share;
  if (!c.peer.user.empty() && std::find(s.users.begin(), s.users.end(), c.peer.user) != s.users.end()) return true;
  for (const auto& g : c.peer.group_names)
    if (std::find(s.groups.begin(), s.groups.end(), g) != s.groups.end()) return true;
  return false;
}

void Holder::require_admin(const Client& c, const char* op) const {
  if (c.admin) return;
  fail(Errc::not_permitted, std::string(op) + " needs the holder's user or root; you are " +
                            (c.peer.user.empty() ? "uid " + std::to_string(c.peer.uid) : c.peer.user));
}

void Holder::require_not_draining(const char* op) const {
  if (draining_) fail(Errc::draining, std::string("the holder is stopping and takes no new ") + op + " requests");
}

Holder::HeldPool& Holder::pool_for(const Client& c, const std::string& name, int device, bool for_use) {
  HeldPool* found = nullptr;
  for (auto& [key, p] : pools_)
    if (key.first == name && (device < 0 || key.second == device)) {
      found = &p;
      break;
    }
  if (!found) {
    bool any = false;
    for (const auto& [key, p] : pools_) any = any || key.first == name;
    if (any) fail(Errc::not_found, "pool " + name + " is not held on device " + std::to_string(device));
    std::vector<std::string> names;
    for (const auto& [key, p] : pools_) names.push_back(key.first);
    const std::string hint = did_you_mean(name, names);
    fail(Errc::not_found, "no pool named \"" + valid_utf8(name) + "\"" + (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
  }
  if (for_use) {
    if (found->want.props.handle_types == 0)
      fail(Errc::bad_request, "pool " + name + " has no IPC handle type, so it can't be shared with other processes");
    if (!permitted(c, *found))
      fail(Errc::not_permitted, "pool " + name + " is not shared with " +
                                (c.peer.user.empty() ? "uid " + std::to_string(c.peer.uid) : "user " + c.peer.user) +
                                (found->want.share.set ? " (its share list names users [" + join(found->want.share.users, ", ") +
                                                             "] and groups [" + join(found->want.share.groups, ", ") + "])"
                                                       : " (it has no share list: only the holder's user and root may use it)"));
    if ((found->want.props.handle_types & static_cast<std::uint32_t>(HandleType::posix_fd)) == 0)
      fail(Errc::bad_request, "pool " + name + " is shared only through fabric handles, which this holder does not serve yet");
  }
  return *found;
}

Json Holder::handle(std::uint64_t id, const Json& request, int& fd_out) {
  fd_out = -1;
  Client& c = client(id);
  proto::Args a(request);
  auto op_it = request.find("op");
  if (op_it == request.end() || !op_it->is_string()) fail(Errc::bad_request, "a request needs \"op\", a string");
  const std::string op = op_it->get<std::string>();
  if (auto id_it = request.find("id"); id_it == request.end() || !id_it->is_number_integer() ||
                                       id_it->get<std::int64_t>() < 0 || id_it->get<std::int64_t>() >= (1LL << 53))
    fail(Errc::bad_request, "a request needs \"id\", an integer from 0 to 2^53-1");
  if (!c.greeted && op != "hello") fail(Errc::hello_required, "the first request on a connection must be \"hello\"");

  Json out;
  if (op == "hello") out = op_hello(c, a);
  else if (op == "list") { out = op_list(c); }
  else if (op == "import_pool") out = op_import_pool(c, a, fd_out);
  else if (op == "alloc") out = op_alloc(id, c, a);
  else if (op == "free") out = op_free(c, a);
  else if (op == "buffer_open") out = op_buffer_open(c, a);
  else if (op == "buffer_close") out = op_buffer_close(c, a);
  else if (op == "status") out = status();
  else if (op == "stats") {
    const bool reset = a.boolean("reset_peaks", false);
    if (reset) require_admin(c, "stats with reset_peaks");
    a.finish();
    out = stats(reset);
  } else if (op == "trim") {
    require_admin(c, "trim");
    const std::uint64_t keep = a.optional_u64("keep", 0, UINT64_MAX).value_or(0);
    const auto pool = a.optional_string("pool", kMaxName);
    const bool graph = a.boolean("graph", true);
    a.finish();
    out = trim(keep, pool, graph);
  } else if (op == "plan") out = op_plan(c, a, false);
  else if (op == "apply") out = op_plan(c, a, true);
  else if (op == "export") {
    a.finish();
    out["config"] = export_config();
  } else if (op == "buffer_create") out = op_buffer_create(c, a);
  else if (op == "buffer_remove") out = op_buffer_remove(c, a);
  else {
    static const std::vector<std::string> ops = {"hello", "list", "import_pool", "alloc", "free", "buffer_open",
                                                 "buffer_close", "status", "stats", "trim", "plan", "apply",
                                                 "export", "buffer_create", "buffer_remove"};
    const std::string hint = did_you_mean(op, ops);
    fail(Errc::unknown_op, "unknown operation \"" + valid_utf8(op) + "\"" + (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
  }
  a.finish();
  return out;
}

Json Holder::op_hello(Client& c, proto::Args& a) {
  const std::uint64_t version = a.u64("protocol", 0, 65535);
  const auto name = a.optional_string("client", kMaxName);
  a.finish();
  if (version != proto::kVersion)
    fail(Errc::unsupported_protocol, "this holder speaks protocol version 1, not " + std::to_string(version));
  if (name) {
    for (char ch : *name)
      if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) fail(Errc::bad_request, "\"client\" must be printable");
    c.name = *name;
  }
  c.greeted = true;
  Json out;
  out["protocol"] = proto::kVersion;
  out["holder"] = std::string("cupool ") + CUPOOL_VERSION;
  out["pid"] = identity_.value("pid", 0);
  out["backend"] = backend_.simulated() ? "simulated" : "cuda";
  out["peer"] = {{"pid", c.peer.pid}, {"uid", c.peer.uid}, {"gid", c.peer.gid}, {"user", c.peer.user}, {"admin", c.admin}};
  out["limits"] = {{"max_payload", proto::kMaxPayload},
                   {"max_leases", limits_.max_leases_per_client},
                   {"max_open_buffers", limits_.max_open_buffers_per_client},
                   {"frame_timeout_ms", 5000},
                   {"max_queued_bytes", 1 << 20}};
  return out;
}

Json Holder::op_list(Client& c) {
  Json out;
  out["pools"] = Json::array();
  for (const auto& [key, p] : pools_) {
    out["pools"].push_back({{"name", key.first},
                            {"device", key.second},
                            {"uuid", device_uuid(key.second)},
                            {"location", location_text(p.want.props)},
                            {"handle_types", handle_names_json(p.want.props.handle_types)},
                            {"max_size", p.want.props.max_size},
                            {"permitted", p.want.props.handle_types != 0 && permitted(c, p)}});
  }
  out["buffers"] = Json::array();
  for (const auto& [name, b] : buffers_) {
    auto p = pools_.find({b.want.pool, b.want.device});
    out["buffers"].push_back({{"name", name},
                              {"pool", b.want.pool},
                              {"device", b.want.device},
                              {"uuid", device_uuid(b.want.device)},
                              {"size", b.want.size},
                              {"opens", b.opens},
                              {"permitted", b.shared && p != pools_.end() && permitted(c, p->second)}});
  }
  return out;
}

Json Holder::op_import_pool(Client& c, proto::Args& a, int& fd_out) {
  const std::string name = a.string("pool", kMaxName);
  const int device = a.device("device", -1);
  a.finish();
  require_not_draining("import_pool");
  HeldPool& p = pool_for(c, name, device, true);
  Json out;
  out["pool"] = p.want.name;
  out["device"] = p.want.device;
  out["uuid"] = device_uuid(p.want.device);
  out["handle_type"] = "posix_fd";
  out["access"] = Json::array();
  for (int peer : p.want.access) out["access"].push_back({{"device", peer}, {"uuid", device_uuid(peer)}});
  out["ready_event"] = proto::to_hex(backend_.ready_event(p.want.device));
  fd_out = backend_.export_pool_fd(p.handle);
  return out;
}

Json Holder::op_alloc(std::uint64_t id, Client& c, proto::Args& a) {
  const std::string name = a.string("pool", kMaxName);
  const int device = a.device("device", -1);
  const std::uint64_t size = a.u64("size", 1, kMaxAllocation);
  const bool synchronize = a.boolean("synchronize", false);
  a.finish();
  require_not_draining("alloc");
  HeldPool& p = pool_for(c, name, device, true);
  if (c.leases.size() >= limits_.max_leases_per_client)
    fail(Errc::limit_exceeded, "a connection may hold at most " + std::to_string(limits_.max_leases_per_client) + " leases");
  const PoolKey key{p.want.name, p.want.device};
  const std::uint64_t held = c.bytes_in_pool[key];
  const std::uint64_t quota = p.want.share.quota_per_client;
  if (quota && (size > quota || held > quota - size))
    fail(Errc::quota_exceeded, "pool " + p.want.name + " on device " + std::to_string(p.want.device) + ": " + format_bytes(quota) +
                               " quota per client; this client holds " + format_bytes(held) + " and asked for " +
                               format_bytes(size));
  SharedAllocation s;
  try {
    s = backend_.allocate_shared(p.handle, size);
  } catch (const CudaError& e) {
    if (e.name() == "CUDA_ERROR_OUT_OF_MEMORY")
      fail(Errc::out_of_memory, "pool " + p.want.name + " on device " + std::to_string(p.want.device) + " has no room for " +
                                format_bytes(size) + " (" + e.what() + ")");
    throw;
  }
  if (synchronize) {
    try {
      backend_.synchronize(p.want.device);
    } catch (...) {
      try {
        backend_.free_shared(p.handle, s.address);
      } catch (...) {
      }
      throw;
    }
  }
  const std::uint64_t lease = ++next_lease_;
  leases_[lease] = Lease{id, p.want.name, p.want.device, size, s.address};
  c.leases.insert(lease);
  c.bytes_in_pool[key] = held + size;
  p.leases += 1;
  p.leased_bytes += size;
  Json out;
  out["lease"] = lease;
  out["size"] = size;
  out["pool"] = p.want.name;
  out["device"] = p.want.device;
  out["uuid"] = device_uuid(p.want.device);
  out["export_data"] = proto::to_hex(s.export_data);
  out["ready"] = synchronize;
  out["ready_event"] = proto::to_hex(backend_.ready_event(p.want.device));
  return out;
}

Json Holder::op_free(Client& c, proto::Args& a) {
  const std::uint64_t lease = a.u64("lease", 1, UINT64_MAX);
  a.finish();
  auto it = leases_.find(lease);
  if (it == leases_.end() || !c.leases.count(lease))
    fail(Errc::not_found, "lease " + std::to_string(lease) + " is not held by this connection");
  const std::uint64_t size = it->second.size;
  free_lease(lease);
  return {{"lease", lease}, {"size", size}};
}

Json Holder::op_buffer_open(Client& c, proto::Args& a) {
  const std::string name = a.string("name", kMaxName);
  a.finish();
  require_not_draining("buffer_open");
  auto it = buffers_.find(name);
  if (it == buffers_.end()) fail(Errc::not_found, "no buffer named \"" + valid_utf8(name) + "\"");
  HeldBuffer& b = it->second;
  HeldPool& p = pool_for(c, b.want.pool, b.want.device, true);
  auto open = c.open_buffers.find(name);
  if (open == c.open_buffers.end() && c.open_buffers.size() >= limits_.max_open_buffers_per_client)
    fail(Errc::limit_exceeded, "a connection may have at most " + std::to_string(limits_.max_open_buffers_per_client) + " buffers open");
  c.open_buffers[name] += 1;
  b.opens += 1;
  Json out;
  out["name"] = name;
  out["pool"] = b.want.pool;
  out["device"] = b.want.device;
  out["uuid"] = device_uuid(b.want.device);
  out["size"] = b.want.size;
  out["export_data"] = proto::to_hex(b.allocation.export_data);
  out["ready"] = true;
  out["ready_event"] = proto::to_hex(backend_.ready_event(p.want.device));
  return out;
}

Json Holder::op_buffer_close(Client& c, proto::Args& a) {
  const std::string name = a.string("name", kMaxName);
  a.finish();
  auto open = c.open_buffers.find(name);
  if (open == c.open_buffers.end()) fail(Errc::not_found, "buffer \"" + valid_utf8(name) + "\" is not open on this connection");
  if (--open->second == 0) c.open_buffers.erase(open);
  auto it = buffers_.find(name);
  if (it != buffers_.end() && it->second.opens > 0) it->second.opens -= 1;
  return {{"name", name}};
}

Json Holder::op_buffer_create(Client& c, proto::Args& a) {
  const std::string name = a.string("name", kMaxName);
  const std::string pool = a.string("pool", kMaxName);
  const int device = a.device("device", -1);
  const std::uint64_t size = a.u64("size", 1, kMaxAllocation);
  a.finish();
  require_admin(c, "buffer_create");
  require_not_draining("buffer_create");
  if (!valid_name(name))
    fail(Errc::bad_request, "buffer name \"" + valid_utf8(name) + "\" must match [a-z0-9][a-z0-9._-]* (at most 64 characters)");
  if (buffers_.count(name)) fail(Errc::exists, "a buffer named " + name + " exists");
  HeldPool& p = pool_for(c, pool, device, true);  // a buffer is for sharing: an IPC pool
  BufferWant w{name, pool, p.want.device, size};
  try {
    create_buffer(w);
  } catch (const CudaError& e) {
    if (e.name() == "CUDA_ERROR_OUT_OF_MEMORY")
      fail(Errc::out_of_memory, "pool " + pool + " has no room for " + format_bytes(size) + " (" + e.what() + ")");
    throw;
  }
  return {{"name", name}, {"pool", pool}, {"device", p.want.device}, {"size", size}};
}

Json Holder::op_buffer_remove(Client& c, proto::Args& a) {
  const std::string name = a.string("name", kMaxName);
  const bool force = a.boolean("force", false);
  a.finish();
  require_admin(c, "buffer_remove");
  auto it = buffers_.find(name);
  if (it == buffers_.end()) fail(Errc::not_found, "no buffer named \"" + valid_utf8(name) + "\"");
  if (it->second.opens > 0 && !force)
    fail(Errc::busy, "buffer " + name + " is open " + std::to_string(it->second.opens) +
                     (it->second.opens == 1 ? " time" : " times") + "; close it first, or pass force");
  const BufferWant w = it->second.want;
  for (auto& [id, cl] : clients_) cl.open_buffers.erase(name);
  destroy_buffer(name);
  return {{"name", w.name}, {"pool", w.pool}, {"device", w.device}, {"size", w.size}};
}

Json Holder::op_plan(Client& c, proto::Args& a, bool apply) {
  const std::string text = a.string("config", proto::kMaxPayload);
  const std::string path = a.optional_string("path", 4096).value_or("<request>");
  a.finish();
  if (apply) {
    require_admin(c, "apply");
    require_not_draining("apply");
  }
  // A ConfigRejected goes up: the conversation answers invalid_config with the findings.
  const Loaded loaded = load_config(SourceFile(valid_utf8(path), text), node_, Scope::all);
  std::vector<Change> changes = apply ? this->apply(loaded.desired) : plan(loaded.desired);
  Json out;
  out["applied"] = apply;
  out["changes"] = Json::array();
  for (const auto& ch : changes) out["changes"].push_back(ch.to_json());
  out["warnings"] = loaded.warnings;
  return out;
}

// ---- reports ----

std::size_t Holder::lease_count() const { return leases_.size(); }

std::uint64_t Holder::leased_bytes() const {
  std::uint64_t total = 0;
  for (const auto& [id, l] : leases_) total += l.size;
  return total;
}

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
                            {"buffers", buffers},
                            {"buffer_bytes", buffer_bytes}});
  }
  out["buffers"] = Json::array();
  for (const auto& [name, b] : buffers_)
    out["buffers"].push_back(
        {{"name", name}, {"pool", b.want.pool}, {"device", b.want.device}, {"uuid", device_uuid(b.want.device)},
         {"size", b.want.size}, {"opens", b.opens}});
  out["clients"] = Json::array();
  out["clients_total"] = clients_.size();
  const std::int64_t now = now_s();
  std::size_t shown = 0;
  for (const auto& [id, c] : clients_) {
    // A reply must fit in one frame: the first kStatusClients clients are listed, all are counted.
    if (++shown > kStatusClients) break;
    std::uint64_t bytes = 0;
    for (const auto& [k, v] : c.bytes_in_pool) bytes += v;
    std::uint64_t opens = 0;
    for (const auto& [k, v] : c.open_buffers) opens += v;
    out["clients"].push_back({{"id", id},
                              {"pid", c.peer.pid},
                              {"uid", c.peer.uid},
                              {"user", c.peer.user},
                              {"name", c.name},
                              {"leases", c.leases.size()},
                              {"leased_bytes", bytes},
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
                            {"reserved_current", u.reserved_current},
                            {"reserved_high", u.reserved_high},
                            {"used_current", u.used_current},
                            {"used_high", u.used_high},
                            {"release_threshold", p.want.settings.release_threshold},
                            {"leases", p.leases},
                            {"leased_bytes", p.leased_bytes}});
  }
  out["devices"] = Json::array();
  for (int d : devices) {
    const GraphMemUsage g = backend_.graph_mem_usage(d);
    if (reset_peaks) backend_.reset_graph_mem_peaks(d);
    out["devices"].push_back({{"device", d},
                              {"uuid", device_uuid(d)},
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
    if (!any) fail(Errc::not_found, "no pool named \"" + valid_utf8(*pool) + "\"");
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
      out["devices"].push_back(
          {{"device", d}, {"uuid", device_uuid(d)}, {"graph_reserved_before", before}, {"graph_reserved_after", after}, {"released", released}});
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
  for (const auto& [name, b] : buffers_)
    buffers.push_back({{"name", name}, {"pool", b.want.pool}, {"device", device_uuid(b.want.device)}, {"size", exact_size(b.want.size)}});
  if (!buffers.empty()) doc["buffers"] = buffers;
  return "# The live state of a cupool holder, written by 'cupool export'.\n" + to_yaml(doc);
}

void Holder::shutdown() noexcept {
  std::vector<std::uint64_t> ids;
  for (const auto& [id, l] : leases_) ids.push_back(id);
  for (auto id : ids) free_lease(id);
  std::vector<std::string> names;
  for (const auto& [name, b] : buffers_) names.push_back(name);
  for (const auto& n : names) {
    try {
      destroy_buffer(n);
    } catch (const std::exception& e) {
      spdlog::error("freeing buffer {}: {}", n, e.what());
    }
  }
  std::vector<PoolKey> keys;
  for (const auto& [key, p] : pools_) keys.push_back(key);
  for (const auto& k : keys) {
    try {
      destroy_pool(k);
    } catch (const std::exception& e) {
      spdlog::error("destroying pool {} on device {}: {}", k.first, k.second, e.what());
      pools_.erase(k);
    }
  }
}

}  // namespace cupool
