#include "protocol/messages.h"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

using namespace cupool;
using namespace cupool::proto;

namespace {

Bytes64 blob_of(std::uint8_t seed) {
  Bytes64 b{};
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(seed + i);
  return b;
}

model::DeviceId gpu(int ordinal) {
  return {ordinal, "GPU-0000000" + std::to_string(ordinal), "00000000:1" + std::to_string(ordinal) + ":00.0"};
}

// What the holder reads of `request` (as it reads every request: Args, then finish).
template <typename Reader>
auto at_holder(Reader reader, const Json& request) {
  Args a(request);
  auto v = reader(a);
  a.finish();
  return v;
}

// Every variant of `body` with one field taken away or replaced by a value of another type: each
// reader may refuse it (std::invalid_argument) or take it, never anything else. Returns how many
// it refused.
template <typename Reader>
int refused_variants(Reader reader, const Json& body) {
  int refused = 0;
  const std::vector<Json> strangers = {nullptr, true, -1, 1.5, "x", Json::array({1}), Json::object()};
  for (const auto& item : body.items()) {
    std::vector<Json> variants;
    Json without = body;
    without.erase(item.key());
    variants.push_back(without);
    for (const Json& s : strangers) {
      Json changed = body;
      changed[item.key()] = s;
      variants.push_back(changed);
    }
    for (const Json& v : variants) try {
        reader(v);
      } catch (const std::invalid_argument&) {
        refused += 1;
      }
  }
  CHECK_THROWS_AS(reader(Json::array()), std::invalid_argument);
  CHECK_THROWS_AS(reader(Json("text")), std::invalid_argument);
  return refused;
}

// A buffer_create without an index or parts.
BufferCreate plain_buffer(const std::string& name, const std::string& pool, int device, std::uint64_t size) {
  BufferCreate v;
  v.name = name;
  v.pool = pool;
  v.device = device;
  v.size_bytes = size;
  return v;
}

}  // namespace

TEST_CASE("every request the client library writes is what the holder reads") {
  const Hello hello{4, std::string("engine-1")};
  const Hello h = at_holder(read_hello, to_json(hello));
  CHECK(h.protocol == 4);
  CHECK(h.client == hello.client);
  CHECK_FALSE(to_json(Hello{3, std::nullopt}).contains("client"));

  const ImportPool ip = at_holder(read_import_pool, to_json(ImportPool{"kv", 1}));
  CHECK(ip.pool == "kv");
  CHECK(ip.device == 1);

  const Alloc al = at_holder(read_alloc, to_json(Alloc{"kv", -1, 4096, true}));
  CHECK(al.pool == "kv");
  CHECK(al.device == -1);
  CHECK(al.size_bytes == 4096);
  CHECK(al.synchronize);

  const Free fr = at_holder(read_free, to_json(Free{7, true}));
  CHECK(fr.lease == 7);
  CHECK(fr.cache);
  // Protocol 1 knows no "cache": a plain free does not send it.
  CHECK_FALSE(to_json(Free{7, false}).contains("cache"));
  CHECK_FALSE(at_holder(read_free, to_json(Free{7, false})).cache);

  CHECK(at_holder(read_reuse, to_json(proto::Reuse{9})).lease == 9);

  const Dropped dr = at_holder([](Args& a) { return read_dropped(a, 16); }, to_json(Dropped{3, {4, 5}}));
  CHECK(dr.ask == 3);
  CHECK(dr.leases == std::vector<std::uint64_t>{4, 5});

  const BufferOpen bo = at_holder(read_buffer_open, to_json(BufferOpen{"weights", 2}));
  CHECK(bo.name == "weights");
  CHECK(bo.part == 2);
  // A holder from before parts knows no "part": part 0 is not sent.
  CHECK_FALSE(to_json(BufferOpen{"weights", 0}).contains("part"));

  CHECK(at_holder(read_buffer_close, to_json(BufferClose{"weights"})).name == "weights");

  // Each request names its op.
  CHECK(to_json(Alloc{}).at("op") == "alloc");
  CHECK(to_json(Dropped{}).at("op") == "dropped");
}

