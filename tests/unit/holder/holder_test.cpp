#include "holder/holder.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "base/fd.h"
#include "config/load.h"
#include "device/sim_backend.h"
#include "holder/conversation.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/holder/requests.h"

using namespace cupool;

namespace {

const char* const kHolderConfig = R"(version: 1
holder: {socket: /tmp/cupool-unit.sock, mode: "0666"}
pools:
  - name: kv
    devices: [0, 1]
    handle_types: [posix_fd]
    max_size: 1GiB
    release_threshold: max
    reserve: 64MiB
    access: [all]
    share: {users: [alice], groups: [gpu], quota_per_client: 256MiB}
  - name: private
    devices: [0]
    handle_types: [posix_fd]
    max_size: 1GiB
  - name: local
    devices: [0]
buffers:
  - {name: weights, pool: kv, device: 0, size: 128MiB}
)";

Peer peer(std::uint32_t uid, std::string user, std::vector<std::string> groups = {}) {
  Peer p;
  p.pid = 4242;
  p.uid = uid;
  p.gid = uid;
  p.user = std::move(user);
  p.group_names = std::move(groups);
  return p;
}

struct Fixture {
  SimBackend sim{test::two_gpu_node()};
  Holder holder{sim, test::two_gpu_node(), /*self_uid=*/1000};

  Fixture() { holder.adopt_holder_settings(want().holder); }
  Desired want(const std::string& text = kHolderConfig) {
    return load_config(SourceFile("test.yaml", text), test::two_gpu_node(), Scope::all).desired;
  }

  std::uint64_t client(const Peer& p) {
    const std::uint64_t id = holder.connect(p);
    call(id, {{"op", "hello"}, {"protocol", proto::kProtocol}});
    return id;
  }
  Json call(std::uint64_t id, Json req) { return test::call(holder, id, std::move(req)); }
  std::string error_code(std::uint64_t id, Json req) { return test::error_code(holder, id, std::move(req)); }
  // The message a request was refused with ("" when it was not).
  std::string error_message(std::uint64_t id, Json req) {
    try {
      call(id, std::move(req));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

}  // namespace

TEST_CASE("apply creates the pools, and the second apply changes nothing and calls nothing") {
  Fixture f;
  const auto first = f.holder.apply(f.want());
  CHECK(first.size() == 5);  // 4 pools + 1 buffer
  const Json status = model::to_json(f.holder.status());
  CHECK(status["pools"].size() == 4);
  CHECK(status["buffers"].size() == 1);
  const std::size_t calls = f.sim.calls().size();
  CHECK(f.holder.apply(f.want()).empty());
  CHECK(f.sim.calls().size() == calls);
  CHECK(f.holder.plan(f.want()).empty());
}

TEST_CASE("reserve is mapped and stays reserved (read back from the pool)") {
  Fixture f;
  f.holder.apply(f.want());
  const Json stats = model::to_json(f.holder.stats(false));
  for (const auto& p : stats["pools"])
    if (p["name"] == "kv" && p["device"] == 1) CHECK(p["reserved_bytes"].get<std::uint64_t>() >= (64ULL << 20));
}

TEST_CASE("plan shows a threshold change; apply makes only that change") {
  Fixture f;
  f.holder.apply(f.want());
  std::string changed = kHolderConfig;
  changed.replace(changed.find("release_threshold: max"), 22, "release_threshold: 512MiB");
  const auto plan = f.holder.plan(f.want(changed));
  REQUIRE(plan.size() == 2);  // kv on both devices
  CHECK(plan[0].action == model::ChangeAction::update);
  CHECK(plan[0].field == "release_threshold");
  CHECK(plan[0].from.text == "max");
  CHECK(plan[0].from.value.is_null());
  CHECK(plan[0].to.text == "512MiB");
  CHECK(plan[0].to.value == 512ULL << 20);
  const std::size_t before = f.sim.calls().size();
  f.holder.apply(f.want(changed));
  std::vector<std::string> made(f.sim.calls().begin() + static_cast<std::ptrdiff_t>(before), f.sim.calls().end());
  CHECK(made.size() == 2);
  for (const auto& c : made) CHECK(c.rfind("set_pool_settings(", 0) == 0);
}

TEST_CASE("an alloc with synchronize waits for the allocation and records no IPC event after it") {
  // Issue 26: a client's first write after the holder recorded its IPC event cost 145-260 us on
  // the H100; after the holder's synchronize without one, 9-12 us. The library asks for it always.
  Fixture f;
  f.holder.apply(f.want());
  const auto alice = f.client(peer(1001, "alice"));
  auto allocated = [&](bool synchronize) {
    const std::size_t before = f.sim.calls().size();
    const Json reply = f.call(
        alice, {{"op", "alloc"}, {"pool", "kv"}, {"device", 0}, {"size_bytes", 1 << 20}, {"synchronize", synchronize}});
    CHECK(reply["ready"] == synchronize);
    for (std::size_t i = before; i < f.sim.calls().size(); ++i)
      if (f.sim.calls()[i].rfind("allocate_shared(", 0) == 0) return f.sim.calls()[i];
    return std::string("no allocate_shared");
  };
  const std::string waited = allocated(true);
  CHECK(waited.size() > 16);
  CHECK(waited.find(",synchronized)") != std::string::npos);
  CHECK(allocated(false).find("synchronized") == std::string::npos);
}

TEST_CASE("protocol 4 speaks docs/naming.md's names; a connection of 3 keeps the old ones") {
  Fixture f;
  f.holder.apply(f.want());
  const auto now = f.client(peer(1001, "alice"));  // protocol 4
  const auto old = f.holder.connect(peer(1001, "alice"));
  const Json hello = f.call(old, {{"op", "hello"}, {"protocol", 3}});
  CHECK(hello["holder"].get<std::string>().rfind("cupool ", 0) == 0);
  CHECK(hello["limits"]["max_payload"] == proto::kMaxPayload);
  CHECK(hello["limits"]["frame_timeout_ms"] == 5000);
  const Json hello4 = f.call(f.holder.connect(peer(1001, "alice")), {{"op", "hello"}, {"protocol", 4}});
  CHECK(hello4["version"] == hello["holder"]);
  CHECK(hello4["limits"]["max_payload_bytes"] == proto::kMaxPayload);
  CHECK(hello4["limits"]["frame_timeout_seconds"] == 5.0);
  CHECK(hello4["limits"]["drop_timeout_seconds"] == 5.0);

  const Json a = f.call(now, {{"op", "alloc"}, {"pool", "kv"}, {"device", 1}, {"size_bytes", 1 << 20}});
  CHECK(a["size_bytes"] == 1 << 20);
  CHECK(!a.contains("size"));
  const std::string unknown = f.error_message(now, {{"op", "alloc"}, {"pool", "kv"}, {"device", 1}, {"size", 1 << 20}});
  CHECK_MESSAGE(unknown.find("size_bytes") != std::string::npos, unknown);  // the old name, on 4: refused
  CHECK(f.call(now, {{"op", "free"}, {"lease", a["lease"]}})["size_bytes"] == 1 << 20);

  const Json b = f.call(old, {{"op", "alloc"}, {"pool", "kv"}, {"device", 1}, {"size", 2 << 20}});
  CHECK(b["size"] == 2 << 20);
  CHECK(!b.contains("size_bytes"));
  CHECK(f.call(old, {{"op", "free"}, {"lease", b["lease"]}})["size"] == 2 << 20);
  // A refusal names an argument as the connection sent it.
  const std::string zero = f.error_message(old, {{"op", "alloc"}, {"pool", "kv"}, {"device", 1}, {"size", 0}});
  CHECK_MESSAGE(zero.find("\"size\"") != std::string::npos, zero);
  CHECK_MESSAGE(zero.find("size_bytes") == std::string::npos, zero);
  const Json opened = f.call(old, {{"op", "buffer_open"}, {"name", "weights"}});
  CHECK(opened["parts"] == 1);
  CHECK(opened["buffer_size"] == opened["size"]);
  CHECK(opened.contains("mapped_size"));
  // What cupool prints has the new names on every version.
  CHECK(f.call(old, {{"op", "status"}})["client_count"] == 3);
}

TEST_CASE("a pool with leases is not removed, and the answer says so") {
  Fixture f;
  f.holder.apply(f.want());
  const auto alice = f.client(peer(1001, "alice"));
  const Json lease = f.call(alice, {{"op", "alloc"}, {"pool", "kv"}, {"device", 1}, {"size_bytes", 1 << 20}});
  std::string without = kHolderConfig;
  without.replace(without.find("devices: [0, 1]"), 15, "devices: [0]");
  const auto changes = f.holder.apply(f.want(without));
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].action == model::ChangeAction::remove);
  CHECK(changes[0].blocked == "1 lease held by 1 client");
  CHECK(model::to_json(f.holder.status())["pools"].size() == 4);
  f.call(alice, {{"op", "free"}, {"lease", lease["lease"]}});
  const auto again = f.holder.apply(f.want(without));
  REQUIRE(again.size() == 1);
  CHECK(again[0].blocked.empty());
  CHECK(model::to_json(f.holder.status())["pools"].size() == 3);
}

