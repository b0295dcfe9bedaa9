#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "config/diagnostics.h"
#include "device/sim_backend.h"
#include "process/process.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

namespace {

std::size_t count_calls(const SimBackend& sim, const std::string& prefix, std::size_t from = 0) {
  return static_cast<std::size_t>(std::count_if(sim.calls().begin() + static_cast<std::ptrdiff_t>(from),
                                                sim.calls().end(),
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
  CHECK(first.changes[0].from == "0B");
  CHECK(first.changes[0].to == "50%");  // as the file wrote it
  CHECK(first.changes[1].field == "reuse.allow_internal_dependencies");
  CHECK(first.changes[2].field == "access");
  const PoolSettings s = sim.pool_settings(sim.default_pool(1));
  CHECK(s.release_threshold.bytes() == (40ULL << 30));
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
    configure_process(sim, "version: 1\nprocess:\n  devices: [5]\n  default_pool: {release_threshold: max}\n",
                      "five.yaml");
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

namespace {

const char* const kCurrent = R"(version: 1
process:
  devices: [1]
  current_pool:
    max_size: 8GiB
    release_threshold: max
    reserve: 1GiB
    reuse: {allow_opportunistic: false}
    access: [0]
)";

}  // namespace

TEST_CASE("configure creates a pool on each selected device and makes it current; a second call changes nothing") {
  SimBackend sim(test::two_gpu_node());
  const ConfigureResult first = configure_process(sim, kCurrent, "c.yaml");
  const PoolHandle def = sim.default_pool(1);
  const PoolHandle cur = sim.current_pool(1);
  REQUIRE(cur != def);
  const auto props = sim.created_props(cur);
  REQUIRE(props);
  CHECK(props->location == PoolProps::Location::device);
  CHECK(props->location_id == 1);
  CHECK(props->max_size == (8ULL << 30));
  CHECK(props->handle_types == 0);  // never exported
  const PoolSettings s = sim.pool_settings(cur);
  CHECK(s.release_threshold.bytes() == UINT64_MAX);
  CHECK_FALSE(s.allow_opportunistic);
  CHECK(s.follow_event_dependencies);                         // not named: the driver's default
  CHECK(sim.pool_usage(cur).reserved_bytes == (1ULL << 30));  // the reserve, kept by the threshold
  CHECK(sim.pool_usage(cur).used_bytes == 0);
  CHECK(sim.pool_access(cur, 0));
  // The default pool is left as it was; device 0 is not selected: no pool made there.
  CHECK(sim.pool_settings(def).release_threshold.bytes() == 0);
  CHECK(sim.current_pool(0) == sim.default_pool(0));
  for (const auto& c : sim.calls()) CHECK(c != "create_pool(0)");

  std::vector<std::string> fields;
  for (const auto& c : first.changes) fields.push_back(c.field);
  CHECK(fields == std::vector<std::string>{"current_pool.release_threshold", "current_pool.reuse.allow_opportunistic",
                                           "current_pool", "current_pool.access"});
  CHECK(first.changes[2].from == "the default pool");
  CHECK(first.changes[2].to == "a new pool (max_size 8 GiB), 1 GiB reserved");

  const std::size_t before = sim.calls().size();
  const ConfigureResult second = configure_process(sim, kCurrent, "c.yaml");
  CHECK(second.changes.empty());
  CHECK(second.warnings_rendered.empty());
  CHECK(sim.current_pool(1) == cur);
  CHECK(count_calls(sim, "create_pool", before) == 0);
  CHECK(count_calls(sim, "set_pool_settings", before) == 0);
  CHECK(count_calls(sim, "set_current_pool", before) == 0);
  CHECK(count_calls(sim, "set_pool_access", before) == 0);

  // A later file with other settings changes the same pool; max_size can't change on a live pool.
  const ConfigureResult third = configure_process(
      sim, "version: 1\nprocess:\n  devices: [1]\n  current_pool: {max_size: 4GiB, release_threshold: 2GiB}\n",
      "d.yaml");
  CHECK(sim.current_pool(1) == cur);
  REQUIRE(third.changes.size() == 1);
  CHECK(third.changes[0].field == "current_pool.release_threshold");
  CHECK(third.changes[0].to == "2GiB");
  CHECK(third.warnings_rendered.find("keeps max_size 8 GiB") != std::string::npos);
}

TEST_CASE("configure leaves a current pool the application chose itself") {
  SimBackend sim(test::two_gpu_node());
  const PoolHandle theirs = sim.application_sets_current_pool(1);
  const ConfigureResult r = configure_process(sim, kCurrent, "c.yaml");
  CHECK(sim.current_pool(1) == theirs);
  CHECK(sim.pool_settings(theirs).release_threshold.bytes() == 0);  // untouched
  CHECK(count_calls(sim, "create_pool") == 0);
  CHECK(r.changes.empty());
  CHECK(r.warnings_rendered.find("device 1: the application made a pool of its own current") != std::string::npos);
  // The same warning typed, as `cupool check` reports findings.
  REQUIRE(r.findings.size() == 1);
  CHECK(r.findings[0].file == "c.yaml");
  CHECK(r.findings[0].severity == "warning");
  CHECK(r.findings[0].code == "process-current-pool");
}

TEST_CASE("configure's report names each change's device as the process numbers it, with its UUID and bus id") {
  SimBackend sim(test::two_gpu_node());
  const ConfigureResult r = configure_process(sim, kSection, "p.yaml");
  REQUIRE(r.changes.size() == 3);
  const DeviceInfo one = sim.device_info(1);
  CHECK(r.changes[0].id.process_device == 1);
  CHECK(r.changes[0].id.uuid == one.uuid);
  CHECK(r.changes[0].id.pci_bus_id == one.pci_bus_id);
  const auto j = r.to_json();
  // The old names are written beside the new ones until cupool 0.2 (docs/naming.md).
  const auto& c = j.at("changes").at(0);
  CHECK(c.at("process_device") == 1);
  CHECK(c.at("device") == 1);
  CHECK(c.at("uuid") == one.uuid);
  CHECK(c.at("field") == "release_threshold");
  CHECK(j.at("findings").is_array());
  CHECK(j.at("warnings_rendered") == j.at("warnings"));
}

TEST_CASE("configure rolls everything back when a device fails half way") {
  SimBackend sim(test::two_gpu_node());
  sim.fail("create_pool(1)", "CUDA_ERROR_OUT_OF_MEMORY");
  const char* both = R"(version: 1
process:
  default_pool: {release_threshold: 1GiB}
  current_pool: {release_threshold: max, reserve: 64MiB}
)";
  CHECK_THROWS_AS(configure_process(sim, both, "both.yaml"), CudaError);
  // Device 0 was done before device 1 failed: its default pool's threshold is back at 0, its
  // current pool is the default pool again, and the pool made there is gone.
  for (int d : {0, 1}) {
    CHECK(sim.current_pool(d) == sim.default_pool(d));
    CHECK(sim.pool_settings(sim.default_pool(d)).release_threshold.bytes() == 0);
  }
  CHECK(count_calls(sim, "create_pool(0)") == 1);
  CHECK(count_calls(sim, "destroy_pool") == 1);
  CHECK(count_calls(sim, "set_current_pool(0") == 2);  // made current, then back
}
