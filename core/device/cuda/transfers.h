// The real backend's Transfers (transfers.cpp): copies from host memory and from files.
#pragma once

#include "device/cuda/driver.h"

namespace cupool::cuda {

class CudaTransfers : public virtual Transfers, protected DriverRole {
 public:
  explicit CudaTransfers(Driver& driver) : DriverRole(driver) {}

  void write(int ordinal, std::uint64_t address, const void* source, std::uint64_t bytes) override;
  void read(int ordinal, std::uint64_t address, void* target, std::uint64_t bytes) override;
  LoadReport load_file(int ordinal, int fd, const std::vector<FileRange>& ranges, const LoadOptions& options,
                       const std::function<void(std::uint64_t)>& progress) override;
};

}  // namespace cupool::cuda