TEST_CASE("share: users, groups, admins; everyone else is refused") {
  Fixture f;
  f.holder.apply(f.want());
  const auto alice = f.client(peer(1001, "alice"));
  const auto bob_gpu = f.client(peer(1002, "bob", {"bob", "gpu"}));
  const auto eve = f.client(peer(1003, "eve", {"eve"}));
  const auto owner = f.client(peer(1000, "svc"));
  const auto root = f.client(peer(0, "root"));
  const Json alloc = {{"op", "alloc"}, {"pool", "kv"}, {"size_bytes", 4096}};
  CHECK(f.error_code(alice, alloc) == "ok");
  CHECK(f.error_code(bob_gpu, alloc) == "ok");
  CHECK(f.error_code(eve, alloc) == "not_permitted");
  CHECK(f.error_code(eve, {{"op", "import_pool"}, {"pool", "kv"}}) == "not_permitted");
  CHECK(f.error_code(eve, {{"op", "buffer_open"}, {"name", "weights"}}) == "not_permitted");
  // No share list: only the holder's user and root.
  const Json priv = {{"op", "alloc"}, {"pool", "private"}, {"size_bytes", 4096}};
  CHECK(f.error_code(alice, priv) == "not_permitted");
  CHECK(f.error_code(owner, priv) == "ok");
  CHECK(f.error_code(root, priv) == "ok");
  // No handle type: can't be shared at all.
  CHECK(f.error_code(root, {{"op", "alloc"}, {"pool", "local"}, {"size_bytes", 4096}}) == "bad_request");
  // Admin operations.
  CHECK(f.error_code(alice, {{"op", "trim"}}) == "not_permitted");
  CHECK(f.error_code(alice, {{"op", "buffer_remove"}, {"name", "weights"}}) == "not_permitted");
  CHECK(f.error_code(alice, {{"op", "stats"}, {"reset_peaks", true}}) == "not_permitted");
  CHECK(f.error_code(alice, {{"op", "stats"}}) == "ok");
  // An importer gets the pool's descriptor; a refused one gets none.
  Reply imported;
  CHECK_NOTHROW(imported = f.holder.handle(alice, {{"id", 2}, {"op", "import_pool"}, {"pool", "kv"}, {"device", 0}}));
  CHECK(imported.fd);
  CHECK_THROWS_AS(f.holder.handle(eve, {{"id", 3}, {"op", "import_pool"}, {"pool", "kv"}, {"device", 0}}), Error);
}

TEST_CASE("quota per client and pool") {
  Fixture f;
  f.holder.apply(f.want());
  const auto alice = f.client(peer(1001, "alice"));
  const auto other = f.client(peer(1001, "alice"));
  CHECK(f.error_code(alice, {{"op", "alloc"}, {"pool", "kv"}, {"device", 0}, {"size_bytes", 200 << 20}}) == "ok");
  CHECK(f.error_code(alice, {{"op", "alloc"}, {"pool", "kv"}, {"device", 0}, {"size_bytes", 100 << 20}}) ==
        "quota_exceeded");
  // Another pool (device 1) and another connection have their own quota.
  CHECK(f.error_code(alice, {{"op", "alloc"}, {"pool", "kv"}, {"device", 1}, {"size_bytes", 200 << 20}}) == "ok");
  CHECK(f.error_code(other, {{"op", "alloc"}, {"pool", "kv"}, {"device", 0}, {"size_bytes", 200 << 20}}) == "ok");
  // The pool's max_size still applies.
  CHECK(f.error_code(f.client(peer(0, "root")), {{"op", "alloc"}, {"pool", "private"}, {"size_bytes", 2ULL << 30}}) ==
        "out_of_memory");
}

TEST_CASE("a closed connection's leases are freed and its buffers closed") {
  Fixture f;
  f.holder.apply(f.want());
  const auto alice = f.client(peer(1001, "alice"));
  for (int i = 0; i < 3; ++i) f.call(alice, {{"op", "alloc"}, {"pool", "kv"}, {"device", 1}, {"size_bytes", 32 << 20}});
  f.call(alice, {{"op", "buffer_open"}, {"name", "weights"}});
  CHECK(f.holder.lease_count() == 3);
  CHECK(model::to_json(f.holder.status())["buffers"][0]["open_count"] == 1);
  f.holder.disconnect(alice);
  CHECK(f.holder.lease_count() == 0);
  CHECK(model::to_json(f.holder.status())["buffers"][0]["open_count"] == 0);
  const Json stats = model::to_json(f.holder.stats(false));
  for (const auto& p : stats["pools"])
    if (p["name"] == "kv" && p["device"] == 1) CHECK(p["used_bytes"] == 0);
}

TEST_CASE("export is a config that applies to the same holder with no changes") {
  Fixture f;
  f.holder.apply(f.want());
  const std::string exported = f.holder.export_config();
  CHECK(exported.find("name: kv") != std::string::npos);
  const Desired back = load_config(SourceFile("export.yaml", exported), test::two_gpu_node(), Scope::all).desired;
  const auto changes = f.holder.plan(back);
  for (const auto& c : changes) INFO(model::to_json(f.holder.view(c)).dump());
  CHECK(changes.empty());
}

TEST_CASE("export writes every share as a config that re-applies: one that names nobody is no share") {
  Fixture f;
  const std::string config = R"(version: 1
pools:
  - {name: none, devices: [0], handle_types: [posix_fd], share: {quota_per_client: 0B}}
  - {name: quota, devices: [0], handle_types: [posix_fd], share: {quota_per_client: 1GiB}}
  - {name: named, devices: [0], handle_types: [posix_fd], share: {users: [alice], groups: [gpu]}}
)";
  f.holder.apply(load_config(SourceFile("share.yaml", config), test::two_gpu_node(), Scope::all).desired);
  const std::string exported = f.holder.export_config();
  INFO(exported);
  CHECK(exported.find("{}") == std::string::npos);  // an empty share is refused by check
  const Loaded back =
      load_config(SourceFile("export.yaml", exported), test::two_gpu_node(), Scope::all);  // throws if refused
  CHECK(f.holder.plan(back.desired).empty());
}

