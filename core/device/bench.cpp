#include "device/bench.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "base/units.h"
#include "device/node.h"
#include "model/model.h"

namespace cupool {

using Json = nlohmann::ordered_json;

Summary summarize(std::vector<double> ns) {
  Summary s;
  if (ns.empty()) return s;
  std::sort(ns.begin(), ns.end());
  auto rank = [&](double q) {
    const auto k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(ns.size())));
    return ns[std::min(ns.size() - 1, k == 0 ? 0 : k - 1)];
  };
  s.median_us = rank(0.5) / 1000.0;
  s.p99_us = rank(0.99) / 1000.0;
  s.min_us = ns.front() / 1000.0;
  s.mean_us = std::accumulate(ns.begin(), ns.end(), 0.0) / static_cast<double>(ns.size()) / 1000.0;
  return s;
}

namespace {

struct Run {
  std::string name;            // case id
  std::string what;            // for people
  ReleaseThreshold threshold;  // the case's, as the config wrote it where it is the configured one
  BenchCase c;
};

}  // namespace

model::BenchReport run_bench(Backend& backend, const BenchOptions& o) {
  const DeviceInfo info = backend.device_info(o.device);
  std::vector<Run> runs;
  const std::string configured = o.threshold.text();
  for (std::uint64_t size : o.sizes) {
    auto add = [&](const char* name, const std::string& what, BenchCase::Kind kind, ReleaseThreshold t, int n) {
      if (t == o.threshold) t = o.threshold;  // at the configured bytes: as the config wrote them
      runs.push_back({name, what, t, BenchCase{kind, size, t.bytes(), n}});
    };
    add("malloc_free", "cudaMalloc + cudaFree", BenchCase::Kind::malloc_free, ReleaseThreshold(0), o.iterations);
    add("async_alloc_free", "cudaMallocAsync + cudaFreeAsync", BenchCase::Kind::async_alloc_free, o.threshold,
        o.iterations);
    add("alloc_free_sync_default", "alloc/free/synchronize, threshold 0 (the default)",
        BenchCase::Kind::alloc_free_sync, ReleaseThreshold(0), o.iterations);
    add("alloc_free_sync_configured", "alloc/free/synchronize, threshold " + configured,
        BenchCase::Kind::alloc_free_sync, o.threshold, o.iterations);
    add("graph_alloc_free", "captured graph alloc/free, launch + synchronize", BenchCase::Kind::graph_alloc_free,
        o.threshold, o.iterations);
    add("trim", "cuMemPoolTrimTo(0) of a pool holding the size", BenchCase::Kind::trim, ReleaseThreshold::max(),
        std::min(o.iterations, 50));
  }
  // The seed shuffles the order, so slow drift of the machine is not charged to one case.
  std::vector<std::size_t> order(runs.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(o.seed);
  std::shuffle(order.begin(), order.end(), rng);

  std::vector<Summary> results(runs.size());
  std::size_t done = 0;
  for (std::size_t i : order) {
    const Run& r = runs[i];
    if (o.progress)
      o.progress("[" + std::to_string(++done) + "/" + std::to_string(runs.size()) + "] " + r.what + ", " +
                 format_bytes(r.c.bytes) + " x " + std::to_string(r.c.iterations));
    results[i] = summarize(backend.bench(o.device, r.c));
  }

  model::BenchReport report;
  report.source = source_of(backend.source());
  report.gpu = {o.device, info.uuid, info.pci_bus_id};
  report.gpu_name = info.name;
  if (backend.simulated())
    report.note = "simulated node: these figures come from a model of measurements on an H100, not from this machine";
  if (!o.config.empty()) report.config = o.config;
  report.release_threshold = o.threshold;
  report.iteration_count = static_cast<std::uint64_t>(o.iterations);
  report.seed = o.seed;
  report.sizes_bytes = o.sizes;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    const Summary& s = results[i];
    model::BenchCase c;
    c.name = r.name;
    c.description = r.what;
    c.size_bytes = r.c.bytes;
    c.release_threshold = r.threshold;
    c.iteration_count = static_cast<std::uint64_t>(r.c.iterations);
    c.median_seconds = s.median_us / 1e6;
    c.p99_seconds = s.p99_us / 1e6;
    c.mean_seconds = s.mean_us / 1e6;
    c.min_seconds = s.min_us / 1e6;
    report.cases.push_back(c);
  }
  auto median = [&](const std::string& name, std::uint64_t size) {
    for (std::size_t i = 0; i < runs.size(); ++i)
      if (runs[i].name == name && runs[i].c.bytes == size) return results[i].median_us;
    return 0.0;
  };
  for (std::uint64_t size : o.sizes) {
    auto ratio = [&](const char* what, const std::string& slow, const std::string& fast) {
      const double a = median(slow, size), b = median(fast, size);
      report.comparisons.push_back({size, what, b > 0 ? a / b : 0.0});
    };
    ratio("cudaMalloc+cudaFree / cudaMallocAsync+cudaFreeAsync", "malloc_free", "async_alloc_free");
    ratio(("alloc/free/sync at threshold 0 / at threshold " + configured).c_str(), "alloc_free_sync_default",
          "alloc_free_sync_configured");
    ratio("direct alloc/free/sync / captured graph launch", "alloc_free_sync_configured", "graph_alloc_free");
  }
  return report;
}

}  // namespace cupool
