// The real backend, GraphMemory: a device's graph memory (CUDA graphs' allocations).
#include "device/cuda/graph_memory.h"

namespace cupool::cuda {

GraphMemUsage CudaGraphMemory::graph_mem_usage(int ordinal) {
  const CUdevice dev = d_.device(ordinal);
  ContextScope scope(api_, d_.context(ordinal));
  GraphMemUsage u;
  u.reserved_bytes = graph_attribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
  u.reserved_peak_bytes = graph_attribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH);
  u.used_bytes = graph_attribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
  u.used_peak_bytes = graph_attribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH);
  return u;
}

void CudaGraphMemory::trim_graph_mem(int ordinal) {
  const CUdevice dev = d_.device(ordinal);
  ContextScope scope(api_, d_.context(ordinal));
  check(api_.cuDeviceGraphMemTrim(dev), "cuDeviceGraphMemTrim");
}

void CudaGraphMemory::reset_graph_mem_peaks(int ordinal) {
  const CUdevice dev = d_.device(ordinal);
  ContextScope scope(api_, d_.context(ordinal));
  // 0 is the only value these accept: "reset to the current value".
  cuuint64_t zero = 0;
  check(api_.cuDeviceSetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero), "cuDeviceSetGraphMemAttribute");
  zero = 0;
  check(api_.cuDeviceSetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &zero),
        "cuDeviceSetGraphMemAttribute");
}

cuuint64_t CudaGraphMemory::graph_attribute(CUdevice dev, CUgraphMem_attribute attr) {
  cuuint64_t value = 0;
  check(api_.cuDeviceGetGraphMemAttribute(dev, attr, &value), "cuDeviceGetGraphMemAttribute");
  return value;
}

}  // namespace cupool::cuda
