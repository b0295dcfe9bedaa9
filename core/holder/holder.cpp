#include "holder/holder.h"

#include <spdlog/spdlog.h>

#include "holder/names.h"

namespace cupool {

// ---- Holder ----

Holder::Holder(Backend& backend, NodeReport node, std::uint32_t self_uid, Limits limits)
    : backend_(backend),
      node_(std::move(node)),
      self_uid_(self_uid),
      limits_(limits),
      clients_(self_uid, limits),
      created_at_(now_s()) {}

Holder::~Holder() { shutdown(); }

std::string Holder::device_uuid(int device) const {
  const DeviceReport* d = node_.device(device);
  return d ? d->info.uuid : "";
}

model::PlanChange Holder::view(const Change& c) const {
  model::PlanChange out;
  out.action = c.action;
  out.object = c.object;
  out.name = c.name;
  if (c.device >= 0) out.id = device_id(c.device);
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

model::DeviceId Holder::device_id(int device) const { return {device, device_uuid(device), device_pci_bus_id(device)}; }

std::string Holder::device_pci_bus_id(int device) const {
  const DeviceReport* d = node_.device(device);
  return d ? d->info.pci_bus_id : "";
}

void Holder::shutdown() noexcept {
  custody_ = nullptr;  // what custody keeps stays there: the next holder adopts it
  notice_ = nullptr;   // the holder is ending: nobody to tell, and the owner may be half gone
  deferred_ = nullptr;
  drops_.forget_waiters();
  for (std::uint64_t id : leases_.ids()) free_lease(id);
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