TEST_CASE("the holder's readers bound what a request says") {
  CHECK_THROWS_AS(at_holder(read_alloc, Json{{"pool", "kv"}, {"size_bytes", 0}}), Error);
  CHECK_THROWS_AS(at_holder(read_alloc, Json{{"pool", "kv"}, {"size_bytes", kMaxAllocation + 1}}), Error);
  CHECK_THROWS_AS(at_holder(read_alloc, Json{{"pool", std::string(proto::kMaxName + 1, 'a')}, {"size_bytes", 1}}),
                  Error);
  CHECK_THROWS_AS(at_holder(read_alloc, Json{{"pool", "kv"}, {"size", 1}}), Error);  // protocol 3's name
  CHECK_THROWS_AS(at_holder(read_free, Json{{"lease", 0}}), Error);
  CHECK_THROWS_AS(at_holder(read_buffer_open, Json{{"name", "w"}, {"part", kMaxPartNumber + 1}}), Error);
  CHECK_THROWS_AS(at_holder([](Args& a) { return read_dropped(a, 1); }, Json{{"ask", 1}, {"leases", {1, 2}}}), Error);
  CHECK_THROWS_AS(at_holder(read_hello, Json{{"protocol", 70000}}), Error);
}

TEST_CASE("every request of the CLI's verbs is what the holder reads") {
  // Those without arguments: the op alone.
  CHECK(to_json(proto::List{}) == Json{{"op", "list"}});
  CHECK(to_json(proto::Status{}) == Json{{"op", "status"}});
  CHECK(to_json(proto::Export{}) == Json{{"op", "export"}});
  at_holder(read_list, to_json(proto::List{}));
  at_holder(read_status, to_json(proto::Status{}));
  at_holder(read_export, to_json(proto::Export{}));

  CHECK(at_holder(read_stats, to_json(proto::Stats{true})).reset_peaks);
  CHECK_FALSE(at_holder(read_stats, to_json(proto::Stats{})).reset_peaks);
  CHECK(to_json(proto::Stats{}) == Json{{"op", "stats"}});  // the exporter's request: no reset_peaks

  proto::Trim trim;
  trim.keep_bytes = 4ULL << 30;
  trim.pool = "kv-cache";
  trim.graph = false;
  trim.cached = false;
  const proto::Trim t = at_holder(read_trim, to_json(trim));
  CHECK(t.keep_bytes == 4ULL << 30);
  CHECK(t.pool == std::optional<std::string>("kv-cache"));
  CHECK_FALSE(t.graph);
  CHECK_FALSE(t.cached);
  // The defaults: every pool, graph memory and cached blocks too; "cached" is sent only as false.
  const Json plain_trim = to_json(proto::Trim{});
  CHECK(plain_trim == Json{{"op", "trim"}, {"keep_bytes", 0}, {"graph", true}});
  const proto::Trim d = at_holder(read_trim, plain_trim);
  CHECK(d.keep_bytes == 0);
  CHECK_FALSE(d.pool);
  CHECK(d.graph);
  CHECK(d.cached);
  const proto::Trim empty = at_holder(read_trim, Json{{"op", "trim"}});
  CHECK(empty.keep_bytes == 0);
  CHECK(empty.graph);
  CHECK(empty.cached);

  const auto read_plan_of = [](bool apply) { return [apply](Args& a) { return read_plan(a, apply, 1 << 20); }; };
  const proto::Plan plan{"version: 1\n", std::string("/etc/cupool/cupool.yaml"), false};
  CHECK(to_json(plan).at("op") == "plan");
  const proto::Plan p = at_holder(read_plan_of(false), to_json(plan));
  CHECK(p.config == "version: 1\n");
  CHECK(p.path == plan.path);
  CHECK_FALSE(p.apply);
  const proto::Plan apply{"version: 1\n", std::nullopt, true};
  const Json apply_wire = to_json(apply);
  CHECK(apply_wire.at("op") == "apply");
  CHECK_FALSE(apply_wire.contains("path"));
  const proto::Plan ap = at_holder(read_plan_of(true), apply_wire);
  CHECK(ap.apply);
  CHECK_FALSE(ap.path);

  proto::BufferCreate create;
  create.name = "weights";
  create.pool = "kv";
  create.device = 1;
  create.size_bytes = 300;
  create.loading = true;
  create.tensors = Json::array({{{"name", "w"}, {"dtype", "F16"}}});
  create.metadata = Json{{"format", "pt"}};
  create.part_sizes_bytes = Json::array({100, 200});
  const proto::BufferCreate c = at_holder(read_buffer_create, to_json(create));
  CHECK(c.name == "weights");
  CHECK(c.pool == "kv");
  CHECK(c.device == 1);
  CHECK(c.size_bytes == 300);
  CHECK(c.loading);
  CHECK(c.tensors == create.tensors);
  CHECK(c.metadata == create.metadata);
  CHECK(c.part_sizes_bytes == create.part_sizes_bytes);
  // The defaults: no device (the pool's first), not loading, no index, one part; none is sent.
  const Json plain_create = to_json(plain_buffer("weights", "kv", -1, 64));
  CHECK(plain_create == Json{{"op", "buffer_create"}, {"name", "weights"}, {"pool", "kv"}, {"size_bytes", 64}});
  const proto::BufferCreate pc = at_holder(read_buffer_create, plain_create);
  CHECK(pc.device == -1);
  CHECK_FALSE(pc.loading);
  CHECK_FALSE(pc.tensors);
  CHECK_FALSE(pc.metadata);
  CHECK_FALSE(pc.part_sizes_bytes);
  // A value the holder checks itself is taken as sent, null too (the holder refuses it).
  const proto::BufferCreate nulls =
      at_holder(read_buffer_create, Json{{"name", "w"}, {"pool", "kv"}, {"size_bytes", 1}, {"tensors", nullptr}});
  REQUIRE(nulls.tensors);
  CHECK(nulls.tensors->is_null());

  CHECK(at_holder(read_buffer_ready, to_json(proto::BufferReady{"weights"})).name == "weights");
  CHECK(at_holder(read_buffer_tensors, to_json(proto::BufferTensors{"weights"})).name == "weights");
  const proto::BufferRemove rm = at_holder(read_buffer_remove, to_json(proto::BufferRemove{"weights", true}));
  CHECK(rm.name == "weights");
  CHECK(rm.force);
  CHECK(to_json(proto::BufferRemove{"weights"}) ==
        Json{{"op", "buffer_remove"}, {"name", "weights"}, {"force", false}});
  CHECK_FALSE(at_holder(read_buffer_remove, Json{{"name", "weights"}}).force);
  CHECK(to_json(proto::BufferReady{}).at("op") == "buffer_ready");
  CHECK(to_json(proto::BufferTensors{}).at("op") == "buffer_tensors");
}

