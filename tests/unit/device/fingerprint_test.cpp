#include "device/fingerprint.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "tests/unit/fixtures.h"

using namespace cupool;

namespace {

// A node's /proc and /sys as the fingerprint reads them, under a directory of the test's.
struct FakeRoot {
  std::string root = test::temp_path("root");
  std::map<std::string, std::string> env;

  FakeRoot() {
    put("proc/sys/kernel/random/boot_id", "1b7c4e52-0000-4000-8000-000000000001\n");
    put("sys/module/nvidia/version", "580.159.04\n");
    put("proc/driver/nvidia/gpus/0000:1b:00.0/information",
        "Model: NVIDIA H200\nGPU UUID: GPU-00000000-0000-4000-8000-000000000000\n");
    put("proc/driver/nvidia/gpus/0000:2b:00.0/information",
        "Model: NVIDIA H200\nGPU UUID: GPU-00000000-0000-4000-8000-000000000001\n");
    std::filesystem::create_directories(root + "/proc/driver/nvidia/capabilities/gpu0");
  }
  void put(const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(root + "/" + path).parent_path());
    std::ofstream(root + "/" + path) << text;
  }
  std::string fingerprint(const std::string& build = "0.1.0") const {
    return node_fingerprint(
        root,
        [this](const char* name) -> std::optional<std::string> {
          const auto it = env.find(name);
          return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
        },
        build);
  }
};

}  // namespace

TEST_CASE("a node's fingerprint changes with what changes the driver's report, and only then") {
  FakeRoot node;
  const std::string first = node.fingerprint();
  CHECK(first.rfind("sha256:", 0) == 0);
  CHECK(node.fingerprint() == first);  // read again: the same
  auto changed = [&](auto change) {
    FakeRoot other;
    change(other);
    return other.fingerprint() != first;
  };
  CHECK(changed([](FakeRoot& n) { n.put("proc/sys/kernel/random/boot_id", "another boot\n"); }));
  CHECK(changed([](FakeRoot& n) { n.put("sys/module/nvidia/version", "580.160.01\n"); }));
  CHECK(changed([](FakeRoot& n) {
    n.put("proc/driver/nvidia/gpus/0000:3b:00.0/information", "Model: NVIDIA H200\nGPU UUID: GPU-2\n");
  }));
  CHECK(changed([](FakeRoot& n) { n.put("proc/driver/nvidia/capabilities/gpu0/mig/gi1/access", "x"); }));
  CHECK(changed([](FakeRoot& n) { n.env["CUDA_VISIBLE_DEVICES"] = "1,0"; }));
  CHECK(changed([](FakeRoot& n) { n.env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"; }));
  CHECK(node.fingerprint("0.2.0") != first);
  // Another directory with the same contents: the same node.
  FakeRoot twin;
  CHECK(twin.fingerprint() == first);
}

TEST_CASE("a node whose GPUs, driver or boot can't be read has no fingerprint") {
  FakeRoot no_gpus;
  std::filesystem::remove_all(no_gpus.root + "/proc/driver/nvidia/gpus");
  CHECK(no_gpus.fingerprint().empty());
  FakeRoot no_module;
  std::filesystem::remove(no_module.root + "/sys/module/nvidia/version");
  CHECK(no_module.fingerprint().empty());
  no_module.put("proc/driver/nvidia/version", "NVRM version: 580.159.04\n");  // the other place it is said
  CHECK_FALSE(no_module.fingerprint().empty());
  FakeRoot no_boot;
  std::filesystem::remove(no_boot.root + "/proc/sys/kernel/random/boot_id");
  CHECK(no_boot.fingerprint().empty());
}
