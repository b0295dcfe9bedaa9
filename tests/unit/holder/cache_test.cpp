// Cached blocks (core/holder/cache.cpp, docs/protocol.md "Cached blocks"): a lease a client keeps
// mapped after releasing it stays charged to it, comes back with `reuse`, and is asked back with a
// `drop` notice by trim, apply and allocations that do not fit; requests that need it wait.
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "config/load.h"
#include "device/sim_backend.h"
#include "holder/conversation.h"
#include "holder/holder.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/holder/requests.h"

using namespace cupool;

namespace {

const char* const kCacheConfig = R"(version: 1
holder: {socket: /tmp/cupool-unit.sock, mode: "0666"}
pools:
  - name: kv
    devices: [0]
    handle_types: [posix_fd]
    max_size: 1GiB
    release_threshold: max
    share: {users: [alice, bob], quota_per_client: 256MiB}
  - name: big
    devices: [0]
    handle_types: [posix_fd]
    max_size: 1GiB
    release_threshold: max
)";

constexpr std::uint64_t MiB = 1ULL << 20;

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct CacheFixture {
  SimBackend sim{test::two_gpu_node()};
  Holder holder{sim, test::two_gpu_node(), /*self_uid=*/1000};
  std::vector<std::pair<std::uint64_t, Json>> notices;   // (client, notice)
  std::vector<std::pair<std::uint64_t, Json>> deferred;  // (client, reply)

  CacheFixture() {
    holder.on_notice([this](std::uint64_t c, const Json& n) { notices.emplace_back(c, n); });
    holder.on_deferred([this](std::uint64_t c, const Json& r) { deferred.emplace_back(c, r); });
    const Desired d = load_config(SourceFile("t.yaml", kCacheConfig), test::two_gpu_node(), Scope::all).desired;
    holder.adopt_holder_settings(d.holder);
    holder.apply(d);
  }
  std::uint64_t client(std::uint32_t uid, const std::string& user, int protocol = 2) {
    Peer p;
    p.pid = 100 + static_cast<int>(uid);
    p.uid = uid;
    p.gid = uid;
    p.user = user;
    const std::uint64_t id = holder.connect(p);
    call(id, {{"op", "hello"}, {"protocol", protocol}});
    return id;
  }
  Json call(std::uint64_t id, Json req, std::int64_t request_id = 1) {
    return test::call(holder, id, std::move(req), request_id);
  }
  // The request's reply waits for drops (Reply::later()).
  bool waits(std::uint64_t id, Json req, std::int64_t request_id) {
    return test::waits(holder, id, std::move(req), request_id);
  }
  std::string error_code(std::uint64_t id, Json req) { return test::error_code(holder, id, std::move(req)); }
  std::uint64_t alloc(std::uint64_t id, const std::string& pool, std::uint64_t size) {
    return call(id, {{"op", "alloc"}, {"pool", pool}, {"size", size}})["lease"].get<std::uint64_t>();
  }
  void cache(std::uint64_t id, std::uint64_t lease) {
    CHECK(call(id, {{"op", "free"}, {"lease", lease}, {"cache", true}, {"quiet", true}})["cached"] == true);
  }
  Json pool(const std::string& name) {
    const Json status = model::to_json(holder.status());
    for (const Json& p : status["pools"])
      if (p["name"] == name) return p;
    return {};
  }
  Json last_notice_for(std::uint64_t id) {
    for (auto it = notices.rbegin(); it != notices.rend(); ++it)
      if (it->first == id) return it->second;
    return {};
  }
};

}  // namespace

TEST_CASE("a cached lease stays charged to its client and comes back with reuse") {
  CacheFixture f;
  const auto alice = f.client(2001, "alice");
  const auto lease = f.alloc(alice, "kv", 64 * MiB);
  f.cache(alice, lease);
  CHECK(f.pool("kv")["lease_count"] == 1);
  CHECK(f.pool("kv")["cached_count"] == 1);
  CHECK(f.pool("kv")["cached_bytes"] == 64 * MiB);
  const Json me = model::to_json(f.holder.status())["clients"][0];
  CHECK(me["cached_count"] == 1);
  CHECK(me["cached_bytes"] == 64 * MiB);
  CHECK(me["leased_bytes"] == 64 * MiB);  // still charged
  CHECK(me["protocol"] == 2);
  CHECK(model::to_json(f.holder.stats(false))["pools"][1]["cached_bytes"] == 64 * MiB);
  CHECK(f.error_code(alice, {{"op", "free"}, {"lease", lease}, {"cache", true}}) == "bad_request");  // twice

  CHECK(f.call(alice, {{"op", "reuse"}, {"lease", lease}})["size"] == 64 * MiB);
  CHECK(f.pool("kv")["cached_count"] == 0);
  CHECK(f.pool("kv")["lease_count"] == 1);
  CHECK(f.error_code(alice, {{"op", "reuse"}, {"lease", lease}}) == "not_found");  // in use, not cached

  // Another client can't reuse it, nor free it.
  const auto bob = f.client(2002, "bob");
  f.cache(alice, lease);
  CHECK(f.error_code(bob, {{"op", "reuse"}, {"lease", lease}}) == "not_found");
  CHECK(f.error_code(bob, {{"op", "free"}, {"lease", lease}}) == "not_found");
  // A plain free of a cached lease frees it (the client unmapped it on its own).
  CHECK(f.call(alice, {{"op", "free"}, {"lease", lease}})["cached"] == false);
  CHECK(f.pool("kv")["lease_count"] == 0);
  CHECK(f.pool("kv")["cached_count"] == 0);
  CHECK(f.sim.pool_usage(1).used_bytes == 0);
}

