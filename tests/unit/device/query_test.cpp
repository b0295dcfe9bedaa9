// `query` on a simulated node (core/device/query.cpp): what build_report asks and keeps for the
// selected devices, and a failed probe in plain words. (sim_backend_test.cpp holds the calls of a
// plain query, --deep on one device, GPUDirect Storage and an unknown selector.)
#include "device/query.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "device/sim_backend.h"
#include "tests/unit/fixtures.h"

namespace cupool::query_test {

// Three GPUs; peer access one way only between 0 and 2 (0 reaches 2, 2 does not reach 0).
NodeReport three_gpu_node() {
  NodeReport n = test::two_gpu_node();
  n.devices.push_back(test::device(2));
  n.devices[2].info.pci_bus_id = "0000:3b:00.0";
  n.peer_access = {{true, true, true}, {true, true, false}, {false, true, true}};
  return n;
}

std::vector<int> ordinals(const NodeReport& r) {
  std::vector<int> out;
  for (const auto& d : r.devices) out.push_back(d.info.ordinal);
  return out;
}

std::size_t count_of(const std::vector<std::string>& calls, const std::string& prefix) {
  return static_cast<std::size_t>(
      std::count_if(calls.begin(), calls.end(), [&](const std::string& c) { return c.rfind(prefix, 0) == 0; }));
}

QueryOptions selecting(const std::vector<std::string>& texts, bool deep = false) {
  QueryOptions o;
  for (const auto& t : texts) {
    const auto sel = parse_device_selector(t);
    REQUIRE_MESSAGE(sel, t);
    o.devices.push_back(*sel);
  }
  o.deep = deep;
  o.gds = false;
  return o;
}

TEST_CASE("build_report: the node's facts, as the backend gives them") {
  NodeReport node = three_gpu_node();
  node.driver_version = 12080;
  node.kernel_driver_version = "570.86.15";
  node.host_numa_nodes = {0, 1};
  SimBackend sim(node);
  const NodeReport r = build_report(sim);
  CHECK(r.driver_version == 12080);
  CHECK(r.kernel_driver_version == "570.86.15");
  CHECK(r.host_numa_nodes == std::vector<int>{0, 1});
  CHECK(r.built_with_cuda == built_with_cuda_version());  // this build's, not the profile's
  CHECK(ordinals(r) == std::vector<int>{0, 1, 2});
  CHECK(r.peer_access == node.peer_access);
  CHECK_FALSE(r.deep);
  CHECK_FALSE(r.gds);
  for (const auto& d : r.devices) CHECK(d.probes.empty());
  CHECK(count_of(sim.calls(), "probe_export") == 0);
}

TEST_CASE("build_report: selected devices keep the node's order and numbering, and their rows of the peer matrix") {
  SimBackend sim(three_gpu_node());
  SUBCASE("by index, out of order and twice") {
    const NodeReport r = build_report(sim, selecting({"2", "0", "2"}));
    CHECK(ordinals(r) == std::vector<int>{0, 2});
    CHECK(r.peer_access == std::vector<std::vector<bool>>{{true, true}, {false, true}});
  }
  SUBCASE("by UUID and by PCI bus id") {
    const NodeReport r = build_report(sim, selecting({"GPU-00000000-0000-4000-8000-000000000002", "0000:2b:00.0"}));
    CHECK(ordinals(r) == std::vector<int>{1, 2});
    CHECK(r.peer_access == std::vector<std::vector<bool>>{{true, false}, {true, true}});
    CHECK(r.devices[0].info.pci_bus_id == "0000:2b:00.0");
  }
  SUBCASE("every device is every device") {
    const NodeReport r = build_report(sim, selecting({"0", "1", "2"}));
    CHECK(ordinals(r) == std::vector<int>{0, 1, 2});
    CHECK(r.peer_access == three_gpu_node().peer_access);
  }
}

TEST_CASE("build_report: a selector that names no device says what the node has") {
  SimBackend sim(three_gpu_node());
  CHECK_THROWS_WITH_AS(build_report(sim, selecting({"0", "7"})),
                       "--devices: no device '7' on this node (it has 3 devices)", InputError);
  NodeReport one = test::two_gpu_node();
  one.devices.pop_back();
  one.peer_access = {{true}};
  SimBackend single(one);
  CHECK_THROWS_WITH_AS(build_report(single, selecting({"1"})),
                       "--devices: no device '1' on this node (it has 1 device)", InputError);
}

TEST_CASE("build_report --deep: probes only the selected devices that have pools, each handle type once") {
  NodeReport node = three_gpu_node();
  node.devices[2].info.memory_pools = false;
  SimBackend sim(node);
  const NodeReport r = build_report(sim, selecting({"1", "2"}, true));
  CHECK(r.deep);
  CHECK_FALSE(r.gds);  // not asked (gds = false)
  CHECK(count_of(sim.calls(), "gds_report") == 0);
  REQUIRE(ordinals(r) == std::vector<int>{1, 2});
  REQUIRE(r.devices[0].probes.size() == 3);
  CHECK(r.devices[0].probes[0].handle_type == HandleType::none);
  CHECK(r.devices[0].probes[1].handle_type == HandleType::posix_fd);
  CHECK(r.devices[0].probes[2].handle_type == HandleType::fabric);
  for (const auto& p : r.devices[0].probes) CHECK(p.ok);
  CHECK(r.devices[1].probes.empty());  // no pools: nothing to export
  CHECK(count_of(sim.calls(), "probe_export(1,") == 3);
  CHECK(count_of(sim.calls(), "probe_export(0,") == 0);
  CHECK(count_of(sim.calls(), "probe_export(2,") == 0);
}

TEST_CASE("build_report --deep: a recorded probe keeps its machine's reason; one without gets explained here") {
  NodeReport node = test::two_gpu_node();
  node.devices[0].probes.push_back({HandleType::fabric, false, "CUDA_ERROR_NOT_PERMITTED",
                                    "cuMemPoolExportToShareableHandle", "IMEX was down on the recorded node", ""});
  node.devices[1].probes.push_back(
      {HandleType::posix_fd, false, "CUDA_ERROR_OUT_OF_MEMORY", "cuMemAllocFromPoolAsync", "", "out of memory"});
  SimBackend sim(node);
  const NodeReport r = build_report(sim, selecting({}, true));
  REQUIRE(r.devices[0].probes.size() == 3);
  CHECK(r.devices[0].probes[2].reason == "IMEX was down on the recorded node");
  REQUIRE(r.devices[1].probes.size() == 3);
  CHECK(r.devices[1].probes[1].reason == "the device has no memory free for a 2 MiB test allocation");
  CHECK(r.devices[1].probes[0].reason.empty());  // it succeeded: nothing to explain
}

TEST_CASE("explain_probe: each driver answer in plain words, naming the handle type") {
  const auto probe = [](HandleType type, const std::string& error, const std::string& description = "") {
    return ExportProbe{type, false, error, "cuMemPoolCreate", "", description};
  };
  CHECK(explain_probe(probe(HandleType::posix_fd, "CUDA_ERROR_NOT_PERMITTED")) ==
        "the driver does not permit this operation for this process");
  CHECK(explain_probe(probe(HandleType::fabric, "CUDA_ERROR_NOT_SUPPORTED")) ==
        "the driver does not support fabric handles for memory pools on this device");
  CHECK(explain_probe(probe(HandleType::fabric, "CUDA_ERROR_INVALID_VALUE")) ==
        "the driver rejected a pool with handle type fabric on this device (invalid value)");
  CHECK(explain_probe(probe(HandleType::posix_fd, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")) ==
        "the device has no memory free for a 2 MiB test allocation");
  // An answer without plain words: the driver's, else its name.
  CHECK(explain_probe(probe(HandleType::posix_fd, "CUDA_ERROR_ILLEGAL_STATE", "the operation is not permitted now")) ==
        "the operation is not permitted now");
  CHECK(explain_probe(probe(HandleType::posix_fd, "CUDA_ERROR_ILLEGAL_STATE")) == "CUDA_ERROR_ILLEGAL_STATE");
}

}  // namespace cupool::query_test
