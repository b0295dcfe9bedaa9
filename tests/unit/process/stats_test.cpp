#include <doctest/doctest.h>

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