TEST_CASE("protocol 1 connections have no cache; quiet is for free, reuse and dropped only") {
  CacheFixture f;
  const auto old = f.client(2001, "alice", 1);
  const auto lease = f.alloc(old, "kv", MiB);
  CHECK(f.error_code(old, {{"op", "free"}, {"lease", lease}, {"cache", true}}) == "bad_request");
  CHECK(f.error_code(old, {{"op", "list"}, {"quiet", true}}) == "bad_request");
  CHECK(f.error_code(old, {{"op", "dropped"}, {"ask", 1}, {"leases", {lease}}}) == "bad_request");  // not cached
  CHECK(f.error_code(old, {{"op", "dropped"}, {"ask", 1}, {"leases", "x"}}) == "bad_request");
  CHECK(f.error_code(old, {{"op", "dropped"}, {"ask", 1}, {"leases", {0}}}) == "bad_request");
  CHECK(f.pool("kv")["lease_count"] == 1);  // nothing was freed by the refused requests
}

TEST_CASE("a client's own cached blocks count against its quota, and are asked back to make room") {
  CacheFixture f;
  const auto alice = f.client(2001, "alice");
  const auto a = f.alloc(alice, "kv", 128 * MiB);
  const auto b = f.alloc(alice, "kv", 64 * MiB);
  f.cache(alice, a);
  f.cache(alice, b);
  // 192 MiB cached of a 256 MiB quota: 128 MiB more needs 64 MiB back, the largest block first.
  REQUIRE(f.waits(alice, {{"op", "alloc"}, {"pool", "kv"}, {"size", 128 * MiB}}, 7));
  const Json drop = f.last_notice_for(alice);
  CHECK(drop["notice"] == "drop");
  CHECK(drop["reason"] == "quota");
  CHECK(drop["leases"] == Json::array({a}));
  CHECK(drop["bytes"] == 128 * MiB);
  CHECK(drop["timeout_ms"] == 5000);
  CHECK(f.deferred.empty());
  // The answer is quiet; the waiting allocation is answered then.
  f.call(alice, {{"op", "dropped"}, {"ask", drop["ask"]}, {"leases", {a}}, {"quiet", true}}, 8);
  REQUIRE(f.deferred.size() == 1);
  CHECK(f.deferred[0].first == alice);
  CHECK(f.deferred[0].second["id"] == 7);
  CHECK(f.deferred[0].second["ok"] == true);
  CHECK(f.deferred[0].second["size"] == 128 * MiB);
  CHECK(f.pool("kv")["lease_count"] == 2);  // b (cached) and the new one
  CHECK(f.pool("kv")["cached_bytes"] == 64 * MiB);
  // Over the quota even with nothing cached: refused at once, nothing asked.
  const std::size_t asked = f.notices.size();
  CHECK(f.error_code(alice, {{"op", "alloc"}, {"pool", "kv"}, {"size", 300 * MiB}}) == "quota_exceeded");
  CHECK(f.notices.size() == asked);
}

