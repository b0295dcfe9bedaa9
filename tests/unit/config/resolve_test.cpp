#include "config/resolve.h"

#include <doctest/doctest.h>

#include "config/load.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

namespace {

Desired resolved(const std::string& text, const NodeReport& node = test::two_gpu_node()) {
  Diagnostics d;
  const Config c = parse_config(SourceFile("t.yaml", text), d);
  REQUIRE_MESSAGE(!d.has_invalid_input(), render_text(d, SourceFile("t.yaml", text)));
  return resolve(c, node);
}

}  // namespace

TEST_CASE("a device list: written order, each once, unknown and repeated selectors set apart") {
  Diagnostics d;
  const Config c = parse_config(
      SourceFile("t.yaml",
                 "version: 1\npools: [{name: a, devices: [1, GPU-00000000-0000-4000-8000-000000000001, 0, 7]}]\n"),
      d);
  REQUIRE(!d.has_invalid_input());
  const DeviceSelection s = select_devices(c.pools[0].devices, test::two_gpu_node());
  CHECK(s.ordinals == std::vector<int>{1, 0});
  REQUIRE(s.repeated.size() == 1);
  CHECK(s.repeated[0].second == 1);
  CHECK(s.repeated[0].first->value.text == "GPU-00000000-0000-4000-8000-000000000001");
  REQUIRE(s.unknown.size() == 1);
  CHECK(s.unknown[0]->value.text == "7");
  DeviceList all;
  all.all = true;
  CHECK(select_devices(all, test::two_gpu_node()).ordinals == std::vector<int>{0, 1});
}

TEST_CASE("a pool entry becomes one want per device, its threshold in bytes of that device") {
  NodeReport node = test::two_gpu_node();
  node.devices[1].info.total_memory = 40ULL << 30;
  const Desired w = resolved(R"(version: 1
pools:
  - {name: kv, devices: all, handle_types: [posix_fd], release_threshold: 50%, access: [1, 0],
     reuse: {allow_opportunistic: false}}
  - {name: scratch, devices: [1]}
)",
                             node);
  REQUIRE(w.pools.size() == 3);
  CHECK(w.pools[0].name == "kv");
  CHECK(w.pools[0].device == 0);
  CHECK(w.pools[0].entry == 0);
  CHECK(w.pools[0].settings.release_threshold.bytes() == 40ULL << 30);
  CHECK(w.pools[1].settings.release_threshold.bytes() == 20ULL << 30);
  CHECK(w.pools[0].settings.release_threshold.text() == "50%");
  CHECK_FALSE(w.pools[0].settings.allow_opportunistic);
  CHECK(w.pools[0].settings.follow_event_dependencies);  // the driver's default, not written
  CHECK(w.pools[0].access == std::vector<int>{1});
  CHECK(w.pools[1].access == std::vector<int>{0});
  CHECK(w.pools[2].name == "scratch");
  CHECK(w.pools[2].entry == 1);
  CHECK(w.pools[2].settings == PoolSettings{});
  CHECK(w.pools[2].settings.release_threshold.text() == "0B");
}

TEST_CASE("the process: section per device; unset settings stay unset") {
  const Desired w = resolved(R"(version: 1
process:
  default_pool: {release_threshold: max, access: [all]}
  current_pool: {max_size: 8GiB, reserve: 1GiB, release_threshold: 2GiB}
)");
  REQUIRE(w.process.size() == 2);  // devices left out: all of them
  const auto& d0 = w.process[0];
  CHECK(d0.device == 0);
  REQUIRE(d0.default_pool);
  CHECK(d0.default_pool->settings.release_threshold == ReleaseThreshold(UINT64_MAX));
  CHECK_FALSE(d0.default_pool->settings.allow_opportunistic.has_value());
  CHECK(d0.default_pool->access == std::vector<int>{1});
  REQUIRE(d0.current_pool);
  CHECK(d0.current_pool->max_size == 8ULL << 30);
  CHECK(d0.current_pool->reserve == 1ULL << 30);
  CHECK(d0.current_pool->settings.release_threshold == ReleaseThreshold(2ULL << 30));
  // A patch over a pool's settings keeps what the file leaves out.
  PoolSettings now;
  now.allow_opportunistic = false;
  const PoolSettings next = d0.default_pool->settings.over(now);
  CHECK(next.release_threshold.bytes() == UINT64_MAX);
  CHECK_FALSE(next.allow_opportunistic);
}

TEST_CASE("check and the holder see the same threshold: the loader resolves once") {
  const std::string text = "version: 1\npools: [{name: kv, devices: [0], release_threshold: 10%, reserve: 9GiB}]\n";
  const Judged j = judge_config(
      SourceFile("t.yaml", text), [] { return test::two_gpu_node(); }, Scope::all);
  REQUIRE(j.desired);
  CHECK(j.desired->pools[0].settings.release_threshold.bytes() == (80ULL << 30) / 10);
  // 9 GiB is above 10% of 80 GiB (8 GiB): the finding quotes the resolved bytes.
  REQUIRE(j.diags.all().size() == 1);
  CHECK(j.diags.all()[0].code == "reserve-above-threshold");
  CHECK(j.diags.all()[0].message.find("10% of 80 GiB = 8 GiB") != std::string::npos);
  CHECK_THROWS_AS(load_config(SourceFile("t.yaml", text), test::two_gpu_node(), Scope::all), ConfigRejected);
}
