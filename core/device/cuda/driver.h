// The real backend's insides, shared by its role classes (one per role of device/backend.h, or a
// small group of them: node.h, pools.h, graph_memory.h, sharing.h, exported.h, transfers.h,
// bench.h): the CUDA driver API and NVML as loaded at run time, the RAII helpers over them, and
// Driver, the state the roles share. Only device/cuda/ includes this header (and so cuda.h);
// everything else sees device/backend.h.
#pragma once

#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/fd.h"
#include "device/backend.h"
#include "device/gds.h"

namespace cupool::cuda {

#define CUPOOL_STR2(x) #x
#define CUPOOL_STR(x) CUPOOL_STR2(x)

// The driver entry points cupool uses. Names go through cuda.h's macros, so dlsym asks for the
// versioned symbol the header means (cuDeviceTotalMem -> cuDeviceTotalMem_v2).
struct DriverApi {
// (clang-format lays a list like this out differently on each pass)
// clang-format off
#define CUPOOL_DRIVER_FUNCTIONS(X)                                                                                     \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet)                                                   \
  X(cuDeviceGetName) X(cuDeviceGetUuid) X(cuDeviceTotalMem) X(cuDeviceGetAttribute)                                    \
  X(cuDeviceGetPCIBusId) X(cuDeviceCanAccessPeer) X(cuGetErrorName) X(cuGetErrorString)                                \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxPushCurrent) X(cuCtxPopCurrent)                      \
  X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemPoolExportToShareableHandle) X(cuMemAllocFromPoolAsync)                \
  X(cuMemFreeAsync) X(cuStreamSynchronize) X(cuMemPoolSetAttribute) X(cuMemPoolGetAttribute)                           \
  X(cuMemPoolSetAccess) X(cuMemPoolTrimTo) X(cuMemPoolImportFromShareableHandle) X(cuMemPoolExportPointer)             \
  X(cuMemPoolImportPointer) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamWaitEvent)                                  \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)                                            \
  X(cuIpcGetEventHandle) X(cuIpcOpenEventHandle) X(cuMemcpyHtoD) X(cuMemcpyDtoH)                                       \
  X(cuDeviceGetGraphMemAttribute) X(cuDeviceSetGraphMemAttribute) X(cuDeviceGraphMemTrim) X(cuDeviceGetDefaultMemPool) \
  X(cuDeviceGetMemPool) X(cuDeviceSetMemPool) X(cuMemPoolGetAccess) X(cuDevicePrimaryCtxGetState)                      \
  X(cuMemAlloc) X(cuMemFree) X(cuMemAllocAsync) X(cuStreamBeginCapture)                                                \
  X(cuStreamEndCapture) X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy)                                   \
  X(cuGraphDestroy) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemcpyHtoDAsync)                                       \
  X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease) X(cuMemExportToShareableHandle)                      \
  X(cuMemImportFromShareableHandle) X(cuMemGetAllocationPropertiesFromHandle) X(cuMemAddressReserve)                  \
  X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)                                                     \
  X(cuMemHostRegister) X(cuMemHostUnregister)
// clang-format on
#define CUPOOL_DECLARE(name) decltype(&::name) name = nullptr;  // NOLINT(bugprone-macro-parentheses): a name
  CUPOOL_DRIVER_FUNCTIONS(CUPOOL_DECLARE)
#undef CUPOOL_DECLARE
};

// NVML, declared by hand from nvml.h's stable C ABI, so no NVML headers are needed.
struct NvmlMemory {  // nvmlMemory_t (v1)
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;  // includes what the driver reserves
};
struct NvmlMemoryV2 {  // nvmlMemory_v2_t
  unsigned version;    // kNvmlMemoryV2
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;  // includes reserved
};
static_assert(sizeof(NvmlMemoryV2) == 40, "nvmlMemory_v2_t is 40 bytes");
// nvml.h's NVML_STRUCT_VERSION(Memory, 2): the struct's size, and its version in the top byte.
constexpr unsigned kNvmlMemoryV2 = static_cast<unsigned>(sizeof(NvmlMemoryV2)) | (2U << 24);
// nvmlProcessInfo_v2_t, what nvmlDeviceGet{Compute,Graphics}RunningProcesses_v2 fill. The _v3
// entry points fill the same 24 bytes on current drivers, but 32 (usedGpuCcProtectedMemory after
// computeInstanceId) on r530/early r535 ones, without a version of their own (nvitop PR #79,
// go-nvml issue #75): so _v2 is asked where it exists, and _v3's stride is worked out (driver.cpp).
struct NvmlProcessInfo {
  unsigned pid;
  unsigned long long used_gpu_memory;  // kNvmlValueNotAvailable when NVML does not know
  unsigned gpu_instance_id;
  unsigned compute_instance_id;
};
static_assert(sizeof(NvmlProcessInfo) == 24 && offsetof(NvmlProcessInfo, used_gpu_memory) == 8,
              "nvmlProcessInfo_v2_t is {pid at 0, usedGpuMemory at 8}, 24 bytes");
