/* The program the exec test's budget checks run with the preload library: it reaches the stand-in
 * driver (fake_cuda.c) and NVML (fake_nvml.c) the ways real programs do (dlopen + dlsym; the CUDA
 * runtime's cuGetProcAddress_v2 with "cuMemAlloc", "cuMemGetInfo", ...; pynvml's dlopen + dlsym of
 * libnvidia-ml.so.1) and prints what it saw, one JSON object a line per command:
 *
 *   budget_probe CUDA_LIB NVML_LIB COMMAND...
 *     where                 which library each lookup's answer lies in (the preload: a wrapper)
 *     view                  the memory figures through every path, and what the driver handed out
 *     device:D              makes device D's context current (cuCtxSetCurrent)
 *     alloc:WAY:BYTES       one allocation, kept: WAY is v2 (dlsym cuMemAlloc_v2), getproc
 *                           ("cuMemAlloc"), pitch (width BYTES, height 4), managed, create0,
 *                           create1 (cuMemCreate on device 0 or 1), async, async_ptsz, pool0 (a
 *                           pool made on device 0, cuMemAllocFromPoolAsync_ptsz), v1 (the
 *                           unsigned-int cuMemAlloc, never freed)
 *     free                  frees the last allocation kept, the way that matches how it was made
 *     freeall               frees them all
 *     fill:WAY:BYTES:MAX    allocates until one fails (at most MAX), then frees them
 *     threads:N:BYTES:EACH  N threads each allocate BYTES EACH times at once, then free
 *     sleep:MS              waits
 *     bench:N               N pairs of cuMemAlloc (1 MiB) and cuMemFree: the nanoseconds a pair */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef unsigned long long CUdeviceptr;
typedef int (*getproc_fn)(const char*, void**, int, uint64_t, void*);
typedef int (*init_fn)(unsigned int);
typedef int (*getinfo_fn)(size_t*, size_t*);
typedef int (*totalmem_fn)(size_t*, int);
typedef int (*alloc_fn)(CUdeviceptr*, size_t);
typedef int (*alloc1_fn)(unsigned int*, unsigned int);
typedef int (*pitch_fn)(CUdeviceptr*, size_t*, size_t, size_t, unsigned int);
typedef int (*managed_fn)(CUdeviceptr*, size_t, unsigned int);
typedef int (*create_fn)(unsigned long long*, size_t, const void*, unsigned long long);
typedef int (*release_fn)(unsigned long long);
typedef int (*async_fn)(CUdeviceptr*, size_t, void*);
typedef int (*pool_alloc_fn)(CUdeviceptr*, size_t, void*, void*);
typedef int (*pool_create_fn)(void**, const void*);
typedef int (*free_fn)(CUdeviceptr);
typedef int (*free_async_fn)(CUdeviceptr, void*);
typedef int (*set_current_fn)(void*);
typedef unsigned long long (*counter_fn)(int);
typedef struct {
  unsigned long long total, free, used;
} nvml_memory;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvml_memory_v2;

static void* cuda;
static void* nvml;
static getproc_fn getproc;

static void* open_lib(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    printf("{\"error\": \"%s\"}\n", dlerror());
    exit(1);
  }
  return lib;
}

/* The runtime's way: cuGetProcAddress_v2 at CUDA 12.0, flags 2 for the per-thread default stream. */
static void* proc(const char* name, int version, uint64_t flags) {
  void* fn = NULL;
  int status = 0;
  if (getproc(name, &fn, version, flags, &status) != 0) return NULL;
  return fn;
}

static const char* where(void* fn) {
  Dl_info info;
  if (!fn || !dladdr(fn, &info) || !info.dli_fname) return "none";
  if (strstr(info.dli_fname, "cupool-preload")) return "preload";
  if (strstr(info.dli_fname, "libcuda")) return "driver";
  if (strstr(info.dli_fname, "nvidia-ml")) return "nvml";
  return "other";
}

