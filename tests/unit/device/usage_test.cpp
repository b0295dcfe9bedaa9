// DeviceUsage on the simulated node (core/device/sim/usage.cpp).
#include "device/sim/usage.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include "device/sim_backend.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

namespace {
constexpr std::uint64_t kUsageMiB = 1ULL << 20;
using SimUsage = sim::SimDeviceUsage;
}  // namespace

TEST_CASE("device usage: an idle simulated device has the driver's reserve, outside used, and no process") {
  SimBackend sim(test::two_gpu_node());
  const DeviceUsageReport u = sim.device_usage(0);
  CHECK(u.source == "simulated");
  CHECK(u.note.empty());
  CHECK(u.total_bytes == 80ULL << 30);
  CHECK(u.reserved_bytes == SimUsage::kDriverReserve);
  CHECK(u.used_bytes == 0);  // as driver 580 answers nvmlDeviceGetMemoryInfo_v2 (backend.h)
  CHECK(u.free_bytes == u.total_bytes - u.reserved_bytes);
  CHECK(u.processes_listed);
  CHECK(u.processes.empty());
  CHECK(sim.calls().back() == "device_usage(0)");
}

TEST_CASE("device usage: this process with a pool's reserve, and a stranger") {
  SimBackend sim(test::two_gpu_node());
  PoolProps props;
  const PoolHandle pool = sim.create_pool(1, props);
  PoolSettings keep;
  keep.release_threshold = ReleaseThreshold::max();
  sim.set_pool_settings(pool, keep);
  sim.free(pool, sim.allocate(pool, 64 * kUsageMiB));  // kept: 64 MiB reserved
  sim.add_gpu_process(1, GpuProcess{4242, 1024 * kUsageMiB});
  sim.add_gpu_process(1, GpuProcess{4243, std::nullopt});  // NVML does not know its figure

  const DeviceUsageReport u = sim.device_usage(1);
  REQUIRE(u.processes.size() == 3);
  CHECK(u.processes[0].pid == static_cast<std::uint32_t>(::getpid()));
  CHECK(u.processes[0].used_bytes == SimUsage::kContextBytes + 64 * kUsageMiB);
  CHECK(u.processes[1].pid == 4242);
  CHECK(u.processes[1].used_bytes == 1024 * kUsageMiB);
  CHECK(!u.processes[2].used_bytes);
  CHECK(u.used_bytes == SimUsage::kContextBytes + 64 * kUsageMiB + 1024 * kUsageMiB);
  CHECK(u.free_bytes == u.total_bytes - u.reserved_bytes - u.used_bytes);

  // The other device: no context there, no stranger.
  CHECK(sim.device_usage(0).processes.empty());
}

TEST_CASE("device usage: an exported allocation counts, and a device the node lacks throws") {
  SimBackend sim(test::two_gpu_node());
  const ExportedAllocation a = sim.create_exported(0, 3 * kUsageMiB);
  const DeviceUsageReport u = sim.device_usage(0);
  REQUIRE(u.processes.size() == 1);
  CHECK(u.processes[0].used_bytes == SimUsage::kContextBytes + a.size);
  ::close(a.fd);
  CHECK_THROWS_AS(sim.device_usage(7), CudaError);
  sim.fail("device_usage", "CUDA_ERROR_UNKNOWN");
  CHECK_THROWS_AS(sim.device_usage(0), CudaError);
}

TEST_CASE("device usage: used never passes the device's total") {
  NodeReport node = test::two_gpu_node();
  node.devices[0].info.total_memory = 256 * kUsageMiB;  // smaller than the reserve and a stranger
  SimBackend sim(node);
  sim.add_gpu_process(0, GpuProcess{7, 1024 * kUsageMiB});
  const DeviceUsageReport u = sim.device_usage(0);
  CHECK(u.reserved_bytes == 256 * kUsageMiB);
  CHECK(u.used_bytes == 0);  // all of it is the reserve
  CHECK(u.free_bytes == 0);
}