TEST_CASE("trim reports what was really released, measured before and after") {
  Fixture f;
  f.holder.apply(f.want());
  const Json t = model::to_json(f.holder.trim(0, std::string("kv"), true));
  REQUIRE(t["pools"].size() == 2);
  // 64 MiB reserve per device; the buffer's 128 MiB stays on device 0.
  std::uint64_t total = 0;
  for (const auto& p : t["pools"]) {
    CHECK(p["released_bytes"].get<std::uint64_t>() ==
          p["reserved_before_bytes"].get<std::uint64_t>() - p["reserved_after_bytes"].get<std::uint64_t>());
    total += p["released_bytes"].get<std::uint64_t>();
  }
  CHECK(t["released_bytes"] == total);
  CHECK(total > 0);
  CHECK(t["devices"].size() == 2);
}

TEST_CASE("buffers: create, open, remove (busy unless forced)") {
  Fixture f;
  f.holder.apply(f.want());
  const auto root = f.client(peer(0, "root"));
  const auto alice = f.client(peer(1001, "alice"));
  CHECK(f.error_code(
            root,
            {{"op", "buffer_create"}, {"name", "scratch"}, {"pool", "kv"}, {"device", 1}, {"size_bytes", 1 << 20}}) ==
        "ok");
  CHECK(f.error_code(root, {{"op", "buffer_create"}, {"name", "scratch"}, {"pool", "kv"}, {"size_bytes", 1 << 20}}) ==
        "exists");
  CHECK(f.error_code(root, {{"op", "buffer_create"}, {"name", "Bad Name"}, {"pool", "kv"}, {"size_bytes", 1}}) ==
        "bad_request");
  CHECK(f.error_code(root, {{"op", "buffer_create"}, {"name", "x"}, {"pool", "nope"}, {"size_bytes", 1}}) ==
        "not_found");
  // A pool that is not held: the ones that are, and the nearest.
  CHECK(f.error_message(root, {{"op", "buffer_create"}, {"name", "x"}, {"pool", "nope"}, {"size_bytes", 1}}) ==
        "no pool named \"nope\"; the pools held: kv, local, private");
  CHECK(f.error_message(root, {{"op", "trim"}, {"pool", "privat"}}) ==
        "no pool named \"privat\" (did you mean \"private\"?); the pools held: kv, local, private");
  // The buffer is an exported allocation: its descriptor rides with the reply, and what this
  // process maps from it is the holder's memory (another process's map shares it).
  Reply opened = f.holder.handle(alice, {{"op", "buffer_open"}, {"name", "scratch"}, {"id", 1}});
  const Json& open = opened.body;
  const Fd descriptor = std::move(opened.fd);
  REQUIRE(descriptor);
  CHECK(open["size_bytes"] == 1 << 20);
  CHECK(open["mapping"] == "exported");
  CHECK(open["mapped_size_bytes"] == SimBackend::kGranule);
  REQUIRE(open["access"].size() == 1);  // access: [all] on two devices: the other one
  CHECK(open["access"][0]["device"] == 0);
  CHECK(open["access"][0]["uuid"] == test::two_gpu_node().devices[0].info.uuid);
  SimBackend importer{test::two_gpu_node()};
  const std::uint64_t here = importer.map_exported(1, descriptor.get(), SimBackend::kGranule, {});
  const char text[] = "shared";
  importer.write(1, here, text, sizeof text);
  char back[sizeof text] = {};
  importer.read(1, here, back, sizeof back);
  CHECK(std::string(back) == "shared");
  // Mapped on the wrong device, or larger than it is: refused.
  CHECK_THROWS_WITH_AS(importer.map_exported(0, descriptor.get(), SimBackend::kGranule, {}),
                       doctest::Contains("on device 1, not on device 0"), CudaError);
  CHECK_THROWS_AS(importer.map_exported(1, descriptor.get(), 2 * SimBackend::kGranule, {}), CudaError);
  CHECK_THROWS_AS(importer.map_exported(1, descriptor.get(), SimBackend::kGranule / 2, {}), CudaError);  // whole or not
  // A client of protocol 2 can't open it, and is told why.
  const auto old = f.holder.connect(peer(1001, "alice"));
  f.call(old, {{"op", "hello"}, {"protocol", 2}});
  const std::string refused = f.error_message(old, {{"op", "buffer_open"}, {"name", "scratch"}});
  CHECK_MESSAGE(refused.find("upgrade the client library") != std::string::npos, refused);
  CHECK(f.error_code(root, {{"op", "buffer_remove"}, {"name", "scratch"}}) == "busy");
  CHECK(f.error_code(root, {{"op", "buffer_remove"}, {"name", "scratch"}, {"force", true}}) == "ok");
  CHECK(f.error_code(alice, {{"op", "buffer_open"}, {"name", "scratch"}}) == "not_found");
}

namespace {

Json tensor_entry(const std::string& name, std::uint64_t offset, std::uint64_t elements, const char* dtype = "F32",
                  std::uint32_t part = 0) {
  return {{"name", name}, {"dtype", dtype},         {"shape", {elements}},
          {"part", part}, {"offset_bytes", offset}, {"size_bytes", elements * 4}};
}

Json loading_buffer(const std::string& name, Json tensors, std::uint64_t size = 1 << 20) {
  return {{"op", "buffer_create"},
          {"name", name},
          {"pool", "kv"},
          {"size_bytes", size},
          {"loading", true},
          {"tensors", std::move(tensors)},
          {"metadata", {{"format", "pt"}}}};
}

}  // namespace

TEST_CASE("buffers: a loading buffer is its loader's alone until buffer_ready, then its index is everyone's") {
  Fixture f;
  f.holder.apply(f.want());
  const auto root = f.client(peer(0, "root"));
  const auto owner = f.client(peer(1000, "svc"));
  const auto alice = f.client(peer(1001, "alice"));
  const auto eve = f.client(peer(1003, "eve", {"eve"}));
  const Json created = f.call(root, loading_buffer("model", {tensor_entry("b", 256, 8), tensor_entry("a", 0, 16)}));
  CHECK(created["tensor_count"] == 2);
  CHECK(created["state"] == "loading");
  CHECK(created["loading"] == true);  // its old name, until cupool 0.2
  CHECK(f.error_code(alice, {{"op", "buffer_open"}, {"name", "model"}}) == "busy");
  CHECK(f.error_code(alice, {{"op", "buffer_tensors"}, {"name", "model"}}) == "busy");
  CHECK(f.error_code(root, {{"op", "buffer_open"}, {"name", "model"}}) == "ok");
  CHECK(model::to_json(f.holder.status())["buffers"][0]["state"] == "loading");  // by name: model, weights
  CHECK(f.error_code(alice, {{"op", "buffer_ready"}, {"name", "model"}}) == "not_permitted");
  CHECK(f.error_code(owner, {{"op", "buffer_ready"}, {"name", "model"}}) == "bad_request");  // not its loader
  CHECK(f.error_code(root, {{"op", "buffer_ready"}, {"name", "nope"}}) == "not_found");
  CHECK(f.call(root, {{"op", "buffer_ready"}, {"name", "model"}})["tensor_count"] == 2);
  CHECK(f.error_code(root, {{"op", "buffer_ready"}, {"name", "model"}}) == "bad_request");  // ready already
  CHECK(f.error_code(alice, {{"op", "buffer_open"}, {"name", "model"}}) == "ok");
  const Json index = f.call(alice, {{"op", "buffer_tensors"}, {"name", "model"}});
  CHECK(index["indexed"] == true);
  CHECK(index["size_bytes"] == 1 << 20);
  REQUIRE(index["tensors"].size() == 2);
  CHECK(index["tensors"][0]["name"] == "a");  // by offset
  CHECK(index["tensors"][1] == tensor_entry("b", 256, 8));
  CHECK(index["metadata"]["format"] == "pt");
  CHECK(f.error_code(eve, {{"op", "buffer_tensors"}, {"name", "model"}}) == "not_permitted");
  const Json plain = f.call(alice, {{"op", "buffer_tensors"}, {"name", "weights"}});
  CHECK(plain["indexed"] == false);
  CHECK(plain["tensors"].empty());
  const Json listed = f.call(alice, {{"op", "list"}});
  CHECK(listed["buffers"][0]["tensor_count"] == 2);
  CHECK(listed["buffers"][0]["state"] == "ready");
  CHECK(listed["buffers"][1]["tensor_count"].is_null());
  // Not the config's: apply leaves it, its pool stays, and export leaves it out (saying so).
  for (const auto& c : f.holder.apply(f.want())) CHECK(c.name != "model");
  CHECK(model::to_json(f.holder.status())["buffers"].size() == 2);
  const std::string without_kv = R"(version: 1
holder: {socket: /tmp/cupool-unit.sock, mode: "0666"}
pools:
  - {name: private, devices: [0], handle_types: [posix_fd], max_size: 1GiB}
)";
  bool blocked = false;
  for (const auto& c : f.holder.plan(f.want(without_kv)))
    if (c.object == model::ChangeObject::pool && c.name == "kv" && c.device == 0)
      blocked = c.blocked.find("buffer model") != std::string::npos;
  CHECK(blocked);
  const std::string exported = f.holder.export_config();
  CHECK(exported.find("name: model") == std::string::npos);
  CHECK(exported.find("Not here: buffer model") != std::string::npos);
}

