// The holder's clients and their leases: who is connected, what each one holds and what it may
// still take (lease limits, quotas), and freeing it all when a client leaves.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/error.h"
#include "base/units.h"
#include "holder/holder.h"
#include "holder/names.h"

namespace cupool {

std::uint64_t Holder::connect(const Peer& peer) { return clients_.connect(peer); }

void Holder::disconnect(std::uint64_t id) {
  then_sync_custody([&] { forget_client(id); });
}

void Holder::forget_client(std::uint64_t id) {
  HeldClient* gone = clients_.find(id);
  if (!gone) return;
  // A request of its own that waited for drops is answered to nobody.
  drops_.forget_waiters_of(id);
  const std::set<std::uint64_t> leases = gone->leases;
  for (std::uint64_t l : leases) free_lease(l);  // answers its drop notices: requests waiting on them go on
  for (std::uint64_t ask : drops_.of(id)) finish_ask(ask);
  for (const auto& [name, opens] : gone->open_buffers) {
    auto b = buffers_.find(name);
    if (b != buffers_.end()) b->second.opens -= std::min(b->second.opens, opens);
  }
  // A buffer it was still loading is half made: nobody may have it.
  std::vector<std::string> unfinished;
  for (const auto& [name, b] : buffers_)
    if (b.loading == id) unfinished.push_back(name);
  for (const std::string& name : unfinished) {
    spdlog::warn("client {} (pid {}) left before buffer {} was loaded; removing it", id, gone->peer.pid, name);
    destroy_buffer(name);
  }
  if (!leases.empty())
    spdlog::info("client {} (pid {}) left; freed {} lease{}", id, gone->peer.pid, leases.size(),
                 leases.size() == 1 ? "" : "s");
  clients_.erase(id);
  run_ready_waiters();
}

bool Holder::admin(std::uint64_t id) const { return clients_.admin(id); }

Holder::Client& Holder::client(std::uint64_t id) { return clients_.at(id); }

// Allocates `size` bytes from `p` for client `id` and records the lease: counted against the
// client's lease limit and the pool's quota, freed when the client frees it or leaves.
std::pair<std::uint64_t, SharedAllocation> Holder::grant_lease(std::uint64_t id, Client& c, HeldPool& p,
                                                               std::uint64_t size, bool synchronize) {
  if (c.leases.size() >= limits_.max_leases_per_client)
    throw Error(Errc::limit_exceeded,
                "a connection may hold at most " + std::to_string(limits_.max_leases_per_client) + " leases");
  const PoolKey key{p.want.name, p.want.device};
  const std::uint64_t held = c.bytes_in_pool[key];
  const std::uint64_t quota = p.want.share.quota_per_client;
  if (quota && (size > quota || held > quota - size))
    throw Error(Errc::quota_exceeded, "pool " + p.want.name + " on device " + std::to_string(p.want.device) + ": " +
                                          format_bytes(quota) + " quota per client; this client holds " +
                                          format_bytes(held) + " and asked for " + format_bytes(size));
  // The pool's buffers are exported allocations beside it, charged to it: its max_size holds them
  // and the leases together.
  if (const std::uint64_t charged = p.want.props.max_size ? buffer_bytes(p.want.name, p.want.device) : 0) {
    const std::uint64_t used = backend_.pool_usage(p.handle).used_bytes;
    if (charged >= p.want.props.max_size || size > p.want.props.max_size - charged ||
        used > p.want.props.max_size - charged - size)
      throw Error(Errc::out_of_memory, "pool " + p.want.name + " on device " + std::to_string(p.want.device) +
                                           " has no room for " + format_bytes(size) + ": its max_size " +
                                           format_bytes(p.want.props.max_size) + " holds " + format_bytes(charged) +
                                           " of buffers and " + format_bytes(used) + " of leases");
  }
  SharedAllocation s;
  try {
    // A client that asks the holder to wait gets memory with no IPC event recorded after it (a
    // write after one cost 145-260 us on the H100; backend.h).
    s = backend_.allocate_shared(p.handle, size,
                                 synchronize ? Backend::Readiness::synchronized : Backend::Readiness::event);
  } catch (const CudaError& e) {
    if (e.name() == "CUDA_ERROR_OUT_OF_MEMORY")
      throw Error(Errc::out_of_memory, "pool " + p.want.name + " on device " + std::to_string(p.want.device) +
                                           " has no room for " + format_bytes(size) + " (" + e.what() + ")");
    throw;
  }
  const std::uint64_t lease = leases_.grant(id, key, size, s.address);
  c.leases.insert(lease);
  c.bytes_in_pool[key] = held + size;
  return {lease, s};
}

void Holder::free_lease(std::uint64_t id) noexcept {
  if (!leases_.find(id)) return;
  uncache_lease(id);  // a cached lease: the pool's cached counts, and the drop notice that asked for it
  const std::optional<Lease> gone = leases_.release(id);
  if (!gone) return;
  const Lease& l = *gone;
  auto p = pools_.find({l.pool, l.device});
  if (p != pools_.end()) {
    try {
      backend_.free_shared(p->second.handle, l.address);
    } catch (const std::exception& e) {
      spdlog::error("freeing lease {} in pool {}: {}", id, l.pool, e.what());
    }
  }
  if (HeldClient* c = clients_.find(l.client)) {
    c->leases.erase(id);
    auto& bytes = c->bytes_in_pool[{l.pool, l.device}];
    bytes -= std::min(bytes, l.size);
  }
}

std::size_t Holder::lease_count() const { return leases_.count(); }

std::uint64_t Holder::leased_bytes() const { return leases_.bytes(); }
}  // namespace cupool
