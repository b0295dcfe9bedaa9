// cupool_load_limits FILE [--json OUT] [--only h2d,cached,direct] [--max-gib G]: what `cupool buffer
// load` could reach on this machine, measured in one run (issue 38), for scripts/load-bench.sh to
// hold its figures against:
//   h2d     pinned host-to-device copies, 64 MiB each, from cuMemHostAlloc memory and from huge
//           pages registered with cuMemHostRegister (the loader's staging slots: device/staging.h)
//   cached  reading FILE from the page cache (read once first, not timed): 16 threads x 2 MiB
//           pread into host memory, no GPU; the best of 3 passes
//   direct  the storage's sequential read: FILE read with O_DIRECT by 8, 16 and 32 threads of 16 MiB
//           and of 64 MiB reads, its pages dropped (fdatasync + POSIX_FADV_DONTNEED) before each
// --max-gib reads at most G GiB of FILE in each pass (0, the default: all of it).
// Exit status: 0 measured, 1 a measurement failed, 2 bad usage, 77 no driver or device, or
// --allow-simulated (a simulated node has no bus or disk to measure), as the other GPU benches.
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "device/staging.h"

namespace {

using json = nlohmann::json;
constexpr const char* kProgram = "cupool_load_limits";
constexpr int kExitSkip = 77;
constexpr std::uint64_t kMiB = 1ULL << 20;
constexpr std::uint64_t kCopy = 64 * kMiB;

#define LIMITS_STR2(x) #x
#define LIMITS_STR(x) LIMITS_STR2(x)  // expands cuda.h's versioning macros (cuMemAlloc -> cuMemAlloc_v2)
// clang-format off
#define LIMITS_DRIVER_FUNCTIONS(X)                                                                          \
  X(cuInit) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDevicePrimaryCtxRetain)               \
  X(cuCtxSetCurrent) X(cuGetErrorName) X(cuMemAlloc) X(cuMemFree) X(cuMemHostAlloc) X(cuMemFreeHost)        \
  X(cuMemHostRegister) X(cuMemHostUnregister) X(cuMemcpyHtoDAsync) X(cuStreamCreate) X(cuStreamSynchronize)
// clang-format on
struct Driver {
#define LIMITS_DECLARE(name) decltype(&::name) name = nullptr;
  LIMITS_DRIVER_FUNCTIONS(LIMITS_DECLARE)
#undef LIMITS_DECLARE
};
Driver cu;

struct Skip : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string failed(const char* call, CUresult r) {
  const char* name = nullptr;
  if (cu.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
  return std::string(call) + " failed: " + (name ? name : "CUresult " + std::to_string(static_cast<int>(r)));
}

void check(CUresult r, const char* call) {
  if (r != CUDA_SUCCESS) throw std::runtime_error(failed(call, r));
}

// Loads the driver and makes device 0's primary context current; returns the device's name.
std::string start_driver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) throw Skip(std::string("no usable NVIDIA driver: libcuda.so.1 could not be loaded (") + dlerror() + ")");
#define LIMITS_LOAD(name)                                                      \
  cu.name = reinterpret_cast<decltype(cu.name)>(dlsym(lib, LIMITS_STR(name))); \
  if (!cu.name) throw Skip(std::string("libcuda.so.1 lacks ") + LIMITS_STR(name));
  LIMITS_DRIVER_FUNCTIONS(LIMITS_LOAD)
