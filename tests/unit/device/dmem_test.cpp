// The kernel's dmem cgroup controller over a fake cgroup tree and /proc (core/device/dmem.cpp).
#include "device/dmem.h"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

namespace {

void dmem_put(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

std::string dmem_slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A temporary directory holding a fake cgroup root (cgroup/) and /proc (proc/), removed with the
// test process's scratch directory.
struct DmemTree {
  std::string root = std::filesystem::path(test::temp_path("x")).parent_path().string();
  std::string cgroup = root + "/cgroup";
  std::string proc = root + "/proc";
};

}  // namespace

TEST_CASE("dmem: no cgroup v2, no controller, no region, and regions") {
  DmemTree t;
  DmemSupport s = dmem_support(t.cgroup);
  CHECK(!s.cgroup_v2);
  CHECK(!s.available());
  CHECK(s.why == "no cgroup v2 hierarchy at " + t.cgroup + " (no cgroup.controllers there)");

  dmem_put(t.cgroup + "/cgroup.controllers", "cpuset cpu io memory pids\n");
  s = dmem_support(t.cgroup);
  CHECK(s.cgroup_v2);
  CHECK(!s.controller);
  CHECK(s.why.find("no dmem cgroup controller") != std::string::npos);

  dmem_put(t.cgroup + "/cgroup.controllers", "cpuset cpu io memory pids dmem\n");
  s = dmem_support(t.cgroup);
  CHECK(s.controller);
  CHECK(s.why.find("no dmem.capacity") != std::string::npos);  // not the root cgroup

  dmem_put(t.cgroup + "/dmem.capacity", "");
  s = dmem_support(t.cgroup);
  CHECK(s.why.find("no GPU driver registered a dmem region") != std::string::npos);

  dmem_put(t.cgroup + "/dmem.capacity",
           "drm/0000:03:00.0/vram0 25753026560\ndrm/0000:03:00.0/stolen 8650752\nnot-a-line\nother/region 4096\n");
  s = dmem_support(t.cgroup);
  CHECK(s.available());
  REQUIRE(s.regions.size() == 3);
  CHECK(s.regions[0].name == "drm/0000:03:00.0/vram0");
  CHECK(s.regions[0].capacity_bytes == 25753026560ULL);
  CHECK(s.regions[0].pci_bus_id == "0000:03:00.0");
  CHECK(s.regions[1].pci_bus_id == "0000:03:00.0");
  CHECK(!s.regions[2].pci_bus_id);
}

TEST_CASE("dmem: a limit goes to the process's cgroup's dmem.max") {
  DmemTree t;
  dmem_put(t.proc + "/123/cgroup", "0::/cupool.slice/app.scope\n");
  dmem_put(t.cgroup + "/cupool.slice/app.scope/dmem.max", "");
  write_dmem_max(123, "drm/0000:03:00.0/vram0", 1ULL << 30, t.cgroup, t.proc);
  CHECK(dmem_slurp(t.cgroup + "/cupool.slice/app.scope/dmem.max") == "drm/0000:03:00.0/vram0 1073741824\n");
  // Its cgroup listing it alone is its own; one with other processes is left alone (a limit there
  // would bind them all).
  dmem_put(t.cgroup + "/cupool.slice/app.scope/cgroup.procs", "123\n");
  write_dmem_max(123, "drm/0000:03:00.0/vram0", 2ULL << 30, t.cgroup, t.proc);
  CHECK(dmem_slurp(t.cgroup + "/cupool.slice/app.scope/dmem.max") == "drm/0000:03:00.0/vram0 2147483648\n");
  dmem_put(t.cgroup + "/cupool.slice/app.scope/cgroup.procs", "123\n456\n789\n");
  try {
    write_dmem_max(123, "drm/0000:03:00.0/vram0", 1, t.cgroup, t.proc);
    FAIL("a shared cgroup got a limit");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::not_permitted);
    CHECK(std::string(e.what()).find("holds 2 other process(es)") != std::string::npos);
  }
  CHECK(dmem_slurp(t.cgroup + "/cupool.slice/app.scope/dmem.max") == "drm/0000:03:00.0/vram0 2147483648\n");
}

TEST_CASE("dmem: what write_dmem_max says when it can't") {
  DmemTree t;
  const auto message = [&t](pid_t pid) {
    try {
      write_dmem_max(pid, "drm/0000:03:00.0/vram0", 1, t.cgroup, t.proc);
    } catch (const Error& e) {
      return std::string(e.what()) + " [" + std::to_string(static_cast<int>(e.code())) + "]";
    }
    return std::string("no error");
  };
  // No such process.
  CHECK(message(9) == "can't read " + t.proc + "/9/cgroup (no process 9?): No such file or directory [" +
                          std::to_string(static_cast<int>(Errc::not_found)) + "]");
  // Only cgroup v1 lines.
  dmem_put(t.proc + "/10/cgroup", "12:memory:/x\n");
  CHECK(message(10).find("has no cgroup v2 line") != std::string::npos);
  // The root cgroup.
  dmem_put(t.proc + "/11/cgroup", "0::/\n");
  CHECK(message(11).find("in the root cgroup") != std::string::npos);
  // A cgroup without dmem.max: the controller is not enabled for it.
  dmem_put(t.proc + "/12/cgroup", "0::/app.scope\n");
  std::filesystem::create_directories(t.cgroup + "/app.scope");
  const std::string no_file = message(12);
  CHECK(no_file.find("can't open " + t.cgroup + "/app.scope/dmem.max: No such file or directory") == 0);
  CHECK(no_file.find("cgroup.subtree_control") != std::string::npos);
  // A dmem.max this user may not write (root may write anything: checked only for others).
  if (::geteuid() != 0) {
    dmem_put(t.cgroup + "/app.scope/dmem.max", "");
    ::chmod((t.cgroup + "/app.scope/dmem.max").c_str(), 0444);
    CHECK(message(12).find("Permission denied [" + std::to_string(static_cast<int>(Errc::not_permitted)) + "]") !=
          std::string::npos);
  }
}
