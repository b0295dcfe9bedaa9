/* A stand-in for libcuda.so.1 in the exec test (no GPU in CI), built as libcuda.so.1 in the test's
 * build directory (found by path, never by the library search): cuInit, cuDeviceGetCount and
 * cuGetProcAddress(_v2) with the driver's signatures, counting the initialisations it gets. */
#include <stdint.h>
#include <string.h>

static int init_calls = 0;

static int init_driver(void) {
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
  *count = 1;
  return 0;
}

int fake_cuda_init_calls(void) { return init_calls; }

int cuGetProcAddress(const char* symbol, void** pfn, int version, uint64_t flags);

int cuGetProcAddress_v2(const char* symbol, void** pfn, int version, uint64_t flags, void* status) {
  (void)flags;
  if (status) memset(status, 0, sizeof(int));
  if (strcmp(symbol, "cuInit") == 0) {
    *pfn = (void*)&cuInit;
    return 0;
  }
  if (strcmp(symbol, "cuGetProcAddress") == 0) {
    *pfn = version >= 12000 ? (void*)&cuGetProcAddress_v2 : (void*)&cuGetProcAddress;
    return 0;
  }
  *pfn = 0;
  return 500; /* CUDA_ERROR_NOT_FOUND */
}

int cuGetProcAddress(const char* symbol, void** pfn, int version, uint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, 0);
}
