// The real backend, PoolExport and PoolImport: pool memory shared between the holder and its clients.
#include "device/cuda/sharing.h"

namespace cupool::cuda {

int CudaSharing::export_pool_fd(PoolHandle handle) {
  Pool& pool = d_.find(handle);
  ContextScope scope(api_, d_.context(pool.device));
  int fd = -1;
  check(api_.cuMemPoolExportToShareableHandle(&fd, pool.pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemPoolExportToShareableHandle");
  pool.exported = true;
  return fd;
}

SharedAllocation CudaSharing::allocate_shared(PoolHandle handle, std::uint64_t bytes, Readiness readiness) {
  Pool& pool = d_.find(handle);
  ContextScope scope(api_, d_.context(pool.device));
  // cuMemPoolExportPointer works only on a pool that has been shared (measured on driver 580:
  // CUDA_ERROR_INVALID_VALUE before the pool's first cuMemPoolExportToShareableHandle).
  if (!pool.exported) {
    int fd = -1;
    check(api_.cuMemPoolExportToShareableHandle(&fd, pool.pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemPoolExportToShareableHandle");
    ::close(fd);
    pool.exported = true;
  }
  CUstream stream = d_.device_stream(pool.device);
  CUevent event = d_.ready(pool.device);
  CUdeviceptr ptr = 0;
  check(api_.cuMemAllocFromPoolAsync(&ptr, static_cast<size_t>(bytes), pool.pool, stream), "cuMemAllocFromPoolAsync");
  // From here on a failure gives the allocation back (stream-ordered) before it throws.
  const bool wait = readiness == Readiness::synchronized;
  CUresult r = wait ? api_.cuStreamSynchronize(stream) : api_.cuEventRecord(event, stream);
  const char* failed_api = wait ? "cuStreamSynchronize" : "cuEventRecord";
  CUmemPoolPtrExportData data;
  std::memset(&data, 0, sizeof data);
  if (r == CUDA_SUCCESS) {
    r = api_.cuMemPoolExportPointer(&data, ptr);
    failed_api = "cuMemPoolExportPointer";
  }
  if (r != CUDA_SUCCESS) {
    api_.cuMemFreeAsync(ptr, stream);
    check(r, failed_api);
  }
  pool.shared.insert(ptr);
  SharedAllocation shared;
  shared.address = ptr;
  static_assert(sizeof data == std::tuple_size<Blob64>::value, "CUmemPoolPtrExportData is 64 bytes");
  std::memcpy(shared.export_data.data(), &data, sizeof data);
  return shared;
}

Blob64 CudaSharing::ready_event(int ordinal) {
  ContextScope scope(api_, d_.context(ordinal));
  CUevent event = d_.ready(ordinal);
  Driver::DeviceState& state = d_.device_state(ordinal);
  if (!state.event_handle) {
    CUipcEventHandle handle;
    std::memset(&handle, 0, sizeof handle);
    check(api_.cuIpcGetEventHandle(&handle, event), "cuIpcGetEventHandle");
    static_assert(sizeof handle == std::tuple_size<Blob64>::value, "CUipcEventHandle is 64 bytes");
    Blob64 bytes{};
    std::memcpy(bytes.data(), &handle, sizeof handle);
    state.event_handle = bytes;
  }
  return *state.event_handle;
}

void CudaSharing::free_shared(PoolHandle handle, std::uint64_t address) {
  Pool& pool = d_.find(handle);
  auto it = pool.shared.find(static_cast<CUdeviceptr>(address));
  if (it == pool.shared.end())
    throw CudaError("cuMemFreeAsync", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                    "not a shared allocation of this pool");
  ContextScope scope(api_, d_.context(pool.device));
  check(api_.cuMemFreeAsync(*it, d_.device_stream(pool.device)), "cuMemFreeAsync");
  pool.shared.erase(it);
}

void CudaSharing::synchronize(int ordinal) {
  CUstream stream = d_.stream_or_null(ordinal);
  if (!stream) return;  // nothing was ever ordered on it
  ContextScope scope(api_, d_.context(ordinal));
  check(api_.cuStreamSynchronize(stream), "cuStreamSynchronize");
}

PoolHandle CudaSharing::import_pool_fd(int ordinal, int fd) {
  ContextScope scope(api_, d_.context(ordinal));
  CUmemoryPool pool = nullptr;
  // The posix_fd handle is the fd itself, passed by value in the pointer argument.
  void* shareable = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd));
  check(api_.cuMemPoolImportFromShareableHandle(&pool, shareable, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemPoolImportFromShareableHandle");
  return d_.add_pool(pool, ordinal, true);
}

std::uint64_t CudaSharing::import_pointer(PoolHandle handle, const Blob64& export_data) {
  Pool& pool = d_.find(handle);
  ContextScope scope(api_, d_.context(pool.device));
  CUmemPoolPtrExportData data;
  static_assert(sizeof data == std::tuple_size<Blob64>::value, "CUmemPoolPtrExportData is 64 bytes");
  std::memcpy(&data, export_data.data(), sizeof data);
  CUdeviceptr ptr = 0;
  check(api_.cuMemPoolImportPointer(&ptr, pool.pool, &data), "cuMemPoolImportPointer");
  pool.imported_pointers.insert(ptr);
  return ptr;
}

void CudaSharing::wait_ready(int ordinal, const Blob64& event) {
  ContextScope scope(api_, d_.context(ordinal));
  auto it = d_.opened_events().find(event);
  if (it == d_.opened_events().end()) {
    CUipcEventHandle handle;
    static_assert(sizeof handle == std::tuple_size<Blob64>::value, "CUipcEventHandle is 64 bytes");
    std::memcpy(&handle, event.data(), sizeof handle);
    CUevent opened = nullptr;
    check(api_.cuIpcOpenEventHandle(&opened, handle), "cuIpcOpenEventHandle");
    it = d_.opened_events().emplace(event, Driver::OpenedEvent{opened, ordinal}).first;
  }
  check(api_.cuEventSynchronize(it->second.event), "cuEventSynchronize");
}

void CudaSharing::free_imported(PoolHandle handle, std::uint64_t address) {
  Pool& pool = d_.find(handle);
  auto it = pool.imported_pointers.find(static_cast<CUdeviceptr>(address));
  if (it == pool.imported_pointers.end())
    throw CudaError("cuMemFreeAsync", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                    "not an imported pointer of this pool");
  ContextScope scope(api_, d_.context(pool.device));
  // cuMemFree, not cuMemFreeAsync on our stream + cuStreamSynchronize: neither waits for the
  // caller's own streams (its work on the lease must be done; client.h says so), and on the
  // H100 cuMemFree took 1-3 us instead of 49-940 us and made the next import of the block
  // 1-4 us instead of 74-1288 us (tests/gpu/RESULTS.md, 2026-11-23 17:42 and 17:45).
  check(api_.cuMemFree(*it), "cuMemFree");
  pool.imported_pointers.erase(it);
}

}  // namespace cupool::cuda
