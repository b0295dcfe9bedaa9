// The simulated node's Bench (bench.cpp): figures from a model, not measurements.
#pragma once

#include "device/sim/state.h"

namespace cupool::sim {

class SimBench : public virtual Bench, protected SimRole {
 public:
  explicit SimBench(SimState& state) : SimRole(state) {}

  // Not a measurement: a model fitted to `cupool bench` on an H100 with driver 580
  // (tests/gpu/results/bench-h100-2026-11-21.txt), so that `bench` runs everywhere and its tests
  // have something to check. Per iteration: cuMemAlloc+cuMemFree 70 us + 0.65 us/MiB;
  // cuMemAllocAsync+cuMemFreeAsync 0.7 us; with a synchronize 1.75 us when the pool keeps the memory
  // (threshold >= size), else 144 us + 2.26 us per MiB above 64 MiB; a trim 38 us + 1.67 us/MiB; a
  // captured graph's alloc/free launch 1 us + 0.0023 us/MiB. Each iteration varies by up to 10%,
  // deterministically.
  std::vector<double> bench(int device, const BenchCase& c) override;
};

}  // namespace cupool::sim
