// The budget inside the process: the driver's and NVML's entry points the preload wraps when
// CUPOOL_EXEC_BUDGET is in force, and what they answer. Without a budget nothing here is handed
// out and the exported names below pass straight through to the real ones.
//
// How the wrappers reach the program. Each is exported from the preload under the entry point's
// own name (programs linked against libcuda.so.1 or libnvidia-ml.so.1 bind to it), and handed
// out in place of the real one by the dlsym hook (a handle of either library: dlopen + dlsym, as
// pynvml and ctypes do) and by the cuGetProcAddress(_v2) hook (how the CUDA runtime gets every
// driver function, asking for "cuMemAlloc" and getting cuMemAlloc_v2, or the _ptsz variant for
// the per-thread default stream). The rule is the same on both paths: the real entry points are
// resolved once, by their exact versioned names, with the C library's dlsym on the library's
// handle; an answer equal to the real address of a wrapped function gets that function's wrapper,
// any other answer passes through. So a wrapper never stands in for a function of another ABI.
//
// What a budgeted process sees, on a device whose UUID (cuDeviceGetUuid(_v2), nvmlDeviceGetUUID)
// has a budget; other devices pass through untouched:
//   cuMemGetInfo_v2 (the current context's device)  total = budget, free = budget - used (>= 0)
//   cuDeviceTotalMem_v2                               the budget
//   nvmlDeviceGetMemoryInfo(_v2)                      total = budget, used = this process's used,
//                                                     free = budget - used, reserved = 0
// None of it depends on what other processes use.
//
// What is counted, per device, in this process (used, and its peak): cuMemAlloc_v2;
// cuMemAllocPitch_v2 (pitch x height as the driver returns it); cuMemAllocManaged (charged to the
// current context's device, wherever its pages go); cuMemCreate with a device location (charged
// to that device; given back at cuMemRelease of the handle, though the driver keeps the memory
// until it is also unmapped); cuMemAllocAsync and cuMemAllocFromPoolAsync and their _ptsz
// variants (charged to the current context's device, not the stream's; from a pool this process
// made with cuMemPoolCreate, to the pool's device); and back by cuMemFree_v2, cuMemFreeAsync(_ptsz)
// and cuMemRelease. The bytes are reserved before the driver is asked and given back if it fails,
// so threads allocating at once can't take a device past its budget: an allocation that would is
// answered CUDA_ERROR_OUT_OF_MEMORY (2) without the driver being asked. A free of an address the
// account doesn't know (allocated before the budget, imported, on a device without a budget)
// passes through uncounted.
//
// Not charged, by design: imported memory (cuMemImportFromShareableHandle, cuIpcOpenMemHandle,
// cuMemPoolImportPointer): a held set a process maps must not cost it budget; nor what the
// preload's own cupool_configure makes (its lookups bypass the hooks).
//
// What escapes the budget:
//   - the v1 entry points with `unsigned int` sizes (cuMemAlloc, cuMemAllocPitch, cuMemFree,
//     cuMemGetInfo, cuDeviceTotalMem, as dlsym names or through cuGetProcAddress asked for a
//     version before 3.2): not wrapped, they allocate uncounted and answer the device's figures;
//   - arrays and mipmapped arrays (cuArrayCreate, cuArray3DCreate, cuMipmappedArrayCreate),
//     host memory (cuMemAllocHost, cuMemHostAlloc);
//   - graph memory: memory nodes (cuGraphAddMemAllocNode) and what a captured graph allocates when
//     it is launched (a cuMemAllocAsync during stream capture is charged once, at capture, and
//     given back by the captured free);
//   - a pool's reserve: what a pool keeps cached after cuMemFreeAsync (up to its release
//     threshold) above what is allocated from it, and the driver's own memory (contexts, modules,
//     local memory): so nvidia-smi may show the process above its budget;
//   - a program that reaches a copy of the driver these hooks don't see (dlmopen, RTLD_DEEPBIND,
//     its own loader), statically linked and set-user-ID programs (no LD_PRELOAD), and, on
//     architectures other than x86-64 (no dlsym hook), every program not linked against the
//     libraries;
//   - MIG devices (UUIDs MIG-...), which CUPOOL_EXEC_BUDGET can't name.
#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <unordered_map>

