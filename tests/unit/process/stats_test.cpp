#include <doctest/doctest.h>

#include <map>
#include <string>

#include "base/units.h"
#include "device/sim_backend.h"
#include "process/process.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

TEST_CASE("process_stats reports the default pool of each used device") {
  SimBackend sim(test::two_gpu_node());
  configure_process(sim, "version: 1\nprocess:\n  devices: [1]\n  default_pool: {release_threshold: 50%}\n", "p.yaml");
  const auto stats = process_stats(sim);
  REQUIRE(stats["devices"].size() == 1);  // only device 1 was touched
  CHECK(stats["devices"][0]["process_device"] == 1);
  CHECK(stats["devices"][0]["uuid"] == test::two_gpu_node().devices[1].info.uuid);
  CHECK(stats["devices"][0]["pools"][0]["role"] == "default");
  CHECK(stats["devices"][0]["pools"][0]["release_threshold"] == "40GiB");
  CHECK(stats["devices"][0]["pools"][0]["release_threshold_bytes"] == (40ULL << 30));
  CHECK(stats["devices"][0]["graph"]["used_bytes"] == 0);
}

TEST_CASE("process_stats: a threshold as the file wrote it, else in a readable unit") {
  SimBackend sim(test::two_gpu_node());
  const ConfigureResult r = configure_process(
      sim, "version: 1\nprocess:\n  devices: [0]\n  default_pool: {release_threshold: 33%}\n", "p.yaml");
  const PoolHandle pool = sim.default_pool(0);
  const std::uint64_t bytes = sim.pool_settings(pool).release_threshold.bytes();
  CHECK(bytes % (1ULL << 30) != 0);  // 33% of this device is no whole number of GiB
  auto shown = [&](const std::map<PoolHandle, ReleaseThreshold>& written) {
    return process_stats(sim, written)["devices"][0]["pools"][0];
  };
  CHECK(shown(r.thresholds)["release_threshold"] == "33%");
  CHECK(shown(r.thresholds)["release_threshold_bytes"] == bytes);
  // Not what the file set (or set by someone else since): the driver's bytes, readable (26.4GiB), not its exact KiB.
  const std::string readable = shown({})["release_threshold"].get<std::string>();
  CHECK(readable == format_bytes(bytes).erase(format_bytes(bytes).find(' '), 1));
  CHECK(readable.find('.') != std::string::npos);
  CHECK(readable.size() <= 8);
  CHECK(readable_threshold(ReleaseThreshold(8ULL << 30)).text() == "8GiB");
  CHECK(readable_threshold(ReleaseThreshold(0)).text() == "0B");
  CHECK(readable_threshold(ReleaseThreshold::max()).text() == "max");
}
