// The backend's side of leases: who may take what (lease limits, quotas, max_size), allocating
// and freeing, and what goes when a client leaves.
#include "holder/leasing.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/error.h"
#include "base/units.h"

namespace cupool {

// Allocates `size` bytes from `p` for client `id` and records the lease: counted against the
// client's lease limit and the pool's quota, freed when the client frees it or leaves.
std::pair<std::uint64_t, SharedAllocation> Leasing::grant(std::uint64_t id, HeldClient& c, HeldPool& p,
                                                          std::uint64_t size, bool synchronize) {
  if (c.leases.size() >= limits_.max_leases_per_client)
    throw Error(Errc::limit_exceeded,
                "a connection may hold at most " + std::to_string(limits_.max_leases_per_client) + " leases");
  const LeaseBook::PoolKey key{p.want.name, p.want.device};
  const std::uint64_t held = c.bytes_in_pool[key];
  const std::uint64_t quota = p.want.share.quota_per_client;
  if (quota && (size > quota || held > quota - size))
    throw Error(Errc::quota_exceeded, "pool " + p.want.name + " on device " + std::to_string(p.want.device) + ": " +
                                          format_bytes(quota) + " quota per client; this client holds " +
                                          format_bytes(held) + " and asked for " + format_bytes(size));
  // The pool's buffers are exported allocations beside it, charged to it: its max_size holds them
  // and the leases together.
  if (const std::uint64_t charged = p.want.props.max_size ? buffers_.bytes_in(p.want.name, p.want.device) : 0) {
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
                                           " has no room for " + format_bytes(size) + ": " + e.api() + " returned " +
                                           e.name());
    throw;
  }
  const std::uint64_t lease = leases_.grant(id, key, size, s.address);
  c.leases.insert(lease);
  c.bytes_in_pool[key] = held + size;
  return {lease, s};
}

void Leasing::free(std::uint64_t id) noexcept {
  if (!leases_.find(id)) return;
  uncache(id);  // a cached lease: the pool's cached counts, and the drop notice that asked for it
  const std::optional<Lease> gone = leases_.release(id);
  if (!gone) return;
  const Lease& l = *gone;
  if (const HeldPool* p = pools_.find({l.pool, l.device})) {
    try {
      backend_.free_shared(p->handle, l.address);
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

void Leasing::leave(std::uint64_t id, const HeldClient& gone) {
  // A request of its own that waited for drops is answered to nobody.
  drops_.forget_waiters_of(id);
  const std::set<std::uint64_t> leases = gone.leases;
  for (std::uint64_t l : leases) free(l);  // answers its drop notices: requests waiting on them go on
  for (std::uint64_t ask : drops_.of(id)) finish_ask(ask);
}

void Leasing::free_all() noexcept {
  notice_ = nullptr;  // the holder is ending: nobody to tell, and the owner may be half gone
  deferred_ = nullptr;
  drops_.forget_waiters();
  for (std::uint64_t id : leases_.ids()) free(id);
}

}  // namespace cupool
