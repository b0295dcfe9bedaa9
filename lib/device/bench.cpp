#include "device/bench.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>

#include "base/output.h"
#include "base/units.h"

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
  std::string name;  // case id
  std::string what;  // for people
  BenchCase c;
};

std::string threshold_label(std::uint64_t t, const std::string& text) {
  if (t == UINT64_MAX) return "max";
  return text.empty() ? format_bytes(t) : text;
}

}  // namespace

Json run_bench(Backend& backend, const BenchOptions& o) {
  const DeviceInfo info = backend.device_info(o.device);
  std::vector<Run> runs;
  const std::string configured = threshold_label(o.threshold, o.threshold_text);
  for (std::uint64_t size : o.sizes) {
    auto add = [&](const char* name, const std::string& what, BenchCase::Kind kind, std::uint64_t threshold, int n) {
      runs.push_back({name, what, BenchCase{kind, size, threshold, n}});
    };
    add("malloc_free", "cudaMalloc + cudaFree", BenchCase::Kind::malloc_free, 0, o.iterations);
    add("async_alloc_free", "cudaMallocAsync + cudaFreeAsync", BenchCase::Kind::async_alloc_free, o.threshold,
        o.iterations);
    add("alloc_free_sync_default", "alloc/free/synchronize, threshold 0 (the default)",
        BenchCase::Kind::alloc_free_sync, 0, o.iterations);
    add("alloc_free_sync_configured", "alloc/free/synchronize, threshold " + configured,
        BenchCase::Kind::alloc_free_sync, o.threshold, o.iterations);
    add("graph_alloc_free", "captured graph alloc/free, launch + synchronize", BenchCase::Kind::graph_alloc_free,
        o.threshold, o.iterations);
    add("trim", "cuMemPoolTrimTo(0) of a pool holding the size", BenchCase::Kind::trim, UINT64_MAX,
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

  Json out;
  out["node"] = {{"simulated", backend.simulated()},
                 {"backend", backend.describe()},
                 {"device", o.device},
                 {"name", info.name},
                 {"uuid", info.uuid}};
  if (backend.simulated())
    out["note"] = "simulated node: these figures come from a model of measurements on an H100, not from this machine";
  out["settings"] = {{"config", o.config},
                     {"release_threshold", configured},
                     {"iterations", o.iterations},
                     {"seed", o.seed},
                     {"sizes", o.sizes}};
  out["cases"] = Json::array();
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    const Summary& s = results[i];
    out["cases"].push_back(
        {{"case", r.name},
         {"what", r.what},
         {"size", r.c.bytes},
         {"threshold", threshold_label(r.c.threshold, r.c.threshold == o.threshold ? o.threshold_text : "")},
         {"n", r.c.iterations},
         {"median_us", s.median_us},
         {"p99_us", s.p99_us},
         {"mean_us", s.mean_us},
         {"min_us", s.min_us}});
  }
  auto median = [&](const std::string& name, std::uint64_t size) {
    for (std::size_t i = 0; i < runs.size(); ++i)
      if (runs[i].name == name && runs[i].c.bytes == size) return results[i].median_us;
    return 0.0;
  };
  out["comparisons"] = Json::array();
  for (std::uint64_t size : o.sizes) {
    auto ratio = [&](const char* what, const std::string& slow, const std::string& fast) {
      const double a = median(slow, size), b = median(fast, size);
      out["comparisons"].push_back({{"size", size}, {"what", what}, {"ratio", b > 0 ? a / b : 0.0}});
    };
    ratio("cudaMalloc+cudaFree / cudaMallocAsync+cudaFreeAsync", "malloc_free", "async_alloc_free");
    ratio(("alloc/free/sync at threshold 0 / at threshold " + configured).c_str(), "alloc_free_sync_default",
          "alloc_free_sync_configured");
    ratio("direct alloc/free/sync / captured graph launch", "alloc_free_sync_configured", "graph_alloc_free");
  }
  return out;
}

std::string render_bench_table(const Json& r) {
  std::ostringstream out;
  const Json& node = r["node"];
  out << "cupool bench on device " << node.value("device", 0) << " (" << node.value("name", "") << "), "
      << node.value("backend", "") << "\n";
  if (r.contains("note")) out << "NOTE: " << r["note"].get<std::string>() << "\n";
  const Json& s = r["settings"];
  out << "release threshold under test: " << s.value("release_threshold", "")
      << (s.value("config", "").empty() ? "" : " (from " + s.value("config", "") + ")") << "; "
      << s.value("iterations", 0) << " iterations per case; seed " << s.value("seed", 0) << "\n\n";
  Table t({"CASE", "SIZE", "N", "MEDIAN us", "P99 us", "MIN us"});
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, v < 10 ? "%.2f" : "%.1f", v);
    return std::string(buf);
  };
  for (const auto& c : r["cases"])
    t.add({c.value("what", ""), format_bytes(c.value("size", std::uint64_t{0})), std::to_string(c.value("n", 0)),
           num(c.value("median_us", 0.0)), num(c.value("p99_us", 0.0)), num(c.value("min_us", 0.0))});
  out << t.str() << "\n";
  Table cmp({"SIZE", "COMPARISON (ratio of medians)", "RATIO"});
  for (const auto& c : r["comparisons"]) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1fx", c.value("ratio", 0.0));
    cmp.add({format_bytes(c.value("size", std::uint64_t{0})), c.value("what", ""), buf});
  }
  out << cmp.str();
  return out.str();
}

}  // namespace cupool
