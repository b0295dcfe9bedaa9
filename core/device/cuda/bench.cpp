// The real backend, Bench: the measured loops of `cupool bench`.
#include "device/cuda/bench.h"

namespace cupool::cuda {

namespace bench_loops {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

// A captured graph of cuMemAllocAsync + cuMemFreeAsync, launched and synchronised `iterations` times.
std::vector<double> graph_alloc_free(const Driver& b, CUstream stream, size_t bytes, int iterations) {
  const DriverApi& api = b.api();
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  b.check(api.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture");
  CUdeviceptr p = 0;
  CUresult r = api.cuMemAllocAsync(&p, bytes, stream);
  if (r == CUDA_SUCCESS) r = api.cuMemFreeAsync(p, stream);
  const CUresult end = api.cuStreamEndCapture(stream, &graph);
  b.check(r, "cuMemAllocAsync/cuMemFreeAsync (captured)");
  b.check(end, "cuStreamEndCapture");
  struct Graph {
    const DriverApi& api;
    CUgraph g;
    CUgraphExec& e;
    ~Graph() {
      if (e) api.cuGraphExecDestroy(e);
      if (g) api.cuGraphDestroy(g);
    }
  } owner{api, graph, exec};
  b.check(api.cuGraphInstantiate(&exec, graph, 0), "cuGraphInstantiate");
  std::vector<double> ns;
  ns.reserve(static_cast<std::size_t>(iterations));
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = Clock::now();
    b.check(api.cuGraphLaunch(exec, stream), "cuGraphLaunch");
    b.check(api.cuStreamSynchronize(stream), "cuStreamSynchronize");
    ns.push_back(since(t0));
  }
  return ns;
}

}  // namespace bench_loops

std::vector<double> CudaBench::bench(int ordinal, const BenchCase& c) {
  using bench_loops::Clock;
  using bench_loops::since;
  ContextScope scope(api_, d_.context(ordinal));
  CUstream stream = d_.device_stream(ordinal);
  CUmemoryPool pool = nullptr;
  check(api_.cuDeviceGetDefaultMemPool(&pool, d_.device(ordinal)), "cuDeviceGetDefaultMemPool");
  const auto saved = d_.get_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
  struct Restore {
    const DriverApi& api;
    CUmemoryPool pool;
    cuuint64_t value;
    ~Restore() {
      cuuint64_t v = value;
      api.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v);
    }
  } restore{api_, pool, saved};
  d_.set_attribute<cuuint64_t>(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, c.threshold);
  const auto bytes = static_cast<size_t>(c.bytes);
  std::vector<double> ns;
  ns.reserve(static_cast<std::size_t>(c.iterations));
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
    case BenchCase::Kind::graph_alloc_free: ns = bench_loops::graph_alloc_free(d_, stream, bytes, c.iterations); break;
  }
  return ns;
}

}  // namespace cupool::cuda
