// The real backend's PoolExport and PoolImport (sharing.cpp): pool memory shared between the
// holder and its clients.
#pragma once

#include "device/cuda/driver.h"

namespace cupool::cuda {

class CudaSharing : public virtual PoolExport, public virtual PoolImport, protected DriverRole {
 public:
  explicit CudaSharing(Driver& driver) : DriverRole(driver) {}

  // PoolExport
  int export_pool_fd(PoolHandle handle) override;
  SharedAllocation allocate_shared(PoolHandle handle, std::uint64_t bytes, Readiness readiness) override;
  Blob64 ready_event(int ordinal) override;
  void free_shared(PoolHandle handle, std::uint64_t address) override;
  void synchronize(int ordinal) override;

  // PoolImport
  PoolHandle import_pool_fd(int ordinal, int fd) override;
  std::uint64_t import_pointer(PoolHandle handle, const Blob64& export_data) override;
  void wait_ready(int ordinal, const Blob64& event) override;
  void free_imported(PoolHandle handle, std::uint64_t address) override;
};

}  // namespace cupool::cuda
