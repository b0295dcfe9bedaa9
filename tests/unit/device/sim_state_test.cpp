// The simulated node's shared state (device/sim/state.h): what its teardown frees.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/fd.h"
#include "device/sim/state.h"
#include "device/sim_backend.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

namespace sim_state_test {

std::size_t open_descriptors() {
  std::size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++n;
  }
  return n;
}

// Mappings of the simulated node's memfds in this process ("/memfd:cupool-sim-pool (deleted)").
std::size_t sim_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::size_t n = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.find("memfd:cupool-sim") != std::string::npos) ++n;
  return n;
}

}  // namespace sim_state_test

TEST_CASE("a simulated node unmaps and closes what its roles made when it goes, and no descriptor it handed out") {
  using sim_state_test::open_descriptors;
  using sim_state_test::sim_mappings;
  constexpr std::uint64_t mib = 1ULL << 20;
  const std::size_t fds = open_descriptors();
  const std::size_t mapped = sim_mappings();
  Fd handed_out;
  {
    SimBackend sim(test::two_gpu_node());
    PoolProps ipc;
    ipc.handle_types = static_cast<std::uint32_t>(HandleType::posix_fd);
    ipc.max_size = 64 * mib;
    const PoolHandle pool = sim.create_pool(0, ipc);
    const std::uint64_t a = sim.allocate(pool, mib);
    const std::uint8_t byte = 1;
    sim.write(0, a, &byte, 1);  // maps the pool's arena here
    const ExportedAllocation e = sim.create_exported(1, mib);
    handed_out = Fd(e.fd);
    const std::uint64_t again = sim.map_exported(1, e.fd, e.size, {});
    CHECK(again != e.address);
    CHECK(sim_mappings() == mapped + 3);   // the arena, the exported allocation twice
    CHECK(open_descriptors() == fds + 2);  // the pool's memfd, the exported allocation's descriptor
  }
  CHECK(sim_mappings() == mapped);
  CHECK(open_descriptors() == fds + 1);  // the exported allocation's descriptor is the caller's
  handed_out.reset();
  CHECK(open_descriptors() == fds);
}