TEST_CASE("pressure: an allocation that does not fit waits for other clients' cached blocks") {
  CacheFixture f;
  const auto one = f.client(0, "root");
  const auto two = f.client(1000, "holder");
  const auto big = f.alloc(one, "big", 768 * MiB);
  f.cache(one, big);
  REQUIRE(f.waits(two, {{"op", "alloc"}, {"pool", "big"}, {"size", 512 * MiB}}, 3));
  const Json drop = f.last_notice_for(one);
  CHECK(drop["reason"] == "pressure");
  CHECK(drop["leases"] == Json::array({big}));

  SUBCASE("answered") {
    f.call(one, {{"op", "dropped"}, {"ask", drop["ask"]}, {"leases", {big}}});
    REQUIRE(f.deferred.size() == 1);
    CHECK(f.deferred[0].first == two);
    CHECK(f.deferred[0].second["ok"] == true);
    CHECK(model::to_json(f.holder.status())["clients"][0]["lease_count"] == 0);
  }
  SUBCASE("the block was reused instead: the allocation still does not fit, and says so") {
    f.call(one, {{"op", "reuse"}, {"lease", big}, {"quiet", true}});  // answers the ask: nothing to drop
    REQUIRE(f.deferred.size() == 1);
    CHECK(f.deferred[0].second["ok"] == false);
    CHECK(f.deferred[0].second["error"]["code"] == "out_of_memory");
    CHECK(f.holder.overdue(now_ms() + 60000).empty());
  }
  SUBCASE("not answered: overdue after the timeout; closing it frees its leases and the wait ends") {
    CHECK(f.holder.overdue(now_ms()).empty());
    REQUIRE(f.holder.next_deadline());
    CHECK(*f.holder.next_deadline() <= now_ms() + 5000);
    CHECK(f.holder.overdue(now_ms() + 5001) == std::vector<std::uint64_t>{one});
    f.holder.disconnect(one);
    REQUIRE(f.deferred.size() == 1);
    CHECK(f.deferred[0].second["ok"] == true);
    CHECK_FALSE(f.holder.next_deadline());
  }
  SUBCASE("the waiting client leaves first: its reply goes nowhere, and the ask still stands") {
    f.holder.disconnect(two);
    f.call(one, {{"op", "dropped"}, {"ask", drop["ask"]}, {"leases", {big}}});
    CHECK(f.deferred.empty());
    CHECK(f.pool("big")["lease_count"] == 0);
  }
}

TEST_CASE("trim asks for cached blocks first, as far as --keep needs, and reports what came back") {
  CacheFixture f;
  const auto root = f.client(0, "root");
  const auto alice = f.client(2001, "alice");
  const auto a = f.alloc(alice, "kv", 128 * MiB);
  const auto b = f.alloc(alice, "kv", 64 * MiB);
  f.cache(alice, a);
  f.cache(alice, b);

  SUBCASE("keep covers what is cached: nothing is asked") {
    const Json out = f.call(root, {{"op", "trim"}, {"keep", 192 * MiB}});
    CHECK(out["dropped_bytes"] == 0);
    CHECK(f.notices.empty());
  }
  SUBCASE("keep 64 MiB: the 128 MiB block is asked for, the trim waits") {
    REQUIRE(f.waits(root, {{"op", "trim"}, {"keep", 64 * MiB}}, 4));
    const Json drop = f.last_notice_for(alice);
    CHECK(drop["reason"] == "trim");
    CHECK(drop["leases"] == Json::array({a}));
    f.call(alice, {{"op", "dropped"}, {"ask", drop["ask"]}, {"leases", {a}}});
    REQUIRE(f.deferred.size() == 1);
    CHECK(f.deferred[0].second["ok"] == true);
    CHECK(f.deferred[0].second["dropped_bytes"] == 128 * MiB);
    CHECK(f.pool("kv")["cached_bytes"] == 64 * MiB);
  }
  SUBCASE("cached false leaves them alone") {
    CHECK(f.call(root, {{"op", "trim"}, {"cached", false}})["dropped_bytes"] == 0);
    CHECK(f.notices.empty());
  }
  SUBCASE("a second request for the same blocks waits on the same notice") {
    REQUIRE(f.waits(root, {{"op", "trim"}}, 5));
    const std::size_t sent = f.notices.size();
    REQUIRE(f.waits(root, {{"op", "trim"}}, 6));
    CHECK(f.notices.size() == sent);
    const Json drop = f.last_notice_for(alice);
    f.call(alice, {{"op", "dropped"}, {"ask", drop["ask"]}, {"leases", {a, b}}});
    CHECK(f.deferred.size() == 2);
  }
}