static void print_where(void) {
  printf(
      "{\"cmd\": \"where\", \"dlsym cuMemAlloc_v2\": \"%s\", \"dlsym cuMemGetInfo_v2\": \"%s\", "
      "\"dlsym cuDeviceTotalMem_v2\": \"%s\", \"dlsym cuMemFree_v2\": \"%s\", \"dlsym cuMemAlloc\": \"%s\", "
      "\"dlsym cuDeviceGet\": \"%s\", \"getproc cuMemAlloc\": \"%s\", \"getproc cuMemAlloc 3000\": \"%s\", "
      "\"getproc cuMemGetInfo\": \"%s\", \"getproc cuDeviceTotalMem\": \"%s\", "
      "\"getproc cuMemAllocAsync ptds\": \"%s\", \"getproc cuMemFreeAsync\": \"%s\", "
      "\"getproc cuDeviceGet\": \"%s\", \"dlsym nvmlDeviceGetMemoryInfo\": \"%s\", "
      "\"dlsym nvmlDeviceGetMemoryInfo_v2\": \"%s\", \"dlsym nvmlDeviceGetUUID\": \"%s\"}\n",
      where(dlsym(cuda, "cuMemAlloc_v2")), where(dlsym(cuda, "cuMemGetInfo_v2")),
      where(dlsym(cuda, "cuDeviceTotalMem_v2")), where(dlsym(cuda, "cuMemFree_v2")), where(dlsym(cuda, "cuMemAlloc")),
      where(dlsym(cuda, "cuDeviceGet")), where(proc("cuMemAlloc", 12000, 0)), where(proc("cuMemAlloc", 3000, 0)),
      where(proc("cuMemGetInfo", 12000, 0)), where(proc("cuDeviceTotalMem", 12000, 0)),
      where(proc("cuMemAllocAsync", 12000, 2)), where(proc("cuMemFreeAsync", 12000, 0)),
      where(proc("cuDeviceGet", 12000, 0)), where(dlsym(nvml, "nvmlDeviceGetMemoryInfo")),
      where(dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2")), where(dlsym(nvml, "nvmlDeviceGetUUID")));
}

static void print_view(void) {
  size_t free_d = 0, total_d = 0, free_p = 0, total_p = 0, mem_d[2] = {0, 0}, mem_p[2] = {0, 0};
  const int rc_d = ((getinfo_fn)dlsym(cuda, "cuMemGetInfo_v2"))(&free_d, &total_d);
  const int rc_p = ((getinfo_fn)proc("cuMemGetInfo", 12000, 0))(&free_p, &total_p);
  for (int d = 0; d < 2; ++d) {
    ((totalmem_fn)dlsym(cuda, "cuDeviceTotalMem_v2"))(&mem_d[d], d);
    ((totalmem_fn)proc("cuDeviceTotalMem", 12000, 0))(&mem_p[d], d);
  }
  counter_fn used = (counter_fn)dlsym(cuda, "fake_cuda_used");
  printf(
      "{\"cmd\": \"view\", \"getinfo_dlsym\": [%d, %zu, %zu], \"getinfo_getproc\": [%d, %zu, %zu], "
      "\"totalmem_dlsym\": [%zu, %zu], \"totalmem_getproc\": [%zu, %zu], \"driver_used\": [%llu, %llu], "
      "\"nvml\": {",
      rc_d, free_d, total_d, rc_p, free_p, total_p, mem_d[0], mem_d[1], mem_p[0], mem_p[1], used(0), used(1));
  ((int (*)(void))dlsym(nvml, "nvmlInit_v2"))();
  int (*handle_of)(unsigned int, void**) = (int (*)(unsigned int, void**))dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
  int (*uuid_of)(void*, char*, unsigned int) = (int (*)(void*, char*, unsigned int))dlsym(nvml, "nvmlDeviceGetUUID");
  int (*info)(void*, nvml_memory*) = (int (*)(void*, nvml_memory*))dlsym(nvml, "nvmlDeviceGetMemoryInfo");
  int (*info2)(void*, nvml_memory_v2*) = (int (*)(void*, nvml_memory_v2*))dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2");
  for (unsigned int i = 0; i < 2; ++i) {
    void* device = NULL;
    char uuid[96] = "";
    nvml_memory m = {0, 0, 0};
    nvml_memory_v2 m2 = {2u << 24 | 40, 0, 0, 0, 0};
    handle_of(i, &device);
    uuid_of(device, uuid, sizeof uuid);
    info(device, &m);
    info2(device, &m2);
    printf("%s\"%s\": {\"v1\": [%llu, %llu, %llu], \"v2\": [%llu, %llu, %llu, %llu]}", i ? ", " : "", uuid, m.total,
           m.free, m.used, m2.total, m2.reserved, m2.free, m2.used);
  }
  printf("}}\n");
}

typedef struct {
  char way[16];
  unsigned long long key;
} Kept;
static Kept kept[4096];
static int kept_count = 0;
static void* pool0 = NULL;

static int allocate(const char* way, size_t bytes, unsigned long long* key) {
  if (strcmp(way, "v2") == 0) return ((alloc_fn)dlsym(cuda, "cuMemAlloc_v2"))(key, bytes);
  if (strcmp(way, "getproc") == 0) return ((alloc_fn)proc("cuMemAlloc", 12000, 0))(key, bytes);
  if (strcmp(way, "pitch") == 0) {
    size_t pitch = 0;
    return ((pitch_fn)proc("cuMemAllocPitch", 12000, 0))(key, &pitch, bytes, 4, 4);
  }
  if (strcmp(way, "managed") == 0) return ((managed_fn)proc("cuMemAllocManaged", 12000, 0))(key, bytes, 1);
  if (strcmp(way, "create0") == 0 || strcmp(way, "create1") == 0) {
    int prop[8] = {1, 0, 1, way[6] - '0', 0, 0, 0, 0}; /* pinned, no handle types, device location */
    return ((create_fn)proc("cuMemCreate", 12000, 0))(key, bytes, prop, 0);
  }
  if (strcmp(way, "async") == 0) return ((async_fn)proc("cuMemAllocAsync", 12000, 0))(key, bytes, NULL);
  if (strcmp(way, "async_ptsz") == 0) return ((async_fn)proc("cuMemAllocAsync", 12000, 2))(key, bytes, NULL);
  if (strcmp(way, "pool0") == 0) {
    if (!pool0) {
      int props[22] = {1, 0, 1, 0};
      ((pool_create_fn)proc("cuMemPoolCreate", 12000, 0))(&pool0, props);
    }
    return ((pool_alloc_fn)proc("cuMemAllocFromPoolAsync", 12000, 2))(key, bytes, pool0, NULL);
  }
  if (strcmp(way, "v1") == 0) {
    unsigned int small = 0;
    const int rc = ((alloc1_fn)proc("cuMemAlloc", 3000, 0))(&small, (unsigned int)bytes);
    *key = 0;
    return rc;
  }
  fprintf(stderr, "unknown way %s\n", way);
  exit(2);
}

static int release(const Kept* k) {
  if (strcmp(k->way, "v1") == 0) return 0;
  if (strcmp(k->way, "v2") == 0) return ((free_fn)dlsym(cuda, "cuMemFree_v2"))(k->key);
  if (strncmp(k->way, "create", 6) == 0) return ((release_fn)proc("cuMemRelease", 12000, 0))(k->key);
  if (strcmp(k->way, "async") == 0) return ((free_async_fn)proc("cuMemFreeAsync", 12000, 0))(k->key, NULL);
  if (strcmp(k->way, "async_ptsz") == 0 || strcmp(k->way, "pool0") == 0)
    return ((free_async_fn)proc("cuMemFreeAsync", 12000, 2))(k->key, NULL);
  return ((free_fn)proc("cuMemFree", 12000, 0))(k->key);
}

/* used/total as the budgeted view says it, through cuMemGetInfo. */
static void print_used(const char* cmd, int rc) {
  size_t left = 0, total = 0;
  ((getinfo_fn)proc("cuMemGetInfo", 12000, 0))(&left, &total);
  counter_fn used = (counter_fn)dlsym(cuda, "fake_cuda_used");
  printf("{\"cmd\": \"%s\", \"rc\": %d, \"view_used\": %zu, \"driver_used\": [%llu, %llu]}\n", cmd, rc, total - left,
         used(0), used(1));
}

typedef struct {
  size_t bytes;
  int each;
  int ok;
  int other_rc;
  unsigned long long keys[256];
} Worker;
static pthread_barrier_t barrier;

static void* work(void* arg) {
  Worker* w = (Worker*)arg;
  alloc_fn alloc = (alloc_fn)proc("cuMemAlloc", 12000, 0);
  pthread_barrier_wait(&barrier);
  for (int i = 0; i < w->each && i < 256; ++i) {
    unsigned long long key = 0;
    const int rc = alloc(&key, w->bytes);
    if (rc == 0)
      w->keys[w->ok++] = key;
    else if (rc != 2)
      w->other_rc = rc;
  }
  return NULL;
}

static void threads(int n, size_t bytes, int each) {
  Worker workers[64];
  pthread_t ids[64];
  if (n > 64) n = 64;
  pthread_barrier_init(&barrier, NULL, (unsigned)n);
  for (int i = 0; i < n; ++i) {
    memset(&workers[i], 0, sizeof workers[i]);
    workers[i].bytes = bytes;
    workers[i].each = each;
    pthread_create(&ids[i], NULL, work, &workers[i]);
  }
  int ok = 0, other = 0;
  for (int i = 0; i < n; ++i) {
    pthread_join(ids[i], NULL);
    ok += workers[i].ok;
    if (workers[i].other_rc) other = workers[i].other_rc;
  }
  size_t left = 0, total = 0;
  ((getinfo_fn)proc("cuMemGetInfo", 12000, 0))(&left, &total);
  counter_fn peak = (counter_fn)dlsym(cuda, "fake_cuda_peak");
  printf(
      "{\"cmd\": \"threads\", \"ok\": %d, \"failed\": %d, \"other_rc\": %d, \"view_used\": %zu, "
      "\"driver_peak\": %llu}\n",
      ok, n * each - ok, other, total - left, peak(0));
  free_fn release_one = (free_fn)proc("cuMemFree", 12000, 0);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < workers[i].ok; ++k) release_one(workers[i].keys[k]);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: budget_probe CUDA_LIB NVML_LIB COMMAND...\n");
    return 2;
  }
  cuda = open_lib(argv[1]);
  nvml = open_lib(argv[2]);
  getproc = (getproc_fn)dlsym(cuda, "cuGetProcAddress_v2");
  const int init = ((init_fn)proc("cuInit", 12000, 0))(0);
  if (init != 0) {
    printf("{\"error\": \"cuInit %d\"}\n", init);
    return 1;
  }
  for (int i = 3; i < argc; ++i) {
    char way[16] = "";
    unsigned long long bytes = 0;
    int a = 0, b = 0;
    if (strcmp(argv[i], "where") == 0) {
      print_where();
    } else if (strcmp(argv[i], "view") == 0) {
      print_view();
    } else if (sscanf(argv[i], "device:%d", &a) == 1) {
      printf("{\"cmd\": \"device\", \"rc\": %d}\n",
             ((set_current_fn)proc("cuCtxSetCurrent", 12000, 0))((void*)(intptr_t)(a + 1)));
    } else if (sscanf(argv[i], "alloc:%15[^:]:%llu", way, &bytes) == 2) {
      Kept* k = &kept[kept_count];
      snprintf(k->way, sizeof k->way, "%s", way);
      const int rc = allocate(way, bytes, &k->key);
      if (rc == 0) ++kept_count;
      print_used("alloc", rc);
    } else if (strcmp(argv[i], "free") == 0) {
      print_used("free", kept_count ? release(&kept[--kept_count]) : -1);
    } else if (strcmp(argv[i], "freeall") == 0) {
      int rc = 0;
      while (kept_count && rc == 0) rc = release(&kept[--kept_count]);
      print_used("freeall", rc);
    } else if (sscanf(argv[i], "fill:%15[^:]:%llu:%d", way, &bytes, &a) == 3) {
      Kept made[256];
      int n = 0, rc = 0;
      while (n < a && n < 256) {
        snprintf(made[n].way, sizeof made[n].way, "%s", way);
        rc = allocate(way, bytes, &made[n].key);
        if (rc != 0) break;
        ++n;
      }
      printf("{\"cmd\": \"fill\", \"ok\": %d, \"rc\": %d}\n", n, rc);
      while (n) release(&made[--n]);
    } else if (sscanf(argv[i], "threads:%d:%llu:%d", &a, &bytes, &b) == 3) {
      threads(a, bytes, b);
    } else if (sscanf(argv[i], "bench:%d", &a) == 1) {
      alloc_fn alloc = (alloc_fn)proc("cuMemAlloc", 12000, 0);
      free_fn release_one = (free_fn)proc("cuMemFree", 12000, 0);
      struct timespec t0, t1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      for (int k = 0; k < a; ++k) {
        unsigned long long key = 0;
        alloc(&key, 1 << 20);
        release_one(key);
      }
      clock_gettime(CLOCK_MONOTONIC, &t1);
      const double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
      printf("{\"cmd\": \"bench\", \"ns_per_pair\": %.1f}\n", ns / (a > 0 ? a : 1));
    } else if (sscanf(argv[i], "sleep:%d", &a) == 1) {
      struct timespec t = {a / 1000, (long)(a % 1000) * 1000000L};
      nanosleep(&t, NULL);
    } else {
      fprintf(stderr, "unknown command %s\n", argv[i]);
      return 2;
    }
    fflush(stdout);
  }
  return 0;
}