#include "preload/budget.h"

// The C library's dlsym (preload.cpp): lookups here must not go through the hook.
extern "C" void* cupool_resolve_dlsym();

// The driver's and NVML's ABI, declared by hand (only device/cuda/ includes cuda.h).
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUmemGenericAllocationHandle = unsigned long long;
using CUstream = void*;
using CUmemoryPool = void*;
struct CUmemLocation {
  int type;  // CU_MEM_LOCATION_TYPE_DEVICE is 1
  int id;
};
struct CUmemAllocationProp;  // its first fields: type, requestedHandleTypes, location (MemoryHead)
struct CUmemPoolProps;       // its first fields: allocType, handleTypes, location (MemoryHead)
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlMemory_v2_t {
  unsigned int version;
  unsigned long long total, reserved, free, used;
};

#define CUPOOL_EXPORT extern "C" __attribute__((visibility("default")))

CUPOOL_EXPORT CUresult cuMemGetInfo_v2(size_t* available, size_t* total);
CUPOOL_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev);
CUPOOL_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize);
CUPOOL_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                          unsigned int element_size);
CUPOOL_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags);
CUPOOL_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                                   unsigned long long flags);
CUPOOL_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUPOOL_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
CUPOOL_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
CUPOOL_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream);
CUPOOL_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                    CUstream stream);
CUPOOL_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr);
CUPOOL_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUPOOL_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUPOOL_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props);
CUPOOL_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUPOOL_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory);
CUPOOL_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory);

namespace cupool::preload {

namespace {

constexpr CUresult kSuccess = 0;
constexpr CUresult kInvalidValue = 1;
constexpr CUresult kOutOfMemory = 2;
constexpr CUresult kNotInitialized = 3;
constexpr nvmlReturn_t kNvmlUninitialized = 1;
constexpr int kLocationDevice = 1;

// CUmemAllocationProp and CUmemPoolProps both begin with two enums and the location.
struct MemoryHead {
  int type;
  int handle_types;
  CUmemLocation location;
};

void debug(const std::string& what) {
  const char* v = std::getenv("CUPOOL_EXEC_DEBUG");
  if (v && std::strcmp(v, "1") == 0)
    std::fprintf(stderr, "cupool exec: [pid %d] %s\n", static_cast<int>(::getpid()), what.c_str());
}

void* library_symbol(void* handle, const char* name) {
  using DlsymFn = void* (*)(void*, const char*);
  auto f = reinterpret_cast<DlsymFn>(cupool_resolve_dlsym());
  return f ? f(handle, name) : nullptr;
}

// The entry points of one library that this file wraps (a wrapper) or uses (none), resolved once
// by name from the library's handle: the first handle a wrapped name is looked up on, or else the
// loaded library of that soname (a program linked against it). Never freed.
class EntryPoints {
 public:
  struct Entry {
    const char* name;
    void* wrapper;  // null: used here, not wrapped
    bool required;  // a library without it is not the one (a wrapped one may be missing: an older driver)
  };
  EntryPoints(const char* soname, std::vector<Entry> entries) : soname_(soname), entries_(std::move(entries)) {
    if (entries_.size() > kMax) std::abort();  // a programming error: kMax is too small
    for (std::size_t i = 0; i < entries_.size(); ++i) real_[i].store(nullptr);
  }

  // Resolves the entry points from `handle`, unless done already. A handle that lacks a required
  // one is not the library; one that answers with a wrapper of ours (the program's own handle,
  // where the preload comes first) can't give the real ones.
  void adopt(void* handle) {
    if (!handle || resolved_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (resolved_.load()) return;
    std::array<void*, kMax> found{};
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      found[i] = library_symbol(handle, entries_[i].name);
      if ((!found[i] && entries_[i].required) || ours(found[i])) return;
    }
    for (std::size_t i = 0; i < entries_.size(); ++i) real_[i].store(found[i]);
    resolved_.store(true, std::memory_order_release);
    debug(std::string("budget: the real entry points of ") + soname_ + " resolved");
  }

