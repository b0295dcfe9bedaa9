#include "device/node.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>

#include "base/error.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

TEST_CASE("device selectors: index, UUID, PCI bus id") {
  auto i = parse_device_selector("3");
  REQUIRE(i);
  CHECK(i->kind == DeviceSelector::Kind::index);
  CHECK(i->index == 3);
  auto u = parse_device_selector("GPU-DDEACB68-6ba3-ca8f-b8e0-48c19fc3c0da");
  REQUIRE(u);
  CHECK(u->kind == DeviceSelector::Kind::uuid);
  CHECK(u->normalized == "GPU-ddeacb68-6ba3-ca8f-b8e0-48c19fc3c0da");
  auto p = parse_device_selector("00000000:1B:00.0");
  REQUIRE(p);
  CHECK(p->kind == DeviceSelector::Kind::pci_bus_id);
  CHECK(p->normalized == "0000:1b:00.0");
  std::string why;
  CHECK_FALSE(parse_device_selector("gpu0", &why));
  CHECK(why.find("PCI bus id") != std::string::npos);
  CHECK_FALSE(parse_device_selector("GPU-1234", &why));
  CHECK(why.find("8-4-4-4-12") != std::string::npos);
}

TEST_CASE("normalize_pci_bus_id") {
  CHECK(normalize_pci_bus_id("1b:00.0") == "0000:1b:00.0");
  CHECK(normalize_pci_bus_id("0000:1B:00.0") == "0000:1b:00.0");
  CHECK(normalize_pci_bus_id("00000001:1b:00.7") == "0001:1b:00.7");
  CHECK_FALSE(normalize_pci_bus_id("0000:1b:00"));
  CHECK_FALSE(normalize_pci_bus_id("0000:1b:0.0"));
  CHECK_FALSE(normalize_pci_bus_id("100000000:1b:00.0"));
  CHECK_FALSE(normalize_pci_bus_id("zz:00.0"));
}

TEST_CASE("resolve_device finds a device by any of its names") {
  const NodeReport node = test::two_gpu_node();
  CHECK(resolve_device(node, *parse_device_selector("1")) == 1);
  CHECK(resolve_device(node, *parse_device_selector(node.devices[1].info.uuid)) == 1);
  CHECK(resolve_device(node, *parse_device_selector("00000000:" + node.devices[0].info.pci_bus_id.substr(5))) == 0);
  CHECK_FALSE(resolve_device(node, *parse_device_selector("2")));
}

TEST_CASE("a report survives JSON and a profile file") {
  NodeReport node = test::two_gpu_node();
  node.devices[0].probes.push_back({HandleType::fabric, false, "CUDA_ERROR_NOT_PERMITTED",
                                    "cuMemPoolExportToShareableHandle", "no IMEX channel", ""});
  const auto again = report_from_json(to_json(node), "test");
  CHECK(to_json(again) == to_json(node));

  const std::string path = test::temp_path("profile.yaml");
  save_profile(node, path);
  const NodeReport loaded = load_profile(path);
  std::remove(path.c_str());
  CHECK(loaded.source.simulated);
  CHECK(loaded.devices.size() == 2);
  CHECK(loaded.devices[0].probes.size() == 1);
  CHECK(loaded.devices[0].probes[0].error == "CUDA_ERROR_NOT_PERMITTED");
  CHECK(loaded.peer_access == node.peer_access);
  CHECK(loaded.devices[1].memory->free == node.devices[1].memory->free);
}

TEST_CASE("a deep report's GPUDirect Storage survives JSON, and a bad mode is named") {
  NodeReport node = test::two_gpu_node();
  GdsReport gds;
  gds.mode = GdsReport::Mode::gpudirect;
  gds.library_version = "1.15";
  gds.nvidia_fs_version = "2.26";
  gds.file_systems = {"nvme", "lustre"};
  node.gds = gds;
  node.deep = true;
  const auto j = to_json(node);
  CHECK(j["gds"]["mode"] == "gpudirect");
  CHECK(j["gds"]["note"].is_null());
  CHECK(j["gds"]["error"].is_null());
  const NodeReport again = report_from_json(j, "test");
  REQUIRE(again.gds);
  CHECK(again.gds->mode == GdsReport::Mode::gpudirect);
  CHECK(again.gds->file_systems == gds.file_systems);
  CHECK(to_json(again) == j);

  GdsReport failed;
  failed.reason = "cuFile's driver did not open";
  failed.error_api = "cuFileDriverOpen";
  failed.error_result = "CU_FILE_DRIVER_NOT_INITIALIZED";
  failed.error_message = "CU_FILE_DRIVER_NOT_INITIALIZED";
  node.gds = failed;
  const auto k = to_json(node);
  CHECK(k["gds"]["mode"] == "unavailable");
  CHECK(k["gds"]["error"]["code"] == "cufile_error");
  CHECK(k["gds"]["error"]["api"] == "cuFileDriverOpen");
  CHECK(to_json(report_from_json(k, "test")) == k);

  auto bad = k;
  bad["gds"]["mode"] = "maybe";
  CHECK_THROWS_WITH_AS(report_from_json(bad, "p.yaml: node"), doctest::Contains("gds.mode"), InputError);
  // Without --deep there is no gds at all.
  CHECK_FALSE(to_json(test::two_gpu_node()).contains("gds"));
}

TEST_CASE("load_profile names the broken key") {
  const std::string path = test::temp_path("profile.yaml");
  {
    std::ofstream out(path);
    out << "profile: {version: 1}\nnode:\n  driver: {cuda_version_int: 13000}\n  host: {numa_nodes: [0]}\n"
           "  devices: [{index: 0}]\n  peer_access: [[true]]\n";
  }
  try {
    load_profile(path);
    FAIL("expected an error");
  } catch (const InputError& e) {
    // The device's identity (device, uuid, pci_bus_id) is read first, in its declared order.
    CHECK(std::string(e.what()).find("node.devices[0].uuid: missing") != std::string::npos);
  }
  std::remove(path.c_str());
  CHECK_THROWS_AS(load_profile("/nonexistent/profile.yaml"), InputError);
}

TEST_CASE("managed pools need a CUDA 13 driver") {
  NodeReport node = test::two_gpu_node();
  CHECK(node.managed_pools_supported(0));
  node.driver_version = 12080;
  CHECK_FALSE(node.managed_pools_supported(0));
  CHECK(cuda_version_string(12080) == "12.8");
}
