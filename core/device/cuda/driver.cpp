// The real backend's shared state (Driver): loading the driver, the helpers its roles share, and teardown.
#include "device/cuda/driver.h"

namespace cupool::cuda {

void Driver::init() {
  if (initialised_) return;
  cuda_ = std::make_unique<Library>("libcuda.so.1");
  if (!cuda_->loaded()) {
    const char* why = dlerror();
    throw NoDriverError(std::string("no NVIDIA driver: libcuda.so.1 could not be loaded (") +
                        (why ? why : "not found") + ")");
  }
#define CUPOOL_LOAD(name)                                                                                     \
  api_.name = reinterpret_cast<decltype(api_.name)>(cuda_->symbol(CUPOOL_STR(name)));                         \
  if (!api_.name)                                                                                             \
    throw NoDriverError(std::string("the NVIDIA driver is too old: libcuda.so.1 lacks ") + CUPOOL_STR(name) + \
                        " (cupool needs a driver for CUDA 11.2 or newer)");
  CUPOOL_DRIVER_FUNCTIONS(CUPOOL_LOAD)
#undef CUPOOL_LOAD
  const CUresult r = api_.cuInit(0);
  if (r == CUDA_ERROR_NO_DEVICE) throw NoDriverError("the NVIDIA driver is loaded but reports no CUDA device");
  if (r != CUDA_SUCCESS) {
    throw NoDriverError("the NVIDIA driver could not be initialised: cuInit failed with " + error_name(r) + " (" +
                        error_string(r) + ")");
  }
  // NVML is loaded when first needed (memory_info, kernel_driver_version): a client that only
  // imports pools never needs it, and its nvmlInit costs a process attaching to the holder.
  initialised_ = true;
}

Driver::~Driver() {
  // Nothing may throw here, and every call's result is ignored. Imported pointers first (an
  // exporter may free its allocations only after every importer has), then this process's own
  // allocations, a synchronize, the pools (their contexts must still be alive), the events, the
  // streams, and last the contexts.
  for (auto& [handle, pool] : pools_) {
    if (pool.imported_pointers.empty()) continue;
    ContextScope scope(api_, context_or_null(pool.device));
    CUstream stream = stream_or_null(pool.device);
    for (CUdeviceptr ptr : pool.imported_pointers) api_.cuMemFreeAsync(ptr, stream);
    api_.cuStreamSynchronize(stream);
  }
  for (auto& [handle, pool] : pools_) {
    ContextScope scope(api_, context_or_null(pool.device));
    for (CUdeviceptr ptr : pool.shared) api_.cuMemFreeAsync(ptr, stream_or_null(pool.device));
    for (CUdeviceptr ptr : pool.allocations) api_.cuMemFreeAsync(ptr, nullptr);
  }
  for (auto& [ordinal, ctx] : contexts_) {
    ContextScope scope(api_, ctx);
    if (CUstream stream = stream_or_null(ordinal)) api_.cuStreamSynchronize(stream);
    api_.cuStreamSynchronize(nullptr);
  }
  for (auto& [handle, pool] : pools_) {
    // The device's default pool, or one that is current (the process allocates from it with
    // cudaMallocAsync, perhaps up to its exit): not ours to destroy.
    if (pool.borrowed || pool.current) continue;
    ContextScope scope(api_, context_or_null(pool.device));
    api_.cuMemPoolDestroy(pool.pool);
  }
  for (auto& [event, opened] : opened_events_) {
    ContextScope scope(api_, context_or_null(opened.device));
    api_.cuEventDestroy(opened.event);
  }
  for (auto& [ordinal, state] : device_states_) {
    ContextScope scope(api_, context_or_null(ordinal));
    if (state.event) api_.cuEventDestroy(state.event);
    if (state.stream) api_.cuStreamDestroy(state.stream);
  }
  for (auto& [address, m] : mappings_) {
    ContextScope scope(api_, context_or_null(m.device));
    api_.cuMemUnmap(static_cast<CUdeviceptr>(address), static_cast<size_t>(m.size));
    api_.cuMemAddressFree(static_cast<CUdeviceptr>(address), static_cast<size_t>(m.size));
  }
  for (auto& [ordinal, ctx] : contexts_) api_.cuDevicePrimaryCtxRelease(device_nothrow(ordinal));
  if (nvml_ready_ && nvml_.shutdown) nvml_.shutdown();
}

CUmemoryPool Driver::driver_default_pool(int ordinal) {
  CUmemoryPool pool = nullptr;
  check(api_.cuDeviceGetDefaultMemPool(&pool, device(ordinal)), "cuDeviceGetDefaultMemPool");
  return pool;
}

PoolHandle Driver::borrow(CUmemoryPool pool, int ordinal) {
  for (const auto& [handle, p] : pools_)
    if (p.pool == pool) return handle;
  const PoolHandle handle = add_pool(pool, ordinal, false);
  pools_[handle].borrowed = true;
  return handle;
}

PoolHandle Driver::add_pool(CUmemoryPool pool, int ordinal, bool imported) {
  const PoolHandle handle = ++last_handle_;
  Pool& record = pools_[handle];
  record.pool = pool;
  record.device = ordinal;
  record.imported = imported;
  return handle;
}

CUstream Driver::device_stream(int ordinal) {
  DeviceState& state = device_states_[ordinal];
  if (!state.stream) check(api_.cuStreamCreate(&state.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  return state.stream;
}

CUstream Driver::stream_or_null(int ordinal) const {
  auto it = device_states_.find(ordinal);
  return it == device_states_.end() ? nullptr : it->second.stream;
}

CUevent Driver::ready(int ordinal) {
  DeviceState& state = device_states_[ordinal];
  if (!state.event)
    check(api_.cuEventCreate(&state.event, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  return state.event;
}

void Driver::after_shared_allocations(int ordinal) {
  auto it = device_states_.find(ordinal);
  if (it != device_states_.end() && it->second.event)
    check(api_.cuStreamWaitEvent(nullptr, it->second.event, 0), "cuStreamWaitEvent");
}

CUcontext Driver::context(int ordinal) {
  auto it = contexts_.find(ordinal);
  if (it != contexts_.end()) return it->second;
  CUcontext ctx = nullptr;
  check(api_.cuDevicePrimaryCtxRetain(&ctx, device(ordinal)), "cuDevicePrimaryCtxRetain");
  contexts_[ordinal] = ctx;
  return ctx;
}

CUcontext Driver::context_or_null(int ordinal) const {
  auto it = contexts_.find(ordinal);
  return it == contexts_.end() ? nullptr : it->second;
}

CUdevice Driver::device_nothrow(int ordinal) const {
  CUdevice dev = 0;
  api_.cuDeviceGet(&dev, ordinal);
  return dev;
}

Driver::Pool& Driver::find(PoolHandle handle) {
  auto it = pools_.find(handle);
  if (it == pools_.end())
    throw CudaError("cupool pool lookup", CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "no such pool");
  return it->second;
}

CUdevice Driver::device(int ordinal) {
  CUdevice dev = 0;
  check(api_.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  return dev;
}

std::string Driver::error_name(CUresult r) const {
  const char* name = nullptr;
  if (api_.cuGetErrorName && api_.cuGetErrorName(r, &name) == CUDA_SUCCESS && name) return name;
  return "CUresult " + std::to_string(static_cast<int>(r));
}

std::string Driver::error_string(CUresult r) const {
  const char* text = nullptr;
  if (api_.cuGetErrorString && api_.cuGetErrorString(r, &text) == CUDA_SUCCESS && text) return text;
  return "";
}

void Driver::check(CUresult r, const char* api) const {
  if (r != CUDA_SUCCESS) throw CudaError(api, static_cast<int>(r), error_name(r), error_string(r));
}

bool Driver::nvml_ready() {
  std::call_once(nvml_once_, [this] { load_nvml(); });
  return nvml_ready_;
}

void Driver::load_nvml() {
  nvml_lib_ = std::make_unique<Library>("libnvidia-ml.so.1");
  if (!nvml_lib_->loaded()) {
    const char* why = dlerror();
    nvml_why_ = std::string("NVML (libnvidia-ml.so.1) could not be loaded: ") + (why ? why : "not found");
    return;
  }
  const Library& lib = *nvml_lib_;
  nvml_.init = reinterpret_cast<int (*)()>(lib.symbol("nvmlInit_v2"));
  nvml_.shutdown = reinterpret_cast<int (*)()>(lib.symbol("nvmlShutdown"));
  nvml_.by_uuid = reinterpret_cast<int (*)(const char*, NvmlDevice*)>(lib.symbol("nvmlDeviceGetHandleByUUID"));
  nvml_.memory = reinterpret_cast<int (*)(NvmlDevice, NvmlMemory*)>(lib.symbol("nvmlDeviceGetMemoryInfo"));
  nvml_.driver_version = reinterpret_cast<int (*)(char*, unsigned)>(lib.symbol("nvmlSystemGetDriverVersion"));
  nvml_.error_string = reinterpret_cast<const char* (*)(int)>(lib.symbol("nvmlErrorString"));
  nvml_.memory_v2 = reinterpret_cast<int (*)(NvmlDevice, NvmlMemoryV2*)>(lib.symbol("nvmlDeviceGetMemoryInfo_v2"));
  // The process lists: _v2 where it exists (its entry has been 24 bytes in every driver); else _v3,
  // whose entry was 32 bytes only in the drivers that had confidential computing's memory figures
  // but not yet nvmlDeviceGetRunningProcessDetailList (r530, early r535), as nvitop tells them.
  nvml_.compute_processes = reinterpret_cast<NvmlProcessList>(lib.symbol("nvmlDeviceGetComputeRunningProcesses_v2"));
  nvml_.graphics_processes = reinterpret_cast<NvmlProcessList>(lib.symbol("nvmlDeviceGetGraphicsRunningProcesses_v2"));
  if (!nvml_.compute_processes) {
    nvml_.compute_processes = reinterpret_cast<NvmlProcessList>(lib.symbol("nvmlDeviceGetComputeRunningProcesses_v3"));
    nvml_.graphics_processes =
        reinterpret_cast<NvmlProcessList>(lib.symbol("nvmlDeviceGetGraphicsRunningProcesses_v3"));
    if (lib.symbol("nvmlDeviceGetConfComputeMemSizeInfo") && !lib.symbol("nvmlDeviceGetRunningProcessDetailList"))
      nvml_.process_stride = kNvmlProcessInfoV3CcStride;
  }
  if (!nvml_.init || !nvml_.shutdown || !nvml_.by_uuid || !nvml_.memory) {
    nvml_why_ =
        "NVML (libnvidia-ml.so.1) lacks nvmlInit_v2, nvmlShutdown, nvmlDeviceGetHandleByUUID or "
        "nvmlDeviceGetMemoryInfo";
    return;
  }
  const int r = nvml_.init();
  nvml_ready_ = r == kNvmlSuccess;
  if (!nvml_ready_) nvml_why_ = "nvmlInit_v2 failed: " + nvml_error(r);
}

std::string Driver::nvml_error(int result) const {
  const char* text = nvml_.error_string ? nvml_.error_string(result) : nullptr;
  return text ? std::string(text) : "NVML error " + std::to_string(result);
}

std::string Driver::uuid(int ordinal) {
  CUuuid id;
  check(api_.cuDeviceGetUuid(&id, device(ordinal)), "cuDeviceGetUuid");
  return format_uuid(id);
}

std::string format_uuid(const CUuuid& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  char buf[64];
  std::snprintf(buf, sizeof buf, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return buf;
}

void Driver::debug(const char* type, int ordinal, const char* step) const {
  if (debug_) debug_(std::string("probe ") + type + " on GPU " + std::to_string(ordinal) + ": " + step);
}

}  // namespace cupool::cuda