TEST_CASE("the holder's readers of the CLI's requests refuse what is unknown, ill-typed or out of bounds") {
  // The message a refusal says.
  const auto refusal = [](auto reader, const Json& request) -> std::string {
    try {
      at_holder(reader, request);
    } catch (const Error& e) {
      CHECK(e.code() == Errc::bad_request);
      return e.what();
    }
    FAIL("the request was read: " << request.dump());
    return "";
  };
  // Requests without arguments take none.
  CHECK(refusal(read_list, Json{{"op", "list"}, {"all", true}}) == "unknown argument \"all\"");
  CHECK(refusal(read_status, Json{{"op", "status"}, {"verbose", true}}) == "unknown argument \"verbose\"");
  CHECK(refusal(read_export, Json{{"op", "export"}, {"format", "json"}}) == "unknown argument \"format\"");

  CHECK(refusal(read_stats, Json{{"reset_peaks", 1}}) == "\"reset_peaks\" must be true or false");
  CHECK(refusal(read_stats, Json{{"reset", true}}).find("unknown argument \"reset\"") == 0);

  CHECK(refusal(read_trim, Json{{"keep_bytes", -1}}) == "\"keep_bytes\" must be a non-negative integer");
  CHECK(refusal(read_trim, Json{{"keep", 1}}).find("unknown argument \"keep\"") == 0);  // protocol 3's name
  CHECK(refusal(read_trim, Json{{"pool", std::string(proto::kMaxName + 1, 'a')}}) ==
        "\"pool\" is longer than 64 bytes");
  CHECK(refusal(read_trim, Json{{"pool", 3}}) == "\"pool\" must be a string");
  CHECK(refusal(read_trim, Json{{"graph", "no"}}) == "\"graph\" must be true or false");
  CHECK(refusal(read_trim, Json{{"cached", nullptr}}) == "\"cached\" must be true or false");

  const auto read_small_plan = [](Args& a) { return read_plan(a, false, 8); };
  CHECK(refusal(read_small_plan, Json{{"path", "x"}}) == "missing argument \"config\"");
  CHECK(refusal(read_small_plan, Json{{"config", "123456789"}}) == "\"config\" is longer than 8 bytes");
  CHECK(refusal(read_small_plan, Json{{"config", ""}, {"path", std::string(kMaxConfigName + 1, 'p')}}) ==
        "\"path\" is longer than 256 bytes");
  CHECK(refusal(read_small_plan, Json{{"config", ""}, {"apply", true}}).find("unknown argument \"apply\"") == 0);

  const Json create = to_json(plain_buffer("weights", "kv", 0, 64));
  const auto changed = [&](const char* key, const Json& value) {
    Json out = create;
    out[key] = value;
    return out;
  };
  CHECK(refusal(read_buffer_create, changed("size_bytes", 0)) ==
        "\"size_bytes\" must be between 1 and " + std::to_string(kMaxAllocation));
  CHECK(refusal(read_buffer_create, changed("size_bytes", kMaxAllocation + 1)).find("\"size_bytes\"") == 0);
  CHECK(refusal(read_buffer_create, changed("device", -2)).find("\"device\" must be a device ordinal") == 0);
  CHECK(refusal(read_buffer_create, changed("loading", "yes")) == "\"loading\" must be true or false");
  CHECK(refusal(read_buffer_create, changed("name", std::string(proto::kMaxName + 1, 'w'))) ==
        "\"name\" is longer than 64 bytes");
  CHECK(refusal(read_buffer_create, changed("size", 64)).find("unknown argument \"size\"") == 0);
  CHECK(refusal(read_buffer_create, changed("parts", Json::array({64}))).find("unknown argument \"parts\"") == 0);
  Json no_pool = create;
  no_pool.erase("pool");
  CHECK(refusal(read_buffer_create, no_pool) == "missing argument \"pool\"");

  CHECK(refusal(read_buffer_ready, Json{{"op", "buffer_ready"}}) == "missing argument \"name\"");
  CHECK(refusal(read_buffer_ready, Json{{"name", "w"}, {"force", true}}).find("unknown argument \"force\"") == 0);
  CHECK(refusal(read_buffer_tensors, Json{{"name", 7}}) == "\"name\" must be a string");
  CHECK(refusal(read_buffer_remove, Json{{"name", "w"}, {"force", 1}}) == "\"force\" must be true or false");
  CHECK(refusal(read_buffer_remove, Json{{"name", "w"}, {"forced", true}}).find("unknown argument \"forced\"") == 0);
}

