// The kernel's dmem cgroup controller: what it offers (dmem_support) and a limit set (write_dmem_max).
#include "device/dmem.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/fd.h"
#include "device/node.h"

namespace cupool {

namespace {

// "0000:03:00.0" out of "drm/0000:03:00.0/vram0"; nullopt for a name of another form.
std::optional<std::string> pci_of_region(const std::string& name) {
  if (name.rfind("drm/", 0) != 0) return std::nullopt;
  const std::size_t end = name.find('/', 4);
  if (end == std::string::npos) return std::nullopt;
  return normalize_pci_bus_id(std::string_view(name).substr(4, end - 4));
}

Errc errc_of(int error) {
  switch (error) {
    case ENOENT:
    case ESRCH: return Errc::not_found;
    case EACCES:
    case EPERM:
    case EROFS: return Errc::not_permitted;
    case EINVAL: return Errc::invalid_input;
    default: return Errc::internal;
  }
}

// The cgroup v2 path of a process ("/system.slice/x.service"), from its `0::PATH` line.
std::string cgroup_of(pid_t pid, const std::string& proc_root) {
  const std::string file = proc_root + "/" + std::to_string(pid) + "/cgroup";
  std::ifstream in(file);
  if (!in) {
    const int error = errno;
    throw Error(errc_of(error),
                "can't read " + file + " (no process " + std::to_string(pid) + "?): " + std::strerror(error));
  }
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  throw Error(Errc::not_found, file + " has no cgroup v2 line (0::/path): the process is not in a cgroup v2 hierarchy");
}

}  // namespace

DmemSupport dmem_support(const std::string& cgroup_root) {
  DmemSupport s;
  std::ifstream controllers(cgroup_root + "/cgroup.controllers");
  if (!controllers) {
    s.why = "no cgroup v2 hierarchy at " + cgroup_root + " (no cgroup.controllers there)";
    return s;
  }
  s.cgroup_v2 = true;
  std::string word;
  while (controllers >> word) s.controller = s.controller || word == "dmem";
  if (!s.controller) {
    s.why = "the kernel has no dmem cgroup controller (it needs Linux 6.14 or later built with CONFIG_CGROUP_DMEM)";
    return s;
  }
  std::ifstream capacity(cgroup_root + "/dmem.capacity");
  if (!capacity) {
    s.why = "no dmem.capacity at " + cgroup_root + ": not the root cgroup (a container's cgroup namespace?)";
    return s;
  }
  std::string line;
  while (std::getline(capacity, line)) {
    std::istringstream fields(line);
    DmemRegion r;
    if (!(fields >> r.name >> r.capacity_bytes)) continue;
    r.pci_bus_id = pci_of_region(r.name);
    s.regions.push_back(std::move(r));
  }
  if (s.regions.empty())
    s.why =
        "no GPU driver registered a dmem region (dmem.capacity is empty): the GPU's driver must register its "
        "memory for the kernel to limit it";
  return s;
}

void write_dmem_max(pid_t pid, const std::string& region, std::uint64_t bytes, const std::string& cgroup_root,
                    const std::string& proc_root) {
  const std::string cgroup = cgroup_of(pid, proc_root);
  if (cgroup == "/")
    throw Error(Errc::not_permitted, "process " + std::to_string(pid) +
                                         " is in the root cgroup, which has no dmem.max: move it into a cgroup first");
  // A cgroup's limit binds every process in it: only a cgroup of the process alone gets one.
  {
    std::ifstream procs(cgroup_root + cgroup + "/cgroup.procs");
    std::size_t others = 0;
    std::string line;
    while (std::getline(procs, line))
      if (!line.empty() && line != std::to_string(pid)) ++others;
    if (others)
      throw Error(Errc::not_permitted, "process " + std::to_string(pid) + "'s cgroup " + cgroup + " holds " +
                                           std::to_string(others) +
                                           " other process(es): a limit there would bind them all (run the command "
                                           "in a cgroup of its own, e.g. systemd-run --scope)");
  }
  const std::string file = cgroup_root + cgroup + "/dmem.max";
  const std::string text = region + " " + std::to_string(bytes) + "\n";
  Fd fd(::open(file.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) {
    const int error = errno;
    std::string hint;
    if (error == ENOENT) hint = " (is +dmem in the parent cgroup's cgroup.subtree_control?)";
    throw Error(errc_of(error), "can't open " + file + ": " + std::strerror(error) + hint);
  }
  const ssize_t n = ::write(fd.get(), text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    const int error = n < 0 ? errno : EIO;
    std::string hint;
    if (error == EINVAL) hint = " (does dmem.capacity list the region '" + region + "'?)";
    throw Error(errc_of(error), "can't write '" + region + " " + std::to_string(bytes) + "' to " + file + ": " +
                                    std::strerror(error) + hint);
  }
}

}  // namespace cupool
