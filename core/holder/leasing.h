// The backend's side of leases: allocating a client's lease from its pool (lease limits, quotas,
// the pool's max_size with its buffers) and freeing it, cached blocks (protocol 2), the `drop`
// notices that ask them back and the requests whose replies wait on the answers, and where
// notices and deferred replies go. The records are the LeaseBook's and the asks the DropAsks';
// this unit owns both and keeps them in step with the driver.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "device/backend.h"
#include "holder/buffer_store.h"
#include "holder/client_table.h"
#include "holder/drop_asks.h"
#include "holder/lease_book.h"
#include "holder/pool_table.h"
#include "holder/reply.h"
#include "holder/request.h"

namespace cupool {

class Leasing {
 public:
  using Json = nlohmann::ordered_json;
  using Send = std::function<void(std::uint64_t client, const Json&)>;

  Leasing(Backend& backend, ClientTable& clients, PoolTable& pools, const BufferStore& buffers,
          const HolderLimits& limits)
      : backend_(backend), clients_(clients), pools_(pools), buffers_(buffers), limits_(limits) {}

  // Allocates for client `id` from `p` and records the lease (leasing.cpp); returns its id and the
  // allocation. Throws limit_exceeded, quota_exceeded, out_of_memory or CudaError.
  std::pair<std::uint64_t, SharedAllocation> grant(std::uint64_t id, HeldClient& c, HeldPool& p, std::uint64_t size,
                                                   bool synchronize);
  void free(std::uint64_t lease) noexcept;
  // Client `id` leaves: its own waiting requests are forgotten, its leases freed (which answers
  // the asks that wanted them) and the asks made of it closed.
  void leave(std::uint64_t id, const HeldClient& gone);
  // Frees every lease and forgets the waiters, the notices' and replies' receivers (a shutdown).
  void free_all() noexcept;

  // ---- cached blocks (cache.cpp) ----
  // A lease released into its client's cache, and back in use (or freed): the pool's counts of
  // cached blocks, and the `drop` notice that asked for it (answered once all its leases are).
  void cache(std::uint64_t id) { leases_.cache(id); }
  void uncache(std::uint64_t id) noexcept;
  // Sends `drop` notices (saying `reason`) for cached leases that `pick` selects, largest first,
  // until they add up to `bytes` (UINT64_MAX: all), counting leases a notice already asked for.
  // Returns the asks to wait for (empty: nothing cached to ask for).
  std::set<std::uint64_t> ask_drops(const std::function<bool(const Lease&)>& pick, std::uint64_t bytes,
                                    const char* reason);
  // Makes the request `r`'s reply wait for `asks`, then answers with `then()`; returns
  // Reply::later() for the handler to return.
  Reply defer(const Request& r, std::set<std::uint64_t> asks, std::function<Json()> then);
  // Waits for `w`'s asks (a reload's apply, which nobody's reply waits for).
  void wait(DropWaiter w) { drops_.wait(std::move(w)); }
  // An ask was answered or its client left: requests that waited only on it are answered.
  void finish_ask(std::uint64_t ask);
  void run_ready_waiters();
  // Client `id` answered `ask` by dropping `ids`: frees them (all or nothing: each must be a
  // cached lease of its own) and closes the ask. Returns the bytes freed.
  std::uint64_t dropped(std::uint64_t id, std::uint64_t ask, const std::vector<std::uint64_t>& ids);

  // Sends `notice` to `client` in the names its protocol speaks (proto::to_old_names below 4).
  void notify(std::uint64_t client, Json notice);
  void on_notice(Send send) { notice_ = std::move(send); }
  void on_deferred(Send send) { deferred_ = std::move(send); }
  void set_drop_timeout_ms(std::int64_t ms) { drops_.set_timeout_ms(ms); }
  std::int64_t drop_timeout_ms() const { return drops_.timeout_ms(); }
  std::vector<std::uint64_t> overdue(std::int64_t now_ms) const { return drops_.overdue(now_ms); }
  std::optional<std::int64_t> next_deadline() const { return drops_.next_deadline(); }

  const LeaseBook& book() const { return leases_; }
  std::uint64_t dropped_bytes() const { return dropped_bytes_; }

 private:
  Backend& backend_;
  ClientTable& clients_;
  PoolTable& pools_;
  const BufferStore& buffers_;
  const HolderLimits& limits_;
  LeaseBook leases_;                 // the leases' records and their totals per pool
  DropAsks drops_;                   // `drop` asks and the requests waiting on them
  std::uint64_t dropped_bytes_ = 0;  // cached bytes clients gave back when asked, ever
  Send notice_;
  Send deferred_;
};

}  // namespace cupool
