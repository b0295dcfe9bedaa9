/* A stand-in for libcuda.so.1 in the exec test (no GPU in CI): cuInit and cuGetProcAddress(_v2)
 * with the driver's signatures, counting the calls it gets. */
#include <stdint.h>
#include <string.h>

static int init_calls = 0;

int cuInit(unsigned int flags) {
  (void)flags;
  ++init_calls;
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
