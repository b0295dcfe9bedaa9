// The simulated node, Bench: figures from a model of measurements on a real H100, not measurements.
#include "device/sim/bench.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <utility>

#include "base/error.h"
#include "base/fd.h"
#include "device/sim/helpers.h"

namespace cupool::sim {

std::vector<double> SimBench::bench(int dev, const BenchCase& c) {
  s_.enter("bench",
           std::to_string(dev) + "," + std::to_string(static_cast<int>(c.kind)) + "," + std::to_string(c.bytes));
  s_.device(dev, "cuDevicePrimaryCtxRetain");
  const double mib = static_cast<double>(c.bytes) / double(1 << 20);
  double us = 0;
  switch (c.kind) {
    case BenchCase::Kind::malloc_free: us = 70.0 + 0.65 * mib; break;
    case BenchCase::Kind::async_alloc_free: us = 0.7; break;
    case BenchCase::Kind::alloc_free_sync:
      us = c.threshold >= c.bytes ? 1.75 : 144.0 + 2.26 * std::max(0.0, mib - 64.0);
      break;
    case BenchCase::Kind::trim: us = 38.0 + 1.67 * mib; break;
    case BenchCase::Kind::graph_alloc_free: us = 1.0 + 0.0023 * mib; break;
  }
  std::vector<double> ns;
  std::uint64_t state = 0x9e3779b97f4a7c15ULL ^ (c.bytes * 31 + static_cast<std::uint64_t>(c.kind));
  for (int i = 0; i < c.iterations; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const double jitter = 1.0 + 0.1 * static_cast<double>(state >> 40) / double(1ULL << 24);
    ns.push_back(us * 1000.0 * jitter);
  }
  return ns;
}

}  // namespace cupool::sim
