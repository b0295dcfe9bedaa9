#include "holder/drop_asks.h"

#include <algorithm>

namespace cupool {

std::uint64_t DropAsks::open(std::uint64_t client, std::set<std::uint64_t> leases, std::int64_t now_ms) {
  const std::uint64_t ask = ++next_ask_;
  asks_[ask] = DropAsk{client, std::move(leases), now_ms + timeout_ms_};
  return ask;
}

DropAsk* DropAsks::find(std::uint64_t ask) {
  auto it = asks_.find(ask);
  return it == asks_.end() ? nullptr : &it->second;
}

std::set<std::uint64_t> DropAsks::close(std::uint64_t ask) {
  auto it = asks_.find(ask);
  if (it == asks_.end()) return {};
  std::set<std::uint64_t> leases = std::move(it->second.leases);
  asks_.erase(it);
  for (DropWaiter& w : waiters_) w.asks.erase(ask);
  return leases;
}

std::vector<std::uint64_t> DropAsks::of(std::uint64_t client) const {
  std::vector<std::uint64_t> out;
  for (const auto& [ask, a] : asks_)
    if (a.client == client) out.push_back(ask);
  return out;
}

std::vector<std::uint64_t> DropAsks::overdue(std::int64_t now_ms) const {
  std::set<std::uint64_t> late;
  for (const auto& [id, a] : asks_)
    if (a.deadline_ms <= now_ms) late.insert(a.client);
  return {late.begin(), late.end()};
}

std::optional<std::int64_t> DropAsks::next_deadline() const {
  std::optional<std::int64_t> first;
  for (const auto& [id, a] : asks_)
    if (!first || a.deadline_ms < *first) first = a.deadline_ms;
  return first;
}

std::optional<DropWaiter> DropAsks::take_ready() {
  auto it = std::find_if(waiters_.begin(), waiters_.end(), [](const DropWaiter& w) { return w.asks.empty(); });
  if (it == waiters_.end()) return std::nullopt;
  DropWaiter w = std::move(*it);
  waiters_.erase(it);
  return w;
}

void DropAsks::forget_waiters_of(std::uint64_t client) {
  waiters_.erase(
      std::remove_if(waiters_.begin(), waiters_.end(), [&](const DropWaiter& w) { return w.client == client; }),
      waiters_.end());
}

}  // namespace cupool
