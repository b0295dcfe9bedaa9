#include "device/bench.h"

#include <doctest/doctest.h>

#include <string>

#include "cli/verbs.h"
#include "device/sim_backend.h"
#include "tests/unit/fixtures.h"

TEST_CASE("bench's table: the settings, a row per case, the ratios, and a simulated node said so") {
  cupool::SimBackend sim(cupool::test::two_gpu_node());
  cupool::BenchOptions o;
  o.device = 1;
  o.sizes = {1ULL << 20};
  o.iterations = 5;
  o.config = "pools.yaml";
  const std::string text = cupool::cli::render_bench_table(cupool::run_bench(sim, o));
  CHECK(text.find("cupool bench on device 1 (") == 0);
  CHECK(text.find("NOTE: simulated node") != std::string::npos);
  CHECK(text.find("release threshold under test: max (from pools.yaml); 5 iterations per case; seed 1\n\n") !=
        std::string::npos);
  CHECK(text.find("CASE ") != std::string::npos);
  CHECK(text.find("COMPARISON (ratio of medians)") != std::string::npos);
}