TEST_CASE("buffers: a tensor set in parts: one allocation each, opened part by part, freed together") {
  Fixture f;
  f.holder.apply(f.want());
  const auto root = f.client(peer(0, "root"));
  const auto alice = f.client(peer(1001, "alice"));
  const auto buffer_bytes = [&] {
    return model::to_json(f.holder.status())["pools"][0]["buffer_bytes"].get<std::uint64_t>();
  };
  const std::uint64_t before = buffer_bytes();
  Json create = loading_buffer(
      "model", {tensor_entry("a", 0, 256), tensor_entry("b", 0, 512, "F32", 1), tensor_entry("c", 2048, 4, "F32", 1)},
      1024 + 4096);
  create["part_sizes_bytes"] = {1024, 4096};
  const Json created = f.call(root, create);
  CHECK(created["part_count"] == 2);
  CHECK(buffer_bytes() == before + 1024 + 4096);
  CHECK(model::to_json(f.holder.status())["buffers"][0]["part_count"] == 2);
  CHECK(f.call(root, {{"op", "buffer_ready"}, {"name", "model"}})["tensor_count"] == 3);
  const Json first = f.call(alice, {{"op", "buffer_open"}, {"name", "model"}});
  CHECK(first["size_bytes"] == 1024);
  CHECK(first["part"] == 0);
  CHECK(first["part_count"] == 2);
  CHECK(first["buffer_size_bytes"] == 1024 + 4096);
  const Json second = f.call(alice, {{"op", "buffer_open"}, {"name", "model"}, {"part", 1}});
  CHECK(second["size_bytes"] == 4096);
  CHECK(second["mapped_size_bytes"] == SimBackend::kGranule);
  CHECK(first["mapping"] == "exported");
  const std::string missing = f.error_message(alice, {{"op", "buffer_open"}, {"name", "model"}, {"part", 2}});
  CHECK_MESSAGE(missing.find("has 2 parts; there is no part 2") != std::string::npos, missing);
  const Json index = f.call(alice, {{"op", "buffer_tensors"}, {"name", "model"}});
  CHECK(index["parts"] == Json::parse(R"([{"part": 0, "size_bytes": 1024}, {"part": 1, "size_bytes": 4096}])"));
  REQUIRE(index["tensors"].size() == 3);
  CHECK(index["tensors"][1] == tensor_entry("b", 0, 512, "F32", 1));  // by part, then offset
  CHECK(f.error_code(root, {{"op", "buffer_remove"}, {"name", "model"}, {"force", true}}) == "ok");
  CHECK(buffer_bytes() == before);
}

TEST_CASE("stats: held buffers and tensor sets per pool and per device, outside the pool's usage") {
  constexpr std::uint64_t kMiB = 1ULL << 20;
  Fixture f;
  f.holder.apply(f.want());
  const auto root = f.client(peer(0, "root"));
  const auto row = [](const Json& rows, const std::string& pool, int device) {
    for (const auto& r : rows)
      if ((pool.empty() || r["name"] == pool) && r["device"] == device) return r;
    FAIL("no row for " << pool << " on device " << device);
    return Json();
  };
  Json stats = model::to_json(f.holder.stats(false));
  // The config's buffer: 128 MiB in kv on device 0, an exported allocation the pool does not count.
  CHECK(row(stats["pools"], "kv", 0)["buffer_count"] == 1);
  CHECK(row(stats["pools"], "kv", 0)["buffer_bytes"] == 128 * kMiB);
  CHECK(row(stats["pools"], "kv", 0)["used_bytes"] == 0);
  CHECK(row(stats["pools"], "kv", 1)["buffer_count"] == 0);
  CHECK(row(stats["devices"], "", 0)["buffer_count"] == 1);
  CHECK(row(stats["devices"], "", 0)["buffer_bytes"] == 128 * kMiB);
  CHECK(row(stats["devices"], "", 1)["buffer_bytes"] == 0);
  // A tensor set of two parts is one more, of its whole size.
  Json create = loading_buffer("model", {tensor_entry("a", 0, 256), tensor_entry("b", 0, 512, "F32", 1)}, 1024 + 4096);
  create["part_sizes_bytes"] = {1024, 4096};
  f.call(root, create);
  f.call(root, {{"op", "buffer_ready"}, {"name", "model"}});
  stats = model::to_json(f.holder.stats(false));
  CHECK(row(stats["pools"], "kv", 0)["buffer_count"] == 2);
  CHECK(row(stats["pools"], "kv", 0)["buffer_bytes"] == 128 * kMiB + 1024 + 4096);
  CHECK(row(stats["devices"], "", 0)["buffer_count"] == 2);
  CHECK(row(stats["devices"], "", 0)["buffer_bytes"] == 128 * kMiB + 1024 + 4096);
  CHECK(f.error_code(root, {{"op", "buffer_remove"}, {"name", "model"}, {"force", true}}) == "ok");
  CHECK(row(model::to_json(f.holder.stats(false))["devices"], "", 0)["buffer_count"] == 1);
}

TEST_CASE("stats: the used high-water mark is what clients used, not the reserve the holder mapped") {
  constexpr std::uint64_t kMiB = 1ULL << 20;
  Fixture f;
  f.holder.apply(f.want());
  const auto kv = [&](int device, bool reset = false) {
    const Json stats = model::to_json(f.holder.stats(reset));
    for (const auto& p : stats["pools"])
      if (p["name"] == "kv" && p["device"] == device) return p;
    FAIL("no kv on device " << device);
    return Json();
  };
  // 64 MiB reserve per device: reserved (and its peak), but no client used any of it.
  CHECK(kv(0)["reserved_peak_bytes"].get<std::uint64_t>() >= 64 * kMiB);
  CHECK(kv(0)["used_peak_bytes"] == 0);
  const auto alice = f.client(peer(1001, "alice"));
  const Json a = f.call(alice, {{"op", "alloc"}, {"pool", "kv"}, {"device", 1}, {"size_bytes", 4 * kMiB}});
  f.call(alice, {{"op", "free"}, {"lease", a["lease"]}});
  CHECK(kv(1)["used_peak_bytes"] == 4 * kMiB);
  // A larger reserve mapped later (a reload) neither counts nor hides the clients' mark from before.
  std::string grown = kHolderConfig;
  grown.replace(grown.find("reserve: 64MiB"), 14, "reserve: 96MiB");
  f.holder.apply(f.want(grown));
  CHECK(kv(1)["reserved_bytes"].get<std::uint64_t>() >= 96 * kMiB);
  CHECK(kv(1, /*reset=*/true)["used_peak_bytes"] == 4 * kMiB);
  CHECK(kv(1)["used_peak_bytes"] == 0);  // reset: the current use
}