  // The real entry point `i`, null when the library isn't loaded.
  void* real(std::size_t i) {
    if (!resolved_.load(std::memory_order_acquire)) {
      void* loaded = ::dlopen(soname_, RTLD_NOW | RTLD_NOLOAD);  // kept open: the pointers must stay valid
      adopt(loaded);
      if (!resolved_.load(std::memory_order_acquire)) return nullptr;
    }
    return real_[i].load(std::memory_order_relaxed);
  }

  [[nodiscard]] bool wraps(const char* name) const {
    for (const Entry& e : entries_)
      if (e.wrapper && std::strcmp(e.name, name) == 0) return true;
    return false;
  }

  // The wrapper of the entry point at address `answer`, else `answer`.
  void* swap(void* answer) const {
    if (!answer || !resolved_.load(std::memory_order_acquire)) return answer;
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].wrapper && real_[i].load(std::memory_order_relaxed) == answer) {
        debug(std::string("budget: handed out the wrapper of ") + entries_[i].name);
        return entries_[i].wrapper;
      }
    return answer;
  }

 private:
  static constexpr std::size_t kMax = 32;
  [[nodiscard]] bool ours(void* f) const {
    for (const Entry& e : entries_)
      if (e.wrapper == f) return true;
    return false;
  }
  const char* soname_;
  std::vector<Entry> entries_;
  std::array<std::atomic<void*>, kMax> real_;
  std::atomic<bool> resolved_{false};
  std::mutex mu_;
};

