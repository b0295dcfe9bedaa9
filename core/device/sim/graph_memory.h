// The simulated node's GraphMemory (graph_memory.cpp): none (its figures are zero).
#pragma once

#include "device/sim/state.h"

namespace cupool::sim {

class SimGraphMemory : public virtual GraphMemory, protected SimRole {
 public:
  explicit SimGraphMemory(SimState& state) : SimRole(state) {}

  GraphMemUsage graph_mem_usage(int device) override;
  void trim_graph_mem(int device) override;
  void reset_graph_mem_peaks(int device) override;
};

}  // namespace cupool::sim
