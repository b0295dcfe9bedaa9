// cupool_bare_init: the baseline for scripts/gpu-run.sh's timing ratio. It does the least a
// program must do to talk to the driver — dlopen libcuda.so.1, cuInit(0), cuDeviceGetCount — so
// `cupool query` time / this program's time says what cupool adds on top of driver start-up.
// Exit 0 with the device count on stdout; exit 3 (as cupool) when there is no usable driver.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>

namespace {

#define BARE_STR2(x) #x
#define BARE_STR(x) BARE_STR2(x)  // expands cuda.h's versioning macros, if a name has one

int no_driver(const char* what, const char* detail) {
  std::fprintf(stderr, "cupool_bare_init: no usable NVIDIA driver: %s%s%s\n", what, detail ? ": " : "",
               detail ? detail : "");
  return 3;
}

}  // namespace

int main() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return no_driver("libcuda.so.1 could not be loaded", dlerror());

  auto init = reinterpret_cast<decltype(&::cuInit)>(dlsym(lib, BARE_STR(cuInit)));
  auto get_count = reinterpret_cast<decltype(&::cuDeviceGetCount)>(dlsym(lib, BARE_STR(cuDeviceGetCount)));
  if (!init || !get_count) return no_driver("libcuda.so.1 lacks cuInit or cuDeviceGetCount", nullptr);

  const CUresult r = init(0);
  if (r != CUDA_SUCCESS) {
    char code[32];
    std::snprintf(code, sizeof code, "CUresult %d", static_cast<int>(r));
    return no_driver("cuInit(0) failed", code);
  }
  int count = 0;
  const CUresult c = get_count(&count);
  if (c != CUDA_SUCCESS) {
    char code[32];
    std::snprintf(code, sizeof code, "CUresult %d", static_cast<int>(c));
    return no_driver("cuDeviceGetCount failed", code);
  }
  std::printf("%d\n", count);
  return 0;
}
