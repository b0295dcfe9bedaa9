#include "device/bench.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "device/sim_backend.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

TEST_CASE("summarize: median and p99 by nearest rank, in microseconds") {
  std::vector<double> ns;
  for (int i = 100; i >= 1; --i) ns.push_back(i * 1000.0);
  const Summary s = summarize(ns);
  CHECK(s.median_us == doctest::Approx(50.0));
  CHECK(s.p99_us == doctest::Approx(99.0));
  CHECK(s.min_us == doctest::Approx(1.0));
  CHECK(s.mean_us == doctest::Approx(50.5));
  CHECK(summarize({}).median_us == 0.0);
}

TEST_CASE("bench on a simulated node: every case per size, ratios, and it says the figures are modelled") {
  SimBackend sim(test::two_gpu_node());
  BenchOptions o;
  o.device = 1;
  o.sizes = {1ULL << 20, 64ULL << 20};
  o.iterations = 20;
  o.threshold = ReleaseThreshold::max();
  std::vector<std::string> progress;
  o.progress = [&](const std::string& line) { progress.push_back(line); };
  const auto r = model::to_json(run_bench(sim, o));
  CHECK(r["source"]["simulated"] == true);
  CHECK(r["gpu"]["device"] == 1);
  CHECK(r["settings"]["release_threshold"] == "max");
  CHECK(r["settings"]["release_threshold_bytes"].is_null());
  CHECK(r["note"].get<std::string>().find("model") != std::string::npos);
  CHECK(r["cases"].size() == 12);
  CHECK(progress.size() == 12);
  CHECK(progress.front().rfind("[1/12] ", 0) == 0);
  CHECK(r["comparisons"].size() == 6);
  // The modelled 64 MiB loop: threshold 0 maps the memory again each time, max keeps it.
  for (const auto& c : r["comparisons"])
    if (c["size_bytes"] == (64ULL << 20) &&
        c["description"].get<std::string>().find("threshold 0") != std::string::npos)
      CHECK(c["ratio"].get<double>() > 20.0);
  for (const auto& c : sim.calls()) CHECK(c.find("bench(0,") == std::string::npos);  // only the chosen device
}

TEST_CASE("the seed sets the order of the cases, not the results of a model") {
  auto calls_for = [](std::uint64_t seed) {
    SimBackend sim(test::two_gpu_node());
    BenchOptions o;
    o.iterations = 3;
    o.seed = seed;
    const auto r = model::to_json(run_bench(sim, o));
    return std::make_pair(sim.calls(), r["cases"]);
  };
  const auto a = calls_for(1), b = calls_for(1), c = calls_for(2);
  CHECK(a.first == b.first);
  CHECK(a.first != c.first);
  CHECK(a.second == c.second);
}
