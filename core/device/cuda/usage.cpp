// The real backend, DeviceUsage: what NVML says of a device's memory and the processes using it.
#include "device/cuda/usage.h"

namespace cupool::cuda {

DeviceUsageReport CudaDeviceUsage::device_usage(int ordinal) {
  DeviceUsageReport report;
  const std::string uuid = d_.uuid(ordinal);  // throws only for an ordinal the driver does not know
  const auto unavailable = [&report](std::string why) {
    report.source = "unavailable";
    report.note = std::move(why);
    return report;
  };
  if (!d_.nvml_ready()) return unavailable(d_.nvml_why());
  const NvmlApi& nvml = d_.nvml();
  NvmlDevice handle = nullptr;
  if (const int r = nvml.by_uuid(uuid.c_str(), &handle); r != kNvmlSuccess)
    return unavailable("nvmlDeviceGetHandleByUUID(" + uuid + ") failed: " + d_.nvml_error(r));
  NvmlMemoryV2 memory{};
  memory.version = kNvmlMemoryV2;
  if (nvml.memory_v2) {
    if (const int r = nvml.memory_v2(handle, &memory); r != kNvmlSuccess)
      return unavailable("nvmlDeviceGetMemoryInfo_v2 failed: " + d_.nvml_error(r));
  } else {
    NvmlMemory v1{};
    if (const int r = nvml.memory(handle, &v1); r != kNvmlSuccess)
      return unavailable("nvmlDeviceGetMemoryInfo failed: " + d_.nvml_error(r));
    memory = NvmlMemoryV2{kNvmlMemoryV2, v1.total, 0, v1.free, v1.used};
  }
  report.source = "nvml";
  report.total_bytes = memory.total;
  report.reserved_bytes = memory.reserved;
  report.free_bytes = memory.free;
  report.used_bytes = memory.used;
  if (!nvml.compute_processes) {
    report.note = "this NVML has no process lists (nvmlDeviceGetComputeRunningProcesses_v2 or _v3)";
    return report;
  }
  int r = read_processes(nvml.compute_processes, handle, report.processes);
  if (r == kNvmlSuccess && nvml.graphics_processes)
    r = read_processes(nvml.graphics_processes, handle, report.processes);
  report.processes_listed = r == kNvmlSuccess;
  if (!report.processes_listed) {
    report.processes.clear();
    report.note = "NVML did not list the device's processes: " + d_.nvml_error(r);
  }
  return report;
}

int CudaDeviceUsage::read_processes(NvmlProcessList list, NvmlDevice device, std::vector<GpuProcess>& into) {
  // Asked with no room first: NVML answers SUCCESS (none) or INSUFFICIENT_SIZE with how many there
  // are. Processes may start between two calls, so each retry has room for a few more, four at most.
  const std::size_t stride = d_.nvml().process_stride;
  std::vector<unsigned char> entries;
  unsigned count = 0;
  int r = list(device, &count, nullptr);
  for (int attempt = 0; r == kNvmlErrorInsufficientSize && attempt < 4; ++attempt) {
    count += 8;
    entries.assign(std::size_t{count} * stride, 0);
    r = list(device, &count, entries.data());
  }
  if (r != kNvmlSuccess) return r;
  for (unsigned i = 0; i < count && (std::size_t{i} + 1) * stride <= entries.size(); ++i) {
    NvmlProcessInfo info{};
    std::memcpy(&info, entries.data() + std::size_t{i} * stride, sizeof info);
    const auto same = [&info](const GpuProcess& p) { return p.pid == info.pid; };
    if (std::any_of(into.begin(), into.end(), same)) continue;
    GpuProcess p;
    p.pid = info.pid;
    if (info.used_gpu_memory != kNvmlValueNotAvailable) p.used_bytes = info.used_gpu_memory;
    into.push_back(p);
  }
  return kNvmlSuccess;
}

}  // namespace cupool::cuda