TEST_CASE("buffers: parts are checked before anything is made") {
  Fixture f;
  f.holder.apply(f.want());
  const auto root = f.client(peer(0, "root"));
  const std::uint64_t before = model::to_json(f.holder.status())["pools"][0]["buffer_bytes"].get<std::uint64_t>();
  auto refused = [&](Json parts, Json tensors, std::uint64_t size, const std::string& words) {
    Json request = loading_buffer("x", std::move(tensors), size);
    request["part_sizes_bytes"] = std::move(parts);
    const std::string message = f.error_message(root, request);
    CHECK_MESSAGE(message.find(words) != std::string::npos, message);
    CHECK(f.error_code(root, request) == "bad_request");
  };
  refused({1024, 1024}, Json::array({tensor_entry("a", 0, 4)}), 4096, "add up to 2048 bytes, not 4096");
  refused({1024, 0}, Json::array({tensor_entry("a", 0, 4)}), 1024, "holds 0, not a size");
  refused(Json::array(), Json::array({tensor_entry("a", 0, 4)}), 1024, "is not a list of parts");
  refused({"1024"}, Json::array({tensor_entry("a", 0, 4)}), 1024, "not a size");
  refused({1024, 1024}, Json::array({tensor_entry("a", 0, 4, "F32", 2)}), 2048,
          "is in part 2, but the buffer has 2 parts");
  refused({1024, 1024}, Json::array({tensor_entry("a", 1000, 16, "F32", 1)}), 2048,
          "past the end of the buffer (1024 bytes)");
  refused({1024, 1024}, {tensor_entry("a", 0, 64, "F32", 1), tensor_entry("b", 128, 64, "F32", 1)}, 2048, "overlap");
  // The same offsets in two parts are two places.
  Json fine = loading_buffer("x", {tensor_entry("a", 0, 64), tensor_entry("b", 0, 64, "F32", 1)}, 2048);
  fine["part_sizes_bytes"] = {1024, 1024};
  CHECK(f.error_code(root, fine) == "ok");
  CHECK(model::to_json(f.holder.status())["pools"][0]["buffer_bytes"].get<std::uint64_t>() == before + 2048);
}

TEST_CASE("buffers: a loader that leaves before buffer_ready takes its half-made buffer with it") {
  Fixture f;
  f.holder.apply(f.want());
  auto used = [&] {
    const Json status = model::to_json(f.holder.status());
    for (const auto& p : status["pools"])
      if (p["name"] == "kv" && p["device"] == 0) return p["buffer_bytes"].get<std::uint64_t>();
    return std::uint64_t{0};
  };
  const std::uint64_t before = used();
  const auto loader = f.client(peer(0, "root"));
  f.call(loader, loading_buffer("half", Json::array({tensor_entry("a", 0, 1024)}), 64 << 20));
  f.call(loader, {{"op", "buffer_open"}, {"name", "half"}});
  CHECK(used() == before + (64 << 20));
  f.holder.disconnect(loader);
  CHECK(model::to_json(f.holder.status())["buffers"].size() == 1);
  CHECK(used() == before);
  // A loaded one stays when its loader leaves.
  const auto second = f.client(peer(0, "root"));
  f.call(second, loading_buffer("done", Json::array({tensor_entry("a", 0, 1024)})));
  f.call(second, {{"op", "buffer_ready"}, {"name", "done"}});
  f.holder.disconnect(second);
  CHECK(model::to_json(f.holder.status())["buffers"].size() == 2);
}

TEST_CASE("buffers: an index is checked before anything is made") {
  Fixture f;
  f.holder.apply(f.want());
  const auto root = f.client(peer(0, "root"));
  auto refused = [&](Json request, const std::string& words) {
    try {
      f.call(root, std::move(request));
      FAIL("accepted: " << words);
    } catch (const Error& e) {
      CHECK(std::string(e.wire_code()) == "bad_request");
      CHECK_MESSAGE(std::string(e.what()).find(words) != std::string::npos, std::string(e.what()));
    }
  };
  refused(loading_buffer("x", Json::array({tensor_entry("a", 1 << 20, 1)})), "past the end of the buffer");
  refused(loading_buffer("x", {tensor_entry("a", 0, 64), tensor_entry("b", 128, 64)}), "overlap");
  refused(loading_buffer("x", {tensor_entry("a", 0, 4), tensor_entry("a", 256, 4)}), "two tensors are named \"a\"");
  refused(loading_buffer("x", Json::array({tensor_entry("a", 0, 4, "F17")})), "unknown dtype");
  refused(loading_buffer("x", Json::object()), "expected an array");
  Json bad_size = tensor_entry("a", 0, 4);
  bad_size["size_bytes"] = 17;
  refused(loading_buffer("x", Json::array({bad_size})), "is 16 bytes, but its offsets span 17");
  refused({{"op", "buffer_create"}, {"name", "x"}, {"pool", "kv"}, {"size_bytes", 64}, {"metadata", Json::object()}},
          "\"metadata\" comes with \"tensors\"");
  CHECK(model::to_json(f.holder.status())["buffers"].size() == 1);
  // Not an admin: refused before the index is looked at.
  CHECK(f.error_code(f.client(peer(1001, "alice")), loading_buffer("x", Json::array({tensor_entry("a", 0, 4)}))) ==
        "not_permitted");
}

TEST_CASE("requests: hello first, versions, unknown operations and arguments") {
  Fixture f;
  f.holder.apply(f.want());
  const auto id = f.holder.connect(peer(1001, "alice"));
  CHECK(f.error_code(id, {{"op", "list"}}) == "hello_required");
  CHECK(f.error_code(id, {{"op", "hello"}, {"protocol", proto::kProtocol + 1}}) == "unsupported_protocol");
  CHECK(f.error_code(id, {{"op", "hello"}, {"protocol", 0}}) == "unsupported_protocol");
  CHECK(f.error_code(id, {{"op", "hello"}, {"protocol", 1}, {"client", "ok-name"}}) == "ok");
  CHECK(f.error_code(id, {{"op", "lst"}}) == "unknown_op");
  CHECK(f.error_code(id, {{"op", "alloc"}, {"pool", "kv"}, {"size_bytes", 0}}) == "bad_request");
  CHECK(f.error_code(id, {{"op", "alloc"}, {"pool", "kv"}, {"sise", 1}}) == "bad_request");
  CHECK(f.error_code(id, {{"op", "free"}, {"lease", 99}}) == "not_found");
  CHECK(f.error_code(id, {{"op", "alloc"}, {"pool", "kv-cash"}, {"size_bytes", 1}}) == "not_found");
  const Json list = f.call(id, {{"op", "list"}});
  CHECK(list["pools"].size() == 4);
}

