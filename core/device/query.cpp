#include "device/query.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/output.h"
#include "base/text.h"
#include "base/units.h"

namespace cupool {

namespace {

// What the host offers for fabric handles, in words.
std::string imex_state() {
  std::ifstream devices("/proc/devices");
  std::string line;
  bool listed = false;
  while (std::getline(devices, line))
    if (line.find("nvidia-caps-imex-channels") != std::string::npos) listed = true;
  if (!listed)
    return "the driver has no nvidia-caps-imex-channels device (not in /proc/devices), so no IMEX service "
           "runs on this node; fabric handles need IMEX (multi-node NVLink systems)";
  for (int i = 0; i < 8; ++i) {
    const std::string path = "/dev/nvidia-caps-imex-channels/channel" + std::to_string(i);
    if (::access(path.c_str(), R_OK | W_OK) == 0)
      return "IMEX channel " + path + " is accessible, but the driver still refused the export";
  }
  return "no /dev/nvidia-caps-imex-channels/channelN file that this user can open; create one with mknod "
         "(major number from /proc/devices) and grant this user access";
}

}  // namespace

std::string explain_probe(const ExportProbe& probe) {
  const std::string type = handle_type_name(probe.handle_type);
  if (probe.error == "CUDA_ERROR_NOT_PERMITTED") {
    if (probe.handle_type == HandleType::fabric) return "no IMEX channel is reachable: " + imex_state();
    return "the driver does not permit this operation for this process";
  }
  if (probe.error == "CUDA_ERROR_NOT_SUPPORTED")
    return "the driver does not support " + type + " handles for memory pools on this device";
  if (probe.error == "CUDA_ERROR_INVALID_VALUE")
    return "the driver rejected a pool with handle type " + type + " on this device (invalid value)";
  if (probe.error == "CUDA_ERROR_OUT_OF_MEMORY") return "the device has no memory free for a 2 MiB test allocation";
  return probe.description.empty() ? probe.error : probe.description;
}

NodeReport build_report(NodeQuery& backend, const QueryOptions& options) {
  backend.init();
  NodeReport report;
  // A simulated node says which profile it answers from (findings name it).
  report.source = backend.source();
  report.driver_version = backend.driver_version();
  report.kernel_driver_version = backend.kernel_driver_version();
  report.built_with_cuda = built_with_cuda_version();
  report.host_numa_nodes = backend.host_numa_nodes();
  const int count = backend.device_count();
  for (int i = 0; i < count; ++i) {
    DeviceReport d;
    d.info = backend.device_info(i);
    d.memory = backend.memory_info(i);
    report.devices.push_back(std::move(d));
  }
  const auto n = static_cast<std::size_t>(count);
  report.peer_access.assign(n, std::vector<bool>(n, true));
  for (int i = 0; i < count; ++i)
    for (int j = 0; j < count; ++j)
      if (i != j)
        report.peer_access[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = backend.can_access_peer(i, j);

  // Restrict to the selected devices (indexes and the peer matrix stay the node's own).
  if (!options.devices.empty()) {
    std::vector<bool> keep(n, false);
    for (const auto& sel : options.devices) {
      const auto ordinal = resolve_device(report, sel);
      if (!ordinal) {
        throw InputError("--devices: no device '" + sel.text + "' on this node (it has " + std::to_string(count) +
                         (count == 1 ? " device" : " devices") + ")");
      }
      keep[static_cast<std::size_t>(*ordinal)] = true;
    }
    std::vector<DeviceReport> kept;
    std::vector<std::size_t> rows;
    for (auto& d : report.devices) {
      if (!keep[static_cast<std::size_t>(d.info.ordinal)]) continue;
      rows.push_back(static_cast<std::size_t>(d.info.ordinal));
      kept.push_back(std::move(d));
    }
    std::vector<std::vector<bool>> peers;
    for (std::size_t r : rows) {
      std::vector<bool> row;
      for (std::size_t c : rows) row.push_back(report.peer_access[r][c]);
      peers.push_back(row);
    }
    report.devices = std::move(kept);
    report.peer_access = std::move(peers);
  }

  if (options.deep) {
    report.deep = true;
    if (options.gds) report.gds = backend.gds_report();
    for (auto& d : report.devices) {
      if (!d.info.memory_pools) continue;
      for (HandleType type : {HandleType::none, HandleType::posix_fd, HandleType::fabric}) {
        ExportProbe probe = backend.probe_export(d.info.ordinal, type);
        if (!probe.ok && probe.reason.empty()) probe.reason = explain_probe(probe);
        d.probes.push_back(std::move(probe));
      }
    }
  }
  return report;
}

namespace {

const char* yes_no(bool b) { return b ? "yes" : "no"; }

}  // namespace

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
