// The real backend's GraphMemory (graph_memory.cpp): a device's graph memory.
#pragma once

#include "device/cuda/driver.h"

namespace cupool::cuda {

class CudaGraphMemory : public virtual GraphMemory, protected DriverRole {
 public:
  explicit CudaGraphMemory(Driver& driver) : DriverRole(driver) {}

  GraphMemUsage graph_mem_usage(int ordinal) override;
  void trim_graph_mem(int ordinal) override;
  void reset_graph_mem_peaks(int ordinal) override;

 private:
  cuuint64_t graph_attribute(CUdevice dev, CUgraphMem_attribute attr);
};

}  // namespace cupool::cuda
