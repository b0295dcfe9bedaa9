// The kernel's dmem cgroup controller (cgroup v2, Linux 6.14+): device memory that GPU drivers
// register as regions, and a cgroup's limit on each (dmem.max). What `query` reports about this
// host's kernel, and how the holder puts a limit on a process.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cupool {

// A region a driver registered, as the root cgroup's dmem.capacity lists it.
struct DmemRegion {
  std::string name;                       // "drm/0000:03:00.0/vram0"
  std::uint64_t capacity_bytes = 0;       // its size, in bytes
  std::optional<std::string> pci_bus_id;  // "0000:03:00.0", read out of a drm/<pci>/... name
};

// Whether the kernel can limit a cgroup's device memory.
struct DmemSupport {
  bool cgroup_v2 = false;           // cgroup v2 is mounted at the root asked (cgroup.controllers)
  bool controller = false;          // "dmem" is in its cgroup.controllers
  std::vector<DmemRegion> regions;  // from its dmem.capacity
  std::string why;                  // why a limit can't be set, in words; "" when one can
  bool available() const noexcept { return why.empty(); }
};

// Reads the cgroup v2 hierarchy mounted at `cgroup_root` (its root cgroup's files); never throws.
DmemSupport dmem_support(const std::string& cgroup_root = "/sys/fs/cgroup");

// Limits process `pid`'s cgroup (the `0::/path` line of PROC_ROOT/PID/cgroup) to `bytes` of
// `region`: writes "REGION BYTES" to that cgroup's dmem.max, only where the cgroup holds that
// process alone (its cgroup.procs): a limit binds every process of the cgroup. Throws cupool::Error naming the file
// and what the system said (not_found: no such process, no cgroup v2 entry, or no dmem.max there;
// not_permitted: EACCES/EPERM; invalid_input: a region the kernel does not know).
void write_dmem_max(pid_t pid, const std::string& region, std::uint64_t bytes,
                    const std::string& cgroup_root = "/sys/fs/cgroup", const std::string& proc_root = "/proc");

}  // namespace cupool
