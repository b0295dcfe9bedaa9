// The real backend, NodeQuery: the driver, the devices and what they support (export probes, GPUDirect Storage).
#include "device/cuda/node.h"

#include "device/fingerprint.h"

namespace cupool::cuda {

ReportSource CudaNodeQuery::source() const {
  ReportSource s;
  s.description = "CUDA driver (libcuda.so.1)";
  return s;
}

void CudaNodeQuery::init() { d_.init(); }

std::string CudaNodeQuery::fingerprint() { return this_node_fingerprint(); }

int CudaNodeQuery::driver_version() {
  int v = 0;
  check(api_.cuDriverGetVersion(&v), "cuDriverGetVersion");
  return v;
}

std::string CudaNodeQuery::kernel_driver_version() {
  if (d_.nvml_ready() && d_.nvml().driver_version) {
    char buf[96] = {0};
    if (d_.nvml().driver_version(buf, sizeof buf) == 0) return buf;
  }
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu ..."
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (std::getline(in, line)) {
    std::istringstream words(line);
    std::string w;
    while (words >> w)
      if (!w.empty() && std::isdigit(static_cast<unsigned char>(w[0])) && w.find('.') != std::string::npos) return w;
  }
  return "";
}

int CudaNodeQuery::device_count() {
  int n = 0;
  check(api_.cuDeviceGetCount(&n), "cuDeviceGetCount");
  return n;
}

DeviceInfo CudaNodeQuery::device_info(int ordinal) {
  const CUdevice dev = d_.device(ordinal);
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {0};
  check(api_.cuDeviceGetName(name, sizeof name - 1, dev), "cuDeviceGetName");
  info.name = name;
  CUuuid uuid;
  check(api_.cuDeviceGetUuid(&uuid, dev), "cuDeviceGetUuid");
  info.uuid = format_uuid(uuid);
  char bus[64] = {0};
  check(api_.cuDeviceGetPCIBusId(bus, sizeof bus - 1, dev), "cuDeviceGetPCIBusId");
  info.pci_bus_id = bus;
  for (auto& c : info.pci_bus_id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t total = 0;
  check(api_.cuDeviceTotalMem(&total, dev), "cuDeviceTotalMem");
  info.total_memory = total;
  info.cc_major = attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  info.cc_minor = attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  info.memory_pools = attribute(dev, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) != 0;
  info.pool_handle_types =
      info.memory_pools ? static_cast<std::uint32_t>(attribute(dev, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES))
                        : 0u;
  info.fabric_handle = attribute_or_zero(dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED) != 0;
  info.host_memory_pools = attribute_or_zero(dev, CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED) != 0;
  info.host_numa_memory_pools = attribute_or_zero(dev, CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED) != 0;
  info.host_numa_id = attribute_or(dev, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, -1);
  info.managed_memory = attribute(dev, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY) != 0;
  info.concurrent_managed_access = attribute(dev, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS) != 0;
  info.pageable_memory_access = attribute(dev, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS) != 0;
  info.vmm = attribute_or_zero(dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0;
  info.ipc_events = attribute_or_zero(dev, CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED) != 0;
  info.gpu_direct_rdma = attribute_or_zero(dev, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED) != 0;
  return info;
}

std::optional<MemoryInfo> CudaNodeQuery::memory_info(int ordinal) {
  if (!d_.nvml_ready()) return std::nullopt;
  const std::string uuid = d_.uuid(ordinal);
  NvmlDevice handle = nullptr;
  if (d_.nvml().by_uuid(uuid.c_str(), &handle) != 0) return std::nullopt;
  NvmlMemory mem{};
  if (d_.nvml().memory(handle, &mem) != 0) return std::nullopt;
  return MemoryInfo{mem.free, mem.total};
}

bool CudaNodeQuery::can_access_peer(int device_ordinal, int peer_ordinal) {
  if (device_ordinal == peer_ordinal) return true;
  int can = 0;
  check(api_.cuDeviceCanAccessPeer(&can, d_.device(device_ordinal), d_.device(peer_ordinal)), "cuDeviceCanAccessPeer");
  return can != 0;
}

std::vector<int> CudaNodeQuery::host_numa_nodes() {
  // "0-1,3" in /sys/devices/system/node/online; absent on hosts without NUMA.
  std::ifstream in("/sys/devices/system/node/online");
  std::string text;
  std::vector<int> nodes;
  if (!std::getline(in, text)) return nodes;
  std::istringstream ranges(text);
  std::string range;
  while (std::getline(ranges, range, ',')) {
    int lo = 0, hi = 0;
    if (std::sscanf(range.c_str(), "%d-%d", &lo, &hi) == 2) {
      for (int n = lo; n <= hi; ++n) nodes.push_back(n);
    } else if (std::sscanf(range.c_str(), "%d", &lo) == 1) {
      nodes.push_back(lo);
    }
  }
  return nodes;
}

GdsReport CudaNodeQuery::gds_report() {
  // cuFile's driver wants a CUDA context on the calling thread: device 0's primary context,
  // retained for the probe only (like the export probes), so none stays active after it.
  if (device_count() == 0) return probe_gds();
  PrimaryContext ctx(api_, d_.device(0));
  return probe_gds();
}

ExportProbe CudaNodeQuery::probe_export(int ordinal, HandleType type) {
  ExportProbe probe;
  probe.handle_type = type;
  const char* type_name = handle_type_name(type);
  const CUdevice dev = d_.device(ordinal);
  d_.debug(type_name, ordinal, "cuDevicePrimaryCtxRetain");
  PrimaryContext ctx(api_, dev);
  CUresult r = ctx.result();
  if (r != CUDA_SUCCESS) return failed(probe, "cuDevicePrimaryCtxRetain", r);

  CUmemPoolProps props;
  std::memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = static_cast<CUmemAllocationHandleType>(type);
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = ordinal;
  CUmemoryPool pool = nullptr;
  d_.debug(type_name, ordinal, "cuMemPoolCreate");
  r = api_.cuMemPoolCreate(&pool, &props);
  if (r != CUDA_SUCCESS) return failed(probe, "cuMemPoolCreate", r);
  PoolGuard guard(api_, pool);

  // Export first: an IPC pool that can't be exported is the finding that matters.
  if (type == HandleType::posix_fd) {
    int fd = -1;
    d_.debug(type_name, ordinal, "cuMemPoolExportToShareableHandle");
    r = api_.cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (fd >= 0 && r == CUDA_SUCCESS) ::close(fd);
    if (r != CUDA_SUCCESS) return failed(probe, "cuMemPoolExportToShareableHandle", r);
  } else if (type == HandleType::fabric) {
    CUmemFabricHandle handle;
    std::memset(&handle, 0, sizeof handle);
    d_.debug(type_name, ordinal, "cuMemPoolExportToShareableHandle");
    r = api_.cuMemPoolExportToShareableHandle(&handle, pool, CU_MEM_HANDLE_TYPE_FABRIC, 0);
    if (r != CUDA_SUCCESS) {
      // Measured on driver 580.159.04 (H100): cuMemPoolDestroy crashes inside libcuda on a fabric
      // pool whose export failed. The empty pool is left to process exit instead.
      guard.leak();
      return failed(probe, "cuMemPoolExportToShareableHandle", r);
    }
  }

  // A small allocation proves the pool serves memory, not only that it was created.
  CUdeviceptr ptr = 0;
  d_.debug(type_name, ordinal, "cuMemAllocFromPoolAsync");
  r = api_.cuMemAllocFromPoolAsync(&ptr, 2u << 20, pool, nullptr);
  if (r != CUDA_SUCCESS) return failed(probe, "cuMemAllocFromPoolAsync", r);
  d_.debug(type_name, ordinal, "cuMemFreeAsync + cuStreamSynchronize");
  r = api_.cuMemFreeAsync(ptr, nullptr);
  if (r == CUDA_SUCCESS) r = api_.cuStreamSynchronize(nullptr);
  if (r != CUDA_SUCCESS) return failed(probe, "cuMemFreeAsync", r);
  d_.debug(type_name, ordinal, "ok");
  probe.ok = true;
  return probe;
}

ExportProbe CudaNodeQuery::failed(ExportProbe probe, const char* api, CUresult r) {
  probe.ok = false;
  probe.api = api;
  probe.error = d_.error_name(r);
  probe.description = d_.error_string(r);
  return probe;
}

int CudaNodeQuery::attribute(CUdevice dev, CUdevice_attribute attr) {
  int v = 0;
  check(api_.cuDeviceGetAttribute(&v, attr, dev), "cuDeviceGetAttribute");
  return v;
}

int CudaNodeQuery::attribute_or(CUdevice dev, CUdevice_attribute attr, int fallback) {
  int v = 0;
  const CUresult r = api_.cuDeviceGetAttribute(&v, attr, dev);
  if (r == CUDA_ERROR_INVALID_VALUE) return fallback;
  check(r, "cuDeviceGetAttribute");
  return v;
}

}  // namespace cupool::cuda
