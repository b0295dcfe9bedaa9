/* A stand-in for libcuda.so.1 in the exec test (no GPU in CI), built as libcuda.so.1 in the test's
 * build directory (found by path, never by the library search), with the driver's signatures:
 * cuInit, counting the initialisations it gets, and cuGetProcAddress(_v2); and a small simulated
 * node for the budget test: 2 devices of 16 GiB with fixed UUIDs, a current device (primary
 * context of device 0 after cuInit; cuCtxSetCurrent or fake_cuda_set_device switch), the memory
 * figures (cuMemGetInfo_v2, cuDeviceTotalMem_v2) from what it has handed out, and the allocation
 * and free entry points handing out fake addresses, counting per device (fake_cuda_used,
 * fake_cuda_peak) and failing with CUDA_ERROR_OUT_OF_MEMORY when a device is full; with
 * FAKE_CUDA_LATENCY_US set, each allocation takes that long before it is made, as the driver's
 * do (so threads that race past a budget would show in the peak).
 *
 * cuGetProcAddress answers with the library's own definitions (hidden aliases, as the driver's
 * own table does), except for cuInit and cuGetProcAddress, whose addresses go through the GOT and
 * so may be the preload's (the case the preload's swap_entry handles). Nothing here calls another
 * exported entry point: the preload defines some of them too. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOCAL(name) extern __typeof(name) local_##name __attribute__((alias(#name), visibility("hidden")));

typedef unsigned long long CUdeviceptr;
typedef struct {
  int type; /* CU_MEM_LOCATION_TYPE_DEVICE: 1 */
  int id;
} MemLocation;
typedef struct { /* the head of CUmemAllocationProp and of CUmemPoolProps */
  int type;
  int handle_types;
  MemLocation location;
} MemoryHead;

enum { kDevices = 2, kRecords = 1 << 16 };
static const unsigned long long kTotal = 16ull << 30;
static const unsigned char kUuids[kDevices][16] = {
    /* device 0 is the bundled H100's (configs/profiles/h100.yaml), so a simulated holder of that
     * profile grants budgets this stand-in's processes find (budget_holder_test.py) */
    {0xe8, 0x86, 0xb2, 0x79, 0x2f, 0x4c, 0x84, 0xd2, 0x1f, 0x32, 0x11, 0xa9, 0xc2, 0x32, 0x57, 0xb7},
    {0x8d, 0x1c, 0x6a, 0x3e, 0x0c, 0x11, 0x4e, 0x4e, 0x9f, 0x1e, 0x1c, 0x2d, 0x3e, 0x4f, 0x5a, 0x6c}};

static int init_calls = 0;
static int current = 0;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long used[kDevices], peak[kDevices];
static unsigned long long next_key = 0x7f0000000000ull;
static struct {
  unsigned long long key, bytes;
  int device;
} records[kRecords];

static long latency_us = 0;

static int init_driver(void) {
  const char* latency = getenv("FAKE_CUDA_LATENCY_US");
  latency_us = latency ? atol(latency) : 0;
  ++init_calls;
  return 0;
}

int cuInit(unsigned int flags) {
  (void)flags;
  return init_driver();
}

/* A library that initialises the driver in a way nobody outside sees (not through cuInit). */
int fake_cuda_init_hidden(void) { return init_driver(); }

/* CUDA_ERROR_NOT_INITIALIZED (3) until initialised, as the driver. */
int cuDeviceGetCount(int* count) {
  if (init_calls == 0) return 3;
  *count = kDevices;
  return 0;
}
LOCAL(cuDeviceGetCount)

int fake_cuda_init_calls(void) { return init_calls; }

int cuDeviceGet(int* device, int ordinal) {
  if (init_calls == 0) return 3;
  if (ordinal < 0 || ordinal >= kDevices) return 101; /* CUDA_ERROR_INVALID_DEVICE */
  *device = ordinal;
  return 0;
}
LOCAL(cuDeviceGet)

static int uuid_of(unsigned char* uuid, int device) {
  if (init_calls == 0) return 3;
  if (device < 0 || device >= kDevices) return 101;
  memcpy(uuid, kUuids[device], 16);
  return 0;
}
int cuDeviceGetUuid(unsigned char* uuid, int device) { return uuid_of(uuid, device); }
LOCAL(cuDeviceGetUuid)
int cuDeviceGetUuid_v2(unsigned char* uuid, int device) { return uuid_of(uuid, device); }
LOCAL(cuDeviceGetUuid_v2)

int cuCtxGetDevice(int* device) {
  if (init_calls == 0) return 3;
  *device = current;
  return 0;
}
LOCAL(cuCtxGetDevice)

