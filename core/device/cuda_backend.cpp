// The real backend: the CUDA driver API, loaded at run time from libcuda.so.1, and NVML
// (libnvidia-ml.so.1) for free memory without a context. The only file that includes cuda.h.
#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
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

namespace cupool {

int built_with_cuda_version() { return CUDA_VERSION; }

namespace {

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
  X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)
// clang-format on
#define CUPOOL_DECLARE(name) decltype(&::name) name = nullptr;  // NOLINT(bugprone-macro-parentheses): a name
  CUPOOL_DRIVER_FUNCTIONS(CUPOOL_DECLARE)
#undef CUPOOL_DECLARE
};

// NVML, declared by hand: four calls of its stable C ABI, so no NVML headers are needed.
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
using NvmlDevice = void*;
struct NvmlApi {
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_uuid)(const char*, NvmlDevice*) = nullptr;
  int (*memory)(NvmlDevice, NvmlMemory*) = nullptr;
  int (*driver_version)(char*, unsigned) = nullptr;
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

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(DebugLog debug) : debug_(std::move(debug)) {}

  ReportSource source() const override {
    ReportSource s;
    s.description = "CUDA driver (libcuda.so.1)";
    return s;
  }

  void init() override {
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

  ~CudaBackend() override {
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

  PoolHandle create_pool(int ordinal, const PoolProps& props) override {
    ContextScope scope(api_, context(ordinal));
    CUmemPoolProps p;
    std::memset(&p, 0, sizeof p);
    p.allocType = props.managed ? CU_MEM_ALLOCATION_TYPE_MANAGED : CU_MEM_ALLOCATION_TYPE_PINNED;
    p.handleTypes = static_cast<CUmemAllocationHandleType>(props.handle_types);
    switch (props.location) {
      case PoolProps::Location::device:
        p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = props.location_id;
        break;
      case PoolProps::Location::host: p.location.type = CU_MEM_LOCATION_TYPE_HOST; break;
      case PoolProps::Location::host_numa:
        p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        p.location.id = props.location_id;
        break;
    }
    p.maxSize = static_cast<size_t>(props.max_size);
    CUmemoryPool pool = nullptr;
    check(api_.cuMemPoolCreate(&pool, &p), "cuMemPoolCreate");
    const PoolHandle handle = add_pool(pool, ordinal, false);
    pools_[handle].props = props;
    return handle;
  }

  void destroy_pool(PoolHandle handle) override {
    Pool& pool = find(handle);
    if (pool.borrowed || pool.current)
      throw CudaError("cuMemPoolDestroy", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                      "a device's default or current pool is not destroyed by cupool");
    ContextScope scope(api_, context(pool.device));
    // An imported pool's pointers are unmapped first, so none outlives the record of it.
    if (!pool.imported_pointers.empty()) {
      CUstream stream = device_stream(pool.device);
      while (!pool.imported_pointers.empty()) {
        check(api_.cuMemFreeAsync(*pool.imported_pointers.begin(), stream), "cuMemFreeAsync");
        pool.imported_pointers.erase(pool.imported_pointers.begin());
      }
      check(api_.cuStreamSynchronize(stream), "cuStreamSynchronize");
    }
    check(api_.cuMemPoolDestroy(pool.pool), "cuMemPoolDestroy");
    pools_.erase(handle);
  }

  void set_pool_settings(PoolHandle handle, const PoolSettings& s) override {
    CUmemoryPool pool = find(handle).pool;
    set_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, s.release_threshold);
    set_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, s.follow_event_dependencies);
    set_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, s.allow_opportunistic);
    set_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, s.allow_internal_dependencies);
  }

  PoolSettings pool_settings(PoolHandle handle) override {
    CUmemoryPool pool = find(handle).pool;
    PoolSettings s;
    s.release_threshold = get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
    s.follow_event_dependencies = get_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES) != 0;
    s.allow_opportunistic = get_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC) != 0;
    s.allow_internal_dependencies = get_attribute<int>(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES) != 0;
    return s;
  }

  PoolUsage pool_usage(PoolHandle handle) override {
    CUmemoryPool pool = find(handle).pool;
    PoolUsage u;
    u.reserved_bytes = get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    u.reserved_peak_bytes = get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
    u.used_bytes = get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    u.used_peak_bytes = get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH);
    return u;
  }

  void reset_pool_peaks(PoolHandle handle) override {
    CUmemoryPool pool = find(handle).pool;
    // 0 is the only value these accept: "reset to the current value".
    set_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0);
    set_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0);
  }

  void set_pool_access(PoolHandle handle, int peer) override {
    CUmemAccessDesc desc;
    std::memset(&desc, 0, sizeof desc);
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = peer;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    check(api_.cuMemPoolSetAccess(find(handle).pool, &desc, 1), "cuMemPoolSetAccess");
  }

  std::uint64_t allocate(PoolHandle handle, std::uint64_t bytes) override {
    Pool& pool = find(handle);
    ContextScope scope(api_, context(pool.device));
    CUdeviceptr ptr = 0;
    check(api_.cuMemAllocFromPoolAsync(&ptr, static_cast<size_t>(bytes), pool.pool, nullptr),
          "cuMemAllocFromPoolAsync");
    pool.allocations.insert(ptr);
    check(api_.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
    return ptr;
  }

  void free(PoolHandle handle, std::uint64_t address) override {
    Pool& pool = find(handle);
    auto it = pool.allocations.find(static_cast<CUdeviceptr>(address));
    if (it == pool.allocations.end())
      throw CudaError("cuMemFreeAsync", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                      "not an allocation of this pool");
    ContextScope scope(api_, context(pool.device));
    check(api_.cuMemFreeAsync(*it, nullptr), "cuMemFreeAsync");
    pool.allocations.erase(it);
    check(api_.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
  }

  void trim_pool(PoolHandle handle, std::uint64_t keep) override {
    check(api_.cuMemPoolTrimTo(find(handle).pool, static_cast<size_t>(keep)), "cuMemPoolTrimTo");
  }

  // ---- this process's own pools ----

  PoolHandle default_pool(int ordinal) override { return borrow(driver_default_pool(ordinal), ordinal); }

  PoolHandle current_pool(int ordinal) override {
    CUmemoryPool pool = nullptr;
    check(api_.cuDeviceGetMemPool(&pool, device(ordinal)), "cuDeviceGetMemPool");
    for (const auto& [handle, p] : pools_)
      if (p.pool == pool) return handle;  // one of ours, or already borrowed
    return borrow(pool, ordinal);
  }

  void set_current_pool(int ordinal, PoolHandle handle) override {
    Pool& pool = find(handle);
    const bool is_default = pool.borrowed && pool.pool == driver_default_pool(ordinal);
    const bool own_here = pool.props && pool.device == ordinal && pool.props->location == PoolProps::Location::device &&
                          pool.props->location_id == ordinal;
    if (!is_default && !own_here)
      throw CudaError("cuDeviceSetMemPool", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                      "only a device pool cupool created on device " + std::to_string(ordinal) +
                          ", or the device's default pool, is made current there");
    check(api_.cuDeviceSetMemPool(device(ordinal), pool.pool), "cuDeviceSetMemPool");
    for (auto& [h, p] : pools_)
      if (p.device == ordinal) p.current = false;
    pool.current = !is_default;
  }

  std::optional<PoolProps> created_props(PoolHandle handle) override { return find(handle).props; }

  bool pool_access(PoolHandle handle, int peer) override {
    CUmemLocation location;
    std::memset(&location, 0, sizeof location);
    location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    location.id = peer;
    CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    check(api_.cuMemPoolGetAccess(&flags, find(handle).pool, &location), "cuMemPoolGetAccess");
    return flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }

  bool context_active(int ordinal) override {
    unsigned int flags = 0;
    int active = 0;
    check(api_.cuDevicePrimaryCtxGetState(device(ordinal), &flags, &active), "cuDevicePrimaryCtxGetState");
    return active != 0;
  }

  // ---- measuring ----

  std::vector<double> bench(int ordinal, const BenchCase& c) override {
    using Clock = std::chrono::steady_clock;
    ContextScope scope(api_, context(ordinal));
    CUstream stream = device_stream(ordinal);
    CUmemoryPool pool = nullptr;
    check(api_.cuDeviceGetDefaultMemPool(&pool, device(ordinal)), "cuDeviceGetDefaultMemPool");
    const auto saved = get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
    struct Restore {
      CudaBackend& b;
      CUmemoryPool pool;
      cuuint64_t value;
      ~Restore() {
        cuuint64_t v = value;
        b.api_.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v);
      }
    } restore{*this, pool, saved};
    set_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, c.threshold);
    const auto bytes = static_cast<size_t>(c.bytes);
    std::vector<double> ns;
    ns.reserve(static_cast<std::size_t>(c.iterations));
    auto since = [](Clock::time_point t0) {
      return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    };
    switch (c.kind) {
      case BenchCase::Kind::malloc_free:
        for (int i = 0; i < c.iterations; ++i) {
          CUdeviceptr p = 0;
          const auto t0 = Clock::now();
          check(api_.cuMemAlloc(&p, bytes), "cuMemAlloc");
          check(api_.cuMemFree(p), "cuMemFree");
          ns.push_back(since(t0));
        }
        break;
      case BenchCase::Kind::async_alloc_free:
        for (int i = 0; i < c.iterations; ++i) {
          CUdeviceptr p = 0;
          const auto t0 = Clock::now();
          check(api_.cuMemAllocAsync(&p, bytes, stream), "cuMemAllocAsync");
          check(api_.cuMemFreeAsync(p, stream), "cuMemFreeAsync");
          ns.push_back(since(t0));
          if (i % 256 == 255) check(api_.cuStreamSynchronize(stream), "cuStreamSynchronize");  // untimed drain
        }
        check(api_.cuStreamSynchronize(stream), "cuStreamSynchronize");
        break;
      case BenchCase::Kind::alloc_free_sync:
        for (int i = 0; i < c.iterations; ++i) {
          CUdeviceptr p = 0;
          const auto t0 = Clock::now();
          check(api_.cuMemAllocAsync(&p, bytes, stream), "cuMemAllocAsync");
          check(api_.cuMemFreeAsync(p, stream), "cuMemFreeAsync");
          check(api_.cuStreamSynchronize(stream), "cuStreamSynchronize");
          ns.push_back(since(t0));
        }
        break;
      case BenchCase::Kind::trim:
        for (int i = 0; i < c.iterations; ++i) {
          CUdeviceptr p = 0;
          check(api_.cuMemAllocAsync(&p, bytes, stream), "cuMemAllocAsync");
          check(api_.cuMemFreeAsync(p, stream), "cuMemFreeAsync");
          check(api_.cuStreamSynchronize(stream), "cuStreamSynchronize");
          const auto t0 = Clock::now();
          check(api_.cuMemPoolTrimTo(pool, 0), "cuMemPoolTrimTo");
          ns.push_back(since(t0));
        }
        break;
      case BenchCase::Kind::graph_alloc_free: {
        CUgraph graph = nullptr;
        CUgraphExec exec = nullptr;
        check(api_.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture");
        CUdeviceptr p = 0;
        CUresult r = api_.cuMemAllocAsync(&p, bytes, stream);
        if (r == CUDA_SUCCESS) r = api_.cuMemFreeAsync(p, stream);
        const CUresult end = api_.cuStreamEndCapture(stream, &graph);
        check(r, "cuMemAllocAsync/cuMemFreeAsync (captured)");
        check(end, "cuStreamEndCapture");
        struct Graph {
          const DriverApi& api;
          CUgraph g;
          CUgraphExec& e;
          ~Graph() {
            if (e) api.cuGraphExecDestroy(e);
            if (g) api.cuGraphDestroy(g);
          }
        } owner{api_, graph, exec};
        check(api_.cuGraphInstantiate(&exec, graph, 0), "cuGraphInstantiate");
        for (int i = 0; i < c.iterations; ++i) {
          const auto t0 = Clock::now();
          check(api_.cuGraphLaunch(exec, stream), "cuGraphLaunch");
          check(api_.cuStreamSynchronize(stream), "cuStreamSynchronize");
          ns.push_back(since(t0));
        }
        break;
      }
    }
    return ns;
  }

  // ---- sharing: the exporting side ----

  int export_pool_fd(PoolHandle handle) override {
    Pool& pool = find(handle);
    ContextScope scope(api_, context(pool.device));
    int fd = -1;
    check(api_.cuMemPoolExportToShareableHandle(&fd, pool.pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemPoolExportToShareableHandle");
    pool.exported = true;
    return fd;
  }

  SharedAllocation allocate_shared(PoolHandle handle, std::uint64_t bytes, Readiness readiness) override {
    Pool& pool = find(handle);
    ContextScope scope(api_, context(pool.device));
    // cuMemPoolExportPointer works only on a pool that has been shared (measured on driver 580:
    // CUDA_ERROR_INVALID_VALUE before the pool's first cuMemPoolExportToShareableHandle).
    if (!pool.exported) {
      int fd = -1;
      check(api_.cuMemPoolExportToShareableHandle(&fd, pool.pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            "cuMemPoolExportToShareableHandle");
      ::close(fd);
      pool.exported = true;
    }
    CUstream stream = device_stream(pool.device);
    CUevent event = ready(pool.device);
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

  Blob64 ready_event(int ordinal) override {
    ContextScope scope(api_, context(ordinal));
    CUevent event = ready(ordinal);
    DeviceState& state = device_states_[ordinal];
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

  void free_shared(PoolHandle handle, std::uint64_t address) override {
    Pool& pool = find(handle);
    auto it = pool.shared.find(static_cast<CUdeviceptr>(address));
    if (it == pool.shared.end())
      throw CudaError("cuMemFreeAsync", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                      "not a shared allocation of this pool");
    ContextScope scope(api_, context(pool.device));
    check(api_.cuMemFreeAsync(*it, device_stream(pool.device)), "cuMemFreeAsync");
    pool.shared.erase(it);
  }

  void synchronize(int ordinal) override {
    CUstream stream = stream_or_null(ordinal);
    if (!stream) return;  // nothing was ever ordered on it
    ContextScope scope(api_, context(ordinal));
    check(api_.cuStreamSynchronize(stream), "cuStreamSynchronize");
  }

  GraphMemUsage graph_mem_usage(int ordinal) override {
    const CUdevice dev = device(ordinal);
    ContextScope scope(api_, context(ordinal));
    GraphMemUsage u;
    u.reserved_bytes = graph_attribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
    u.reserved_peak_bytes = graph_attribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH);
    u.used_bytes = graph_attribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
    u.used_peak_bytes = graph_attribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH);
    return u;
  }

  void trim_graph_mem(int ordinal) override {
    const CUdevice dev = device(ordinal);
    ContextScope scope(api_, context(ordinal));
    check(api_.cuDeviceGraphMemTrim(dev), "cuDeviceGraphMemTrim");
  }

  void reset_graph_mem_peaks(int ordinal) override {
    const CUdevice dev = device(ordinal);
    ContextScope scope(api_, context(ordinal));
    // 0 is the only value these accept: "reset to the current value".
    cuuint64_t zero = 0;
    check(api_.cuDeviceSetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero),
          "cuDeviceSetGraphMemAttribute");
    zero = 0;
    check(api_.cuDeviceSetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &zero),
          "cuDeviceSetGraphMemAttribute");
  }

  // ---- exported allocations (VMM) ----

  std::uint64_t allocation_granularity(int ordinal) override {
    CUmemAllocationProp prop = exported_prop(ordinal);
    size_t granularity = 0;
    check(api_.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
    return granularity;
  }

  ExportedAllocation create_exported(int ordinal, std::uint64_t bytes) override {
    ContextScope scope(api_, context(ordinal));
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

  std::uint64_t map_exported(int ordinal, int fd, std::uint64_t size, const std::vector<int>& peers) override {
    // The mapping is the process's, not a context's: a process that works on a peer device maps
    // in that device's context instead of creating one on the holder's device (on 2x H100 that
    // context cost a peer's first mapping of a held set ~150 ms).
    const int in = peers.empty() ? ordinal : peers.front();
    ContextScope scope(api_, context(in));
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
    mappings_[address].device = in;  // unmapped in the same context
    return address;
  }

  void grant_exported_access(std::uint64_t address, int peer) override {
    auto it = mappings_.find(address);
    if (it == mappings_.end())
      throw CudaError("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                      "not an exported allocation mapped by this process");
    ContextScope scope(api_, context(it->second.device));
    const CUmemAccessDesc desc = access_desc(peer);
    check(api_.cuMemSetAccess(static_cast<CUdeviceptr>(address), static_cast<size_t>(it->second.size), &desc, 1),
          "cuMemSetAccess");
  }

  void unmap_exported(std::uint64_t address) override {
    auto it = mappings_.find(address);
    if (it == mappings_.end())
      throw CudaError("cuMemUnmap", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                      "not an exported allocation mapped by this process");
    ContextScope scope(api_, context(it->second.device));
    const std::uint64_t size = it->second.size;
    mappings_.erase(it);
    check(api_.cuMemUnmap(static_cast<CUdeviceptr>(address), static_cast<size_t>(size)), "cuMemUnmap");
    check(api_.cuMemAddressFree(static_cast<CUdeviceptr>(address), static_cast<size_t>(size)), "cuMemAddressFree");
  }

  // ---- sharing: the importing side ----

  PoolHandle import_pool_fd(int ordinal, int fd) override {
    ContextScope scope(api_, context(ordinal));
    CUmemoryPool pool = nullptr;
    // The posix_fd handle is the fd itself, passed by value in the pointer argument.
    void* shareable = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd));
    check(api_.cuMemPoolImportFromShareableHandle(&pool, shareable, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemPoolImportFromShareableHandle");
    return add_pool(pool, ordinal, true);
  }

  std::uint64_t import_pointer(PoolHandle handle, const Blob64& export_data) override {
    Pool& pool = find(handle);
    ContextScope scope(api_, context(pool.device));
    CUmemPoolPtrExportData data;
    static_assert(sizeof data == std::tuple_size<Blob64>::value, "CUmemPoolPtrExportData is 64 bytes");
    std::memcpy(&data, export_data.data(), sizeof data);
    CUdeviceptr ptr = 0;
    check(api_.cuMemPoolImportPointer(&ptr, pool.pool, &data), "cuMemPoolImportPointer");
    pool.imported_pointers.insert(ptr);
    return ptr;
  }

  void wait_ready(int ordinal, const Blob64& event) override {
    ContextScope scope(api_, context(ordinal));
    auto it = opened_events_.find(event);
    if (it == opened_events_.end()) {
      CUipcEventHandle handle;
      static_assert(sizeof handle == std::tuple_size<Blob64>::value, "CUipcEventHandle is 64 bytes");
      std::memcpy(&handle, event.data(), sizeof handle);
      CUevent opened = nullptr;
      check(api_.cuIpcOpenEventHandle(&opened, handle), "cuIpcOpenEventHandle");
      it = opened_events_.emplace(event, OpenedEvent{opened, ordinal}).first;
    }
    check(api_.cuEventSynchronize(it->second.event), "cuEventSynchronize");
  }

  void free_imported(PoolHandle handle, std::uint64_t address) override {
    Pool& pool = find(handle);
    auto it = pool.imported_pointers.find(static_cast<CUdeviceptr>(address));
    if (it == pool.imported_pointers.end())
      throw CudaError("cuMemFreeAsync", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE",
                      "not an imported pointer of this pool");
    ContextScope scope(api_, context(pool.device));
    // cuMemFree, not cuMemFreeAsync on our stream + cuStreamSynchronize: neither waits for the
    // caller's own streams (its work on the lease must be done; client.h says so), and on the
    // H100 cuMemFree took 1-3 us instead of 49-940 us and made the next import of the block
    // 1-4 us instead of 74-1288 us (tests/gpu/RESULTS.md, 2026-11-23 17:42 and 17:45).
    check(api_.cuMemFree(*it), "cuMemFree");
    pool.imported_pointers.erase(it);
  }

  void write(int ordinal, std::uint64_t address, const void* source, std::uint64_t bytes) override {
    ContextScope scope(api_, context(ordinal));
    after_shared_allocations(ordinal);
    check(api_.cuMemcpyHtoD(static_cast<CUdeviceptr>(address), source, static_cast<size_t>(bytes)), "cuMemcpyHtoD");
    // From pageable memory the copy may return before its DMA has finished; another process may
    // read right after this returns.
    check(api_.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
  }

  LoadReport load_file(int ordinal, int fd, const std::vector<FileRange>& ranges, const LoadOptions& options,
                       const std::function<void(std::uint64_t)>& progress) override {
    CUcontext ctx = context(ordinal);
    {
      ContextScope scope(api_, ctx);
      after_shared_allocations(ordinal);
    }
    // One per worker thread, made on it: its context current, a blocking stream (it waits for the
    // legacy stream, which after_shared_allocations ordered), two pinned slots (a copy
    // from pageable memory would be staged by the driver, one synchronous chunk at a time) and an
    // event per slot. Frees what it made on every path; finish() waits for the copies first.
    class PinnedSink : public LoadSink {
     public:
      PinnedSink(const CudaBackend& b, CUcontext c, std::uint64_t slot_bytes) : b_(b), scope_(b.api_, c) {
        b_.check(b_.api_.cuStreamCreate(&stream_, CU_STREAM_DEFAULT), "cuStreamCreate");
        for (unsigned i = 0; i < kSlots; ++i) {
          b_.check(b_.api_.cuMemHostAlloc(&host_[i], static_cast<size_t>(slot_bytes), 0), "cuMemHostAlloc");
          b_.check(b_.api_.cuEventCreate(&done_[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
        }
      }
      PinnedSink(const PinnedSink&) = delete;
      PinnedSink& operator=(const PinnedSink&) = delete;
      ~PinnedSink() override {
        if (stream_) b_.api_.cuStreamSynchronize(stream_);
        for (CUevent e : done_)
          if (e) b_.api_.cuEventDestroy(e);
        for (void* h : host_)
          if (h) b_.api_.cuMemFreeHost(h);
        if (stream_) b_.api_.cuStreamDestroy(stream_);
      }
      unsigned char* slot(unsigned i) override { return static_cast<unsigned char*>(host_[i]); }
      void wait(unsigned i) override { b_.check(b_.api_.cuEventSynchronize(done_[i]), "cuEventSynchronize"); }
      void send(unsigned i, const unsigned char* from, std::uint64_t address, std::uint64_t bytes) override {
        b_.check(
            b_.api_.cuMemcpyHtoDAsync(static_cast<CUdeviceptr>(address), from, static_cast<size_t>(bytes), stream_),
            "cuMemcpyHtoDAsync");
        b_.check(b_.api_.cuEventRecord(done_[i], stream_), "cuEventRecord");
      }
      void finish() override { b_.check(b_.api_.cuStreamSynchronize(stream_), "cuStreamSynchronize"); }

     private:
      const CudaBackend& b_;
      ContextScope scope_;
      CUstream stream_ = nullptr;
      void* host_[kSlots] = {};
      CUevent done_[kSlots] = {};
    };
    // GPUDirect Storage: cuFile with the file registered (with nvidia-fs opened again with
    // O_DIRECT, which it wants; in the compatibility mode as it is, so its reads use the page
    // cache) and, with nvidia-fs, the ranges' memory registered (unregistered memory goes through
    // cuFile's own GPU bounce buffers).
    // Everything in the device's context, made current on each reader's thread.
    class CuFilePath : public DirectPath {
     public:
      CuFilePath(const CudaBackend& b, CUcontext c, int fd, const std::vector<FileRange>& ranges) : b_(b), ctx_(c) {
        ContextScope scope(b_.api_, ctx_);
        cufile_ = CuFile::open();
        if (cufile_->gpudirect()) direct_ = reopen_direct(fd);  // nvidia-fs reads what was opened with O_DIRECT
        file_ = cufile_->register_file(direct_ ? direct_.get() : fd);
        // One registration for the span of the ranges (they lie in one lease; one per tensor
        // would pin BAR1 space a thousand times). Where cuFile will not, its bounce buffers serve.
        if (cufile_->gpudirect() && !ranges.empty()) {
          std::uint64_t lo = ranges.front().address, hi = lo;
          for (const FileRange& r : ranges) {
            lo = std::min(lo, r.address);
            hi = std::max(hi, r.address + r.bytes);
          }
          if (cufile_->register_buffer(lo, hi - lo, nullptr)) registered_ = {lo, hi};
        }
      }
      CuFilePath(const CuFilePath&) = delete;
      CuFilePath& operator=(const CuFilePath&) = delete;
      ~CuFilePath() override {
        ContextScope scope(b_.api_, ctx_);
        if (registered_.second) cufile_->deregister_buffer(registered_.first);
        file_.reset();
        cufile_.reset();
      }
      bool gpudirect() const override { return cufile_->gpudirect(); }
      bool direct_io() const override { return static_cast<bool>(direct_); }
      std::unique_ptr<DirectReader> reader() override { return std::make_unique<Reader>(*this); }

     private:
      class Reader : public DirectReader {
       public:
        explicit Reader(const CuFilePath& p) : p_(p), scope_(p.b_.api_, p.ctx_) {}
        void read(std::uint64_t file_offset, std::uint64_t address, std::uint64_t bytes) override {
          // Registered memory is named by its registered base (cuFile finds the registration by it).
          const auto [lo, hi] = p_.registered_;
          const bool inside = hi && address >= lo && address + bytes <= hi;
          const std::uint64_t base = inside ? lo : address;
          p_.cufile_->read(*p_.file_, base, address - base, bytes, file_offset);
        }

       private:
        const CuFilePath& p_;
        ContextScope scope_;
      };
      const CudaBackend& b_;
      CUcontext ctx_;
      std::unique_ptr<CuFile> cufile_;
      Fd direct_;
      std::unique_ptr<CuFile::File> file_;
      std::pair<std::uint64_t, std::uint64_t> registered_{0, 0};  // [lo, hi) registered with cuFile
    };
    LoadPaths paths;
    paths.sink = [this, ctx](std::uint64_t slot_bytes) { return std::make_unique<PinnedSink>(*this, ctx, slot_bytes); };
    paths.nvidia_fs = nvidia_fs_loaded();
    paths.open_direct = [this, ctx](int file, const std::vector<FileRange>& rs) -> std::unique_ptr<DirectPath> {
      return std::make_unique<CuFilePath>(*this, ctx, file, rs);
    };
    return load_file_ranges(fd, ranges, options, paths, progress);
  }

  void read(int ordinal, std::uint64_t address, void* target, std::uint64_t bytes) override {
    ContextScope scope(api_, context(ordinal));
    after_shared_allocations(ordinal);
    check(api_.cuMemcpyDtoH(target, static_cast<CUdeviceptr>(address), static_cast<size_t>(bytes)), "cuMemcpyDtoH");
  }

  int driver_version() override {
    int v = 0;
    check(api_.cuDriverGetVersion(&v), "cuDriverGetVersion");
    return v;
  }

  std::string kernel_driver_version() override {
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

  int device_count() override {
    int n = 0;
    check(api_.cuDeviceGetCount(&n), "cuDeviceGetCount");
    return n;
  }

  DeviceInfo device_info(int ordinal) override {
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
        info.memory_pools
            ? static_cast<std::uint32_t>(attribute(dev, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES))
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

  std::optional<MemoryInfo> memory_info(int ordinal) override {
    if (!nvml_ready()) return std::nullopt;
    const std::string uuid = device_info_uuid(ordinal);
    NvmlDevice handle = nullptr;
    if (nvml_.by_uuid(uuid.c_str(), &handle) != 0) return std::nullopt;
    NvmlMemory mem{};
    if (nvml_.memory(handle, &mem) != 0) return std::nullopt;
    return MemoryInfo{mem.free, mem.total};
  }

  bool can_access_peer(int device_ordinal, int peer_ordinal) override {
    if (device_ordinal == peer_ordinal) return true;
    int can = 0;
    check(api_.cuDeviceCanAccessPeer(&can, device(device_ordinal), device(peer_ordinal)), "cuDeviceCanAccessPeer");
    return can != 0;
  }

  std::vector<int> host_numa_nodes() override {
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

  GdsReport gds_report() override {
    // cuFile's driver wants a CUDA context on the calling thread: device 0's primary context,
    // retained for the probe only (like the export probes), so none stays active after it.
    if (device_count() == 0) return probe_gds();
    PrimaryContext ctx(api_, device(0));
    return probe_gds();
  }

  ExportProbe probe_export(int ordinal, HandleType type) override {
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

 private:
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

  CUmemoryPool driver_default_pool(int ordinal) {
    CUmemoryPool pool = nullptr;
    check(api_.cuDeviceGetDefaultMemPool(&pool, device(ordinal)), "cuDeviceGetDefaultMemPool");
    return pool;
  }

  // A pool the driver owns (a device's default or current pool), recorded once.
  PoolHandle borrow(CUmemoryPool pool, int ordinal) {
    for (const auto& [handle, p] : pools_)
      if (p.pool == pool) return handle;
    const PoolHandle handle = add_pool(pool, ordinal, false);
    pools_[handle].borrowed = true;
    return handle;
  }

  PoolHandle add_pool(CUmemoryPool pool, int ordinal, bool imported) {
    const PoolHandle handle = ++last_handle_;
    Pool& record = pools_[handle];
    record.pool = pool;
    record.device = ordinal;
    record.imported = imported;
    return handle;
  }

  // The device's stream; its context must be current.
  CUstream device_stream(int ordinal) {
    DeviceState& state = device_states_[ordinal];
    if (!state.stream) check(api_.cuStreamCreate(&state.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    return state.stream;
  }
  CUstream stream_or_null(int ordinal) const {
    auto it = device_states_.find(ordinal);
    return it == device_states_.end() ? nullptr : it->second.stream;
  }
  // The device's ready event; its context must be current.
  CUevent ready(int ordinal) {
    DeviceState& state = device_states_[ordinal];
    if (!state.event)
      check(api_.cuEventCreate(&state.event, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    return state.event;
  }
  // Orders the current context's legacy stream (where cuMemcpyHtoD/DtoH run) after the last
  // allocate_shared of the device, so a copy never races the stream-ordered allocation.
  void after_shared_allocations(int ordinal) {
    auto it = device_states_.find(ordinal);
    if (it != device_states_.end() && it->second.event)
      check(api_.cuStreamWaitEvent(nullptr, it->second.event, 0), "cuStreamWaitEvent");
  }

  cuuint64_t graph_attribute(CUdevice dev, CUgraphMem_attribute attr) {
    cuuint64_t value = 0;
    check(api_.cuDeviceGetGraphMemAttribute(dev, attr, &value), "cuDeviceGetGraphMemAttribute");
    return value;
  }

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

  // The device's primary context, retained once for the backend's lifetime.
  // What a held buffer's memory is made with: pinned memory of the device, exportable as a POSIX fd.
  static CUmemAllocationProp exported_prop(int ordinal) {
    CUmemAllocationProp prop;
    std::memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
  }

  static CUmemAccessDesc access_desc(int ordinal) {
    CUmemAccessDesc desc;
    std::memset(&desc, 0, sizeof desc);
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = ordinal;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return desc;
  }

  // Reserves `size` bytes of address space, maps `handle` there and gives `ordinal` and `peers`
  // read-write access; undoes what it did when a step fails.
  // An exported allocation's descriptor imported as a handle (in the current context), released
  // when this goes; the descriptor stays the caller's.
  struct Imported {
    const DriverApi& api;
    CUmemGenericAllocationHandle handle;
    Imported(const Imported&) = delete;
    Imported& operator=(const Imported&) = delete;
    ~Imported() { api.cuMemRelease(handle); }
  };
  Imported import_exported(int fd) {
    CUmemGenericAllocationHandle handle = 0;
    // The posix_fd handle is the fd itself, passed by value in the pointer argument.
    void* shareable = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd));
    check(api_.cuMemImportFromShareableHandle(&handle, shareable, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "cuMemImportFromShareableHandle");
    return Imported{api_, handle};
  }

  std::uint64_t map_handle(int ordinal, CUmemGenericAllocationHandle handle, std::uint64_t size,
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
    mappings_[ptr] = Mapping{ordinal, size};
    return ptr;
  }

  CUcontext context(int ordinal) {
    auto it = contexts_.find(ordinal);
    if (it != contexts_.end()) return it->second;
    CUcontext ctx = nullptr;
    check(api_.cuDevicePrimaryCtxRetain(&ctx, device(ordinal)), "cuDevicePrimaryCtxRetain");
    contexts_[ordinal] = ctx;
    return ctx;
  }
  CUcontext context_or_null(int ordinal) const {
    auto it = contexts_.find(ordinal);
    return it == contexts_.end() ? nullptr : it->second;
  }
  CUdevice device_nothrow(int ordinal) const {
    CUdevice dev = 0;
    api_.cuDeviceGet(&dev, ordinal);
    return dev;
  }

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

  Pool& find(PoolHandle handle) {
    auto it = pools_.find(handle);
    if (it == pools_.end())
      throw CudaError("cupool pool lookup", CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "no such pool");
    return it->second;
  }

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

  // The driver's answer alone; build_report (query.cpp) says in words what it means.
  ExportProbe failed(ExportProbe probe, const char* api, CUresult r) {
    probe.ok = false;
    probe.api = api;
    probe.error = error_name(r);
    probe.description = error_string(r);
    return probe;
  }

  CUdevice device(int ordinal) {
    CUdevice dev = 0;
    check(api_.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
    return dev;
  }

  std::string device_info_uuid(int ordinal) {
    CUuuid uuid;
    check(api_.cuDeviceGetUuid(&uuid, device(ordinal)), "cuDeviceGetUuid");
    return format_uuid(uuid);
  }

  int attribute(CUdevice dev, CUdevice_attribute attr) {
    int v = 0;
    check(api_.cuDeviceGetAttribute(&v, attr, dev), "cuDeviceGetAttribute");
    return v;
  }

  // Attributes newer than some drivers: an older driver answers INVALID_VALUE, which means "no".
  int attribute_or(CUdevice dev, CUdevice_attribute attr, int fallback) {
    int v = 0;
    const CUresult r = api_.cuDeviceGetAttribute(&v, attr, dev);
    if (r == CUDA_ERROR_INVALID_VALUE) return fallback;
    check(r, "cuDeviceGetAttribute");
    return v;
  }
  int attribute_or_zero(CUdevice dev, CUdevice_attribute attr) { return attribute_or(dev, attr, 0); }

  static std::string format_uuid(const CUuuid& uuid) {
    const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
    char buf[64];
    std::snprintf(buf, sizeof buf, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                  b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return buf;
  }

  std::string error_name(CUresult r) const {
    const char* name = nullptr;
    if (api_.cuGetErrorName && api_.cuGetErrorName(r, &name) == CUDA_SUCCESS && name) return name;
    return "CUresult " + std::to_string(static_cast<int>(r));
  }
  std::string error_string(CUresult r) const {
    const char* text = nullptr;
    if (api_.cuGetErrorString && api_.cuGetErrorString(r, &text) == CUDA_SUCCESS && text) return text;
    return "";
  }

  void check(CUresult r, const char* api) const {
    if (r != CUDA_SUCCESS) throw CudaError(api, static_cast<int>(r), error_name(r), error_string(r));
  }

  bool nvml_ready() {
    std::call_once(nvml_once_, [this] { load_nvml(); });
    return nvml_ready_;
  }

  void load_nvml() {
    nvml_lib_ = std::make_unique<Library>("libnvidia-ml.so.1");
    if (!nvml_lib_->loaded()) return;
    nvml_.init = reinterpret_cast<int (*)()>(nvml_lib_->symbol("nvmlInit_v2"));
    nvml_.shutdown = reinterpret_cast<int (*)()>(nvml_lib_->symbol("nvmlShutdown"));
    nvml_.by_uuid = reinterpret_cast<int (*)(const char*, NvmlDevice*)>(nvml_lib_->symbol("nvmlDeviceGetHandleByUUID"));
    nvml_.memory = reinterpret_cast<int (*)(NvmlDevice, NvmlMemory*)>(nvml_lib_->symbol("nvmlDeviceGetMemoryInfo"));
    nvml_.driver_version = reinterpret_cast<int (*)(char*, unsigned)>(nvml_lib_->symbol("nvmlSystemGetDriverVersion"));
    nvml_ready_ = nvml_.init && nvml_.shutdown && nvml_.by_uuid && nvml_.memory && nvml_.init() == 0;
  }

  // A step of a probe, for --log-level debug.
  void debug(const char* type, int ordinal, const char* step) const {
    if (debug_) debug_(std::string("probe ") + type + " on GPU " + std::to_string(ordinal) + ": " + step);
  }

  DebugLog debug_;
  std::unique_ptr<Library> cuda_;
  std::unique_ptr<Library> nvml_lib_;
  DriverApi api_;
  NvmlApi nvml_;
  std::map<int, CUcontext> contexts_;
  std::map<PoolHandle, Pool> pools_;
  // Exported allocations mapped here (create_exported, map_exported): address -> the device whose
  // context mapped it, and its size.
  struct Mapping {
    int device = 0;
    std::uint64_t size = 0;
  };
  std::map<std::uint64_t, Mapping> mappings_;
  std::map<int, DeviceState> device_states_;
  std::map<Blob64, OpenedEvent> opened_events_;
  PoolHandle last_handle_ = 0;
  std::once_flag nvml_once_;
  bool nvml_ready_ = false;  // set once, in nvml_ready()
  bool initialised_ = false;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(DebugLog debug) { return std::make_unique<CudaBackend>(std::move(debug)); }

}  // namespace cupool
