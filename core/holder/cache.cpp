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
#include "holder/leasing.h"
#include "protocol/messages.h"

namespace cupool {

namespace {

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void Leasing::uncache(std::uint64_t id) noexcept {
  const std::uint64_t ask = leases_.uncache(id);
  if (!ask) return;
  if (DropAsk* a = drops_.find(ask)) {
    a->leases.erase(id);
    if (a->leases.empty()) finish_ask(ask);
  }
}

std::set<std::uint64_t> Leasing::ask_drops(const std::function<bool(const Lease&)>& pick, std::uint64_t bytes,
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

Reply Leasing::defer(const Request& r, std::set<std::uint64_t> asks, std::function<Json()> then) {
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

void Leasing::notify(std::uint64_t client, Json notice) {
  if (!notice_) return;
  const HeldClient* c = clients_.find(client);
  if (c && c->protocol < proto::kNamedProtocol)
    proto::to_old_names(proto::Message::notice, proto::notice_name(notice), notice);  // ours have one
  notice_(client, notice);
}

void Leasing::finish_ask(std::uint64_t ask) {
  for (std::uint64_t id : drops_.close(ask)) leases_.forget_ask(id, ask);
}

void Leasing::run_ready_waiters() {
  // A waiter's reply may free leases or send notices, never start another wait (then() runs with
  // waiting off), so this ends.
  while (std::optional<DropWaiter> ready = drops_.take_ready()) {
    DropWaiter& w = *ready;
    Json reply;
    try {
      reply = proto::ok_reply(w.id, w.then());
    } catch (const Error& e) {
      reply = proto::error_reply(w.id, {e.wire_code(), e.what(), {}, {}});
    } catch (const std::exception& e) {
      spdlog::error("internal error answering a request that waited for cached blocks: {}", e.what());
      reply = proto::error_reply(w.id, {errc_info(Errc::internal).wire, e.what(), {}, {}});
    }
    if (w.client == 0) {
      if (const auto error = proto::error_of_reply(reply))
        spdlog::error("after cached blocks were dropped: {}", model::to_json(*error).dump());
    } else if (clients_.find(w.client) && deferred_) {
      deferred_(w.client, reply);
    }
  }
}

std::uint64_t Leasing::dropped(std::uint64_t id, std::uint64_t ask, const std::vector<std::uint64_t>& ids) {
  // All or nothing: every lease named must be a cached lease of this connection.
  for (std::uint64_t lease : ids) {
    const Lease* l = leases_.find(lease);
    if (!l || l->client != id || !l->cached)
      throw Error(Errc::bad_request, "lease " + std::to_string(lease) + " is not a cached lease of this connection");
  }
  std::uint64_t bytes = 0;
  for (std::uint64_t lease : ids) {
    bytes += leases_.at(lease).size;
    dropped_bytes_ += leases_.at(lease).size;
    free(lease);
  }
  const DropAsk* a = drops_.find(ask);
  if (a && a->client == id) {
    // What it did not drop it reused (its `reuse` came first on the same socket), or it keeps
    // against the protocol; either way the ask is answered.
    for (std::uint64_t lease : a->leases)
      if (const Lease* l = leases_.find(lease); l && l->cached)
        spdlog::warn("client {} answered drop {} but kept cached lease {}", id, ask, lease);
    finish_ask(ask);
  }
  return bytes;
}

}  // namespace cupool