TEST_CASE("every reply the holder writes is what the client library reads") {
  HelloReply hello;
  hello.protocol = 4;
  hello.oldest_protocol = 1;
  hello.newest_protocol = 4;
  hello.version = "cupool 0.1.0";
  hello.pid = 42;
  hello.backend = "simulated";
  hello.peer = {7, 1000, 1000, "alice", false};
  hello.limits = {65536, 16 << 20, 65536, 1024, 64, 5.0, 1 << 20, 2.5};
  const HelloReply h = hello_reply_from_json(to_json(hello));
  CHECK(h.protocol == 4);
  CHECK(h.oldest_protocol == 1);
  CHECK(h.newest_protocol == 4);
  CHECK(h.version == "cupool 0.1.0");
  CHECK(h.pid == 42);
  CHECK(h.backend == "simulated");
  CHECK(h.peer.user == "alice");
  CHECK(h.peer.uid == 1000);
  CHECK(h.limits.max_open_buffer_count == 64);
  CHECK(h.limits.drop_timeout_seconds == doctest::Approx(2.5));

  ImportPoolReply imp{"kv", gpu(1), "posix_fd", {gpu(0)}, 3, blob_of(1)};
  const ImportPoolReply i = import_pool_reply_from_json(to_json(imp));
  CHECK(i.pool == "kv");
  CHECK(i.id.device == 1);
  CHECK(i.id.uuid == imp.id.uuid);
  CHECK(i.id.pci_bus_id == imp.id.pci_bus_id);
  REQUIRE(i.access.size() == 1);
  CHECK(i.access[0].uuid == gpu(0).uuid);
  CHECK(i.generation == 3);
  CHECK(i.ready_event == blob_of(1));

  AllocReply alloc{11, 4096, "kv", gpu(0), 2, blob_of(2), true, blob_of(3)};
  const AllocReply a = alloc_reply_from_json(to_json(alloc));
  CHECK(a.lease == 11);
  CHECK(a.size_bytes == 4096);
  CHECK(a.generation == std::optional<std::uint64_t>(2));
  CHECK(a.export_data == blob_of(2));
  CHECK(a.ready);
  CHECK(a.ready_event == blob_of(3));

  BufferOpenReply pooled;
  pooled.name = "weights";
  pooled.pool = "kv";
  pooled.id = gpu(0);
  pooled.size_bytes = 100;
  pooled.part = 1;
  pooled.part_count = 2;
  pooled.buffer_size_bytes = 300;
  pooled.generation = 5;
  pooled.export_data = blob_of(4);
  pooled.ready_event = blob_of(5);
  const BufferOpenReply p = buffer_open_reply_from_json(to_json(pooled));
  CHECK_FALSE(p.exported);
  CHECK(p.part == 1);
  CHECK(p.part_count == 2);
  CHECK(p.buffer_size_bytes == 300);
  CHECK(p.export_data == blob_of(4));
  CHECK(p.generation == std::optional<std::uint64_t>(5));

  BufferOpenReply exported = pooled;
  exported.exported = true;
  exported.mapped_size_bytes = 2 << 20;
  exported.access = {gpu(1)};
  const Json wire = to_json(exported);
  CHECK(wire.at("mapping") == "exported");
  CHECK_FALSE(wire.contains("export_data"));  // its descriptor rides with the reply instead
  const BufferOpenReply e = buffer_open_reply_from_json(wire);
  CHECK(e.exported);
  CHECK(e.mapped_size_bytes == 2u << 20);
  REQUIRE(e.access.size() == 1);
  CHECK(e.access[0].device == 1);
}