#define CUPOOL_WRAPPED(name) \
  EntryPoints::Entry { #name, reinterpret_cast < void*>(&::name), false }
#define CUPOOL_USED(name, required) \
  EntryPoints::Entry { #name, nullptr, required }

// The driver's entry points, in the order of Cu.
enum class Cu : std::size_t {
  mem_get_info,
  device_total_mem,
  mem_alloc,
  mem_alloc_pitch,
  mem_alloc_managed,
  mem_create,
  mem_release,
  mem_alloc_async,
  mem_alloc_async_ptsz,
  mem_alloc_from_pool_async,
  mem_alloc_from_pool_async_ptsz,
  mem_free,
  mem_free_async,
  mem_free_async_ptsz,
  mem_pool_create,
  mem_pool_destroy,
  device_get_count,
  device_get,
  device_get_uuid_v2,
  device_get_uuid,
  ctx_get_device,
};

EntryPoints& cuda() {
  static EntryPoints* const entries = new EntryPoints("libcuda.so.1", {CUPOOL_WRAPPED(cuMemGetInfo_v2),
                                                                       CUPOOL_WRAPPED(cuDeviceTotalMem_v2),
                                                                       CUPOOL_WRAPPED(cuMemAlloc_v2),
                                                                       CUPOOL_WRAPPED(cuMemAllocPitch_v2),
                                                                       CUPOOL_WRAPPED(cuMemAllocManaged),
                                                                       CUPOOL_WRAPPED(cuMemCreate),
                                                                       CUPOOL_WRAPPED(cuMemRelease),
                                                                       CUPOOL_WRAPPED(cuMemAllocAsync),
                                                                       CUPOOL_WRAPPED(cuMemAllocAsync_ptsz),
                                                                       CUPOOL_WRAPPED(cuMemAllocFromPoolAsync),
                                                                       CUPOOL_WRAPPED(cuMemAllocFromPoolAsync_ptsz),
                                                                       CUPOOL_WRAPPED(cuMemFree_v2),
                                                                       CUPOOL_WRAPPED(cuMemFreeAsync),
                                                                       CUPOOL_WRAPPED(cuMemFreeAsync_ptsz),
                                                                       CUPOOL_WRAPPED(cuMemPoolCreate),
                                                                       CUPOOL_WRAPPED(cuMemPoolDestroy),
                                                                       CUPOOL_USED(cuDeviceGetCount, true),
                                                                       CUPOOL_USED(cuDeviceGet, true),
                                                                       CUPOOL_USED(cuDeviceGetUuid_v2, false),
                                                                       CUPOOL_USED(cuDeviceGetUuid, true),
                                                                       CUPOOL_USED(cuCtxGetDevice, true)});
  return *entries;
}

enum class Nvml : std::size_t { get_memory_info, get_memory_info_v2, get_uuid };

EntryPoints& nvml() {
  static EntryPoints* const entries = new EntryPoints(
      "libnvidia-ml.so.1", {CUPOOL_WRAPPED(nvmlDeviceGetMemoryInfo), CUPOOL_WRAPPED(nvmlDeviceGetMemoryInfo_v2),
                            CUPOOL_USED(nvmlDeviceGetUUID, true)});
  return *entries;
}

// The real entry point `which`, as a pointer of type F (the wrapper's own type for a wrapped one).
template <class F>
F real(Cu which) {
  return reinterpret_cast<F>(cuda().real(static_cast<std::size_t>(which)));
}
template <class F>
F real(Nvml which) {
  return reinterpret_cast<F>(nvml().real(static_cast<std::size_t>(which)));
}

// This process's devices to budget slots (-1: no budget), by UUID: built once the driver answers
// cuDeviceGetCount (after cuInit). A budget that names no device here is said once.
class DeviceSlots {
 public:
  int of(CUdevice device) {
    const std::vector<int>* slots = slots_.load(std::memory_order_acquire);
    if (!slots) slots = build();
    const auto index = static_cast<std::size_t>(device);
    return slots && device >= 0 && index < slots->size() ? (*slots)[index] : -1;
  }

 private:
  const std::vector<int>* build() {
    std::lock_guard<std::mutex> lock(mu_);
    if (const auto* done = slots_.load()) return done;
    auto count = real<CUresult (*)(int*)>(Cu::device_get_count);
    auto get = real<CUresult (*)(CUdevice*, int)>(Cu::device_get);
    using UuidFn = CUresult (*)(unsigned char*, CUdevice);
    auto uuid_of = real<UuidFn>(Cu::device_get_uuid_v2);
    if (!uuid_of) uuid_of = real<UuidFn>(Cu::device_get_uuid);
    int n = 0;
    if (!count || !get || !uuid_of || count(&n) != kSuccess) return nullptr;  // not initialised yet
    Ledger& ledger = *budget();
    auto* slots = new std::vector<int>();  // never freed: read without a lock
    std::vector<bool> matched(static_cast<std::size_t>(ledger.size()), false);
    for (int ordinal = 0; ordinal < n; ++ordinal) {
      CUdevice device = -1;
      unsigned char bytes[16];
      if (get(&device, ordinal) != kSuccess || device < 0 || device >= 4096 || uuid_of(bytes, device) != kSuccess)
        continue;
      const int slot = ledger.slot_of(uuid_text(bytes));
      const auto index = static_cast<std::size_t>(device);
      if (index >= slots->size()) slots->resize(index + 1, -1);
      (*slots)[index] = slot;
      if (slot >= 0) matched[static_cast<std::size_t>(slot)] = true;
    }
    for (int slot = 0; slot < ledger.size(); ++slot)
      if (!matched[static_cast<std::size_t>(slot)])
        std::fprintf(stderr, "cupool exec: pid %d has no device %s (CUDA_VISIBLE_DEVICES?): its budget is unused\n",
                     static_cast<int>(::getpid()), ledger.budget(slot).uuid.c_str());
    slots_.store(slots, std::memory_order_release);
    // The first time the process asks the driver about a device: it uses CUDA, so it is the
    // process of the command that holds the grant (a shell or launcher before it never gets here).
    start_budget();
    return slots;
  }
  std::atomic<const std::vector<int>*> slots_{nullptr};
  std::mutex mu_;
};

DeviceSlots& device_slots() {
  static DeviceSlots* const slots = new DeviceSlots();
  return *slots;
}

// The budget slot of the current context's device; -1 without a context or a budget there.
int current_slot() {
  auto get = real<CUresult (*)(CUdevice*)>(Cu::ctx_get_device);
  CUdevice device = -1;
  if (!get || get(&device) != kSuccess) return -1;
  return device_slots().of(device);
}

// The devices of the pools this process made (cuMemPoolCreate), by pool.
class PoolDevices {
 public:
  void add(CUmemoryPool pool, CUdevice device) {
    std::lock_guard<std::mutex> lock(mu_);
    devices_[pool] = device;
  }
  void remove(CUmemoryPool pool) {
    std::lock_guard<std::mutex> lock(mu_);
    devices_.erase(pool);
  }
  std::optional<CUdevice> of(CUmemoryPool pool) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = devices_.find(pool);
    return it == devices_.end() ? std::nullopt : std::optional<CUdevice>(it->second);
  }

 private:
  std::mutex mu_;
  std::unordered_map<CUmemoryPool, CUdevice> devices_;
};

PoolDevices& pool_devices() {
  static PoolDevices* const pools = new PoolDevices();
  return *pools;
}

// The budget slot of an NVML device, by its UUID (cached by handle).
int nvml_slot(Ledger& ledger, nvmlDevice_t device) {
  static std::mutex mu;
  static auto* const known = new std::unordered_map<nvmlDevice_t, int>();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known->find(device); it != known->end()) return it->second;
  }
  auto get_uuid = real<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int)>(Nvml::get_uuid);
  char uuid[96] = {};
  if (!get_uuid || get_uuid(device, uuid, sizeof uuid) != 0) return -1;
  const int slot = ledger.slot_of(uuid);
  std::lock_guard<std::mutex> lock(mu);
  (*known)[device] = slot;
  return slot;
}