TEST_CASE("hello: a client name is shown to admins, so it must show as itself") {
  Fixture f;
  f.holder.apply(f.want());
  const auto id = f.holder.connect(peer(1001, "alice"));
  // C0, DEL, C1 (U+009B is CSI), and the right-to-left override U+202E are refused.
  for (const char* bad : {"a\x1b[2Jb", "a\x7f",
                          "a\xc2\x9b"
                          "31m",
                          "evil\xe2\x80\xaegnp.exe",
                          "a\xe2\x81\xa6"
                          "b"})
    CHECK_MESSAGE(f.error_code(id, {{"op", "hello"}, {"protocol", 1}, {"client", bad}}) == "bad_request", bad);
  CHECK(f.error_code(id, {{"op", "hello"}, {"protocol", 1}, {"client", "caf\xc3\xa9 \xe6\x8e\xa8\xe7\x90\x86"}}) ==
        "ok");
  CHECK(model::to_json(f.holder.status())["clients"][0]["name"] == "caf\xc3\xa9 \xe6\x8e\xa8\xe7\x90\x86");
}

TEST_CASE("draining refuses new work but lets clients free") {
  Fixture f;
  f.holder.apply(f.want());
  const auto alice = f.client(peer(1001, "alice"));
  const Json l = f.call(alice, {{"op", "alloc"}, {"pool", "kv"}, {"size_bytes", 4096}});
  f.holder.set_draining(true);
  CHECK(f.error_code(alice, {{"op", "alloc"}, {"pool", "kv"}, {"size_bytes", 4096}}) == "draining");
  CHECK(f.error_code(alice, {{"op", "free"}, {"lease", l["lease"]}}) == "ok");
}

TEST_CASE("a config with errors is rejected with its findings, and nothing changes") {
  Fixture f;
  f.holder.apply(f.want());
  const auto root = f.client(peer(0, "root"));
  const std::size_t calls = f.sim.calls().size();
  try {
    f.call(root, {{"op", "apply"}, {"config", "version: 1\npools:\n  - name: x\n    devices: [7]\n"}});
    FAIL("apply accepted a config naming a missing device");
  } catch (const ConfigRejected& e) {
    CHECK(e.findings().size() >= 1);
    CHECK(e.rendered().find("<request>:4:") != std::string::npos);
  }
  CHECK(f.sim.calls().size() == calls);
}

TEST_CASE("what apply put in place is said in status until the holder reads its own file again") {
  Fixture f;
  f.holder.apply(f.want());
  model::HolderInfo id;
  id.config = "/etc/cupool/cupool.yaml";
  f.holder.set_identity(id);
  CHECK_FALSE(f.holder.status().holder.applied_config);
  CHECK(f.holder.status().holder.apply_count == 0);
  const auto root = f.client(peer(0, "root"));
  // A plan changes nothing and is not counted; both say which file a reload goes back to.
  const Json plan = f.call(root, {{"op", "plan"}, {"config", kHolderConfig}, {"path", "other.yaml"}});
  CHECK(plan["config"] == "/etc/cupool/cupool.yaml");
  CHECK(plan["holder_config"] == "/etc/cupool/cupool.yaml");  // its old name, until cupool 0.2
  CHECK_FALSE(f.holder.status().holder.applied_config);
  const Json applied = f.call(root, {{"op", "apply"}, {"config", kHolderConfig}, {"path", "other.yaml"}});
  CHECK(applied["config"] == "/etc/cupool/cupool.yaml");
  const model::Status s = f.holder.status();
  REQUIRE(s.holder.applied_config);
  CHECK(s.holder.applied_config->path == "other.yaml");
  CHECK(s.holder.applied_config->user == std::optional<std::string>("root"));
  CHECK(s.holder.applied_config->since.size() == 20);
  CHECK(s.holder.apply_count == 1);
  CHECK(model::to_json(s)["holder"]["applied_config"]["path"] == "other.yaml");
  // A reload reads the file again: what apply made is forgotten (and the server says so).
  const auto forgotten = f.holder.forget_applied();
  REQUIRE(forgotten);
  CHECK(forgotten->path == "other.yaml");
  CHECK_FALSE(f.holder.status().holder.applied_config);
  CHECK(model::to_json(f.holder.status())["holder"]["applied_config"].is_null());
  CHECK(f.holder.status().holder.apply_count == 1);
}

TEST_CASE("a pool name is replaced on all its devices or on none") {
  Fixture f;
  f.holder.apply(f.want());
  // The buffer 'weights' lives in kv on device 0, so kv can't be replaced there; device 1 must wait too.
  std::string bigger = kHolderConfig;
  bigger.replace(bigger.find("max_size: 1GiB"), 14, "max_size: 2GiB");
  const auto changes = f.holder.plan(f.want(bigger));
  int replaces = 0;
  for (const auto& c : changes) {
    if (c.action != model::ChangeAction::replace || c.name != "kv") continue;
    ++replaces;
    CHECK_FALSE(c.blocked.empty());
    if (c.device == 1) CHECK(c.blocked.find("replaced on all its devices or on none") != std::string::npos);
  }
  CHECK(replaces == 2);
  const std::size_t before = f.sim.calls().size();
  f.holder.apply(f.want(bigger));
  for (std::size_t i = before; i < f.sim.calls().size(); ++i) CHECK(f.sim.calls()[i].rfind("destroy_pool", 0) != 0);
  // export still describes one pool that applies to itself unchanged.
  CHECK(f.holder
            .plan(load_config(SourceFile("export.yaml", f.holder.export_config()), test::two_gpu_node(), Scope::all)
                      .desired)
            .empty());
}

TEST_CASE("connection limits: per user for everyone but admins, and a reserve that keeps admins in") {
  SimBackend sim{test::two_gpu_node()};
  HolderLimits limits;
  limits.max_clients = 6;
  limits.max_clients_per_user = 2;
  limits.admin_reserve = 2;
  Holder holder{sim, test::two_gpu_node(), /*self_uid=*/1000, limits};
  auto refused = [&](const Peer& p) {
    try {
      holder.connect(p);
    } catch (const Error& e) {
      return e.wire_code() + std::string(": ") + e.what();
    }
    return std::string();
  };
  const Peer alice = peer(2001, "alice");
  holder.connect(alice);
  const std::uint64_t second = holder.connect(alice);
  const std::string third = refused(alice);
  CHECK(third.rfind("limit_exceeded", 0) == 0);
  CHECK(third.find("2 connections per user, and user alice (uid 2001)") != std::string::npos);
  holder.disconnect(second);  // one leaves: alice may connect again
  CHECK(refused(alice).empty());
  // Others are not held back by alice; admins have no per-user limit.
  holder.connect(peer(2002, "bob"));
  holder.connect(peer(2002, "bob"));
  for (int i = 0; i < 2; ++i) holder.connect(peer(1000, "holder"));
  // 6 connections: the limit for everyone else, 2 more for admins (root or the holder's user).
  CHECK(refused(peer(2003, "carol")).find("at most 6 connections") != std::string::npos);
  CHECK(refused(peer(0, "root")).empty());
  CHECK(refused(peer(1000, "holder")).empty());
  CHECK(refused(peer(1000, "holder")).find("(and 2 more for admins)") != std::string::npos);
}

namespace {

// A socket whose mode and group can be set, or that refuses (as a socket file replaced or gone).
struct FakeSocket : SocketPermissions {
  unsigned mode = 0666;
  std::string group;
  bool refuse = false;
  void set(unsigned m, const std::string& g) override {
    if (refuse) throw Error(Errc::unreachable, "can't set the mode of /tmp/cupool-unit.sock: Operation not permitted");
    mode = m;
    group = g.empty() ? "(the holder's)" : g;
  }
};

}  // namespace

