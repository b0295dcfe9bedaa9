#include "model/fields.h"

#include <doctest/doctest.h>

#include <fstream>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "process/report.h"

namespace cupool::model::fields_test {

namespace {

// ---- the schemas' properties, $ref and allOf followed ----

Json load_schema(const std::string& file) {
  std::ifstream in(std::string(CUPOOL_SOURCE_DIR) + "/schemas/" + file);
  REQUIRE_MESSAGE(in, "cannot read schemas/" << file);
  return Json::parse(in);
}

void schema_properties(const std::string& file, const Json& node, std::set<std::string>& out) {
  if (!node.is_object()) return;
  if (const auto ref = node.find("$ref"); ref != node.end()) {
    const std::string r = ref->get<std::string>();
    const std::size_t hash = r.find('#');
    const std::string target = hash == 0 ? file : r.substr(0, hash);
    const Json doc = load_schema(target);
    schema_properties(target, doc.at(Json::json_pointer(r.substr(hash + 1))), out);
  }
  if (const auto props = node.find("properties"); props != node.end())
    for (auto it = props->begin(); it != props->end(); ++it) out.insert(it.key());
  if (const auto all = node.find("allOf"); all != node.end())
    for (const Json& part : *all) schema_properties(file, part, out);
}

// The names a schema gives an object: the union over `where` ("FILE#/pointer").
std::set<std::string> schema_names(std::initializer_list<const char*> where) {
  std::set<std::string> out;
  for (const std::string w : where) {
    const std::size_t hash = w.find('#');
    const std::string file = w.substr(0, hash);
    const Json doc = load_schema(file);
    const Json& node = hash == std::string::npos ? doc : doc.at(Json::json_pointer(w.substr(hash + 1)));
    schema_properties(file, node, out);
  }
  out.erase("schema_version");  // written by base/output.h's versioned(), not by the object
  return out;
}

// Whether the declared names equal the schema's; each missing piece is said.
template <class T>
void check_agrees(const char* type, std::initializer_list<const char*> where, const char* object = nullptr,
                  std::set<std::string> written_elsewhere = {}) {
  const std::vector<std::string> list = json_names<T>(object);
  const std::set<std::string> declared(list.begin(), list.end());
  CHECK_MESSAGE(declared.size() == list.size(), type << " declares a name twice");
  std::set<std::string> schema = schema_names(where);
  for (const std::string& n : written_elsewhere) schema.erase(n);
  const std::string what = std::string(type) + (object ? std::string(".") + object : "");
  for (const std::string& n : declared)
    CHECK_MESSAGE(schema.count(n),
                  what << " declares \"" << n << "\", which " << std::string(*where.begin()) << " lacks");
  for (const std::string& n : schema)
    CHECK_MESSAGE(declared.count(n), std::string(*where.begin())
                                         << " has \"" << n << "\", which " << what << " does not declare");
}

// Written, read back and written again: the same JSON.
template <class T>
void check_round_trip(const T& v) {
  const Json j = write_json(v);
  CHECK(write_json(read_json<T>(j)) == j);
}

}  // namespace

TEST_CASE("the declared names are the schemas' properties") {
  check_agrees<DeviceId>("DeviceId", {"cupool-common-v1.schema.json#/$defs/identity"});
  check_agrees<ProcessDeviceId>("ProcessDeviceId", {"cupool-common-v1.schema.json#/$defs/process_identity"});
  check_agrees<Source>("Source", {"cupool-common-v1.schema.json#/$defs/source"});
  check_agrees<ErrorInfo>("ErrorInfo", {"cupool-common-v1.schema.json#/$defs/error"});
  check_agrees<Finding>("Finding", {"cupool-common-v1.schema.json#/$defs/finding"});
  check_agrees<Usage>("Usage", {"cupool-common-v1.schema.json#/$defs/usage"});
  check_agrees<cupool::ReleaseThreshold>("ReleaseThreshold", {"cupool-common-v1.schema.json#/$defs/threshold"});
  check_agrees<cupool::model::Reuse>("Reuse", {"cupool-common-v1.schema.json#/$defs/reuse"});
  check_agrees<LeaseTotals>("LeaseTotals", {"cupool-common-v1.schema.json#/$defs/lease_totals"});
  check_agrees<BufferTotals>("BufferTotals", {"cupool-common-v1.schema.json#/$defs/buffer_totals"});
  check_agrees<PoolStatus>("PoolStatus", {"cupool-common-v1.schema.json#/$defs/pool"});
  check_agrees<AdoptedBuffer>("AdoptedBuffer", {"cupool-common-v1.schema.json#/$defs/buffer_summary"});
  check_agrees<TensorEntry>("TensorEntry", {"cupool-common-v1.schema.json#/$defs/tensor"});
  // status
  check_agrees<Status>("Status", {"cupool-status-v1.schema.json"});
  check_agrees<HolderInfo>("HolderInfo", {"cupool-status-v1.schema.json#/$defs/holder"});
  check_agrees<AppliedConfig>("AppliedConfig",
                              {"cupool-status-v1.schema.json#/$defs/holder/properties/applied_config"});
  check_agrees<ClientInfo>("ClientInfo", {"cupool-status-v1.schema.json#/$defs/client"});
  check_agrees<Custody>("Custody", {"cupool-status-v1.schema.json#/$defs/custody"});
  check_agrees<Adoption>("Adoption", {"cupool-status-v1.schema.json#/$defs/adoption"});
  check_agrees<RefusedBuffer>("RefusedBuffer",
                              {"cupool-status-v1.schema.json#/$defs/adoption/properties/refused/items"});
  // stats, trim
  check_agrees<Stats>("Stats", {"cupool-stats-v1.schema.json"});
  check_agrees<PoolStats>("PoolStats", {"cupool-stats-v1.schema.json#/$defs/pool_usage"});
  check_agrees<DeviceGraph>("DeviceGraph", {"cupool-stats-v1.schema.json#/$defs/device_graph"});
  // ledger (and stats' "ledger")
  check_agrees<Ledger>("Ledger", {"cupool-ledger-v1.schema.json#/$defs/ledger_body"});
  check_agrees<LedgerDevice>("LedgerDevice", {"cupool-ledger-v1.schema.json#/$defs/ledger_device"});
  check_agrees<LedgerDevice>("LedgerDevice", {"cupool-ledger-v1.schema.json#/$defs/ledger_device/properties/usage"},
                             "usage");
  check_agrees<LedgerBuffer>("LedgerBuffer", {"cupool-ledger-v1.schema.json#/$defs/ledger_buffer"});
  check_agrees<LedgerPool>("LedgerPool", {"cupool-ledger-v1.schema.json#/$defs/ledger_pool"});
  check_agrees<LedgerBudget>("LedgerBudget", {"cupool-ledger-v1.schema.json#/$defs/budget"});
  check_agrees<LedgerProcess>("LedgerProcess", {"cupool-ledger-v1.schema.json#/$defs/process"});
  check_agrees<LedgerMemory>("LedgerMemory", {"cupool-ledger-v1.schema.json#/$defs/memory"});
  check_agrees<Trim>("Trim", {"cupool-trim-v1.schema.json"});
  check_agrees<PoolTrim>("PoolTrim", {"cupool-trim-v1.schema.json#/$defs/pool_trim"});
  check_agrees<GraphTrim>("GraphTrim", {"cupool-trim-v1.schema.json#/$defs/device_trim"});
  check_agrees<GraphTrim>("GraphTrim", {"cupool-trim-v1.schema.json#/$defs/trimmed"}, "graph");
  // the buffer verbs
  check_agrees<BufferInfo>("BufferInfo", {"cupool-buffer-ls-v1.schema.json#/$defs/listed_buffer"});
  check_agrees<BufferTensors>("BufferTensors", {"cupool-buffer-ls-v1.schema.json#/$defs/buffer_tensors"});
  check_agrees<BufferMade>("BufferMade", {"cupool-buffer-load-v1.schema.json", "cupool-buffer-create-v1.schema.json",
                                          "cupool-buffer-rm-v1.schema.json"});
  check_agrees<BuffersLoaded>("BuffersLoaded", {"cupool-buffer-load-many-v1.schema.json"});
  check_agrees<LoadStages>("LoadStages", {"cupool-buffer-load-v1.schema.json#/$defs/loaded_buffer/properties/stages"});
  // exec --report
  check_agrees<ProcessPool>("ProcessPool", {"cupool-exec-report-v1.schema.json#/$defs/process_pool"});
  check_agrees<ProcessDevice>("ProcessDevice", {"cupool-exec-report-v1.schema.json#/$defs/process_device_stats"});
  check_agrees<ProcessStats>("ProcessStats", {"cupool-exec-report-v1.schema.json#/properties/stats"});
  // cupool_configure's report
  check_agrees<cupool::ConfigureResult>("ConfigureResult", {"cupool-configure-v1.schema.json"});
  check_agrees<cupool::ProcessChange>("ProcessChange", {"cupool-configure-v1.schema.json#/$defs/change"});
  // plan / apply: the refusal (`error`) is written by the verb, not by the reply
  check_agrees<PlanReply>("PlanReply", {"cupool-plan-v1.schema.json"}, nullptr, {"error"});
  check_agrees<PlanChange>("PlanChange", {"cupool-plan-v1.schema.json#/$defs/change"});
  // export: the config it writes (no process section: that is a process's, not the holder's)
  check_agrees<ExportedConfig>("ExportedConfig", {"cupool-config-v1.schema.json"}, nullptr, {"process"});
  check_agrees<ExportedHolder>("ExportedHolder", {"cupool-config-v1.schema.json#/$defs/holder"});
  check_agrees<ExportedPool>("ExportedPool", {"cupool-config-v1.schema.json#/$defs/pool"});
  check_agrees<ExportedShare>("ExportedShare", {"cupool-config-v1.schema.json#/$defs/share"});
  check_agrees<ExportedBuffer>("ExportedBuffer", {"cupool-config-v1.schema.json#/$defs/buffer"});
  // bench
  check_agrees<BenchReport>("BenchReport", {"cupool-bench-v1.schema.json"});
  check_agrees<BenchReport>("BenchReport", {"cupool-bench-v1.schema.json#/properties/gpu"}, "gpu");
  check_agrees<BenchReport>("BenchReport", {"cupool-bench-v1.schema.json#/properties/settings"}, "settings");
  check_agrees<cupool::model::BenchCase>("BenchCase", {"cupool-bench-v1.schema.json#/$defs/case"});
  check_agrees<BenchComparison>("BenchComparison", {"cupool-bench-v1.schema.json#/properties/comparisons/items"});
  // query
  // The one document in two shapes: the node's facts, or (no driver answered) what is known and why.
  check_agrees<NodeFacts>("NodeFacts", {"cupool-query-v1.schema.json"}, nullptr, {"error"});
  check_agrees<QueryFailure>("QueryFailure", {"cupool-query-v1.schema.json"}, nullptr, {"gds"});
  check_agrees<QueryFailure>("QueryFailure", {"cupool-query-v1.schema.json#/properties/host"}, "host");
  check_agrees<NodeFacts>("NodeFacts", {"cupool-query-v1.schema.json#/properties/driver"}, "driver");
  check_agrees<NodeFacts>("NodeFacts", {"cupool-query-v1.schema.json#/properties/host"}, "host");
  check_agrees<DeviceFacts>("DeviceFacts", {"cupool-query-v1.schema.json#/$defs/device_facts"});
  check_agrees<DeviceFacts>("DeviceFacts", {"cupool-query-v1.schema.json#/$defs/device_facts/properties/memory"},
                            "memory");
  check_agrees<HandleProbe>("HandleProbe", {"cupool-query-v1.schema.json#/$defs/deep_result"});
  check_agrees<GdsFacts>("GdsFacts", {"cupool-query-v1.schema.json#/properties/gds"});
  check_agrees<DmemFacts>("DmemFacts", {"cupool-query-v1.schema.json#/properties/dmem"});
  check_agrees<DmemRegionFacts>("DmemRegionFacts",
                                {"cupool-query-v1.schema.json#/properties/dmem/properties/regions/items"});
  // check, keeper --list
  check_agrees<CheckReport>("CheckReport", {"cupool-check-v1.schema.json"});
  check_agrees<CheckReport>("CheckReport", {"cupool-check-v1.schema.json#/properties/summary"}, "summary");
  check_agrees<KeeperList>("KeeperList", {"cupool-keeper-list-v1.schema.json"});
}

TEST_CASE("every declared object reads back what it wrote") {
  Status s;
  s.source = {true, "simulated node (h100.yaml)", std::string("h100.yaml"), false, std::nullopt, std::nullopt};
  s.holder.pid = 42;
  s.holder.applied_config = AppliedConfig{"/tmp/x.yaml", "2026-01-01T00:00:00Z", std::nullopt};
  PoolStatus p;
  p.pool = {"kv", {1, "GPU-1", "0000:1b:00.0"}, "device", {"posix_fd"}, 64ULL << 30};
  p.release_threshold = cupool::ReleaseThreshold::max();
  p.leases = {2, 128, 1, 64};
  s.pools.push_back(p);
  BufferInfo b;
  b.name = "w";
  b.tensor_count = 3;
  b.permitted = true;
  s.buffers.push_back(b);
  s.custody.kind = "keeper";
  s.custody.error = ErrorInfo{"x", "y", std::string("cuMemMap"), std::nullopt};
  s.custody.adoption = Adoption{
      7, {AdoptedBuffer{"w", "kv", {1, "u", "p"}, 9}}, {RefusedBuffer{"z", {"a", "b", {}, {}}}}, 1, false, 0.5};
  s.clients.push_back(ClientInfo{});
  s.clients.back().user = "ana";
  s.clients.back().protocol = 4;
  check_round_trip(s);
  CHECK(read_json<Status>(write_json(s)).custody.adoption->buffers.at(0).id.device == 1);

  PlanChange c;
  c.action = "update";
  c.object = "pool";
  c.name = "kv";
  c.id = DeviceId{0, "GPU-0", "p"};
  c.field = "max_size";
  c.from = "";
  c.to = "8GiB";
  c.to_value = 8ULL << 30;
  check_round_trip(c);
  const PlanChange back = read_json<PlanChange>(write_json(c));
  CHECK(back.id);
  CHECK(back.from_value.is_null());
  CHECK(!read_json<PlanChange>(Json{{"action", "create"}, {"object", "holder"}}).id);
  CHECK(std::string(change_word(ChangeAction::replace)) == "replace");
  CHECK(std::string(change_word(ChangeObject::holder)) == "holder");
  // A share rule as a change's value: every name written, no quota as null.
  CHECK(write_json(ShareValue{{"ana"}, {}, {}}).dump() ==
        R"({"users":["ana"],"groups":[],"quota_per_client_bytes":null})");
  CHECK(write_json(ShareValue{{}, {"ml"}, 1024}).dump() ==
        R"({"users":[],"groups":["ml"],"quota_per_client_bytes":1024})");

  // What export writes: members left empty are left out, in the config's order.
  ExportedConfig e;
  e.holder = {"/run/cupool.sock", "0660", {}};
  CHECK(write_json(e).dump() == R"({"version":1,"holder":{"socket":"/run/cupool.sock","mode":"0660"}})");
  ExportedPool ep;
  ep.name = "kv";
  ep.devices = {"GPU-0"};
  ep.location = "device";
  ep.alloc_type = "pinned";
  ep.handle_types = {"none"};
  ep.release_threshold = "max";
  ep.share = ExportedShare{{}, {{"ml"}}, {}};
  e.pools = std::vector<ExportedPool>{ep};
  CHECK(write_json(e)["pools"][0].dump() ==
        R"({"name":"kv","devices":["GPU-0"],"location":"device","alloc_type":"pinned","handle_types":["none"],)"
        R"("release_threshold":"max","reuse":{"follow_event_dependencies":false,"allow_opportunistic":false,)"
        R"("allow_internal_dependencies":false},"share":{"groups":["ml"]}})");

  BufferTensors t;
  t.name = "w";
  t.part_sizes = {4096, 8192};
  t.tensors.push_back({"a", "F16", {2, 3}, 1, 0, 12});
  t.metadata["format"] = "pt";
  check_round_trip(t);
  CHECK(read_json<BufferTensors>(write_json(t)).part_sizes == t.part_sizes);

  BufferMade m;
  m.stages = LoadStages{1, 2, 3, 4, 5, 6};
  m.read_method = "staged";
  check_round_trip(m);
  m.gds = LoadGds{std::string("no nvidia-fs")};
  check_round_trip(m);
  CHECK(write_json(m).at("gds").at("note") == "no nvidia-fs");
  CHECK(write_json(m).at("gds_note") == "no nvidia-fs");  // its old name, until cupool 0.2
  CHECK(!write_json(m).contains("loading"));              // no state: no old name either

  NodeFacts n;
  n.devices.emplace_back();
  n.devices.back().probes = std::vector<HandleProbe>{{"fabric", false, ErrorInfo{"cuda_error", "no", {}, {}}}};
  n.peer_access = {{true, false}, {false, true}};
  n.gds = GdsFacts{};
  check_round_trip(n);
  n.dmem = DmemFacts{true,
                     true,
                     true,
                     std::nullopt,
                     {{"drm/0000:1b:00.0/vram0", 1, "0000:1b:00.0", DeviceId{0, "GPU-x", "0000:1b:00.0"}}}};
  check_round_trip(n);

  BenchReport r;
  r.note = "n";
  r.sizes_bytes = {1, 2};
  r.cases.emplace_back();
  r.comparisons.emplace_back();
  check_round_trip(r);

  check_round_trip(Stats{{PoolStats{}}, 5, {DeviceGraph{}}, std::nullopt});
  Ledger ledger;
  ledger.context_allowance_bytes = 7;
  ledger.devices.emplace_back();
  ledger.devices[0].buffers.push_back({"w", 8, 2});
  ledger.devices[0].pools.push_back({"kv", 9});
  ledger.devices[0].budgets.push_back({"b1-x", 42, "u", "cmd", true, 10, 4, 5, std::uint64_t{6}});
  ledger.devices[0].processes.push_back({42, "budgeted", "cmd", std::nullopt});
  ledger.devices[0].memory = LedgerMemory{1, 2, 3, 4};
  ledger.devices[0].accounted_bytes = 11;
  ledger.devices[0].unexplained_bytes = -3;
  check_round_trip(ledger);
  check_round_trip(Stats{{PoolStats{}}, 5, {DeviceGraph{}}, ledger});
  check_round_trip(Trim{1, 2, {PoolTrim{}}, {GraphTrim{{0, "u", "p"}, 3, 2, 1}}});
  check_round_trip(CheckReport{"f", "fits", 0, Source{}, 1, 2, 3, 4, {Finding{}}});
  check_round_trip(ProcessDevice{{0, "u", "p"}, {ProcessPool{}}, Usage{1, 2, 3, 4}});
  check_round_trip(PlanReply{true, {c}, {Finding{}}, "w", std::string("/etc/cupool.yaml")});
  check_round_trip(ListReply{{PoolListed{}}, {b}});
  check_round_trip(KeeperList{"s", {"a", "b"}});
}

TEST_CASE("an old name is written beside the new one, and read where the new one is absent") {
  BufferMade made;
  made.state = "loading";
  const Json j = write_json(made);
  CHECK(j.at("state") == "loading");
  CHECK(j.at("loading") == true);
  CHECK(read_json<BufferMade>(Json{{"loading", true}}).state == std::optional<std::string>("loading"));
  CHECK(read_json<BufferMade>(Json{{"loading", false}}).state == std::optional<std::string>("ready"));
  CHECK(read_json<BufferMade>(Json{{"state", "ready"}, {"loading", true}}).state ==
        std::optional<std::string>("ready"));
  CHECK_THROWS_AS(read_json<BufferMade>(Json{{"loading", "yes"}}), FieldError);
  Seen seen;
  BufferMade shown;
  read_json_lenient(Json{{"loading", "yes"}}, shown, seen);  // for display: passed over
  CHECK(!shown.state);
}

TEST_CASE("a reader keeps defaults for what is missing and names what is ill-typed") {
  // An older holder omits a field: its default stays.
  const Stats st = read_json<Stats>(Json::parse(R"({"pools": [{"name": "kv", "future_field": 1}]})"));
  CHECK(st.pools.at(0).name == "kv");
  CHECK(st.pools.at(0).usage.used_bytes == 0);
  CHECK(st.devices.empty());
  // An ill-typed value is an error naming where it is.
  CHECK_THROWS_WITH_AS(read_json<Stats>(Json::parse(R"({"pools": [{"used_bytes": "x"}]})")),
                       "\"pools[0].used_bytes\" is not a non-negative integer", std::invalid_argument);
  CHECK_THROWS_WITH_AS(read_json<Status>(Json::parse(R"({"holder": {"pid": true}})")),
                       "\"holder.pid\" is not an integer", std::invalid_argument);
  CHECK_THROWS_WITH_AS(read_json<DeviceFacts>(Json::parse(R"({"memory": {"total_bytes": -1}})")),
                       "\"memory.total_bytes\" is not a non-negative integer", std::invalid_argument);
  CHECK_THROWS_AS(read_json<Usage>(Json::parse("[]")), std::invalid_argument);
  // Strict: what is not optional must be there.
  CHECK_THROWS_WITH_AS(read_json_strict<ErrorInfo>(Json{{"code", "x"}}), "missing \"message\"", std::invalid_argument);
  CHECK(!read_json_strict<ErrorInfo>(Json{{"code", "x"}, {"message", "y"}}).api);
  // nlohmann's form reads the same way.
  CHECK(Json{{"reserved_bytes", 5}}.get<Usage>().reserved_bytes == 5);
}

TEST_CASE("a strict reader's error says the key's path and what is wrong, and `defaulted` is not required") {
  try {
    read_json_strict<NodeFacts>(Json::parse(R"({"driver": {"cuda_version_int": 13000}, "host": {"numa_nodes": []},
                                                "devices": [{"memory": 1}], "peer_access": []})"));
    FAIL("expected an error");
  } catch (const FieldError& e) {
    CHECK(e.path() == "devices[0].device");
    CHECK(e.problem() == "missing");
    CHECK(std::string(e.what()) == "missing \"devices[0].device\"");
  }
  try {
    read_json_strict<ProfileHeader>(Json{{"version", "1"}});
    FAIL("expected an error");
  } catch (const FieldError& e) {
    CHECK(e.path() == "version");
    CHECK(e.problem() == "is not an integer");
  }
  // cuda_version and deep are `defaulted`, source and built_with_cuda optional: a profile's node
  // section has none of them.
  const NodeFacts n = read_json_strict<NodeFacts>(
      Json::parse(R"({"driver": {"cuda_version_int": 13000}, "host": {"numa_nodes": [0]}, "devices": [],
                      "peer_access": []})"));
  CHECK(n.cuda_version_int == 13000);
  CHECK(n.cuda_version.empty());
  CHECK(!n.source);
  CHECK(!write_json(n).contains("built_with_cuda"));
}

TEST_CASE("the reader records what a reply had") {
  Status s;
  Seen seen;
  read_json(Json::parse(R"({"source": {"backend": "x"}, "holder": {"pid": 7}, "pools": [{"name": "p"}, {}]})"), s,
            &seen);
  CHECK(s.holder.pid == 7);
  CHECK(seen.has(s.holder.pid));
  CHECK(!seen.has(s.holder.socket));
  CHECK(seen.has(s.source));
  CHECK(!seen.has(s.source.simulated));  // the object is there, its first member is not
  CHECK(seen.has(s.pools.at(0).pool.name));
  CHECK(!seen.has(s.pools.at(1).pool.name));
  CHECK(!seen.has(s.custody));
}

TEST_CASE("a release threshold is read back as its one value, each of its keys recorded as a part") {
  const ReleaseThreshold share =
      read_json<ReleaseThreshold>(Json{{"release_threshold", "75%"}, {"release_threshold_bytes", 48ULL << 30}});
  CHECK(share.bytes() == 48ULL << 30);
  CHECK(share.text() == "75%");  // as written
  CHECK(share == ReleaseThreshold(48ULL << 30));
  const ReleaseThreshold max =
      read_json<ReleaseThreshold>(Json{{"release_threshold", "max"}, {"release_threshold_bytes", nullptr}});
  CHECK(max.is_max());
  CHECK(write_json(max) == Json{{"release_threshold", "max"}, {"release_threshold_bytes", nullptr}});
  CHECK(write_json(ReleaseThreshold(1ULL << 20)) ==
        Json{{"release_threshold", "1MiB"}, {"release_threshold_bytes", 1ULL << 20}});
  CHECK_THROWS_WITH_AS(read_json<ReleaseThreshold>(Json{{"release_threshold_bytes", "x"}}),
                       "\"release_threshold_bytes\" is not a non-negative integer", std::invalid_argument);
  CHECK_THROWS_WITH_AS(read_json_strict<ReleaseThreshold>(Json{{"release_threshold_bytes", 0}}),
                       "missing \"release_threshold\"", std::invalid_argument);
  CHECK(read_json_strict<ReleaseThreshold>(Json{{"release_threshold", "0B"}}).text() == "0B");  // bytes: optional
  // For display: each key is a part of its own, there or not (an ill-typed one passed over).
  PoolStats p;
  Seen seen;
  read_json_lenient(Json{{"release_threshold", "8GiB"}, {"release_threshold_bytes", "x"}}, p, seen);
  CHECK(seen.has_part<ThresholdText>(p.release_threshold));
  CHECK(!seen.has_part<ThresholdBytes>(p.release_threshold));
  CHECK(p.release_threshold.text() == "8GiB");
  PoolStats q;
  Seen seen_q;
  read_json_lenient(Json{{"release_threshold_bytes", nullptr}}, q, seen_q);
  CHECK(!seen_q.has_part<ThresholdText>(q.release_threshold));
  CHECK(seen_q.has_part<ThresholdBytes>(q.release_threshold));
  CHECK(q.release_threshold.is_max());
  CHECK(!seen_q.has(q.release_threshold));  // parts, not the value
}

}  // namespace cupool::model::fields_test