// An allocation charged to `slot` (none: -1): its bytes reserved first, given back if the driver
// fails, recorded under the key the driver wrote to `out` when it succeeds.
template <class Call>
CUresult charged(Ledger* ledger, int slot, std::uint64_t bytes, Ledger::Kind kind, const unsigned long long* out,
                 Call call) {
  if (!ledger || slot < 0) return call();
  if (!ledger->reserve(slot, bytes)) return kOutOfMemory;
  const CUresult rc = call();
  if (rc != kSuccess || !out)
    ledger->give_back(slot, bytes);
  else
    ledger->record(kind, *out, {slot, bytes});
  return rc;
}

// A free: out of the account before the driver frees (the address may be handed out again at
// once), back in it if the driver fails; its bytes given back when the driver succeeds.
template <class Call>
CUresult released(Ledger* ledger, Ledger::Kind kind, std::uint64_t key, Call call) {
  const auto charge = ledger ? ledger->take(kind, key) : std::nullopt;
  const CUresult rc = call();
  if (charge) {
    if (rc == kSuccess)
      ledger->give_back(charge->slot, charge->bytes);
    else
      ledger->record(kind, key, *charge);
  }
  return rc;
}

int pool_slot(Ledger* ledger, CUmemoryPool pool) {
  if (!ledger) return -1;
  const auto device = pool_devices().of(pool);
  return device ? device_slots().of(*device) : current_slot();
}

CUresult alloc_async(Cu which, CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  auto f = real<CUresult (*)(CUdeviceptr*, size_t, CUstream)>(which);
  if (!f) return kNotInitialized;
  Ledger* ledger = budget();
  const int slot = ledger ? current_slot() : -1;
  return charged(ledger, slot, bytesize, Ledger::Kind::address, dptr, [&] { return f(dptr, bytesize, stream); });
}

