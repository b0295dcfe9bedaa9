// `cupool bench`: what allocation costs on this node, measured in one run against the obvious
// alternatives (cudaMalloc, the default threshold 0, direct launches) and reported as medians,
// p99 and ratios. On a simulated node the figures come from a model and the report says so.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "device/backend.h"
#include "model/model.h"

namespace cupool {

struct BenchOptions {
  int device = 0;
  std::vector<std::uint64_t> sizes{1ULL << 20, 64ULL << 20};
  int iterations = 200;                                  // per case and size (trim: at most 50)
  std::uint64_t seed = 1;                                // the order in which the cases run
  ReleaseThreshold threshold = ReleaseThreshold::max();  // the configured release threshold
  std::string config;                                    // the config file, "" when none
  // Called before each case: "[3/12] alloc/free/sync 64 MiB, threshold 0".
  std::function<void(const std::string&)> progress;
};

// Runs every case for every size; returns the report (cases, comparisons, node).
model::BenchReport run_bench(Backend& backend, const BenchOptions& options);

// Median, p99 (nearest rank) and mean of `ns`, in microseconds.
struct Summary {
  double median_us = 0, p99_us = 0, mean_us = 0, min_us = 0;
};
Summary summarize(std::vector<double> ns);

}  // namespace cupool
