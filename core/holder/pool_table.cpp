#include "holder/pool_table.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/error.h"
#include "base/text.h"
#include "base/units.h"
#include "holder/names.h"

namespace cupool {

std::string device_uuid(const NodeReport& node, int device) {
  const DeviceReport* d = node.device(device);
  return d ? d->info.uuid : "";
}

model::DeviceId device_id(const NodeReport& node, int device) {
  const DeviceReport* d = node.device(device);
  return {device, d ? d->info.uuid : "", d ? d->info.pci_bus_id : ""};
}

void PoolTable::create(const PoolWant& w) {
  HeldPool held;
  held.want = w;
  held.handle = backend_.create_pool(w.device, w.props);
  held.generation = ++next_generation_;
  PoolKey key{w.name, w.device};
  try {
    backend_.set_pool_settings(held.handle, w.settings);
    for (int peer : w.access) backend_.set_pool_access(held.handle, peer);
    if (w.reserve > 0) {
      map_reserve(held, w.reserve);
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

void PoolTable::map_reserve(HeldPool& held, std::uint64_t reserve) {
  // Map the reserve and give it back to the pool: it stays reserved because the release threshold
  // is at least the reserve (check enforces it). Read back what really stayed. The driver counts
  // the mapping in the pool's used high-water mark, which says what clients used: reset it (to
  // the current use, CU_MEMPOOL_ATTR_USED_MEM_HIGH) and keep the mark from before.
  held.used_peak_before_reserve =
      std::max(held.used_peak_before_reserve, backend_.pool_usage(held.handle).used_peak_bytes);
  const std::uint64_t address = backend_.allocate(held.handle, reserve);
  backend_.free(held.handle, address);
  backend_.reset_pool_used_peak(held.handle);
  held.reserved_after_reserve = backend_.pool_usage(held.handle).reserved_bytes;
}

void PoolTable::update(HeldPool& held, const PoolWant& w) {
  if (held.want.settings != w.settings) {
    backend_.set_pool_settings(held.handle, w.settings);
    held.want.settings = w.settings;
  }
  for (int peer : w.access)
    if (std::find(held.want.access.begin(), held.want.access.end(), peer) == held.want.access.end()) {
      backend_.set_pool_access(held.handle, peer);
      held.want.access.push_back(peer);
    }
  std::sort(held.want.access.begin(), held.want.access.end());
  held.want.share = w.share;
  if (w.reserve > held.want.reserve) map_reserve(held, w.reserve);
  held.want.reserve = w.reserve;
}

std::uint64_t PoolTable::destroy(const PoolKey& key) {
  auto it = pools_.find(key);
  if (it == pools_.end()) return 0;
  backend_.synchronize(key.second);
  backend_.destroy_pool(it->second.handle);
  const std::uint64_t generation = it->second.generation;
  pools_.erase(it);
  spdlog::info("removed pool {} on device {}", key.first, key.second);
  return generation;
}

bool PoolTable::permitted(const HeldClient& c, const HeldPool& p) {
  if (c.admin) return true;
  if (!p.want.share.set) return false;
  const auto& s = p.want.share;
  if (!c.peer.user.empty() && std::find(s.users.begin(), s.users.end(), c.peer.user) != s.users.end()) return true;
  for (const auto& g : c.peer.group_names)
    if (std::find(s.groups.begin(), s.groups.end(), g) != s.groups.end()) return true;
  return false;
}

bool PoolTable::holds(const std::string& name) const {
  const auto named = [&](const auto& kv) { return kv.first.first == name; };
  return std::any_of(pools_.begin(), pools_.end(), named) || std::any_of(declared_.begin(), declared_.end(), named);
}

Error PoolTable::no_such_pool(const std::string& name) const {
  constexpr std::size_t kListed = 20;
  std::vector<std::string> names;
  for (const auto& [key, p] : pools_)
    if (std::find(names.begin(), names.end(), key.first) == names.end()) names.push_back(key.first);
  const std::string hint = did_you_mean(name, names);
  std::string text = "no pool named \"" + valid_utf8(name) + "\"";
  if (!hint.empty()) text += " (did you mean \"" + hint + "\"?)";
  if (names.empty()) return Error(Errc::not_found, text + "; this holder holds no pool");
  const std::size_t more = names.size() > kListed ? names.size() - kListed : 0;
  names.resize(names.size() - more);
  if (more) names.push_back("and " + std::to_string(more) + " more");
  return Error(Errc::not_found, text + "; the pools held: " + join(names, ", "));
}

void PoolTable::declare(const std::vector<PoolWant>& pools) {
  declared_.clear();
  for (const PoolWant& w : pools) declared_[{w.name, w.device}].want = w;
}

HeldPool& PoolTable::for_client(const HeldClient& c, const std::string& name, int device, bool for_use) {
  HeldPool* found = nullptr;
  for (Map* table : {&pools_, &declared_}) {
    for (auto& [key, p] : *table)
      if (key.first == name && (device < 0 || key.second == device)) {
        found = &p;
        break;
      }
    if (found) break;
  }
  if (!found) {
    if (holds(name)) throw Error(Errc::not_found, "pool " + name + " is not held on device " + std::to_string(device));
    throw no_such_pool(name);
  }
  if (for_use) {
    if (found->want.props.handle_types == 0)
      throw Error(Errc::bad_request,
                  "pool " + name + " has no IPC handle type, so it can't be shared with other processes");
    if (!permitted(c, *found))
      throw Error(Errc::not_permitted,
                  "pool " + name + " is not shared with " +
                      (c.peer.user.empty() ? "uid " + std::to_string(c.peer.uid) : "user " + c.peer.user) +
                      (found->want.share.set ? " (its share list names users [" + join(found->want.share.users, ", ") +
                                                   "] and groups [" + join(found->want.share.groups, ", ") + "])"
                                             : " (it has no share list: only the holder's user and root may use it)"));
    if ((found->want.props.handle_types & static_cast<std::uint32_t>(HandleType::posix_fd)) == 0)
      throw Error(Errc::bad_request,
                  "pool " + name + " is shared only through fabric handles, which this holder does not serve yet");
  }
  return *found;
}

HeldPool* PoolTable::find(const PoolKey& key) {
  auto it = pools_.find(key);
  return it == pools_.end() ? nullptr : &it->second;
}

const HeldPool* PoolTable::find(const PoolKey& key) const {
  auto it = pools_.find(key);
  return it == pools_.end() ? nullptr : &it->second;
}

std::vector<PoolTable::PoolKey> PoolTable::keys() const {
  std::vector<PoolKey> out;
  for (const auto& [key, p] : pools_) out.push_back(key);
  return out;
}

model::PoolInfo PoolTable::info(const PoolKey& key, const HeldPool& p) const {
  model::PoolInfo v;
  v.name = key.first;
  v.id = device_id(key.second);
  v.location = location_text(p.want.props);
  v.handle_types = handle_type_names(p.want.props.handle_types);
  if (p.want.props.max_size) v.max_size_bytes = p.want.props.max_size;
  return v;
}

std::vector<model::DeviceId> PoolTable::access_of(const HeldPool& p) const {
  std::vector<model::DeviceId> out;
  for (int peer : p.want.access) out.push_back(device_id(peer));
  return out;
}

}  // namespace cupool
