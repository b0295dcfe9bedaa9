// The real backend: its role classes composed into one Backend over one Driver.
#include "device/cuda/bench.h"
#include "device/cuda/driver.h"
#include "device/cuda/exported.h"
#include "device/cuda/graph_memory.h"
#include "device/cuda/node.h"
#include "device/cuda/pools.h"
#include "device/cuda/sharing.h"
#include "device/cuda/transfers.h"
#include "device/cuda/usage.h"

namespace cupool {

namespace cuda {

// Owns the Driver the roles share. The first base of CudaBackend, so the Driver is made before
// the roles that reference it and outlives them (its destructor frees what they made).
class DriverOwner {
 protected:
  explicit DriverOwner(DebugLog debug) : driver_(std::move(debug)) {}
  Driver driver_;
};

// Every role of the real backend; each role's functions are its role class's (the role
// interfaces are virtual bases of Backend and of the role classes, so the role class overrides).
class CudaBackend final : private DriverOwner,
                          public Backend,
                          public CudaNodeQuery,
                          public CudaPools,
                          public CudaSharing,
                          public CudaGraphMemory,
                          public CudaExportedMemory,
                          public CudaTransfers,
                          public CudaDeviceUsage,
                          public CudaBench {
 public:
  explicit CudaBackend(DebugLog debug)
      : DriverOwner(std::move(debug)),
        CudaNodeQuery(driver_),
        CudaPools(driver_),
        CudaSharing(driver_),
        CudaGraphMemory(driver_),
        CudaExportedMemory(driver_),
        CudaTransfers(driver_),
        CudaDeviceUsage(driver_),
        CudaBench(driver_) {}
};

}  // namespace cuda

int built_with_cuda_version() { return CUDA_VERSION; }

std::unique_ptr<Backend> make_cuda_backend(DebugLog debug) {
  return std::make_unique<cuda::CudaBackend>(std::move(debug));
}

}  // namespace cupool
