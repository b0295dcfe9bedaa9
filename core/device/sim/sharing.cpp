// The simulated node, PoolExport and PoolImport: pools shared through memfds between processes.
#include "device/sim/sharing.h"

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

int SimSharing::export_pool_fd(PoolHandle handle) {
  s_.enter("export_pool_fd", std::to_string(handle));
  const char* api = "cuMemPoolExportToShareableHandle";
  Pool& p = s_.own_pool(handle, api);
  if (p.memfd < 0) throw invalid_value(api, "the pool was not created with the posix_fd handle type");
  const int fd = ::fcntl(p.memfd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw system_error(api, "dup of the pool's memfd", errno, "CUDA_ERROR_UNKNOWN");
  return fd;
}

SharedAllocation SimSharing::allocate_shared(PoolHandle handle, std::uint64_t bytes, Readiness readiness) {
  // The journal says which way (",synchronized"): the simulated node's memory is ready at once.
  s_.enter("allocate_shared", std::to_string(handle) + "," + std::to_string(bytes) +
                                  (readiness == Readiness::synchronized ? ",synchronized" : ""));
  const char* api = "cuMemAllocFromPoolAsync";
  Pool& p = s_.own_pool(handle, api);
  if (p.memfd < 0)
    throw invalid_value("cuMemPoolExportPointer", "the pool was not created with the posix_fd handle type");
  SharedAllocation shared;
  shared.address = s_.take(handle, p, bytes, true, api);
  std::copy(std::begin(kExportMagic), std::end(kExportMagic), shared.export_data.begin());
  put_u64(shared.export_data, 16, p.arena.size);
  put_u64(shared.export_data, 24, shared.address & (kMaxArena - 1));
  put_u64(shared.export_data, 32, bytes);
  return shared;
}

Blob64 SimSharing::ready_event(int dev) {
  s_.enter("ready_event", std::to_string(dev));
  s_.device(dev, "cuEventCreate");
  Blob64 event{};
  std::copy(std::begin(kEventMagic), std::end(kEventMagic), event.begin());
  put_u64(event, 16, static_cast<std::uint64_t>(dev));
  return event;
}

void SimSharing::free_shared(PoolHandle handle, std::uint64_t address) {
  s_.enter("free_shared", std::to_string(handle));
  // Stream-ordered: the memory stays reserved until the next synchronize.
  s_.release(s_.own_pool(handle, "cuMemFreeAsync"), address, true, "cuMemFreeAsync");
}

void SimSharing::synchronize(int dev) {
  s_.enter("synchronize", std::to_string(dev));
  for (auto& [handle, p] : s_.pools())
    if (!p.imported && p.device == dev) s_.settle(p);
}

PoolHandle SimSharing::import_pool_fd(int dev, int fd) {
  s_.enter("import_pool_fd", std::to_string(dev));
  const char* api = "cuMemPoolImportFromShareableHandle";
  struct stat st;
  if (::fstat(fd, &st) != 0) throw system_error(api, "fstat of the pool's fd", errno, "CUDA_ERROR_INVALID_VALUE");
  if (!S_ISREG(st.st_mode) || st.st_size <= 0)
    throw invalid_value(api, "the fd is not a simulated pool's handle (a memfd)");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  void* base =
      ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (base == MAP_FAILED) throw system_error(api, "mmap of the pool's memfd", errno, "CUDA_ERROR_OUT_OF_MEMORY");
  Pool p;
  p.device = dev;
  p.props.location_id = dev;
  p.props.handle_types = static_cast<std::uint32_t>(HandleType::posix_fd);
  p.arena.size = size;
  p.mapping = base;
  p.imported = true;
  return s_.add_pool(std::move(p));
}

std::uint64_t SimSharing::import_pointer(PoolHandle handle, const Blob64& export_data) {
  s_.enter("import_pointer", std::to_string(handle));
  const char* api = "cuMemPoolImportPointer";
  Pool& p = s_.imported_pool(handle, api);
  if (!has_magic(export_data, kExportMagic)) throw invalid_value(api, "not a simulated pool's export data");
  const std::uint64_t arena = get_u64(export_data, 16);
  const std::uint64_t offset = get_u64(export_data, 24);
  const std::uint64_t bytes = get_u64(export_data, 32);
  if (arena != p.arena.size) throw invalid_value(api, "the export data is from another pool (arena size differs)");
  if (bytes == 0 || offset > arena || bytes > arena - offset)
    throw invalid_value(api, "the exported range lies outside the pool");
  const std::uint64_t address = reinterpret_cast<std::uintptr_t>(p.mapping) + offset;
  p.imported_pointers[address] = bytes;
  return address;
}

void SimSharing::wait_ready(int dev, const Blob64& event) {
  s_.enter("wait_ready", std::to_string(dev));
  if (!has_magic(event, kEventMagic)) throw invalid_value("cuIpcOpenEventHandle", "not a simulated ready event");
}

void SimSharing::free_imported(PoolHandle handle, std::uint64_t address) {
  s_.enter("free_imported", std::to_string(handle));
  Pool& p = s_.imported_pool(handle, "cuMemFreeAsync");
  if (p.imported_pointers.erase(address) == 0)
    throw invalid_value("cuMemFreeAsync", "not an imported pointer of this pool");
}

}  // namespace cupool::sim
