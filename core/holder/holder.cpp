// The holder as a composition: its units wired together, and what spans them (a client leaving,
// an apply with its custody sync, the shutdown in order).
#include "holder/holder.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "holder/names.h"

namespace cupool {

Holder::Holder(Backend& backend, NodeReport node, std::uint32_t self_uid, Limits limits)
    : node_(std::move(node)),
      limits_(limits),
      clients_(self_uid, limits),
      pools_(backend, node_),
      buffers_(backend, node_, self_uid, pools_),
      leasing_(backend, clients_, pools_, buffers_, limits_),
      reconciler_(pools_, buffers_, clients_, leasing_),
      client_requests_(backend, clients_, pools_, buffers_, leasing_, limits_, identity_, draining_),
      buffer_requests_(backend, clients_, pools_, buffers_, limits_, draining_),
      budget_requests_(backend, node_, clients_, pools_, buffers_, budgets_, limits_.budget_context_bytes, draining_),
      admin_requests_(
          {backend, node_, clients_, pools_, buffers_, leasing_, reconciler_, budget_requests_, identity_, draining_}),
      operations_(operations()) {}

Holder::~Holder() { shutdown(); }

std::vector<Change> Holder::apply(const Desired& want) {
  return buffers_.then_sync_custody([&] {
    std::vector<Change> changes = reconciler_.apply(want);
    pools_.made();  // the pools the start declared are made (or refused) now
    return changes;
  });
}

bool Holder::serves_while_starting(const std::optional<std::string>& op) {
  static const std::set<std::string> kServed{"hello", "status", "buffer_open", "buffer_close", "buffer_tensors"};
  return !op || kServed.count(*op) > 0;
}

bool Holder::apply_after_drops(const Desired& want, std::function<void(const std::vector<Change>&)> done) {
  std::set<std::uint64_t> asks = reconciler_.ask_drops_for(want);
  if (asks.empty()) {
    done(apply(want));
    return false;
  }
  leasing_.wait(DropWaiter{0, Json(), std::move(asks), [this, want, done = std::move(done)] {
                             done(apply(want));
                             return Json::object();
                           }});
  return true;
}

void Holder::disconnect(std::uint64_t id) {
  buffers_.then_sync_custody([&] { forget_client(id); });
}

bool Holder::needs_holder(std::uint64_t id) const {
  const HeldClient* c = clients_.find(id);
  if (!c) return false;
  for (std::uint64_t lease : c->leases)
    if (const Lease* l = leasing_.book().find(lease); l && !l->cached) return true;
  for (const auto& [name, b] : buffers_)
    if (b.loading == id) return true;
  for (const auto& [name, opens] : c->open_buffers) {
    const HeldBuffer* b = buffers_.find(name);
    if (opens > 0 && b && !b->exported) return true;
  }
  return false;
}

void Holder::forget_client(std::uint64_t id) {
  HeldClient* gone = clients_.find(id);
  if (!gone) return;
  const std::size_t lease_count = gone->leases.size();
  leasing_.leave(id, *gone);
  for (const auto& [name, opens] : gone->open_buffers)
    if (HeldBuffer* b = buffers_.find(name)) b->opens -= std::min(b->opens, opens);
  // A buffer it was still loading is half made: nobody may have it.
  std::vector<std::string> unfinished;
  for (const auto& [name, b] : buffers_)
    if (b.loading == id) unfinished.push_back(name);
  for (const std::string& name : unfinished) {
    spdlog::warn("client {} (pid {}) left before buffer {} was loaded; removing it", id, gone->peer.pid, name);
    buffers_.destroy(name);
  }
  if (lease_count)
    spdlog::info("client {} (pid {}) left; freed {} lease{}", id, gone->peer.pid, lease_count,
                 lease_count == 1 ? "" : "s");
  for (const Grant& g : budgets_.leave(id))
    spdlog::info("budget {} of pid {} ended with its connection", g.id, g.claimed_pid);
  clients_.erase(id);
  leasing_.run_ready_waiters();
}

void Holder::expire_budgets() {
  for (const Grant& g : budgets_.expire())
    spdlog::info("budget {} of pid {} ended with its process (no process of it claimed it)", g.id, g.pid);
}

void Holder::shutdown() noexcept {
  leasing_.free_all();
  buffers_.close_all_for_stop();  // and forgets custody: what it keeps stays there for the next holder
  for (const auto& k : pools_.keys()) {
    try {
      reconciler_.destroy_pool(k);
    } catch (const std::exception& e) {
      spdlog::error("destroying pool {} on device {}: {}", k.first, k.second, e.what());
      pools_.forget(k);
    }
  }
}

}  // namespace cupool