TEST_CASE("a socket given on the command line (hold --socket) is not a change the file asks for") {
  auto socket_changes = [](const std::vector<Change>& changes) {
    return std::count_if(changes.begin(), changes.end(), [](const Change& c) { return c.field == "socket"; });
  };
  Fixture f;
  f.holder.apply(f.want());
  HolderWant started = f.want().holder;
  started.socket = "/tmp/cupool-elsewhere.sock";
  f.holder.adopt_holder_settings(started);
  // Started from the file with another socket: a restart would move it, and plan says so.
  REQUIRE(socket_changes(f.holder.plan(f.want())) == 1);
  // Started with --socket: the command line wins at every reload, as it did at the start.
  f.holder.keep_socket_from_command_line();
  CHECK(socket_changes(f.holder.plan(f.want())) == 0);
  CHECK(socket_changes(f.holder.apply(f.want())) == 0);
  CHECK(f.holder.holder_settings().socket == "/tmp/cupool-elsewhere.sock");
}

TEST_CASE("apply changes the socket's mode and group, and says so only when they were made true") {
  Fixture f;
  FakeSocket socket;
  f.holder.attach_socket(&socket);
  f.holder.apply(f.want());
  std::string tighter = kHolderConfig;
  tighter.replace(tighter.find("mode: \"0666\""), 12, "mode: \"0600\", group: root");
  auto changes = f.holder.apply(f.want(tighter));
  REQUIRE(changes.size() == 2);
  CHECK(changes[0].field == "mode");
  CHECK(changes[0].blocked.empty());
  CHECK(socket.mode == 0600);
  CHECK(socket.group == "root");
  CHECK(f.holder.plan(f.want(tighter)).empty());
  CHECK(f.holder.export_config().find("mode: \"0600\"") != std::string::npos);

  // The socket refuses: the changes are reported as not made, and the holder keeps what is true.
  socket.refuse = true;
  changes = f.holder.apply(f.want());
  REQUIRE(changes.size() == 2);
  for (const Change& c : changes) CHECK(c.blocked.find("not applied: can't set the mode") == 0);
  CHECK(socket.mode == 0600);
  CHECK(f.holder.holder_settings().mode == 0600);
  CHECK(f.holder.plan(f.want()).size() == 2);  // still to do
  socket.refuse = false;
  CHECK(f.holder.apply(f.want()).size() == 2);
  CHECK(socket.mode == 0666);
  CHECK(socket.group == "(the holder's)");
  CHECK(f.holder.plan(f.want()).empty());
}

TEST_CASE("a client that imported a pool is told when the pool is replaced; replies say which pool they are from") {
  Fixture f;
  std::vector<std::pair<std::uint64_t, Json>> notices;
  f.holder.on_notice([&](std::uint64_t client, const Json& n) { notices.emplace_back(client, n); });
  f.holder.apply(f.want());
  const auto admin = f.client(peer(1000, "holder"));
  const auto other = f.client(peer(0, "root"));
  const Json imported = f.call(admin, {{"op", "import_pool"}, {"pool", "private"}, {"device", 0}});
  const std::uint64_t before = imported["generation"];
  CHECK(f.call(other, {{"op", "list"}})["pools"].size() == 4);  // it imported nothing
  // max_size can't change on a live pool: the pool is replaced (it has no leases or buffers).
  std::string bigger = kHolderConfig;
  const auto at = bigger.find("max_size: 1GiB", bigger.find("name: private"));
  bigger.replace(at, 14, "max_size: 2GiB");
  const auto changes = f.holder.apply(f.want(bigger));
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].action == model::ChangeAction::replace);
  CHECK(changes[0].blocked.empty());
  REQUIRE(notices.size() == 1);
  CHECK(notices[0].first == admin);
  CHECK(notices[0].second["notice"] == "pool_gone");
  CHECK(notices[0].second["pool"] == "private");
  CHECK(notices[0].second["device"] == 0);
  CHECK(notices[0].second["uuid"] == imported["uuid"]);  // the device's whole identity (docs/naming.md)
  CHECK(notices[0].second["pci_bus_id"] == imported["pci_bus_id"]);
  CHECK(!imported["pci_bus_id"].get<std::string>().empty());
  CHECK(notices[0].second["generation"] == before);
  const Json lease = f.call(admin, {{"op", "alloc"}, {"pool", "private"}, {"device", 0}, {"size_bytes", 4096}});
  CHECK(lease["generation"] != before);
  const Json again = f.call(admin, {{"op", "import_pool"}, {"pool", "private"}, {"device", 0}});
  CHECK(again["generation"] == lease["generation"]);
  f.call(admin, {{"op", "free"}, {"lease", lease["lease"]}});
}

namespace {
// Feeds `bytes` to a conversation as the server would; returns the replies it queued.
std::vector<Json> converse(Conversation& talk, const std::string& bytes) {
  std::size_t used = 0;
  while (used < bytes.size()) {
    const std::size_t n = talk.receive(bytes.data() + used, bytes.size() - used);
    if (n == 0) break;  // closing
    used += n;
  }
  std::vector<Json> replies;
  std::string out;
  for (auto& f : talk.out()) out += f.bytes.substr(f.sent);
  std::size_t at = 0;
  std::string joined;
  while (at < out.size()) {
    const auto h = proto::decode_header(reinterpret_cast<const std::uint8_t*>(out.data() + at), proto::Kind::reply);
    joined += out.substr(at + proto::kHeaderSize, h.length);
    at += proto::kHeaderSize + h.length;
    if (h.kind == proto::Kind::part) continue;
    replies.push_back(proto::parse_payload(joined));
    joined.clear();
  }
  while (!talk.out().empty()) talk.sent(talk.out().front().bytes.size() - talk.out().front().sent);
  return replies;
}
}  // namespace

TEST_CASE("while the holder starts, requests that need no driver are served and the others wait, in order") {
  Fixture f;
  f.holder.declare_pools(f.want());
  f.holder.set_starting(true);
  const std::uint64_t id = f.client(peer(0, "root"));
  Conversation talk(f.holder, id);
  auto frame = [](std::int64_t n, const char* op) {
    return proto::encode(proto::Kind::request, {{"id", n}, {"op", op}});
  };
  const Json hello = {{"id", 1}, {"op", "hello"}, {"protocol", proto::kProtocol}};
  REQUIRE(converse(talk, proto::encode(proto::Kind::request, hello)).size() == 1);
  const auto status = converse(talk, frame(2, "status"));
  REQUIRE(status.size() == 1);
  CHECK(status[0]["ok"] == true);
  CHECK(status[0]["pools"].empty());  // declared, not made yet
  // list needs the pools made: held, and status after it too (replies keep the requests' order).
  CHECK(converse(talk, frame(3, "list")).empty());
  CHECK(talk.parked());
  CHECK(converse(talk, frame(4, "status")).empty());
  CHECK_FALSE(talk.has_work());
  // Served here, a request that needs the driver is refused, never run on the serving thread.
  CHECK(test::error_code(f.holder, id, {{"op", "stats"}}) == "busy");
  // The driver is up, the pools are made: the held requests are served in order.
  f.holder.apply(f.want());
  f.holder.set_starting(false);
  CHECK(talk.has_work());
  talk.work();
  talk.work();
  const auto replies = converse(talk, "");
  REQUIRE(replies.size() == 2);
  CHECK(replies[0]["id"] == 3);
  CHECK(replies[0]["ok"] == true);
  CHECK_FALSE(replies[0]["pools"].empty());
  CHECK(replies[1]["id"] == 4);
  CHECK_FALSE(replies[1]["pools"].empty());
  CHECK(Holder::serves_while_starting(std::string("buffer_open")));
  CHECK_FALSE(Holder::serves_while_starting(std::string("alloc")));
}

