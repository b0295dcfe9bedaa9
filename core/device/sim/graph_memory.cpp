// The simulated node, GraphMemory: a device's graph memory, which a simulated node never has.
#include "device/sim/graph_memory.h"

#include <string>

namespace cupool::sim {

GraphMemUsage SimGraphMemory::graph_mem_usage(int dev) {
  s_.enter("graph_mem_usage", std::to_string(dev));
  s_.device(dev, "cuDeviceGetGraphMemAttribute");
  return GraphMemUsage{};
}

void SimGraphMemory::trim_graph_mem(int dev) {
  s_.enter("trim_graph_mem", std::to_string(dev));
  s_.device(dev, "cuDeviceGraphMemTrim");
}

void SimGraphMemory::reset_graph_mem_peaks(int dev) {
  s_.enter("reset_graph_mem_peaks", std::to_string(dev));
  s_.device(dev, "cuDeviceSetGraphMemAttribute");
}

}  // namespace cupool::sim
