// The holder's leases: each allocation a client holds (its pool, size and address, whether the
// client cached it and which `drop` ask wants it back), and the per-pool totals that plan, status
// and stats show. Records only: the allocations themselves are the holder's (Backend calls).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"

namespace cupool {

// One allocation a client holds.
struct Lease {
  std::uint64_t client = 0;
  std::string pool;
  int device = 0;
  std::uint64_t size = 0;  // bytes
  std::uint64_t address = 0;
  bool cached = false;    // released by the client into its cache: still mapped there, still charged
  std::uint64_t ask = 0;  // the `drop` notice that asked for it back (0: none)
};

class LeaseBook {
 public:
  using PoolKey = std::pair<std::string, int>;  // pool name, device
  using Map = std::map<std::uint64_t, Lease>;

  // Records a lease of `size` bytes at `address` in pool `key` for `client`; returns its id (from
  // 1, never reused).
  std::uint64_t grant(std::uint64_t client, const PoolKey& key, std::uint64_t size, std::uint64_t address);
  // Forgets the lease `id` (uncache() it first: the cached totals are not touched here); returns
  // its record, none for a lease the book does not have.
  std::optional<Lease> release(std::uint64_t id) noexcept;
  // The client released lease `id` into its cache; no change for a cached one. Throws
  // std::out_of_range for an unknown id.
  void cache(std::uint64_t id);
  // Lease `id` is in use again (or about to be freed): no longer cached. Returns the `drop` ask
  // that wanted it back (0: none, or the lease was not cached), which it no longer names.
  std::uint64_t uncache(std::uint64_t id) noexcept;
  // Lease `id` is wanted back by `ask`; forget(ask) clears that again where it still names it.
  void ask(std::uint64_t id, std::uint64_t ask) { leases_.at(id).ask = ask; }
  void forget_ask(std::uint64_t id, std::uint64_t ask) noexcept;

  // The lease `id`, or null.
  const Lease* find(std::uint64_t id) const;
  // The lease `id`; throws std::out_of_range for an unknown one.
  const Lease& at(std::uint64_t id) const { return leases_.at(id); }
  // The leases of pool `key` and their bytes, cached ones included, and of those the cached ones.
  model::LeaseTotals of(const PoolKey& key) const;
  // How many clients hold leases of pool `key`.
  std::size_t clients_of(const PoolKey& key) const;
  // All leases, cached ones included, and their bytes; the cached ones and their bytes.
  std::size_t count() const { return leases_.size(); }
  std::uint64_t bytes() const;
  std::size_t cached_count() const;
  std::uint64_t cached_bytes() const;
  std::vector<std::uint64_t> ids() const;
  Map::const_iterator begin() const { return leases_.begin(); }
  Map::const_iterator end() const { return leases_.end(); }

 private:
  Map leases_;
  std::map<PoolKey, model::LeaseTotals> pools_;
  std::uint64_t next_lease_ = 0;
};

}  // namespace cupool