CUresult alloc_from_pool(Cu which, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {
  auto f = real<CUresult (*)(CUdeviceptr*, size_t, CUmemoryPool, CUstream)>(which);
  if (!f) return kNotInitialized;
  Ledger* ledger = budget();
  return charged(ledger, pool_slot(ledger, pool), bytesize, Ledger::Kind::address, dptr,
                 [&] { return f(dptr, bytesize, pool, stream); });
}

CUresult free_async(Cu which, CUdeviceptr dptr, CUstream stream) {
  auto f = real<CUresult (*)(CUdeviceptr, CUstream)>(which);
  if (!f) return kNotInitialized;
  return released(budget(), Ledger::Kind::address, dptr, [&] { return f(dptr, stream); });
}

// NVML's answer, with the budget's figures on a budgeted device (reserved 0 in the _v2 struct).
template <class Memory>
nvmlReturn_t memory_info(Nvml which, nvmlDevice_t device, Memory* memory) {
  auto f = real<nvmlReturn_t (*)(nvmlDevice_t, Memory*)>(which);
  if (!f) return kNvmlUninitialized;
  const nvmlReturn_t rc = f(device, memory);
  Ledger* ledger = budget();
  const int slot = rc == 0 && ledger && memory ? nvml_slot(*ledger, device) : -1;
  if (slot >= 0) {
    memory->total = ledger->budget(slot).bytes;
    memory->used = ledger->used(slot);
    memory->free = ledger->left(slot);
    if constexpr (std::is_same_v<Memory, nvmlMemory_v2_t>) memory->reserved = 0;
  }
  return rc;
}

}  // namespace

void* budget_dlsym_entry(void* handle, const char* name, void* answer) {
  if (cuda().wraps(name)) cuda().adopt(handle);
  if (nvml().wraps(name)) nvml().adopt(handle);
  return nvml().swap(cuda().swap(answer));
}

void* budget_getproc_entry(void* driver, void* answer) {
  cuda().adopt(driver);
  return cuda().swap(answer);
}

}  // namespace cupool::preload

using cupool::preload::budget;
using cupool::preload::Cu;
using cupool::preload::Ledger;
using cupool::preload::Nvml;
using cupool::preload::real;

CUresult cuMemGetInfo_v2(size_t* available, size_t* total) {
  auto f = real<decltype(&cuMemGetInfo_v2)>(Cu::mem_get_info);
  if (!f) return cupool::preload::kNotInitialized;
  Ledger* ledger = budget();
  const int slot = ledger ? cupool::preload::current_slot() : -1;
  if (slot < 0) return f(available, total);
  if (!available || !total) return cupool::preload::kInvalidValue;
  *total = ledger->budget(slot).bytes;
  *available = ledger->left(slot);
  return cupool::preload::kSuccess;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  auto f = real<decltype(&cuDeviceTotalMem_v2)>(Cu::device_total_mem);
  if (!f) return cupool::preload::kNotInitialized;
  Ledger* ledger = budget();
  const int slot = ledger ? cupool::preload::device_slots().of(dev) : -1;
  if (slot < 0) return f(bytes, dev);
  if (!bytes) return cupool::preload::kInvalidValue;
  *bytes = ledger->budget(slot).bytes;
  return cupool::preload::kSuccess;
}

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  auto f = real<decltype(&cuMemAlloc_v2)>(Cu::mem_alloc);
  if (!f) return cupool::preload::kNotInitialized;
  Ledger* ledger = budget();
  const int slot = ledger ? cupool::preload::current_slot() : -1;
  return cupool::preload::charged(ledger, slot, bytesize, Ledger::Kind::address, dptr,
                                  [&] { return f(dptr, bytesize); });
}

