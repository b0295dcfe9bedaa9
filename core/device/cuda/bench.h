// The real backend's Bench (bench.cpp): the measured loops of `cupool bench`.
#pragma once

#include "device/cuda/driver.h"

namespace cupool::cuda {

class CudaBench : public virtual Bench, protected DriverRole {
 public:
  explicit CudaBench(Driver& driver) : DriverRole(driver) {}

  std::vector<double> bench(int ordinal, const BenchCase& c) override;
};

}  // namespace cupool::cuda
