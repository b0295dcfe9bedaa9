// The real backend's ExportedMemory (exported.cpp): held buffers as exported VMM allocations.
#pragma once

#include "device/cuda/driver.h"

namespace cupool::cuda {

class CudaExportedMemory : public virtual ExportedMemory, protected DriverRole {
 public:
  explicit CudaExportedMemory(Driver& driver) : DriverRole(driver) {}

  std::uint64_t allocation_granularity(int ordinal) override;
  ExportedAllocation create_exported(int ordinal, std::uint64_t bytes) override;
  std::uint64_t map_exported(int ordinal, int fd, std::uint64_t size, const std::vector<int>& peers) override;
  void grant_exported_access(std::uint64_t address, int peer) override;
  void unmap_exported(std::uint64_t address) override;

 private:
  // What a held buffer's memory is made with: pinned memory of the device, exportable as a POSIX fd.
  static CUmemAllocationProp exported_prop(int ordinal);
  static CUmemAccessDesc access_desc(int ordinal);
  Imported import_exported(int fd);
  // Reserves `size` bytes of address space, maps `handle` there and gives `ordinal` and `peers`
  // read-write access; undoes what it did when a step fails.
  std::uint64_t map_handle(int ordinal, CUmemGenericAllocationHandle handle, std::uint64_t size,
                           const std::vector<int>& peers);
};

}  // namespace cupool::cuda