TEST_CASE("apply asks back the cached blocks that alone keep a pool from going") {
  CacheFixture f;
  const auto root = f.client(0, "root");
  const auto alice = f.client(2001, "alice");
  const auto lease = f.alloc(alice, "kv", 64 * MiB);
  f.cache(alice, lease);
  std::string without_kv = kCacheConfig;
  without_kv.erase(without_kv.find("  - name: kv"), without_kv.find("  - name: big") - without_kv.find("  - name: kv"));
  const std::string yaml = without_kv;
  // plan says why it would wait.
  const Json plan = f.call(root, {{"op", "plan"}, {"config", yaml}});
  CHECK(plan["changes"][0]["blocked"].get<std::string>().find("all cached: apply asks for them back first") !=
        std::string::npos);
  REQUIRE(f.waits(root, {{"op", "apply"}, {"config", yaml}}, 9));
  const Json drop = f.last_notice_for(alice);
  CHECK(drop["reason"] == "apply");
  f.call(alice, {{"op", "dropped"}, {"ask", drop["ask"]}, {"leases", {lease}}});
  REQUIRE(f.deferred.size() == 1);
  const Json reply = f.deferred[0].second;
  CHECK(reply["ok"] == true);
  CHECK(reply["changes"][0]["action"] == "remove");
  CHECK_FALSE(reply["changes"][0].contains("blocked"));
  CHECK(f.pool("kv").is_null());

  // A pool with a lease in use is not waited for: blocked as before.
  const auto in_use = f.alloc(root, "big", MiB);
  (void)in_use;
  const std::string nothing = "version: 1\nholder: {socket: /tmp/cupool-unit.sock, mode: \"0666\"}\n";
  const Json blocked = f.call(root, {{"op", "apply"}, {"config", nothing}});
  CHECK(blocked["changes"][0]["blocked"].get<std::string>().find("1 lease held by 1 client") != std::string::npos);
}

TEST_CASE("a reload waits for the cached blocks that keep a pool from going, then applies") {
  CacheFixture f;
  const auto alice = f.client(2001, "alice");
  const auto lease = f.alloc(alice, "kv", 64 * MiB);
  f.cache(alice, lease);
  std::string yaml = kCacheConfig;
  yaml.erase(yaml.find("  - name: kv"), yaml.find("  - name: big") - yaml.find("  - name: kv"));
  const Desired without_kv = load_config(SourceFile("t.yaml", yaml), test::two_gpu_node(), Scope::all).desired;
  std::vector<Change> applied;
  bool done = false;
  CHECK(f.holder.apply_after_drops(without_kv, [&](const std::vector<Change>& c) {
    applied = c;
    done = true;
  }));
  CHECK_FALSE(done);
  CHECK(f.last_notice_for(alice)["reason"] == "apply");
  f.call(alice, {{"op", "dropped"}, {"ask", f.last_notice_for(alice)["ask"]}, {"leases", {lease}}});
  REQUIRE(done);
  REQUIRE(applied.size() == 1);
  CHECK(applied[0].action == model::ChangeAction::remove);
  CHECK(applied[0].blocked.empty());
  CHECK(f.deferred.empty());  // nobody waited on a reply
  // Nothing cached in the way: applied at once.
  done = false;
  CHECK_FALSE(f.holder.apply_after_drops(without_kv, [&](const std::vector<Change>&) { done = true; }));
  CHECK(done);
}

TEST_CASE("a client that leaves gives back its cached blocks") {
  CacheFixture f;
  const auto alice = f.client(2001, "alice");
  f.cache(alice, f.alloc(alice, "kv", 32 * MiB));
  f.cache(alice, f.alloc(alice, "kv", 32 * MiB));
  CHECK(f.holder.cached_count() == 2);
  CHECK(f.holder.cached_bytes() == 64 * MiB);
  f.holder.disconnect(alice);
  CHECK(f.holder.cached_count() == 0);
  CHECK(f.holder.lease_count() == 0);
  CHECK(f.sim.pool_usage(1).used_bytes == 0);
}

TEST_CASE("a connection whose request waits is served its quiet requests; others wait their turn") {
  CacheFixture f;
  const auto alice = f.client(2001, "alice");
  const auto a = f.alloc(alice, "kv", 200 * MiB);
  f.cache(alice, a);
  Conversation talk(f.holder, alice);
  auto send = [&](const Json& request) {
    const std::string bytes = proto::encode(proto::Kind::request, request);
    std::size_t used = 0;
    while (used < bytes.size()) used += talk.receive(bytes.data() + used, bytes.size() - used);
  };
  send({{"id", 20}, {"op", "alloc"}, {"pool", "kv"}, {"size", 100 * MiB}});
  CHECK(talk.waiting());
  CHECK(talk.out().empty());           // no reply yet
  send({{"id", 21}, {"op", "list"}});  // held
  CHECK(talk.out().empty());
  const Json drop = f.last_notice_for(alice);
  send({{"id", 22}, {"op", "dropped"}, {"ask", drop["ask"]}, {"leases", {a}}, {"quiet", true}});
  REQUIRE(f.deferred.size() == 1);
  CHECK(f.deferred[0].second["id"] == 20);
  talk.answer(f.deferred[0].second);
  CHECK_FALSE(talk.waiting());
  CHECK(talk.has_work());  // the held list
  talk.work();
  REQUIRE(talk.out().size() == 2);  // alloc's reply, then list's: in the order they were asked
  CHECK(talk.out()[1].bytes.find("\"id\":21") != std::string::npos);
}