constexpr std::size_t kNvmlProcessInfoV3CcStride = 32;  // the r530 layout of _v3's element
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlErrorInsufficientSize = 7;
using NvmlDevice = void*;
// A process list: device, count in (room) and out (how many; on INSUFFICIENT_SIZE how many there
// are), the array (process_stride bytes an entry).
using NvmlProcessList = int (*)(NvmlDevice, unsigned*, void*);
struct NvmlApi {
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_uuid)(const char*, NvmlDevice*) = nullptr;
  int (*memory)(NvmlDevice, NvmlMemory*) = nullptr;
  int (*driver_version)(char*, unsigned) = nullptr;
  const char* (*error_string)(int) = nullptr;             // nvmlErrorString
  int (*memory_v2)(NvmlDevice, NvmlMemoryV2*) = nullptr;  // r510 and later
  NvmlProcessList compute_processes = nullptr;
  NvmlProcessList graphics_processes = nullptr;
  std::size_t process_stride = sizeof(NvmlProcessInfo);
};

// Owns a dlopen handle.
class Library {
 public:
  Library() = default;
  explicit Library(const char* name) : handle_(dlopen(name, RTLD_NOW | RTLD_LOCAL)) {}
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  ~Library() {
    if (handle_) dlclose(handle_);
  }
  bool loaded() const noexcept { return handle_ != nullptr; }
  void* symbol(const char* name) const noexcept { return handle_ ? dlsym(handle_, name) : nullptr; }

 private:
  void* handle_ = nullptr;
};

// Makes `ctx` current for a scope (nothing when null); never throws.
class ContextScope {
 public:
  ContextScope(const DriverApi& api, CUcontext ctx)
      : api_(api), pushed_(ctx && api.cuCtxPushCurrent(ctx) == CUDA_SUCCESS) {}
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  ~ContextScope() {
    CUcontext popped = nullptr;
    if (pushed_) api_.cuCtxPopCurrent(&popped);
  }

 private:
  const DriverApi& api_;
  bool pushed_;
};

// An exported allocation's descriptor imported as a handle (in the current context), released
// when this goes; the descriptor stays the caller's.
struct Imported {
  const DriverApi& api;
  CUmemGenericAllocationHandle handle;
  Imported(const Imported&) = delete;
  Imported& operator=(const Imported&) = delete;
  ~Imported() { api.cuMemRelease(handle); }
};

// Retains the primary context and makes it current for the probe's lifetime.
class PrimaryContext {
 public:
  PrimaryContext(const DriverApi& api, CUdevice dev) : api_(api), dev_(dev) {
    result_ = api_.cuDevicePrimaryCtxRetain(&ctx_, dev_);
    if (result_ == CUDA_SUCCESS) {
      result_ = api_.cuCtxPushCurrent(ctx_);
      pushed_ = result_ == CUDA_SUCCESS;
    }
  }
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  ~PrimaryContext() {
    CUcontext popped = nullptr;
    if (pushed_) api_.cuCtxPopCurrent(&popped);
    if (ctx_) api_.cuDevicePrimaryCtxRelease(dev_);
  }
  CUresult result() const noexcept { return result_; }

 private:
  const DriverApi& api_;
  CUdevice dev_;
  CUcontext ctx_ = nullptr;
  CUresult result_ = CUDA_SUCCESS;
  bool pushed_ = false;
};

class PoolGuard {
 public:
  PoolGuard(const DriverApi& api, CUmemoryPool pool) : api_(api), pool_(pool) {}
  PoolGuard(const PoolGuard&) = delete;
  PoolGuard& operator=(const PoolGuard&) = delete;
  ~PoolGuard() {
    if (pool_) api_.cuMemPoolDestroy(pool_);  // non-throwing: result ignored at teardown
  }
  void leak() noexcept { pool_ = nullptr; }

 private:
  const DriverApi& api_;
  CUmemoryPool pool_;
};

// What the real backend's roles share, owned by CudaBackend (backend.cpp) and referenced by each
// role: the loaded driver and NVML, the primary contexts retained, the pools made or found, the
// devices' streams and ready events, the exporters' events opened here and the exported
// allocations mapped here. Its destructor frees them all, in the driver's order (driver.cpp).
class Driver {
 public:
  struct Pool {
    CUmemoryPool pool = nullptr;
    int device = 0;
    bool imported = false;                    // from import_pool_fd
    bool exported = false;                    // its shareable handle was made at least once
    bool borrowed = false;                    // a device's default/current pool: never destroyed
    bool current = false;                     // made current by set_current_pool: never destroyed
    std::optional<PoolProps> props;           // what create_pool made it with (only those)
    std::set<CUdeviceptr> allocations;        // allocate (legacy stream)
    std::set<CUdeviceptr> shared;             // allocate_shared (the device's stream)
    std::set<CUdeviceptr> imported_pointers;  // import_pointer
  };
  // What the backend orders work on, per device; each created on first use.
  struct DeviceState {
    CUstream stream = nullptr;           // non-blocking
    CUevent event = nullptr;             // interprocess, recorded after each allocate_shared
    std::optional<Blob64> event_handle;  // its cuIpcGetEventHandle bytes
  };
  // An exporter's event opened through its IPC handle, and the device whose context opened it.
  struct OpenedEvent {
    CUevent event = nullptr;
    int device = 0;
  };
  // An exported allocation mapped here (create_exported, map_exported): the device whose context
  // mapped it, and its size.
  struct Mapping {
    int device = 0;
    std::uint64_t size = 0;
  };

