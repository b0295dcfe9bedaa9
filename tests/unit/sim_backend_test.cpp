#include <doctest/doctest.h>

#include "core/error.h"
#include "core/query.h"
#include "core/sim_backend.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

TEST_CASE("query asks attributes only, and records each call") {
  SimBackend sim(test::two_gpu_node());
  const NodeReport r = build_report(sim);
  CHECK(r.devices.size() == 2);
  CHECK(r.source.simulated);
  const std::vector<std::string> expected{
      "init()", "driver_version()", "kernel_driver_version()", "host_numa_nodes()", "device_count()",
      "device_info(0)", "memory_info(0)", "device_info(1)", "memory_info(1)", "can_access_peer(0,1)", "can_access_peer(1,0)"};
  CHECK(sim.calls() == expected);
}

TEST_CASE("--deep probes every handle type on every selected device") {
  NodeReport node = test::two_gpu_node();
  node.devices[1].info.pool_handle_types = 0x1;  // no fabric
  SimBackend sim(node);
  QueryOptions o;
  o.deep = true;
  o.devices = {*parse_device_selector("1")};
  const NodeReport r = build_report(sim, o);
  REQUIRE(r.devices.size() == 1);
  CHECK(r.devices[0].info.ordinal == 1);
  CHECK(r.peer_access == std::vector<std::vector<bool>>{{true}});
  REQUIRE(r.devices[0].probes.size() == 3);
  CHECK(r.devices[0].probes[1].ok);
  CHECK_FALSE(r.devices[0].probes[2].ok);
  CHECK(r.devices[0].probes[2].error == "CUDA_ERROR_NOT_SUPPORTED");
  CHECK(sim.calls().back() == "probe_export(1,fabric)");
}

TEST_CASE("recorded probes are the node's answer") {
  NodeReport node = test::two_gpu_node();
  node.devices[0].probes.push_back({HandleType::fabric, false, "CUDA_ERROR_NOT_PERMITTED", "cuMemPoolExportToShareableHandle", "no IMEX"});
  SimBackend sim(node);
  const ExportProbe p = sim.probe_export(0, HandleType::fabric);
  CHECK_FALSE(p.ok);
  CHECK(p.error == "CUDA_ERROR_NOT_PERMITTED");
}

TEST_CASE("failure injection") {
  SUBCASE("no device at init is a NoDriverError") {
    SimBackend sim(test::two_gpu_node());
    sim.fail("init", "CUDA_ERROR_NO_DEVICE");
    CHECK_THROWS_AS(build_report(sim), NoDriverError);
  }
  SUBCASE("a failing attribute query is a CudaError naming the call") {
    SimBackend sim(test::two_gpu_node());
    sim.fail("device_info", "CUDA_ERROR_UNKNOWN");
    try {
      build_report(sim);
      FAIL("expected CudaError");
    } catch (const CudaError& e) {
      CHECK(e.name() == "CUDA_ERROR_UNKNOWN");
      CHECK(e.code() == 999);
      CHECK(std::string(e.what()).find("device_info") != std::string::npos);
    }
  }
  SUBCASE("a node without devices") {
    NodeReport empty = test::two_gpu_node();
    empty.devices.clear();
    empty.peer_access.clear();
    SimBackend sim(empty);
    CHECK_THROWS_AS(build_report(sim), NoDriverError);
  }
  SUBCASE("an invalid ordinal is the driver's INVALID_DEVICE") {
    SimBackend sim(test::two_gpu_node());
    CHECK_THROWS_AS(sim.device_info(5), CudaError);
  }
}

TEST_CASE("a device selector that names no device is an input error") {
  SimBackend sim(test::two_gpu_node());
  QueryOptions o;
  o.devices = {*parse_device_selector("GPU-99999999-0000-4000-8000-000000000000")};
  CHECK_THROWS_AS(build_report(sim, o), InputError);
}

TEST_CASE("the table names a simulated node and shows the peer matrix") {
  NodeReport node = test::two_gpu_node();
  node.peer_access[0][1] = false;
  SimBackend sim(node);
  NodeReport r = build_report(sim);
  r.source.profile_path = "p.yaml";
  const std::string t = render_report_table(r);
  CHECK(t.find("Simulated node from p.yaml") == 0);
  CHECK(t.find("  GPU0  -     no\n") != std::string::npos);
  CHECK(t.find("  GPU1  yes   -\n") != std::string::npos);
}

