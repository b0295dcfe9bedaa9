// The real backend, NodeQuery: the driver, the devices and what they support (export probes, GPUDirect Storage).
#include "device/cuda/driver.h"

namespace cupool::cuda {

ReportSource CudaBackend::source() const {
  ReportSource s;
  s.description = "CUDA driver (libcuda.so.1)";
  return s;
}

int CudaBackend::driver_version() {
  int v = 0;
  check(api_.cuDriverGetVersion(&v), "cuDriverGetVersion");
  return v;
}

std::string CudaBackend::kernel_driver_version() {
  if (nvml_ready() && nvml_.driver_version) {
    char buf[96] = {0};
    if (nvml_.driver_version(buf, sizeof buf) == 0) return buf;
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

int CudaBackend::device_count() {
  int n = 0;
  check(api_.cuDeviceGetCount(&n), "cuDeviceGetCount");
  return n;
}

DeviceInfo CudaBackend::device_info(int ordinal) {
  const CUdevice dev = device(ordinal);
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

std::optional<MemoryInfo> CudaBackend::memory_info(int ordinal) {
  if (!nvml_ready()) return std::nullopt;
  const std::string uuid = device_info_uuid(ordinal);
  NvmlDevice handle = nullptr;
  if (nvml_.by_uuid(uuid.c_str(), &handle) != 0) return std::nullopt;
  NvmlMemory mem{};
  if (nvml_.memory(handle, &mem) != 0) return std::nullopt;
  return MemoryInfo{mem.free, mem.total};
}

bool CudaBackend::can_access_peer(int device_ordinal, int peer_ordinal) {
  if (device_ordinal == peer_ordinal) return true;
  int can = 0;
  check(api_.cuDeviceCanAccessPeer(&can, device(device_ordinal), device(peer_ordinal)), "cuDeviceCanAccessPeer");
  return can != 0;
}

std::vector<int> CudaBackend::host_numa_nodes() {
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

GdsReport CudaBackend::gds_report() {
  // cuFile's driver wants a CUDA context on the calling thread: device 0's primary context,
  // retained for the probe only (like the export probes), so none stays active after it.
  if (device_count() == 0) return probe_gds();
  PrimaryContext ctx(api_, device(0));
  return probe_gds();
}

ExportProbe CudaBackend::probe_export(int ordinal, HandleType type) {
  ExportProbe probe;
  probe.handle_type = type;
  const char* type_name = handle_type_name(type);
  const CUdevice dev = device(ordinal);
  debug(type_name, ordinal, "cuDevicePrimaryCtxRetain");
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
  debug(type_name, ordinal, "cuMemPoolCreate");
  r = api_.cuMemPoolCreate(&pool, &props);
  if (r != CUDA_SUCCESS) return failed(probe, "cuMemPoolCreate", r);
  PoolGuard guard(api_, pool);

  // Export first: an IPC pool that can't be exported is the finding that matters.
  if (type == HandleType::posix_fd) {
    int fd = -1;
    debug(type_name, ordinal, "cuMemPoolExportToShareableHandle");
    r = api_.cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (fd >= 0 && r == CUDA_SUCCESS) ::close(fd);
    if (r != CUDA_SUCCESS) return failed(probe, "cuMemPoolExportToShareableHandle", r);
  } else if (type == HandleType::fabric) {
    CUmemFabricHandle handle;
    std::memset(&handle, 0, sizeof handle);
    debug(type_name, ordinal, "cuMemPoolExportToShareableHandle");
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
  debug(type_name, ordinal, "cuMemAllocFromPoolAsync");
  r = api_.cuMemAllocFromPoolAsync(&ptr, 2u << 20, pool, nullptr);
  if (r != CUDA_SUCCESS) return failed(probe, "cuMemAllocFromPoolAsync", r);
  debug(type_name, ordinal, "cuMemFreeAsync + cuStreamSynchronize");
  r = api_.cuMemFreeAsync(ptr, nullptr);
  if (r == CUDA_SUCCESS) r = api_.cuStreamSynchronize(nullptr);
  if (r != CUDA_SUCCESS) return failed(probe, "cuMemFreeAsync", r);
  debug(type_name, ordinal, "ok");
  probe.ok = true;
  return probe;
}

}  // namespace cupool::cuda
