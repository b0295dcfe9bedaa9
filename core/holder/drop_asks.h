// The holder's `drop` asks (docs/protocol.md, "Cached blocks"): the cached leases each client was
// asked to unmap and by when, and the requests whose replies wait for the answers. Which leases to
// ask for, and the notices, are the holder's (cache.cpp); this keeps the books.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

namespace cupool {

// A `drop` notice: the cached leases a client was asked to unmap, and by when (steady clock, ms).
struct DropAsk {
  std::uint64_t client = 0;
  std::set<std::uint64_t> leases;
  std::int64_t deadline_ms = 0;
};

// A request whose reply waits for `drop` answers (`asks`), then runs `then` for its reply.
struct DropWaiter {
  std::uint64_t client = 0;  // 0: nobody waits for the reply (a reload); it is logged
  nlohmann::ordered_json id;
  std::set<std::uint64_t> asks;
  std::function<nlohmann::ordered_json()> then;
};

class DropAsks {
 public:
  // How long a client has to answer (5 s unless set).
  void set_timeout_ms(std::int64_t ms) { timeout_ms_ = ms; }
  std::int64_t timeout_ms() const { return timeout_ms_; }

  // Records an ask of `client` for `leases`, due timeout_ms() after `now_ms`; returns its id (from 1).
  std::uint64_t open(std::uint64_t client, std::set<std::uint64_t> leases, std::int64_t now_ms);
  // The ask `ask`, or null.
  DropAsk* find(std::uint64_t ask);
  // Forgets the ask (answered, or its client left): waiters stop waiting on it. Returns its leases
  // (none for an ask it does not know).
  std::set<std::uint64_t> close(std::uint64_t ask);
  // The asks made of `client`.
  std::vector<std::uint64_t> of(std::uint64_t client) const;
  // The clients with an ask due at `now_ms` or before.
  std::vector<std::uint64_t> overdue(std::int64_t now_ms) const;
  // The earliest deadline of an open ask, if any.
  std::optional<std::int64_t> next_deadline() const;

  void wait(DropWaiter w) { waiters_.push_back(std::move(w)); }
  // Takes out a waiter whose asks are all answered, if any (oldest first).
  std::optional<DropWaiter> take_ready();
  // Forgets the waiters of `client` (it left: nobody to answer).
  void forget_waiters_of(std::uint64_t client);
  void forget_waiters() { waiters_.clear(); }

 private:
  std::map<std::uint64_t, DropAsk> asks_;
  std::uint64_t next_ask_ = 0;
  std::vector<DropWaiter> waiters_;
  std::int64_t timeout_ms_ = 5000;
};

}  // namespace cupool
