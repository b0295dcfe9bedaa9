#include "cli/query_table.h"

#include <sstream>

#include "base/output.h"
#include "base/text.h"
#include "base/units.h"
#include "device/backend.h"
#include "device/query.h"

namespace cupool {

namespace query_table {

const char* yes_no(bool b) { return b ? "yes" : "no"; }

// Whether the kernel can limit a cgroup's GPU memory, and the regions it can limit.
std::string dmem_line(const DmemSupport& dmem, const NodeReport& report) {
  std::string line = "GPU memory limits (dmem cgroup) ";
  if (!dmem.available()) {
    line += "no: " + dmem.why;
  } else {
    std::vector<std::string> regions;
    for (const DmemRegion& r : dmem.regions) {
      std::string text = r.name + " (" + format_bytes(r.capacity_bytes);
      if (const auto ordinal = dmem_device(r, report)) text += ", GPU " + std::to_string(*ordinal);
      regions.push_back(text + ")");
    }
    line += "yes: " + join(regions, ", ");
  }
  if (report.source.simulated) line += " [this host's kernel, not the profile's]";
  return line;
}

}  // namespace query_table
using query_table::dmem_line;
using query_table::yes_no;

std::string render_report_table(const NodeReport& report) {
  std::ostringstream out;
  if (report.source.simulated) {
    out << "Simulated node from " << report.source.profile_path;
    if (report.source.synthetic)
      out << " (synthetic profile, not recorded on a real machine)";
    else if (!report.source.recorded.empty())
      out << " (recorded " << report.source.recorded
          << (report.source.recorded_host.empty() ? "" : " on " + report.source.recorded_host) << ")";
    out << "\n";
  }
  out << "Driver:  CUDA " << cuda_version_string(report.driver_version);
  if (!report.kernel_driver_version.empty()) out << " (kernel module " << report.kernel_driver_version << ")";
  out << "\ncupool:  built with CUDA " << cuda_version_string(report.built_with_cuda) << "\n";
  out << "Host:    NUMA nodes ";
  if (report.host_numa_nodes.empty()) {
    out << "none";
  } else {
    std::vector<std::string> ids;
    for (int id : report.host_numa_nodes) ids.push_back(std::to_string(id));
    out << join(ids, ", ");
  }
  out << "\n";
  if (report.dmem) out << "Kernel:  " << dmem_line(*report.dmem, report) << "\n";

  for (const auto& d : report.devices) {
    const DeviceInfo& i = d.info;
    out << "\nGPU " << i.ordinal << ": " << i.name << "\n";
    Table t({"", ""});
    t.add({"uuid", i.uuid});
    t.add({"pci bus id", i.pci_bus_id});
    std::string memory = format_bytes(i.total_memory);
    if (d.memory) memory += " (" + format_bytes(d.memory->free) + " free)";
    t.add({"memory", memory});
    t.add({"compute capability", std::to_string(i.cc_major) + "." + std::to_string(i.cc_minor)});
    t.add({"memory pools", yes_no(i.memory_pools)});
    const auto types = handle_type_names(i.pool_handle_types);
    t.add({"pool handle types", types.empty() ? "none" : join(types, ", ")});
    t.add({"fabric handles", yes_no(i.fabric_handle)});
    t.add({"host pools", yes_no(i.host_memory_pools)});
    t.add(
        {"host NUMA pools", std::string(yes_no(i.host_numa_memory_pools)) +
                                (i.host_numa_id >= 0 ? " (nearest node " + std::to_string(i.host_numa_id) + ")" : "")});
    t.add({"managed memory", std::string(yes_no(i.managed_memory)) +
                                 (i.concurrent_managed_access ? ", concurrent access" : ", no concurrent access")});
    t.add({"managed pools", yes_no(report.managed_pools_supported(i.ordinal))});
    t.add({"virtual memory mgmt", yes_no(i.vmm)});
    t.add({"IPC events", yes_no(i.ipc_events)});
    t.add({"GPUDirect RDMA", yes_no(i.gpu_direct_rdma)});
    for (const auto& p : d.probes) {
      std::string outcome = p.ok ? "ok" : "FAILED: " + p.error + " in " + p.api + ": " + p.reason;
      t.add({std::string("pool export ") + handle_type_name(p.handle_type), outcome});
    }
    // Skip the blank header row.
    std::string body = t.str("  ");
    out << body.substr(body.find('\n') + 1);
  }

  if (report.devices.size() > 1) {
    out << "\nPeer access (row can access column's memory):\n";
    std::vector<std::string> header{""};
    for (const auto& d : report.devices) header.push_back("GPU" + std::to_string(d.info.ordinal));
    Table t(header);
    for (std::size_t r = 0; r < report.devices.size(); ++r) {
      std::vector<std::string> cells{"GPU" + std::to_string(report.devices[r].info.ordinal)};
      for (std::size_t c = 0; c < report.devices.size(); ++c)
        cells.push_back(r == c ? "-" : report.peer_access[r][c] ? "yes" : "no");
      t.add(cells);
    }
    out << t.str("  ");
  }
  if (report.gds) {
    const GdsReport& g = *report.gds;
    const std::string cufile = g.library_version ? "cuFile " + *g.library_version : "cuFile";
    out << "\nGPUDirect Storage: ";
    switch (g.mode) {
      case GdsReport::Mode::gpudirect:
        out << "yes (" << cufile << ", nvidia-fs " << g.nvidia_fs_version.value_or("?")
            << (g.file_systems.empty() ? "" : "; reads " + join(g.file_systems, ", ") + " directly") << ")\n";
        break;
      case GdsReport::Mode::compatibility:
        out << "compatibility mode only (" << cufile << "): " << g.reason << "\n";
        break;
      case GdsReport::Mode::unavailable: out << "no: " << g.reason << "\n"; break;
    }
  }
  return out.str();
}

}  // namespace cupool