TEST_CASE("simulated pools: threshold, trim, peaks, limits") {
  SimBackend sim(test::two_gpu_node());
  const std::uint64_t mib = 1ULL << 20;
  PoolProps props;
  props.handle_types = 0x1;
  props.max_size = 256 * mib;
  const PoolHandle pool = sim.create_pool(0, props);
  CHECK(sim.pool_settings(pool).release_threshold == 0);

  std::uint64_t p = sim.allocate(pool, 3 * mib);
  CHECK(sim.pool_usage(pool).used_current == 3 * mib);
  CHECK(sim.pool_usage(pool).reserved_current == 4 * mib);  // 2 MiB granules
  sim.free(pool, p);
  CHECK(sim.pool_usage(pool).reserved_current == 0);  // threshold 0: released at the synchronize

  PoolSettings keep;
  keep.release_threshold = UINT64_MAX;
  sim.set_pool_settings(pool, keep);
  p = sim.allocate(pool, 64 * mib);
  sim.free(pool, p);
  CHECK(sim.pool_usage(pool).reserved_current == 64 * mib);
  sim.trim_pool(pool, 16 * mib);
  CHECK(sim.pool_usage(pool).reserved_current == 32 * mib);  // whole 32 MiB chunks, as the driver does
  sim.trim_pool(pool, 0);
  CHECK(sim.pool_usage(pool).reserved_current == 0);
  CHECK(sim.pool_usage(pool).reserved_high == 64 * mib);
  sim.reset_pool_peaks(pool);
  CHECK(sim.pool_usage(pool).reserved_high == 0);

  // A threshold in between keeps that much.
  keep.release_threshold = 10 * mib;
  sim.set_pool_settings(pool, keep);
  p = sim.allocate(pool, 64 * mib);
  sim.free(pool, p);
  CHECK(sim.pool_usage(pool).reserved_current == 10 * mib);

  // Sizes near 2^64 saturate instead of wrapping around.
  CHECK_THROWS_AS(sim.allocate(pool, UINT64_MAX), CudaError);
  CHECK_THROWS_AS(sim.allocate(pool, UINT64_MAX - mib), CudaError);
  const std::uint64_t before = sim.pool_usage(pool).reserved_current;
  sim.trim_pool(pool, UINT64_MAX);
  CHECK(sim.pool_usage(pool).reserved_current == before);

  // Limits and misuse are the driver's errors.
  CHECK_THROWS_AS(sim.allocate(pool, 512 * mib), CudaError);  // above max_size
  CHECK_THROWS_AS(sim.free(pool, 0xdead), CudaError);
  CHECK_THROWS_AS(sim.pool_usage(pool + 100), CudaError);
  sim.set_pool_access(pool, 1);
  sim.destroy_pool(pool);
  CHECK_THROWS_AS(sim.pool_usage(pool), CudaError);
}

TEST_CASE("simulated pools follow the node: support, handle types, peers, free memory") {
  NodeReport node = test::two_gpu_node();
  node.devices[1].info.memory_pools = false;
  node.devices[0].info.pool_handle_types = 0x1;
  node.peer_access[1][0] = false;
  node.devices[0].memory->free = 8ULL << 20;
  SimBackend sim(node);
  PoolProps fabric;
  fabric.handle_types = 0x8;
  CHECK_THROWS_AS(sim.create_pool(0, fabric), CudaError);
  CHECK_THROWS_AS(sim.create_pool(1, PoolProps{}), CudaError);
  PoolProps host;
  host.location = PoolProps::Location::host;
  host.handle_types = 0x1;
  CHECK_THROWS_AS(sim.create_pool(0, host), CudaError);
  const PoolHandle pool = sim.create_pool(0, PoolProps{});
  CHECK_THROWS_AS(sim.set_pool_access(pool, 1), CudaError);
  CHECK_THROWS_AS(sim.allocate(pool, 16ULL << 20), CudaError);  // more than the device has free
  sim.fail("allocate", "CUDA_ERROR_OUT_OF_MEMORY");
  try {
    sim.allocate(pool, 1);
    FAIL("expected the injected failure");
  } catch (const CudaError& e) {
    CHECK(e.name() == "CUDA_ERROR_OUT_OF_MEMORY");
  }
}
