// The simulated node: its role classes composed into one Backend over one SimState.
#include <map>
#include <string>
#include <utility>

#include "device/sim_backend.h"

namespace cupool {

int cuda_error_code(const std::string& name) {
  static const std::map<std::string, int> codes = {
      {"CUDA_SUCCESS", 0},
      {"CUDA_ERROR_INVALID_VALUE", 1},
      {"CUDA_ERROR_OUT_OF_MEMORY", 2},
      {"CUDA_ERROR_NOT_INITIALIZED", 3},
      {"CUDA_ERROR_NO_DEVICE", 100},
      {"CUDA_ERROR_INVALID_DEVICE", 101},
      {"CUDA_ERROR_NOT_PERMITTED", 800},
      {"CUDA_ERROR_NOT_SUPPORTED", 801},
      {"CUDA_ERROR_UNKNOWN", 999},
  };
  auto it = codes.find(name);
  return it == codes.end() ? 999 : it->second;
}

SimBackend::SimBackend(NodeReport profile)
    : SimStateOwner(std::move(profile)),
      SimNodeQuery(state_),
      SimPools(state_),
      SimSharing(state_),
      SimGraphMemory(state_),
      SimExportedMemory(state_),
      SimTransfers(state_),
      SimDeviceUsage(state_),
      SimBench(state_) {}

}  // namespace cupool
