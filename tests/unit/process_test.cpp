#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "core/holder.h"
#include "core/process.h"
#include "core/sim_backend.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

namespace {

std::size_t count_calls(const SimBackend& sim, const std::string& prefix, std::size_t from = 0) {
  return static_cast<std::size_t>(std::count_if(sim.calls().begin() + static_cast<std::ptrdiff_t>(from), sim.calls().end(),
                                                [&](const std::string& c) { return c.rfind(prefix, 0) == 0; }));
}

const char* const kSection = R"(version: 1
process:
  devices: [1]
  default_pool:
    release_threshold: 50%
    reuse: {allow_internal_dependencies: false}
    access: [all]
pools:
  - {name: huge, devices: [0], reserve: 79GiB, release_threshold: max}
)";

}  // namespace

TEST_CASE("configure sets the selected devices' default pools, and a second call changes nothing") {
  SimBackend sim(test::two_gpu_node());
  const ConfigureResult first = configure_process(sim, kSection, "p.yaml");
  CHECK(first.devices == std::vector<int>{1});
  REQUIRE(first.changes.size() == 3);
  CHECK(first.changes[0].field == "release_threshold");
  CHECK(first.changes[0].from == "0 B");
  CHECK(first.changes[0].to == "40 GiB");
  CHECK(first.changes[1].field == "reuse.allow_internal_dependencies");
  CHECK(first.changes[2].field == "access");
  const PoolSettings s = sim.pool_settings(sim.default_pool(1));
  CHECK(s.release_threshold == (40ULL << 30));
  CHECK_FALSE(s.allow_internal_dependencies);
  CHECK(s.allow_opportunistic);  // not named in the file: left as it was
  CHECK(sim.pool_access(sim.default_pool(1), 0));
  // Device 0 is not selected: nothing asked of it, no pool touched.
  for (const auto& c : sim.calls()) CHECK(c != "default_pool(0)");

  const std::size_t before = sim.calls().size();
  const ConfigureResult second = configure_process(sim, kSection, "p.yaml");
  CHECK(second.changes.empty());
  CHECK(count_calls(sim, "set_pool_settings", before) == 0);
  CHECK(count_calls(sim, "set_pool_access", before) == 0);
}

TEST_CASE("configure judges only the process section: the holder's pools don't stop an application") {
  // The pool above reserves more than device 0 has free (check would say so); that is the
  // holder's business, and the application's section is fine.
  SimBackend sim(test::two_gpu_node());
  CHECK_NOTHROW(configure_process(sim, kSection, "p.yaml"));
}

TEST_CASE("configure refuses a bad file with findings, and changes nothing") {
  SimBackend sim(test::two_gpu_node());
  try {
    configure_process(sim, "version: 1\nprocess:\n  default_pool: {release_treshold: max}\n", "bad.yaml");
    FAIL("accepted an unknown key");
  } catch (const ConfigRejected& e) {
    CHECK(e.invalid_input());
    CHECK(e.rendered().find("bad.yaml:3:") != std::string::npos);
    CHECK(e.rendered().find("release_threshold") != std::string::npos);  // did you mean
  }
  try {
    configure_process(sim, "version: 1\nprocess:\n  devices: [5]\n  default_pool: {release_threshold: max}\n", "five.yaml");
    FAIL("accepted a missing device");
  } catch (const ConfigRejected& e) {
    CHECK_FALSE(e.invalid_input());
  }
  CHECK(count_calls(sim, "set_pool") == 0);
}

TEST_CASE("configure: a file without a process section changes nothing; a driver refusal is an error") {
  SimBackend sim(test::two_gpu_node());
  const ConfigureResult r = configure_process(sim, "version: 1\n", "empty.yaml");
  CHECK(r.changes.empty());
  sim.fail("set_pool_settings", "CUDA_ERROR_NOT_PERMITTED");
  CHECK_THROWS_AS(configure_process(sim, "version: 1\nprocess: {default_pool: {release_threshold: max}}\n", "p.yaml"),
                  CudaError);
}

TEST_CASE("process_stats reports the default pool of each used device") {
  SimBackend sim(test::two_gpu_node());
  configure_process(sim, kSection, "p.yaml");
  const auto stats = process_stats(sim);
  REQUIRE(stats["devices"].size() == 1);  // only device 1 was touched
  CHECK(stats["devices"][0]["device"] == 1);
  CHECK(stats["devices"][0]["pools"][0]["pool"] == "default");
  CHECK(stats["devices"][0]["pools"][0]["release_threshold"] == (40ULL << 30));
  CHECK(stats["devices"][0]["graph"]["used_current"] == 0);
}
