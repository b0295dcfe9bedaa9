#include "model/model.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>

using namespace cupool::model;

TEST_CASE("a release threshold: config syntax and bytes, max without a sentinel") {
  const cupool::ReleaseThreshold max(std::numeric_limits<std::uint64_t>::max());
  CHECK(max.text() == "max");
  CHECK(max.is_max());
  CHECK(cupool::ReleaseThreshold(8ULL << 30).text() == "8GiB");
  CHECK(cupool::ReleaseThreshold(0).text() == "0B");
  CHECK(cupool::ReleaseThreshold(1000).text() == "1000B");
  const cupool::ReleaseThreshold written(60ULL << 30, "75%");
  CHECK(written.text() == "75%");
  CHECK(written.bytes() == 60ULL << 30);
  CHECK(cupool::ReleaseThreshold(1ULL << 20, "").text() == "1MiB");  // not written: the bytes, exactly
  Json out;
  put_threshold(out, max);
  CHECK(out.dump() == R"({"release_threshold":"max","release_threshold_bytes":null})");
}

TEST_CASE("every per-device object has one identity, in one order") {
  Json out;
  put_identity(out, DeviceId{1, "GPU-1", "0000:1b:00.0"});
  CHECK(out.dump() == R"({"device":1,"uuid":"GPU-1","pci_bus_id":"0000:1b:00.0"})");
  Json process;
  put_identity(process, ProcessDeviceId{0, "GPU-1", "0000:1b:00.0"});
  CHECK(process.dump() == R"({"process_device":0,"uuid":"GPU-1","pci_bus_id":"0000:1b:00.0"})");
}

TEST_CASE("status: counts carry their unit, unknowns are null, client_count is the clients'") {
  Status s;
  PoolStatus p;
  p.pool = {"kv", {0, "GPU-0", "0000:1b:00.0"}, "device", {}, std::nullopt};
  p.release_threshold = cupool::ReleaseThreshold::max();
  p.leases = {2, 128, 1, 64};
  s.pools.push_back(p);
  s.clients.push_back(ClientInfo{});
  s.custody.kind = "none";
  const Json j = to_json(s);
  const Json& pool = j["pools"][0];
  CHECK(pool["handle_types"] == Json::array());
  CHECK(pool["max_size_bytes"].is_null());
  CHECK(pool["lease_count"] == 2);
  CHECK(pool["cached_bytes"] == 64);
  const Json& client = j["clients"][0];
  CHECK(client["user"].is_null());
  CHECK(client["name"].is_null());
  CHECK(client["protocol"].is_null());  // before hello
  CHECK(j["client_count"] == 1);
  CHECK(j["custody"]["error"].is_null());
  CHECK(j["custody"]["adoption"].is_null());
}

TEST_CASE("graph memory is one nested object; trim says before, after and released in bytes") {
  Stats st;
  st.devices.push_back({{0, "GPU-0", "p"}, {4, 5, 1, 2}, {}});
  CHECK(to_json(st)["devices"][0]["graph"].dump() ==
        R"({"reserved_bytes":4,"reserved_peak_bytes":5,"used_bytes":1,"used_peak_bytes":2})");
  Trim t;
  t.devices.push_back({{0, "GPU-0", "p"}, 8, 2, 6});
  CHECK(to_json(t)["devices"][0]["graph"].dump() ==
        R"({"reserved_before_bytes":8,"reserved_after_bytes":2,"released_bytes":6})");
}

TEST_CASE("a plan change: config syntax and typed values, the identity only per device") {
  PlanChange c;
  c.action = "update";
  c.object = "holder";
  c.name = "holder";
  c.field = "group";
  c.from = "";
  c.to = "gpu";
  c.from_value = nullptr;
  c.to_value = "gpu";
  const Json j = to_json(c);
  CHECK(!j.contains("device"));
  CHECK(j["from_value"].is_null());
  CHECK(j["to"] == "gpu");
  c.object = "pool";
  c.id = DeviceId{1, "GPU-1", "x"};
  CHECK(to_json(c)["uuid"] == "GPU-1");
}

TEST_CASE("errors: one object; read back the same") {
  const ErrorInfo e{"cuda_error", "no IMEX channel", "cuMemPoolExportToShareableHandle", "CUDA_ERROR_NOT_PERMITTED"};
  const Json j = to_json(e);
  const ErrorInfo back = error_from_json(j);
  CHECK(back.code == e.code);
  CHECK(back.message == e.message);
  CHECK(back.api == e.api);
  CHECK(back.result == e.result);
  CHECK(!to_json(ErrorInfo{"refused", "why", {}, {}}).contains("api"));
  CHECK_THROWS_AS(error_from_json(Json{{"code", "x"}}), std::invalid_argument);
}

TEST_CASE("a finding reads back as it was written") {
  Finding f{"pools.yaml",
            4,
            5,
            "warning",
            "reserve-above-threshold",
            "reserve is above",
            false,
            std::nullopt,
            std::string("set release_threshold to max")};
  const Finding back = finding_from_json(to_json(f));
  CHECK(back.line == 4);
  CHECK(back.code == "reserve-above-threshold");
  CHECK(!back.fact);
  CHECK(back.help == f.help);
  CHECK_THROWS_AS(finding_from_json(Json{{"file", "x"}}), std::invalid_argument);
}
