// Cached blocks (protocol 2, docs/protocol.md "Cached blocks"): leases a client released into its
// own cache and still maps. The holder keeps them allocated and charged to that client until the
// client says it unmapped them (`dropped`, or `free`) or leaves. When the holder wants them back
// (trim, apply, an allocation that does not fit) it sends a `drop` notice and the request that
// needs the memory waits for the answers, at most the drop timeout; a client that does not
// answer in time is disconnected, which frees its leases.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "base/error.h"
#include "holder/holder.h"
#include "protocol/messages.h"

namespace cupool {

namespace {

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void Holder::cache_lease(std::uint64_t id) { leases_.cache(id); }

void Holder::uncache_lease(std::uint64_t id) noexcept {
  const std::uint64_t ask = leases_.uncache(id);
  if (!ask) return;
  if (DropAsk* a = drops_.find(ask)) {
    a->leases.erase(id);
    if (a->leases.empty()) finish_ask(ask);
  }
}

std::set<std::uint64_t> Holder::ask_drops(const std::function<bool(const Lease&)>& pick, std::uint64_t bytes,
                                          const char* reason) {
  std::vector<std::pair<std::uint64_t, const Lease*>> candidates;
  for (const auto& [id, l] : leases_)
    if (l.cached && pick(l)) candidates.emplace_back(id, &l);
  // Largest first: the fewest blocks (and clients) for the bytes wanted.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return a.second->size > b.second->size; });
  std::set<std::uint64_t> waits;
  std::map<std::uint64_t, std::vector<std::uint64_t>> fresh;  // client -> leases not asked for yet
  std::uint64_t got = 0;
  for (const auto& [id, l] : candidates) {
    if (got >= bytes) break;
    got += l->size;
    if (l->ask)
      waits.insert(l->ask);
    else
      fresh[l->client].push_back(id);
  }
  const std::int64_t now = now_ms();
  for (const auto& [client_id, ids] : fresh) {
    const std::uint64_t ask = drops_.open(client_id, {ids.begin(), ids.end()}, now);
    std::uint64_t sum = 0;
    for (std::uint64_t id : ids) {
      leases_.ask(id, ask);
      sum += leases_.at(id).size;
    }
    waits.insert(ask);
    spdlog::info("asking client {} to drop {} cached block{} ({} bytes) for {}", client_id, ids.size(),
                 ids.size() == 1 ? "" : "s", sum, reason);
    notify(client_id,
           proto::to_json(proto::Drop{ask, ids, sum, reason, static_cast<double>(drops_.timeout_ms()) / 1000.0}));
  }
  return waits;
}

Reply Holder::defer(const Request& r, std::set<std::uint64_t> asks, std::function<Json()> then) {
  // The reply comes later, in the names of the connection's protocol as an answer now would.
  if (r.client.protocol < proto::kNamedProtocol)
    then = [op = r.op, then = std::move(then)] {
      Json out = then();
      proto::to_old_names(proto::Message::reply, op, out);
      return out;
    };
  drops_.wait(DropWaiter{r.id, r.request_id, std::move(asks), std::move(then)});
  return Reply::later();
}

void Holder::notify(std::uint64_t client, Json notice) {
  if (!notice_) return;
  const HeldClient* c = clients_.find(client);
  if (c && c->protocol < proto::kNamedProtocol)
    proto::to_old_names(proto::Message::notice, notice.value("notice", ""), notice);
  notice_(client, notice);
}

void Holder::finish_ask(std::uint64_t ask) {
  for (std::uint64_t id : drops_.close(ask)) leases_.forget_ask(id, ask);
}

void Holder::run_ready_waiters() {
  // A waiter's reply may free leases or send notices, never start another wait (then() runs with
  // waiting off), so this ends.
  while (std::optional<DropWaiter> ready = drops_.take_ready()) {
    DropWaiter& w = *ready;
    Json reply;
    reply["id"] = w.id;
    try {
      Json body = w.then();
      reply["ok"] = true;
      for (auto& [k, v] : body.items()) reply[k] = v;
    } catch (const Error& e) {
      reply = proto::error_reply(w.id, {e.wire_code(), e.what(), {}, {}});
    } catch (const std::exception& e) {
      spdlog::error("internal error answering a request that waited for cached blocks: {}", e.what());
      reply = proto::error_reply(w.id, {errc_info(Errc::internal).wire, e.what(), {}, {}});
    }
    if (w.client == 0) {
      if (!reply.value("ok", false)) spdlog::error("after cached blocks were dropped: {}", reply["error"].dump());
    } else if (clients_.find(w.client) && deferred_) {
      deferred_(w.client, reply);
    }
  }
}

std::vector<std::uint64_t> Holder::overdue(std::int64_t now) const { return drops_.overdue(now); }

std::optional<std::int64_t> Holder::next_deadline() const { return drops_.next_deadline(); }

std::size_t Holder::cached_count() const { return leases_.cached_count(); }

std::uint64_t Holder::cached_bytes() const { return leases_.cached_bytes(); }

std::set<std::uint64_t> Holder::ask_drops_for(const Desired& want) {
  // A pool name is replaced on all its devices or none (plan()): every device of a blocked pool.
  std::set<std::string> names;
  for (const Change& ch : plan(want))
    if (ch.object == "pool" && (ch.action == "remove" || ch.action == "replace") && !ch.blocked.empty())
      names.insert(ch.name);
  std::set<PoolKey> keys;
  for (const auto& [key, p] : pools_) {
    const model::LeaseTotals t = leases_.of(key);
    if (names.count(key.first) && t.cached_count && t.cached_count == t.lease_count) keys.insert(key);
  }
  if (keys.empty()) return {};
  return ask_drops([&](const Lease& l) { return keys.count({l.pool, l.device}) > 0; }, UINT64_MAX, "apply");
}

bool Holder::apply_after_drops(const Desired& want, std::function<void(const std::vector<Change>&)> done) {
  std::set<std::uint64_t> asks = ask_drops_for(want);
  if (asks.empty()) {
    done(apply(want));
    return false;
  }
  drops_.wait(DropWaiter{0, Json(), std::move(asks), [this, want, done = std::move(done)] {
                           done(apply(want));
                           return Json::object();
                         }});
  return true;
}

// ---- requests ----

Reply Holder::op_reuse(Request& r) {
  const std::uint64_t lease = proto::read_reuse(r.args).lease;
  r.args.finish();
  const Lease* l = leases_.find(lease);
  if (!l || l->client != r.id || !l->cached)
    throw Error(Errc::not_found, "lease " + std::to_string(lease) + " is not a cached lease of this connection");
  uncache_lease(lease);
  return proto::to_json(proto::ReuseReply{lease, l->size});
}

Reply Holder::op_dropped(Request& r) {
  const proto::Dropped answer = proto::read_dropped(r.args, limits_.max_leases_per_client);
  r.args.finish();
  const std::uint64_t ask = answer.ask;
  const std::vector<std::uint64_t>& ids = answer.leases;
  // All or nothing: every lease named must be a cached lease of this connection.
  for (std::uint64_t id : ids) {
    const Lease* l = leases_.find(id);
    if (!l || l->client != r.id || !l->cached)
      throw Error(Errc::bad_request, "lease " + std::to_string(id) + " is not a cached lease of this connection");
  }
  std::uint64_t bytes = 0;
  for (std::uint64_t id : ids) {
    bytes += leases_.at(id).size;
    dropped_bytes_ += leases_.at(id).size;
    free_lease(id);
  }
  const DropAsk* a = drops_.find(ask);
  if (a && a->client == r.id) {
    // What it did not drop it reused (its `reuse` came first on the same socket), or it keeps
    // against the protocol; either way the ask is answered.
    for (std::uint64_t id : a->leases)
      if (const Lease* l = leases_.find(id); l && l->cached)
        spdlog::warn("client {} answered drop {} but kept cached lease {}", r.id, ask, id);
    finish_ask(ask);
  }
  return proto::to_json(proto::DroppedReply{ask, ids.size(), bytes});
}

}  // namespace cupool