TEST_CASE("a request in parts is joined for admins, refused for others, and bounded") {
  Fixture f;
  f.holder.apply(f.want());
  // hello says how long a message each side may send.
  const Json admin_hello = f.call(f.holder.connect(peer(0, "root")), {{"op", "hello"}, {"protocol", 1}});
  const Json user_hello = f.call(f.holder.connect(peer(2000, "alice", {"gpu"})), {{"op", "hello"}, {"protocol", 1}});
  CHECK(admin_hello["limits"]["max_request"] == proto::kMaxRequest);
  CHECK(user_hello["limits"]["max_request"] == proto::kMaxPayload);
  CHECK(user_hello["limits"]["max_reply"] == proto::kMaxReply);
  // The held config over 64 KiB (long comments) planned back: no changes.
  std::string text = kHolderConfig;
  for (int i = 0; i < 2000; ++i) text += "# a long comment, line " + std::to_string(i) + std::string(60, '.') + "\n";
  const Json plan = {{"id", 5}, {"op", "plan"}, {"config", text}, {"path", "big.yaml"}};
  const std::string request = proto::encode(proto::Kind::request, plan);
  REQUIRE(request.size() > 2 * proto::kMaxPayload);

  Conversation admin(f.holder, f.client(peer(1000, "holder")));
  const auto replies = converse(admin, request);
  REQUIRE(replies.size() == 1);
  CHECK(replies[0]["id"] == 5);
  CHECK(replies[0]["ok"] == true);
  CHECK(replies[0]["changes"].empty());
  CHECK_FALSE(admin.closing());
  CHECK_FALSE(admin.mid_frame());

  // Another user: the first part is refused (the holder keeps none of it) and the stream ends.
  Conversation other(f.holder, f.client(peer(2000, "alice", {"gpu"})));
  const auto refused = converse(other, request);
  REQUIRE(refused.size() == 1);
  CHECK(refused[0]["error"]["code"] == "bad_frame");
  CHECK(refused[0]["error"]["message"].get<std::string>().find("admins only") != std::string::npos);
  CHECK(other.closing());

  // Parts past kMaxRequest, from an admin: refused when the part that crosses it is whole.
  Conversation flood(f.holder, f.client(peer(0, "root")));
  std::string part = proto::encode(proto::Kind::request, Json{{"x", std::string(200000, 'x')}});
  const auto first = proto::decode_header(reinterpret_cast<const std::uint8_t*>(part.data()), proto::Kind::request);
  REQUIRE(first.kind == proto::Kind::part);
  part.resize(proto::kHeaderSize + first.length);  // its first frame, sent again and again
  std::size_t sent = 0;
  while (!flood.closing() && sent < 2 * proto::kMaxRequest) {
    converse(flood, part);
    sent += part.size();
  }
  CHECK(flood.closing());
  CHECK(sent > proto::kMaxRequest);
  CHECK(sent <= proto::kMaxRequest + 2 * part.size());
}

TEST_CASE("the findings of a file made to be large fit a reply; the name a request gives is bounded and shown safely") {
  Fixture f;
  f.holder.apply(f.want());
  const auto alice = f.client(peer(2000, "alice", {"gpu"}));
  // 1000 findings whose keys are control characters (YAML escapes), under a name of 256 of them:
  // each finding quotes its key and repeats the name.
  std::string text = "version: 1\npools:\n  - name: kv\n    devices: [0]\n";
  for (int i = 0; i < 1000; ++i) {
    text += "    \"";
    for (int k = 0; k < 230; ++k) text += "\\x1b";
    text += std::to_string(i) + "\": 1\n";
  }
  REQUIRE(text.size() <= kMaxConfigBytes);
  const std::string name(proto::kMaxConfigName, '\x1b');
  CHECK(f.error_code(alice, {{"op", "plan"}, {"config", "version: 1\n"}, {"path", name + "x"}}) == "bad_request");
  // A config longer than a file `cupool check` reads (1 MiB) is refused before it is parsed.
  CHECK(f.error_code(alice, {{"op", "plan"}, {"config", std::string(kMaxConfigBytes + 1, '#')}}) == "bad_request");
  Json reply;
  try {
    f.call(alice, {{"op", "plan"}, {"config", text}, {"path", name}});
    FAIL("the file was accepted");
  } catch (const ConfigRejected& e) {
    reply = rejected_body(1, e);
    const auto size = reply.dump().size();
    MESSAGE("reply of 1000 findings with control characters: " << size << " bytes");
    CHECK(size < proto::kMaxReply / 2);
    CHECK(reply["error"]["findings"].size() == kMaxFindings);
    const std::string shown = reply["error"]["findings"][0]["file"];
    CHECK(shown.find('\x1b') == std::string::npos);
    CHECK(shown.find("\xef\xbf\xbd") == 0);  // U+FFFD for each
    const std::string message = reply["error"]["findings"][0]["message"];
    CHECK(message.find('\x1b') == std::string::npos);
    CHECK(reply["error"]["rendered"].get<std::string>().find('\x1b') == std::string::npos);

    // Were a reply ever over the limit, it still goes: the text cut first, then the last findings.
    const Json small = rejected_body(1, e, 200000);
    CHECK(small.dump().size() <= 200000);
    CHECK(small["error"]["finding_count"] == kMaxFindings);
    REQUIRE_FALSE(small["error"]["findings"].empty());
    CHECK(small["error"]["findings"].size() < kMaxFindings);
    CHECK(small["error"]["findings"][0] == reply["error"]["findings"][0]);
    CHECK(small["error"]["rendered"].get<std::string>().find("(cut: a reply is at most 200000 bytes)") !=
          std::string::npos);
  }
}

TEST_CASE("buffers: exported allocations are charged to their pool's max_size, with its leases") {
  Fixture f;
  f.holder.apply(f.want());
  const auto root = f.client(peer(0, "root"));
  const auto create = [&](const char* name, std::uint64_t size) {
    return f.error_message(
        root, {{"op", "buffer_create"}, {"name", name}, {"pool", "private"}, {"device", 0}, {"size_bytes", size}});
  };
  CHECK(create("first", 600ULL << 20).empty());
  const std::string refused = create("second", 600ULL << 20);
  // Said once, in cupool's words: no CUDA error wrapped around cupool's own reason.
  CHECK(refused ==
        "pool private on device 0 has no room for 600 MiB: its max_size 1 GiB holds 600 MiB of buffers and 0 B "
        "reserved");
  CHECK(f.error_code(root, {{"op", "buffer_create"},
                            {"name", "second"},
                            {"pool", "private"},
                            {"device", 0},
                            {"size_bytes", 600ULL << 20}}) == "out_of_memory");
  // A lease that would pass the pool's max_size with the buffer in it is refused the same way.
  const std::string lease =
      f.error_message(root, {{"op", "alloc"}, {"pool", "private"}, {"device", 0}, {"size_bytes", 512ULL << 20}});
  CHECK_MESSAGE(lease.find("of buffers") != std::string::npos, lease);
  CHECK(f.error_code(root, {{"op", "buffer_remove"}, {"name", "first"}}) == "ok");
  CHECK(create("second", 600ULL << 20).empty());
  // The driver's own refusal: its call and result said once, not a CUDA error inside parentheses.
  f.sim.fail("create_exported", "CUDA_ERROR_OUT_OF_MEMORY");
  CHECK(create("third", 1ULL << 20) ==
        "pool private on device 0 has no room for 1 MiB: simulated create_exported returned CUDA_ERROR_OUT_OF_MEMORY");
}