TEST_CASE("a reply of an older holder reads with what that holder meant") {
  // Protocol 1 to 3 sent no pci_bus_id, hello no range; buffer_open of protocol 2 no parts.
  const Json old_open = {{"name", "w"},
                         {"pool", "kv"},
                         {"device", 0},
                         {"uuid", "GPU-1"},
                         {"size_bytes", 64},
                         {"export_data", to_hex(blob_of(1))},
                         {"ready_event", to_hex(blob_of(2))}};
  const BufferOpenReply b = buffer_open_reply_from_json(old_open);
  CHECK(b.id.pci_bus_id.empty());
  CHECK(b.part_count == 1);
  CHECK(b.buffer_size_bytes == 64);
  CHECK_FALSE(b.exported);
  CHECK(b.ready);
  CHECK_FALSE(b.generation);
  const HelloReply h = hello_reply_from_json({{"protocol", 1}});
  CHECK(h.oldest_protocol == 1);
  CHECK(h.newest_protocol == 1);
  CHECK(h.backend == "cuda");
}

TEST_CASE("a malformed reply or notice is refused naming the field, never anything worse") {
  const Json alloc = to_json(AllocReply{11, 4096, "kv", gpu(0), 2, blob_of(2), false, blob_of(3)});
  CHECK(refused_variants(alloc_reply_from_json, alloc) > 20);
  try {
    Json bad = alloc;
    bad.erase("export_data");
    alloc_reply_from_json(bad);
    FAIL("a reply without export_data was read");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("export_data") != std::string::npos);
  }
  try {
    Json bad = alloc;
    bad["device"] = -3;
    alloc_reply_from_json(bad);
    FAIL("a negative device was read");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("device") != std::string::npos);
  }
  CHECK(refused_variants(import_pool_reply_from_json,
                         to_json(ImportPoolReply{"kv", gpu(1), "posix_fd", {gpu(0)}, 3, blob_of(1)})) > 10);
  BufferOpenReply exported;
  exported.name = "w";
  exported.pool = "kv";
  exported.exported = true;
  exported.size_bytes = 1;
  exported.mapped_size_bytes = 2;
  CHECK(refused_variants(buffer_open_reply_from_json, to_json(exported)) > 10);
  CHECK(refused_variants(hello_reply_from_json, to_json(HelloReply{})) > 0);
  CHECK(refused_variants(pool_gone_from_json, to_json(PoolGone{"kv", gpu(0), 1, "gone"})) > 5);
  CHECK(refused_variants(drop_from_json, to_json(Drop{1, {2, 3}, 64, "pressure", 2.0})) > 5);
  CHECK_THROWS_AS(notice_name(Json{{"pool", "kv"}}), std::invalid_argument);
  CHECK(notice_name(to_json(Draining{"stopping"})) == "draining");
}