  explicit Driver(DebugLog debug) : debug_(std::move(debug)) {}
  // Frees what the roles made, never throwing: imported pointers, own allocations, pools, events,
  // streams, mappings, then the primary contexts; NVML last.
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // Loads libcuda.so.1 and every entry point, and calls cuInit (once). Throws NoDriverError.
  void init();
  // The loaded driver, and its error check (throws CudaError naming `api`).
  const DriverApi& api() const noexcept { return api_; }
  void check(CUresult r, const char* api) const;
  std::string error_name(CUresult r) const;
  std::string error_string(CUresult r) const;
  // NVML, loaded on first use; false when the node has none (nvml_why() says why).
  bool nvml_ready();
  const NvmlApi& nvml() const noexcept { return nvml_; }
  const std::string& nvml_why() const noexcept { return nvml_why_; }
  // NVML's words for one of its results ("Insufficient Permissions"), or "NVML error N".
  std::string nvml_error(int result) const;
  // The device's UUID, "GPU-xxxxxxxx-...", as NVML's nvmlDeviceGetHandleByUUID takes it.
  std::string uuid(int ordinal);
  // A step of a probe, for --log-level debug.
  void debug(const char* type, int ordinal, const char* step) const;

  CUdevice device(int ordinal);
  CUdevice device_nothrow(int ordinal) const;
  // The device's primary context, retained once for the backend's lifetime.
  CUcontext context(int ordinal);
  CUcontext context_or_null(int ordinal) const;
  // The device's stream; its context must be current.
  CUstream device_stream(int ordinal);
  CUstream stream_or_null(int ordinal) const;
  // The device's ready event; its context must be current.
  CUevent ready(int ordinal);
  DeviceState& device_state(int ordinal) { return device_states_[ordinal]; }
  // Orders the current context's legacy stream (where cuMemcpyHtoD/DtoH run) after the last
  // allocate_shared of the device, so a copy never races the stream-ordered allocation.
  void after_shared_allocations(int ordinal);

  // The pools, by handle. find throws CudaError (INVALID_HANDLE) for a handle it doesn't know.
  Pool& find(PoolHandle handle);
  std::map<PoolHandle, Pool>& pools() noexcept { return pools_; }
  PoolHandle add_pool(CUmemoryPool pool, int ordinal, bool imported);
  // A pool the driver owns (a device's default or current pool), recorded once.
  PoolHandle borrow(CUmemoryPool pool, int ordinal);
  CUmemoryPool driver_default_pool(int ordinal);
  // Pool attributes are int (reuse flags) or cuuint64_t (threshold, usage) by the driver's table.
  template <class T>
  T get_attribute(CUmemoryPool pool, CUmemPool_attribute attr) {
    T value{};
    check(api_.cuMemPoolGetAttribute(pool, attr, &value), "cuMemPoolGetAttribute");
    return value;
  }
  template <class T>
  void set_attribute(CUmemoryPool pool, CUmemPool_attribute attr, T value) {
    check(api_.cuMemPoolSetAttribute(pool, attr, &value), "cuMemPoolSetAttribute");
  }

  std::map<Blob64, OpenedEvent>& opened_events() noexcept { return opened_events_; }
  std::map<std::uint64_t, Mapping>& mappings() noexcept { return mappings_; }

 private:
  void load_nvml();
  DebugLog debug_;
  std::unique_ptr<Library> cuda_;
  std::unique_ptr<Library> nvml_lib_;
  DriverApi api_;
  NvmlApi nvml_;
  std::map<int, CUcontext> contexts_;
  std::map<PoolHandle, Pool> pools_;
  std::map<std::uint64_t, Mapping> mappings_;
  std::map<int, DeviceState> device_states_;
  std::map<Blob64, OpenedEvent> opened_events_;
  PoolHandle last_handle_ = 0;
  std::once_flag nvml_once_;
  bool nvml_ready_ = false;  // set once, in nvml_ready()
  std::string nvml_why_;     // why not ready, in words
  bool initialised_ = false;
};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" of a CUuuid.
std::string format_uuid(const CUuuid& uuid);

// What each role class holds: the shared Driver, its entry points and its error check.
class DriverRole {
 protected:
  using Pool = Driver::Pool;
  explicit DriverRole(Driver& driver) : d_(driver), api_(driver.api()) {}
  void check(CUresult r, const char* api) const { d_.check(r, api); }
  Driver& d_;
  const DriverApi& api_;
};

}  // namespace cupool::cuda