/* A context is its device + 1 here. */
int cuCtxSetCurrent(void* context) {
  const intptr_t device = (intptr_t)context - 1;
  if (device < 0 || device >= kDevices) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
  current = (int)device;
  return 0;
}
LOCAL(cuCtxSetCurrent)

void fake_cuda_set_device(int device) { current = device; }
unsigned long long fake_cuda_used(int device) { return used[device]; }
unsigned long long fake_cuda_peak(int device) { return peak[device]; }

int cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (init_calls == 0) return 3;
  pthread_mutex_lock(&mu);
  *free = kTotal - used[current];
  *total = kTotal;
  pthread_mutex_unlock(&mu);
  return 0;
}
LOCAL(cuMemGetInfo_v2)

int cuDeviceTotalMem_v2(size_t* bytes, int device) {
  if (device < 0 || device >= kDevices) return 101;
  *bytes = kTotal;
  return 0;
}
LOCAL(cuDeviceTotalMem_v2)

/* An allocation of `bytes` on `device`: a new key (address or handle) recorded, or out of memory. */
static int take(int device, unsigned long long bytes, unsigned long long* key) {
  if (init_calls == 0) return 3;
  if (!key || bytes == 0) return 1; /* CUDA_ERROR_INVALID_VALUE */
  if (device < 0 || device >= kDevices) return 101;
  if (latency_us > 0) {
    struct timespec t = {latency_us / 1000000, (latency_us % 1000000) * 1000};
    nanosleep(&t, NULL);
  }
  int rc = 2;
  pthread_mutex_lock(&mu);
  if (bytes <= kTotal - used[device]) {
    for (int i = 0; i < kRecords; ++i)
      if (records[i].key == 0) {
        records[i].key = next_key;
        records[i].bytes = bytes;
        records[i].device = device;
        *key = next_key;
        next_key += (bytes + 0xfffff) & ~0xfffffull;
        used[device] += bytes;
        if (used[device] > peak[device]) peak[device] = used[device];
        rc = 0;
        break;
      }
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

static int give(unsigned long long key) {
  int rc = 1;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < kRecords; ++i)
    if (key != 0 && records[i].key == key) {
      used[records[i].device] -= records[i].bytes;
      records[i].key = 0;
      rc = 0;
      break;
    }
  pthread_mutex_unlock(&mu);
  return rc;
}

int cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) { return take(current, bytesize, dptr); }
LOCAL(cuMemAlloc_v2)

/* The v1 entry point: 32-bit address and size. */
int cuMemAlloc(unsigned int* dptr, unsigned int bytesize) {
  unsigned long long key = 0;
  const int rc = take(current, bytesize, &key);
  if (rc == 0) *dptr = (unsigned int)key;
  return rc;
}
LOCAL(cuMemAlloc)

int cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height, unsigned int element_size) {
  (void)element_size;
  if (!pitch) return 1;
  *pitch = (width + 511) & ~(size_t)511;
  return take(current, (unsigned long long)*pitch * height, dptr);
}
LOCAL(cuMemAllocPitch_v2)

int cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  (void)flags;
  return take(current, bytesize, dptr);
}
LOCAL(cuMemAllocManaged)

int cuMemCreate(unsigned long long* handle, size_t size, const MemoryHead* prop, unsigned long long flags) {
  (void)flags;
  if (!prop || prop->location.type != 1) return 1;
  return take(prop->location.id, size, handle);
}
LOCAL(cuMemCreate)

int cuMemRelease(unsigned long long handle) { return give(handle); }
LOCAL(cuMemRelease)

int cuMemFree_v2(CUdeviceptr dptr) { return give(dptr); }
LOCAL(cuMemFree_v2)

int cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, void* stream) {
  (void)stream;
  return take(current, bytesize, dptr);
}
LOCAL(cuMemAllocAsync)
int cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, void* stream) {
  (void)stream;
  return take(current, bytesize, dptr);
}
LOCAL(cuMemAllocAsync_ptsz)

/* A pool is its device + 1 here. */
int cuMemPoolCreate(void** pool, const MemoryHead* props) {
  if (!pool || !props || props->location.type != 1 || props->location.id < 0 || props->location.id >= kDevices)
    return 1;
  *pool = (void*)(intptr_t)(props->location.id + 1);
  return 0;
}
LOCAL(cuMemPoolCreate)

int cuMemPoolDestroy(void* pool) {
  (void)pool;
  return 0;
}
LOCAL(cuMemPoolDestroy)