TEST_CASE("an error reply: written in one shape, read back, and a malformed one still says something") {
  const Json reply = error_reply(5, {"not_found", "no pool named \"x\"", {}, {}});
  CHECK(reply.at("id") == 5);
  CHECK(reply.at("ok") == false);
  const auto e = error_of_reply(reply);
  REQUIRE(e);
  CHECK(e->code == "not_found");
  CHECK(e->message == "no pool named \"x\"");
  CHECK_FALSE(error_of_reply({{"id", 5}, {"ok", true}}));
  const auto bare = error_of_reply({{"id", 5}, {"ok", false}});
  REQUIRE(bare);
  CHECK(bare->code == "internal");
  const auto malformed = error_of_reply({{"id", 5}, {"ok", false}, {"error", {{"code", 3}}}});
  REQUIRE(malformed);
  CHECK(malformed->message.find("malformed") != std::string::npos);
}

TEST_CASE("the envelope read by hand: a reply's ok and id, a request's op, whatever a peer sent") {
  CHECK(ok_of(Json{{"id", 1}, {"ok", true}}) == std::optional<bool>(true));
  CHECK(ok_of(Json{{"id", 1}, {"ok", false}}) == std::optional<bool>(false));
  CHECK_FALSE(ok_of(Json{{"id", 1}}));                 // not a reply
  CHECK_FALSE(ok_of(Json{{"id", 1}, {"ok", "yes"}}));  // not a boolean
  CHECK_FALSE(ok_of(Json::array({1, 2})));             // not an object
  CHECK_FALSE(reply_ok(Json{{"id", 1}}));
  CHECK(id_of(Json{{"id", 7}, {"ok", true}}) == 7);
  CHECK(id_of(Json{{"ok", true}}).is_null());
  CHECK(request_head(Json{{"id", 2}, {"op", "list"}}).op == std::optional<std::string>("list"));
  CHECK_FALSE(request_head(Json{{"id", 2}, {"op", 3}}).op);  // an op that is not a string is none
}
