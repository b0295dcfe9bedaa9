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

model::QueryFailure query_failure(NodeQuery& backend, const QueryOptions& options, const Error& why) {
  NodeReport known;
  known.source = backend.source();
  known.built_with_cuda = built_with_cuda_version();
  known.host_numa_nodes = backend.host_numa_nodes();
  known.deep = options.deep;
  if (options.cgroup_root) known.dmem = dmem_support(*options.cgroup_root);
  model::NodeFacts facts = facts_of(known);
  model::QueryFailure out;
  out.source = std::move(facts.source);
  out.built_with_cuda = std::move(facts.built_with_cuda);
  out.numa_nodes = std::move(facts.numa_nodes);
  out.deep = facts.deep;
  out.dmem = std::move(facts.dmem);
  out.error = model::ErrorInfo{why.wire_code(), why.what(), {}, {}};
  return out;
}

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

  if (options.cgroup_root) report.dmem = dmem_support(*options.cgroup_root);
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

}  // namespace cupool
