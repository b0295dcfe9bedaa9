// The simulated node, ExportedMemory: held buffers as memfds of their rounded size.
#include "device/sim/exported.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <utility>

#include "base/error.h"
#include "base/fd.h"
#include "device/sim/helpers.h"

namespace cupool::sim {

std::uint64_t SimExportedMemory::allocation_granularity(int dev) {
  s_.enter("allocation_granularity", std::to_string(dev));
  s_.device(dev, "cuMemGetAllocationGranularity");
  return kGranule;  // as an H100's and an H200's (tests/gpu/RESULTS.md)
}

ExportedAllocation SimExportedMemory::create_exported(int dev, std::uint64_t bytes) {
  s_.enter("create_exported", std::to_string(dev) + "," + std::to_string(bytes));
  const char* api = "cuMemCreate";
  const DeviceReport& d = s_.device(dev, api);
  if (bytes == 0 || bytes > kMaxArena) throw invalid_value(api, "no size, or more than a simulated device holds");
  const std::uint64_t size = round_up(bytes, kGranule);
  const std::uint64_t free = d.memory ? d.memory->free : d.info.total_memory;
  if (s_.reserved_on(dev) + size > free) throw CudaError(api, 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of device memory");
  Fd fd(::memfd_create("cupool-sim-exported", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw system_error(api, "memfd_create", errno, "CUDA_ERROR_OUT_OF_MEMORY");
  Blob64 page{};
  std::copy(std::begin(kExportedMagic), std::end(kExportedMagic), page.begin());
  put_u64(page, 16, static_cast<std::uint64_t>(dev));
  put_u64(page, 24, size);
  if (::ftruncate(fd.get(), static_cast<off_t>(size + kExportedPage)) != 0 ||
      ::pwrite(fd.get(), page.data(), page.size(), static_cast<off_t>(size)) != static_cast<ssize_t>(page.size()) ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    throw system_error(api, "making the allocation's memfd", errno, "CUDA_ERROR_OUT_OF_MEMORY");
  void* base =
      ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd.get(), 0);
  if (base == MAP_FAILED) throw system_error(api, "mmap of the allocation", errno, "CUDA_ERROR_OUT_OF_MEMORY");
  const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(base));
  s_.mappings()[address] = Mapping{dev, size, true};
  return {address, size, fd.release()};
}

std::uint64_t SimExportedMemory::map_exported(int dev, int fd, std::uint64_t size, const std::vector<int>& peers) {
  s_.enter("map_exported", std::to_string(dev) + "," + std::to_string(size));
  const char* api = "cuMemImportFromShareableHandle";
  struct stat st;
  if (::fstat(fd, &st) != 0) throw system_error(api, "fstat of the allocation's fd", errno, "CUDA_ERROR_INVALID_VALUE");
  Blob64 page{};
  const auto length = static_cast<std::uint64_t>(st.st_size);
  if (!S_ISREG(st.st_mode) || length < kExportedPage ||
      ::pread(fd, page.data(), page.size(), static_cast<off_t>(length - kExportedPage)) !=
          static_cast<ssize_t>(page.size()) ||
      !has_magic(page, kExportedMagic) || get_u64(page, 24) != length - kExportedPage)
    throw invalid_value(api, "the fd is not a simulated exported allocation");
  if (get_u64(page, 16) != static_cast<std::uint64_t>(dev))
    throw CudaError(
        "cuMemGetAllocationPropertiesFromHandle", 101, "CUDA_ERROR_INVALID_DEVICE",
        "the allocation is on device " + std::to_string(get_u64(page, 16)) + ", not on device " + std::to_string(dev));
  // As the driver: the whole allocation or nothing (cuMemMap of a part of it fails).
  if (size != length - kExportedPage)
    throw invalid_value("cuMemMap", "the allocation has " + std::to_string(length - kExportedPage) + " bytes, not " +
                                        std::to_string(size));
  (void)peers;  // the importing side never consults the profile; any peer can address host memory
  void* base =
      ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (base == MAP_FAILED) throw system_error("cuMemMap", "mmap of the allocation", errno, "CUDA_ERROR_OUT_OF_MEMORY");
  const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(base));
  s_.mappings()[address] = Mapping{dev, size, false};
  return address;
}

void SimExportedMemory::grant_exported_access(std::uint64_t address, int peer) {
  s_.enter("grant_exported_access", std::to_string(peer));
  if (!s_.mappings().count(address)) throw invalid_value("cuMemSetAccess", "not an exported allocation mapped here");
}

void SimExportedMemory::unmap_exported(std::uint64_t address) {
  s_.enter("unmap_exported");
  auto it = s_.mappings().find(address);
  if (it == s_.mappings().end()) throw invalid_value("cuMemUnmap", "not an exported allocation mapped here");
  ::munmap(reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), static_cast<std::size_t>(it->second.size));
  s_.mappings().erase(it);
}

}  // namespace cupool::sim
