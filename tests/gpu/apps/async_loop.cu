// A C++ CUDA program as nvcc builds it by default (the CUDA runtime linked statically): a 64 MiB
// cudaMallocAsync / cudaFreeAsync / cudaStreamSynchronize loop on device 0's current pool. Prints one
// JSON line: the current pool's release threshold as the program sees it after the loop, and the
// loop's median and p99 in microseconds. Nothing in it knows about cupool.
//   nvcc -O2 -o async_loop tests/gpu/apps/async_loop.cu   [-cudart shared]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 300;
  const size_t size = 64ull << 20;
  cudaSetDevice(0);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  void* p = nullptr;
  if (cudaMallocAsync(&p, size, stream) != cudaSuccess) {
    std::printf("{\"error\": \"cudaMallocAsync failed\"}\n");
    return 1;
  }
  cudaFreeAsync(p, stream);
  cudaStreamSynchronize(stream);
  std::vector<double> us;
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    cudaMallocAsync(&p, size, stream);
    cudaFreeAsync(p, stream);
    cudaStreamSynchronize(stream);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  cudaMemPool_t pool;
  cudaDeviceGetMemPool(&pool, 0);
  std::uint64_t threshold = 0;
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  std::printf("{\"release_threshold\": %llu, \"median_us\": %.1f, \"p99_us\": %.1f}\n",
              static_cast<unsigned long long>(threshold), us[us.size() / 2], us[us.size() * 99 / 100]);
  return 0;
}