#undef LIMITS_LOAD
  if (cu.cuInit(0) != CUDA_SUCCESS) throw Skip("no usable GPU: cuInit(0) failed");
  int count = 0;
  if (cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || count < 1) throw Skip("the NVIDIA driver reports no CUDA device");
  CUdevice dev = 0;
  check(cu.cuDeviceGet(&dev, 0), "cuDeviceGet");
  char name[256] = {};
  check(cu.cuDeviceGetName(name, sizeof name, dev), "cuDeviceGetName");
  CUcontext ctx = nullptr;
  check(cu.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  return name;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// GB/s of 64 MiB copies from `host` (4 of them, 256 MiB) to device memory: the best of 5 rounds of 4 GiB.
double copy_rate(const unsigned char* host, CUdeviceptr device, CUstream stream) {
  double best = 0;
  for (int round = 0; round <= 5; ++round) {  // round 0 warms up
    const auto t0 = std::chrono::steady_clock::now();
    for (std::uint64_t i = 0; i < 64; ++i)
      check(cu.cuMemcpyHtoDAsync(device + (i % 4) * kCopy, host + (i % 4) * kCopy, kCopy, stream), "cuMemcpyHtoDAsync");
    check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
    if (round > 0) best = std::max(best, static_cast<double>(64 * kCopy) / since(t0) / 1e9);
  }
  return best;
}

json measure_h2d() {
  CUstream stream = nullptr;
  check(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  CUdeviceptr device = 0;
  check(cu.cuMemAlloc(&device, 4 * kCopy), "cuMemAlloc");
  void* pinned = nullptr;
  check(cu.cuMemHostAlloc(&pinned, 4 * kCopy, 0), "cuMemHostAlloc");
  std::memset(pinned, 1, 4 * kCopy);
  json out{{"copy_bytes", kCopy}, {"pinned_gbps", copy_rate(static_cast<unsigned char*>(pinned), device, stream)}};
  cu.cuMemFreeHost(pinned);
  std::string why;
  if (unsigned char* huge = cupool::map_huge(4 * kCopy, why)) {
    const CUresult r = cu.cuMemHostRegister(huge, 4 * kCopy, 0);
    if (r == CUDA_SUCCESS) {
      out["huge_pages_gbps"] = copy_rate(huge, device, stream);
      cu.cuMemHostUnregister(huge);
    } else {
      why = failed("cuMemHostRegister", r);
    }
    cupool::unmap_huge(huge, 4 * kCopy);
  }
  if (!why.empty()) out["huge_pages_note"] = why;
  cu.cuMemFree(device);
  return out;
}

// GB/s of reading the first `bytes` of the file at `fd` by `threads` threads in `chunk`-byte
// preads taken in turn (O_DIRECT: lengths rounded up to 4 KiB; `chunk` is a multiple of it).
double read_rate(int fd, std::uint64_t bytes, std::uint64_t chunk, unsigned threads) {
  std::atomic<std::uint64_t> next{0};
  std::atomic<int> failed{0};  // an errno
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> crew;
  for (unsigned t = 0; t < threads; ++t)
    crew.emplace_back([&] {
      void* buffer = nullptr;
      if (::posix_memalign(&buffer, 4096, chunk) != 0) {
        failed = ENOMEM;
        return;
      }
      for (std::uint64_t at; (at = next.fetch_add(chunk)) < bytes && !failed;) {
        const std::uint64_t n = (std::min(chunk, bytes - at) + 4095) & ~std::uint64_t{4095};
        const ssize_t got = ::pread(fd, buffer, n, static_cast<off_t>(at));
        if (got <= 0) failed = got < 0 ? errno : EIO;
      }
      std::free(buffer);
    });
  for (std::thread& th : crew) th.join();
  if (failed) throw std::runtime_error("reading the file failed: " + std::string(std::strerror(failed)));
  return static_cast<double>(bytes) / since(t0) / 1e9;
}

void drop_pages(int fd) {
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
}

json measure_cached(int fd, std::uint64_t bytes) {
  read_rate(fd, bytes, 2 * kMiB, 16);  // into the page cache
  json passes = json::array();
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    passes.push_back(read_rate(fd, bytes, 2 * kMiB, 16));
    best = std::max(best, passes.back().get<double>());
  }
  return {{"threads", 16}, {"chunk_bytes", 2 * kMiB}, {"passes_gbps", passes}, {"gbps", best}};
}

json measure_direct(const std::string& path, int fd, std::uint64_t bytes) {
  const int direct = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (direct < 0) throw std::runtime_error(path + " cannot be opened with O_DIRECT: " + std::strerror(errno));
  json configs = json::array(), best;
  for (std::uint64_t chunk : {16 * kMiB, 64 * kMiB})
    for (unsigned threads : {8u, 16u, 32u}) {
      drop_pages(fd);
      const double gbps = read_rate(direct, bytes, chunk, threads);
      configs.push_back({{"chunk_bytes", chunk}, {"threads", threads}, {"gbps", gbps}});
      if (best.is_null() || gbps > best["gbps"].get<double>()) best = configs.back();
    }
  ::close(direct);
  return {{"configs", configs}, {"best", best}};
}

int usage(const char* why) {
  if (why) std::fprintf(stderr, "%s: %s\n", kProgram, why);
  std::fprintf(why ? stderr : stdout,
               "usage: %s FILE [--json OUT] [--only h2d,cached,direct] [--max-gib G] [--allow-simulated]\n"
               "Measures pinned host-to-device copies, FILE's reads from the page cache, and the storage's\n"
               "O_DIRECT sequential read of FILE: the limits of `cupool buffer load` (scripts/load-bench.sh).\n"
               "Exit status: 0 measured, 1 a measurement failed, 2 bad usage, 77 no driver or device, or\n"
               "--allow-simulated (a simulated node has no bus or disk to measure).\n",
               kProgram);
  return why ? 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file, json_out, only = "h2d,cached,direct";
  double max_gib = 0;
  bool simulated = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_next = i + 1 < argc;
    if (a == "--help" || a == "-h") return usage(nullptr);
    if (a == "--allow-simulated") {
      simulated = true;
    } else if ((a == "--json" || a == "--only" || a == "--max-gib") && !has_next) {
      return usage((a + " needs a value").c_str());
    } else if (a == "--json") {
      json_out = argv[++i];
    } else if (a == "--only") {
      only = argv[++i];
    } else if (a == "--max-gib") {
      max_gib = std::atof(argv[++i]);
    } else if (a.rfind("--", 0) == 0 || !file.empty()) {
      return usage(("unexpected argument " + a).c_str());
    } else {
      file = a;
    }
  }
  if (file.empty()) return usage("FILE is missing");
  const auto wanted = [&](const char* what) {
    return ("," + only + ",").find(std::string(",") + what + ",") != std::string::npos;
  };
  if (simulated) {
    std::printf("%s: skipped (exit 77): --allow-simulated: a simulated node has no bus or disk to measure\n", kProgram);
    return kExitSkip;
  }
  try {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0)
      return usage((file + ": not a readable regular file that has bytes").c_str());
    auto bytes = static_cast<std::uint64_t>(st.st_size);
    if (max_gib > 0) bytes = std::min(bytes, static_cast<std::uint64_t>(max_gib * 1073741824.0));
    json out{{"file", file}, {"bytes", bytes}, {"device", start_driver()}};
    std::printf("%s: the limits of `cupool buffer load` for %s (%.2f GiB read a pass) on %s\n", kProgram, file.c_str(),
                static_cast<double>(bytes) / 1073741824.0, out["device"].get<std::string>().c_str());
    if (wanted("h2d")) {
      out["h2d"] = measure_h2d();
      const json& h = out["h2d"];
      std::printf("host to device, 64 MiB copies: pinned (cuMemHostAlloc) %.2f GB/s\n", h["pinned_gbps"].get<double>());
      if (h.contains("huge_pages_gbps"))
        std::printf("host to device, 64 MiB copies: huge pages registered %.2f GB/s\n",
                    h["huge_pages_gbps"].get<double>());
      else
        std::printf("host to device: no huge pages registered (%s)\n", h["huge_pages_note"].get<std::string>().c_str());
    }
    if (wanted("cached")) {
      out["page_cache"] = measure_cached(fd, bytes);
      std::printf("page cache read, 16 threads x 2 MiB pread: %.2f GB/s (the best of 3 passes)\n",
                  out["page_cache"]["gbps"].get<double>());
    }
    if (wanted("direct")) {
      out["direct"] = measure_direct(file, fd, bytes);
      std::printf("O_DIRECT sequential read, pages dropped before each:\n");
      for (const json& c : out["direct"]["configs"])
        std::printf("  %3llu MiB x %2u threads: %.2f GB/s\n",
                    static_cast<unsigned long long>(c["chunk_bytes"].get<std::uint64_t>() / kMiB),
                    c["threads"].get<unsigned>(), c["gbps"].get<double>());
      const json& b = out["direct"]["best"];
      std::printf("  best: %llu MiB x %u threads, %.2f GB/s\n",
                  static_cast<unsigned long long>(b["chunk_bytes"].get<std::uint64_t>() / kMiB),
                  b["threads"].get<unsigned>(), b["gbps"].get<double>());
    }
    ::close(fd);
    if (!json_out.empty()) {
      std::ofstream f(json_out);
      f << out.dump(2) << "\n";
      if (!f) throw std::runtime_error("--json: cannot write " + json_out);
    }
    return 0;
  } catch (const Skip& e) {
    std::printf("%s: skipped (exit 77): %s\n", kProgram, e.what());
    return kExitSkip;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
    return 1;
  }
}
