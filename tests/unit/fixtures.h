// Nodes built in code for unit tests (the CLI tests use the recorded profiles).
#pragma once

#include <stdlib.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "device/node.h"

namespace cupool::test {

// One directory of the test process's own in $TMPDIR (ctest gives each test a folder of its own
// there and fails a test that leaves anything: tests/hygiene), else /tmp; removed with all in it
// when the process exits, a failed test's included. Socket paths in it must stay under 108 bytes:
// a TMPDIR longer than 48 bytes is passed over for /tmp.
inline const std::string& scratch_dir() {
  struct Scratch {
    std::string path;
    Scratch() {
      const char* env = std::getenv("TMPDIR");
      const std::string base = env && *env == '/' && std::string(env).size() <= 48 ? env : "/tmp";
      std::string dir = base + "/cupool-unit-XXXXXX";
      if (mkdtemp(dir.data())) path = dir;
      if (!path.empty()) (void)chmod(path.c_str(), 0755);  // tests that run a part as another user reach in
    }
    ~Scratch() {
      std::error_code ignored;
      if (!path.empty()) std::filesystem::remove_all(path, ignored);
    }
  };
  static const Scratch scratch;
  return scratch.path;
}

// A fresh path in a new directory of scratch_dir().
inline std::string temp_path(const std::string& name) {
  std::string dir = scratch_dir() + "/XXXXXX";
  if (!mkdtemp(dir.data())) return scratch_dir() + "/" + name;
  return dir + "/" + name;
}

inline DeviceReport device(int ordinal) {
  DeviceReport d;
  DeviceInfo& i = d.info;
  i.ordinal = ordinal;
  i.name = "Test GPU";
  i.uuid = "GPU-00000000-0000-4000-8000-00000000000" + std::to_string(ordinal);
  i.pci_bus_id = "0000:" + std::string(ordinal ? "2b" : "1b") + ":00.0";
  i.total_memory = 80ULL << 30;
  i.cc_major = 9;
  i.memory_pools = true;
  i.pool_handle_types = 0x1 | 0x8;
  i.fabric_handle = true;
  i.host_memory_pools = true;
  i.host_numa_memory_pools = true;
  i.host_numa_id = 0;
  i.managed_memory = true;
  i.concurrent_managed_access = true;
  i.vmm = true;
  i.ipc_events = true;
  d.memory = MemoryInfo{70ULL << 30, 80ULL << 30};
  return d;
}

// Two GPUs with peer access both ways, host NUMA node 0, a CUDA 13.0 driver.
inline NodeReport two_gpu_node() {
  NodeReport n;
  n.driver_version = 13000;
  n.kernel_driver_version = "580.159.04";
  n.built_with_cuda = 13000;
  n.host_numa_nodes = {0};
  n.devices = {device(0), device(1)};
  n.peer_access = {{true, true}, {true, true}};
  return n;
}

}  // namespace cupool::test
