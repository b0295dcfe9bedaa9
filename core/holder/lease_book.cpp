// The records of the holder's leases and the totals per pool kept along with them.
#include "holder/lease_book.h"

#include <algorithm>
#include <set>

namespace cupool {

std::uint64_t LeaseBook::grant(std::uint64_t client, const PoolKey& key, std::uint64_t size, std::uint64_t address) {
  const std::uint64_t id = ++next_lease_;
  leases_[id] = Lease{client, key.first, key.second, size, address};
  model::LeaseTotals& t = pools_[key];
  t.lease_count += 1;
  t.leased_bytes += size;
  return id;
}

std::optional<Lease> LeaseBook::release(std::uint64_t id) noexcept {
  auto it = leases_.find(id);
  if (it == leases_.end()) return std::nullopt;
  Lease l = std::move(it->second);
  leases_.erase(it);
  auto p = pools_.find({l.pool, l.device});
  if (p != pools_.end()) {
    p->second.lease_count -= std::min<std::uint64_t>(p->second.lease_count, 1);
    p->second.leased_bytes -= std::min(p->second.leased_bytes, l.size);
    if (p->second.lease_count == 0) pools_.erase(p);
  }
  return l;
}

void LeaseBook::cache(std::uint64_t id) {
  Lease& l = leases_.at(id);
  if (l.cached) return;
  l.cached = true;
  model::LeaseTotals& t = pools_[{l.pool, l.device}];
  t.cached_count += 1;
  t.cached_bytes += l.size;
}

std::uint64_t LeaseBook::uncache(std::uint64_t id) noexcept {
  auto it = leases_.find(id);
  if (it == leases_.end() || !it->second.cached) return 0;
  Lease& l = it->second;
  l.cached = false;
  auto p = pools_.find({l.pool, l.device});
  if (p != pools_.end()) {
    p->second.cached_count -= std::min<std::uint64_t>(p->second.cached_count, 1);
    p->second.cached_bytes -= std::min(p->second.cached_bytes, l.size);
  }
  const std::uint64_t ask = l.ask;
  l.ask = 0;
  return ask;
}

void LeaseBook::forget_ask(std::uint64_t id, std::uint64_t ask) noexcept {
  auto it = leases_.find(id);
  if (it != leases_.end() && it->second.ask == ask) it->second.ask = 0;
}

const Lease* LeaseBook::find(std::uint64_t id) const {
  auto it = leases_.find(id);
  return it == leases_.end() ? nullptr : &it->second;
}

model::LeaseTotals LeaseBook::of(const PoolKey& key) const {
  auto it = pools_.find(key);
  return it == pools_.end() ? model::LeaseTotals{} : it->second;
}

std::size_t LeaseBook::clients_of(const PoolKey& key) const {
  std::set<std::uint64_t> holders;
  for (const auto& [id, l] : leases_)
    if (l.pool == key.first && l.device == key.second) holders.insert(l.client);
  return holders.size();
}

std::uint64_t LeaseBook::bytes() const {
  std::uint64_t total = 0;
  for (const auto& [id, l] : leases_) total += l.size;
  return total;
}

std::size_t LeaseBook::cached_count() const {
  std::size_t n = 0;
  for (const auto& [key, t] : pools_) n += t.cached_count;
  return n;
}

std::uint64_t LeaseBook::cached_bytes() const {
  std::uint64_t n = 0;
  for (const auto& [key, t] : pools_) n += t.cached_bytes;
  return n;
}

std::vector<std::uint64_t> LeaseBook::ids() const {
  std::vector<std::uint64_t> out;
  for (const auto& [id, l] : leases_) out.push_back(id);
  return out;
}

}  // namespace cupool
