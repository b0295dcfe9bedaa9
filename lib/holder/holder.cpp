#include "holder/holder.h"

#include <spdlog/spdlog.h>

#include "holder/names.h"

namespace cupool {

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

std::string Holder::device_pci_bus_id(int device) const {
  const DeviceReport* d = node_.device(device);
  return d ? d->info.pci_bus_id : "";
}

void Holder::shutdown() noexcept {
  custody_ = nullptr;  // what custody keeps stays there: the next holder adopts it
  notice_ = nullptr;   // the holder is ending: nobody to tell, and the owner may be half gone
  deferred_ = nullptr;
  waiters_.clear();
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
