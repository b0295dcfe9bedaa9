// The real backend, ExportedMemory: held buffers as exported VMM allocations (cuMemCreate and a POSIX fd).
#include "device/cuda/exported.h"

namespace cupool::cuda {

std::uint64_t CudaExportedMemory::allocation_granularity(int ordinal) {
  CUmemAllocationProp prop = exported_prop(ordinal);
  size_t granularity = 0;
  check(api_.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");
  return granularity;
}

ExportedAllocation CudaExportedMemory::create_exported(int ordinal, std::uint64_t bytes) {
  ContextScope scope(api_, d_.context(ordinal));
  const std::uint64_t granularity = allocation_granularity(ordinal);
  if (bytes == 0 || bytes > UINT64_MAX - granularity)
    throw CudaError("cuMemCreate", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "no size to allocate");
  const std::uint64_t size = (bytes + granularity - 1) / granularity * granularity;
  CUmemAllocationProp prop = exported_prop(ordinal);
  CUmemGenericAllocationHandle handle = 0;
  check(api_.cuMemCreate(&handle, static_cast<size_t>(size), &prop, 0), "cuMemCreate");
  // The mapping (and the descriptor) keep the memory; the handle is released on every path.
  struct Release {
    const DriverApi& api;
    CUmemGenericAllocationHandle handle;
    ~Release() { api.cuMemRelease(handle); }
  } release{api_, handle};
  int fd = -1;
  check(api_.cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle");
  try {
    const std::uint64_t address = map_handle(ordinal, handle, size, {});
    return {address, size, fd};
  } catch (...) {
    ::close(fd);
    throw;
  }
}

std::uint64_t CudaExportedMemory::map_exported(int ordinal, int fd, std::uint64_t size, const std::vector<int>& peers) {
  // The mapping is the process's, not a context's: a process that works on a peer device maps
  // in that device's context instead of creating one on the holder's device (on 2x H100 that
  // context cost a peer's first mapping of a held set ~150 ms).
  const int in = peers.empty() ? ordinal : peers.front();
  ContextScope scope(api_, d_.context(in));
  const Imported imported = import_exported(fd);
  const CUmemGenericAllocationHandle handle = imported.handle;
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof prop);
  check(api_.cuMemGetAllocationPropertiesFromHandle(&prop, handle), "cuMemGetAllocationPropertiesFromHandle");
  if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != ordinal)
    throw CudaError("cuMemGetAllocationPropertiesFromHandle", CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE",
                    "the allocation is on device " + std::to_string(prop.location.id) + ", not on device " +
                        std::to_string(ordinal));
  const std::uint64_t address = map_handle(ordinal, handle, size, peers);
  d_.mappings()[address].device = in;  // unmapped in the same context
  return address;
}

void CudaExportedMemory::grant_exported_access(std::uint64_t address, int peer) {
  auto it = d_.mappings().find(address);
  if (it == d_.mappings().end())
    throw CudaError("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                    "not an exported allocation mapped by this process");
  ContextScope scope(api_, d_.context(it->second.device));
  const CUmemAccessDesc desc = access_desc(peer);
  check(api_.cuMemSetAccess(static_cast<CUdeviceptr>(address), static_cast<size_t>(it->second.size), &desc, 1),
        "cuMemSetAccess");
}

void CudaExportedMemory::unmap_exported(std::uint64_t address) {
  auto it = d_.mappings().find(address);
  if (it == d_.mappings().end())
    throw CudaError("cuMemUnmap", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                    "not an exported allocation mapped by this process");
  ContextScope scope(api_, d_.context(it->second.device));
  const std::uint64_t size = it->second.size;
  d_.mappings().erase(it);
  check(api_.cuMemUnmap(static_cast<CUdeviceptr>(address), static_cast<size_t>(size)), "cuMemUnmap");
  check(api_.cuMemAddressFree(static_cast<CUdeviceptr>(address), static_cast<size_t>(size)), "cuMemAddressFree");
}

CUmemAllocationProp CudaExportedMemory::exported_prop(int ordinal) {
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

CUmemAccessDesc CudaExportedMemory::access_desc(int ordinal) {
  CUmemAccessDesc desc;
  std::memset(&desc, 0, sizeof desc);
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = ordinal;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return desc;
}

Imported CudaExportedMemory::import_exported(int fd) {
  CUmemGenericAllocationHandle handle = 0;
  // The posix_fd handle is the fd itself, passed by value in the pointer argument.
  void* shareable = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd));
  check(api_.cuMemImportFromShareableHandle(&handle, shareable, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuMemImportFromShareableHandle");
  return Imported{api_, handle};
}

std::uint64_t CudaExportedMemory::map_handle(int ordinal, CUmemGenericAllocationHandle handle, std::uint64_t size,
                                             const std::vector<int>& peers) {
  CUdeviceptr ptr = 0;
  check(api_.cuMemAddressReserve(&ptr, static_cast<size_t>(size), 0, 0, 0), "cuMemAddressReserve");
  bool mapped = false;
  try {
    check(api_.cuMemMap(ptr, static_cast<size_t>(size), 0, handle, 0), "cuMemMap");
    mapped = true;
    std::vector<CUmemAccessDesc> access{access_desc(ordinal)};
    for (int peer : peers)
      if (peer != ordinal) access.push_back(access_desc(peer));
    check(api_.cuMemSetAccess(ptr, static_cast<size_t>(size), access.data(), access.size()), "cuMemSetAccess");
  } catch (...) {
    if (mapped) api_.cuMemUnmap(ptr, static_cast<size_t>(size));
    api_.cuMemAddressFree(ptr, static_cast<size_t>(size));
    throw;
  }
  d_.mappings()[ptr] = Driver::Mapping{ordinal, size};
  return ptr;
}

}  // namespace cupool::cuda