// The pitch is the driver's choice: width x height is reserved first, what pitch x height adds
// after; an allocation the addition doesn't fit is freed again and answered out of memory.
CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height, unsigned int element_size) {
  auto f = real<decltype(&cuMemAllocPitch_v2)>(Cu::mem_alloc_pitch);
  if (!f) return cupool::preload::kNotInitialized;
  Ledger* ledger = budget();
  const int slot = ledger ? cupool::preload::current_slot() : -1;
  if (slot < 0) return f(dptr, pitch, width, height, element_size);
  if (height != 0 && width > SIZE_MAX / height) return cupool::preload::kOutOfMemory;
  const std::uint64_t least = static_cast<std::uint64_t>(width) * height;
  if (!ledger->reserve(slot, least)) return cupool::preload::kOutOfMemory;
  const CUresult rc = f(dptr, pitch, width, height, element_size);
  if (rc != cupool::preload::kSuccess || !dptr || !pitch) {
    ledger->give_back(slot, least);
    return rc;
  }
  const std::uint64_t bytes = static_cast<std::uint64_t>(*pitch) * height;
  if (bytes > least && !ledger->reserve(slot, bytes - least)) {
    if (auto release = real<decltype(&cuMemFree_v2)>(Cu::mem_free)) release(*dptr);
    ledger->give_back(slot, least);
    return cupool::preload::kOutOfMemory;
  }
  if (bytes < least) ledger->give_back(slot, least - bytes);
  ledger->record(Ledger::Kind::address, *dptr, {slot, bytes});
  return rc;
}

CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  auto f = real<decltype(&cuMemAllocManaged)>(Cu::mem_alloc_managed);
  if (!f) return cupool::preload::kNotInitialized;
  Ledger* ledger = budget();
  const int slot = ledger ? cupool::preload::current_slot() : -1;
  return cupool::preload::charged(ledger, slot, bytesize, Ledger::Kind::address, dptr,
                                  [&] { return f(dptr, bytesize, flags); });
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
  auto f = real<decltype(&cuMemCreate)>(Cu::mem_create);
  if (!f) return cupool::preload::kNotInitialized;
  Ledger* ledger = budget();
  const auto* head = reinterpret_cast<const cupool::preload::MemoryHead*>(prop);
  const int slot = ledger && head && head->location.type == cupool::preload::kLocationDevice
                       ? cupool::preload::device_slots().of(head->location.id)
                       : -1;
  return cupool::preload::charged(ledger, slot, size, Ledger::Kind::handle, handle,
                                  [&] { return f(handle, size, prop, flags); });
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  auto f = real<decltype(&cuMemRelease)>(Cu::mem_release);
  if (!f) return cupool::preload::kNotInitialized;
  return cupool::preload::released(budget(), Ledger::Kind::handle, handle, [&] { return f(handle); });
}

CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return cupool::preload::alloc_async(Cu::mem_alloc_async, dptr, bytesize, stream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return cupool::preload::alloc_async(Cu::mem_alloc_async_ptsz, dptr, bytesize, stream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {
  return cupool::preload::alloc_from_pool(Cu::mem_alloc_from_pool_async, dptr, bytesize, pool, stream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {
  return cupool::preload::alloc_from_pool(Cu::mem_alloc_from_pool_async_ptsz, dptr, bytesize, pool, stream);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  auto f = real<decltype(&cuMemFree_v2)>(Cu::mem_free);
  if (!f) return cupool::preload::kNotInitialized;
  return cupool::preload::released(budget(), Ledger::Kind::address, dptr, [&] { return f(dptr); });
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  return cupool::preload::free_async(Cu::mem_free_async, dptr, stream);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  return cupool::preload::free_async(Cu::mem_free_async_ptsz, dptr, stream);
}

CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  auto f = real<decltype(&cuMemPoolCreate)>(Cu::mem_pool_create);
  if (!f) return cupool::preload::kNotInitialized;
  const CUresult rc = f(pool, props);
  const auto* head = reinterpret_cast<const cupool::preload::MemoryHead*>(props);
  if (rc == cupool::preload::kSuccess && budget() && pool && head &&
      head->location.type == cupool::preload::kLocationDevice)
    cupool::preload::pool_devices().add(*pool, head->location.id);
  return rc;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  auto f = real<decltype(&cuMemPoolDestroy)>(Cu::mem_pool_destroy);
  if (!f) return cupool::preload::kNotInitialized;
  if (budget()) cupool::preload::pool_devices().remove(pool);
  return f(pool);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  return cupool::preload::memory_info(Nvml::get_memory_info, device, memory);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  return cupool::preload::memory_info(Nvml::get_memory_info_v2, device, memory);
}