static int from_pool(CUdeviceptr* dptr, size_t bytesize, void* pool) {
  return take((int)((intptr_t)pool - 1), bytesize, dptr);
}
int cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, void* pool, void* stream) {
  (void)stream;
  return from_pool(dptr, bytesize, pool);
}
LOCAL(cuMemAllocFromPoolAsync)
int cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, void* pool, void* stream) {
  (void)stream;
  return from_pool(dptr, bytesize, pool);
}
LOCAL(cuMemAllocFromPoolAsync_ptsz)

int cuMemFreeAsync(CUdeviceptr dptr, void* stream) {
  (void)stream;
  return give(dptr);
}
LOCAL(cuMemFreeAsync)
int cuMemFreeAsync_ptsz(CUdeviceptr dptr, void* stream) {
  (void)stream;
  return give(dptr);
}
LOCAL(cuMemFreeAsync_ptsz)

int cuGetProcAddress(const char* symbol, void** pfn, int version, uint64_t flags);
int cuGetProcAddress_v2(const char* symbol, void** pfn, int version, uint64_t flags, void* status);

/* What cuGetProcAddress finds, as the driver's table: the base name, the oldest version that gets
 * this entry point, the per-thread default stream variant (flags & 2) or not. */
static const struct {
  const char* name;
  int since;
  int ptds;
  void* fn;
} kTable[] = {
    {"cuDeviceGetCount", 2000, 0, (void*)&local_cuDeviceGetCount},
    {"cuDeviceGet", 2000, 0, (void*)&local_cuDeviceGet},
    {"cuDeviceGetUuid", 11040, 0, (void*)&local_cuDeviceGetUuid_v2},
    {"cuDeviceGetUuid", 9020, 0, (void*)&local_cuDeviceGetUuid},
    {"cuCtxGetDevice", 2000, 0, (void*)&local_cuCtxGetDevice},
    {"cuCtxSetCurrent", 4000, 0, (void*)&local_cuCtxSetCurrent},
    {"cuMemGetInfo", 3020, 0, (void*)&local_cuMemGetInfo_v2},
    {"cuDeviceTotalMem", 3020, 0, (void*)&local_cuDeviceTotalMem_v2},
    {"cuMemAlloc", 3020, 0, (void*)&local_cuMemAlloc_v2},
    {"cuMemAlloc", 2000, 0, (void*)&local_cuMemAlloc},
    {"cuMemAllocPitch", 3020, 0, (void*)&local_cuMemAllocPitch_v2},
    {"cuMemAllocManaged", 6000, 0, (void*)&local_cuMemAllocManaged},
    {"cuMemCreate", 10020, 0, (void*)&local_cuMemCreate},
    {"cuMemRelease", 10020, 0, (void*)&local_cuMemRelease},
    {"cuMemFree", 3020, 0, (void*)&local_cuMemFree_v2},
    {"cuMemAllocAsync", 11020, 1, (void*)&local_cuMemAllocAsync_ptsz},
    {"cuMemAllocAsync", 11020, 0, (void*)&local_cuMemAllocAsync},
    {"cuMemAllocFromPoolAsync", 11020, 1, (void*)&local_cuMemAllocFromPoolAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 11020, 0, (void*)&local_cuMemAllocFromPoolAsync},
    {"cuMemFreeAsync", 11020, 1, (void*)&local_cuMemFreeAsync_ptsz},
    {"cuMemFreeAsync", 11020, 0, (void*)&local_cuMemFreeAsync},
    {"cuMemPoolCreate", 11020, 0, (void*)&local_cuMemPoolCreate},
    {"cuMemPoolDestroy", 11020, 0, (void*)&local_cuMemPoolDestroy},
};

int cuGetProcAddress_v2(const char* symbol, void** pfn, int version, uint64_t flags, void* status) {
  if (status) memset(status, 0, sizeof(int));
  if (strcmp(symbol, "cuInit") == 0) {
    *pfn = (void*)&cuInit;
    return 0;
  }
  if (strcmp(symbol, "cuGetProcAddress") == 0) {
    *pfn = version >= 12000 ? (void*)&cuGetProcAddress_v2 : (void*)&cuGetProcAddress;
    return 0;
  }
  const int ptds = (flags & 2) != 0; /* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */
  for (size_t i = 0; i < sizeof kTable / sizeof kTable[0]; ++i)
    if (strcmp(symbol, kTable[i].name) == 0 && version >= kTable[i].since && (kTable[i].ptds == 0 || ptds)) {
      *pfn = kTable[i].fn;
      return 0;
    }
  *pfn = 0;
  return 500; /* CUDA_ERROR_NOT_FOUND */
}

int cuGetProcAddress(const char* symbol, void** pfn, int version, uint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, 0);
}
