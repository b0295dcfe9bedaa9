// A simulated node: answers every Backend question from a node profile (recorded on a real
// machine with `query --profile-out`), records the calls made, and fails on request.
//
// Sharing is real: a posix_fd pool is backed by a memfd the size of its address range, its
// exported "handle" is a dup of that memfd, and an importer (another process, with a SimBackend of
// its own made from any profile) maps it, so what one process writes another reads.
//
// Each role is a class of its own in device/sim/ (node.h, pools.h, graph_memory.h, sharing.h,
// exported.h, transfers.h, usage.h, bench.h; their rules are written there), over one SimState (state.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "device/backend.h"
#include "device/node.h"
#include "device/sim/bench.h"
#include "device/sim/exported.h"
#include "device/sim/graph_memory.h"
#include "device/sim/node.h"
#include "device/sim/pools.h"
#include "device/sim/sharing.h"
#include "device/sim/state.h"
#include "device/sim/transfers.h"
#include "device/sim/usage.h"

namespace cupool {

class SimBackend final : private sim::SimStateOwner,
                         public Backend,
                         public sim::SimNodeQuery,
                         public sim::SimPools,
                         public sim::SimSharing,
                         public sim::SimGraphMemory,
                         public sim::SimExportedMemory,
                         public sim::SimTransfers,
                         public sim::SimDeviceUsage,
                         public sim::SimBench {
 public:
  explicit SimBackend(NodeReport profile);
  // Unmaps every arena and closes every memfd (SimState's destructor).
  ~SimBackend() override = default;
  SimBackend(const SimBackend&) = delete;
  SimBackend& operator=(const SimBackend&) = delete;

  static constexpr std::uint64_t kGranule = sim::SimState::kGranule;
  static constexpr std::uint64_t kTrimChunk = sim::SimState::kTrimChunk;
  static constexpr unsigned kAddressBits = sim::SimState::kAddressBits;
  static constexpr std::uint64_t kMaxArena = sim::SimState::kMaxArena;
  // The arena of a pool with no max_size and no device size to go by (host pools).
  static constexpr std::uint64_t kDefaultArena = sim::SimState::kDefaultArena;

  // Failure injection: every later call of `call` ("init", "device_info", "probe_export", ...)
  // fails with the named driver error ("CUDA_ERROR_NOT_PERMITTED"). `call` may also name one call
  // as calls() records it ("create_pool(1)"): only that one fails.
  void fail(const std::string& call, const std::string& error_name) { state_.fail(call, error_name); }
  // Another process that NVML lists on `device` from now on, with its bytes (a test hook: the
  // holder's ledger meets a process it does not know).
  void add_gpu_process(int device, GpuProcess process) { state_.strangers()[device].push_back(process); }
  // The calls made so far, e.g. "device_info(0)", in order.
  const std::vector<std::string>& calls() const { return state_.calls(); }
  const NodeReport& profile() const { return state_.profile(); }
  // application_sets_current_pool (a test hook): sim::SimPools.
};

// The CUresult value of a driver error name; 999 (CUDA_ERROR_UNKNOWN) for names it doesn't know.
int cuda_error_code(const std::string& name);

}  // namespace cupool
