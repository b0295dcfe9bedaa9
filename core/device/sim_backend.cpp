#include "device/sim_backend.h"

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

SimBackend::SimBackend(NodeReport profile) : profile_(std::move(profile)) {}

SimBackend::~SimBackend() {
  for (auto& [handle, p] : pools_) unmap(p);
  for (auto& [address, m] : mappings_)
    ::munmap(reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), static_cast<std::size_t>(m.size));
}

ReportSource SimBackend::source() const {
  ReportSource s = profile_.source;
  s.simulated = true;
  s.description = "simulated node (" + (s.profile_path.empty() ? std::string("in memory") : s.profile_path) + ")";
  return s;
}

void SimBackend::fail(const std::string& call, const std::string& error_name) { failures_[call] = error_name; }

void SimBackend::enter(const std::string& call, const std::string& args) {
  calls_.push_back(call + "(" + args + ")");
  auto it = failures_.find(call);
  if (it == failures_.end()) it = failures_.find(calls_.back());
  if (it == failures_.end()) return;
  if (call == "init") {
    if (it->second == "CUDA_ERROR_NO_DEVICE")
      throw NoDriverError("the NVIDIA driver is loaded but reports no CUDA device");
    throw NoDriverError("the NVIDIA driver could not be initialised: cuInit failed with " + it->second);
  }
  throw CudaError("simulated " + call, cuda_error_code(it->second), it->second, "injected failure");
}

const DeviceReport& SimBackend::device(int ordinal, const char* api) const {
  const DeviceReport* d = profile_.device(ordinal);
  if (!d) throw CudaError(api, 101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal");
  return *d;
}

void SimBackend::init() {
  enter("init");
  if (profile_.devices.empty()) throw NoDriverError("the simulated node has no CUDA device");
}

int SimBackend::driver_version() {
  enter("driver_version");
  return profile_.driver_version;
}

std::string SimBackend::kernel_driver_version() {
  enter("kernel_driver_version");
  return profile_.kernel_driver_version;
}

int SimBackend::device_count() {
  enter("device_count");
  return static_cast<int>(profile_.devices.size());
}

DeviceInfo SimBackend::device_info(int ordinal) {
  enter("device_info", std::to_string(ordinal));
  return device(ordinal, "cuDeviceGet").info;
}

std::optional<MemoryInfo> SimBackend::memory_info(int ordinal) {
  enter("memory_info", std::to_string(ordinal));
  return device(ordinal, "cuDeviceGet").memory;
}

bool SimBackend::can_access_peer(int dev, int peer) {
  enter("can_access_peer", std::to_string(dev) + "," + std::to_string(peer));
  device(dev, "cuDeviceCanAccessPeer");
  device(peer, "cuDeviceCanAccessPeer");
  return profile_.peer_access[static_cast<std::size_t>(dev)][static_cast<std::size_t>(peer)];
}

std::vector<int> SimBackend::host_numa_nodes() {
  enter("host_numa_nodes");
  return profile_.host_numa_nodes;
}

ExportProbe SimBackend::probe_export(int ordinal, HandleType type) {
  enter("probe_export", std::to_string(ordinal) + "," + handle_type_name(type));
  const DeviceReport& d = device(ordinal, "cuDeviceGet");
  // A recorded probe is the node's real answer.
  for (const auto& p : d.probes)
    if (p.handle_type == type) return p;
  ExportProbe probe;
  probe.handle_type = type;
  const auto bit = static_cast<std::uint32_t>(type);
  if (!d.info.memory_pools || (type != HandleType::none && (d.info.pool_handle_types & bit) == 0)) {
    probe.api = "cuMemPoolCreate";
    probe.error = "CUDA_ERROR_NOT_SUPPORTED";
    probe.description = "operation not supported";
  } else {
    probe.ok = true;
  }
  return probe;
}

GdsReport SimBackend::gds_report() {
  enter("gds_report");
  if (profile_.gds) return *profile_.gds;
  GdsReport none;
  none.reason =
      "the simulated node's profile records no GPUDirect Storage (a profile recorded with "
      "'query --deep --profile-out' on a node keeps what it had)";
  return none;
}

// ---- pools ----

namespace {
// Rounds up to a multiple of `granule`, saturating instead of wrapping near 2^64.
std::uint64_t round_up(std::uint64_t bytes, std::uint64_t granule) {
  const std::uint64_t rest = bytes % granule;
  if (rest == 0) return bytes;
  return bytes > UINT64_MAX - (granule - rest) ? UINT64_MAX : bytes + (granule - rest);
}

constexpr std::uint8_t kExportMagic[10] = {'C', 'U', 'P', 'O', 'O', 'L', 'S', 'I', 'M', '1'};
constexpr std::uint8_t kEventMagic[10] = {'C', 'U', 'P', 'O', 'O', 'L', 'E', 'V', 'T', '1'};
constexpr std::uint8_t kExportedMagic[10] = {'C', 'U', 'P', 'O', 'O', 'L', 'V', 'M', 'M', '1'};
constexpr std::uint64_t kExportedPage = 4096;  // what follows an exported allocation's bytes

void put_u64(Blob64& blob, std::size_t at, std::uint64_t value) {
  for (std::size_t i = 0; i < 8; ++i) blob[at + i] = static_cast<std::uint8_t>(value >> (8 * i));
}
std::uint64_t get_u64(const Blob64& blob, std::size_t at) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < 8; ++i) value |= static_cast<std::uint64_t>(blob[at + i]) << (8 * i);
  return value;
}
bool has_magic(const Blob64& blob, const std::uint8_t (&magic)[10]) {
  return std::equal(std::begin(magic), std::end(magic), blob.begin());
}

CudaError invalid_value(const char* api, const std::string& why) {
  return CudaError(api, 1, "CUDA_ERROR_INVALID_VALUE", why);
}
CudaError system_error(const char* api, const char* call, int code, const char* error_name) {
  return CudaError(api, cuda_error_code(error_name), error_name, std::string(call) + ": " + std::strerror(code));
}
}  // namespace

SimBackend::Arena::Arena(std::uint64_t bytes) : size(bytes) {
  if (size) free_ranges[0] = size;
}

std::optional<std::uint64_t> SimBackend::Arena::take(std::uint64_t span) {
  for (auto it = free_ranges.begin(); it != free_ranges.end(); ++it) {
    if (it->second < span) continue;
    const std::uint64_t offset = it->first;
    const std::uint64_t rest = it->second - span;
    free_ranges.erase(it);
    if (rest) free_ranges[offset + span] = rest;
    return offset;
  }
  return std::nullopt;
}

void SimBackend::Arena::give_back(std::uint64_t offset, std::uint64_t span) {
  auto next = free_ranges.lower_bound(offset);
  if (next != free_ranges.end() && offset + span == next->first) {
    span += next->second;
    next = free_ranges.erase(next);
  }
  if (next != free_ranges.begin()) {
    auto before = std::prev(next);
    if (before->first + before->second == offset) {
      before->second += span;
      return;
    }
  }
  free_ranges[offset] = span;
}

SimBackend::Pool& SimBackend::pool(PoolHandle handle, const char* api) {
  auto it = pools_.find(handle);
  if (it == pools_.end()) throw CudaError(api, 400, "CUDA_ERROR_INVALID_HANDLE", "no such pool");
  return it->second;
}

SimBackend::Pool& SimBackend::own_pool(PoolHandle handle, const char* api) {
  Pool& p = pool(handle, api);
  if (p.imported) throw invalid_value(api, "the pool is imported from another process");
  return p;
}

SimBackend::Pool& SimBackend::imported_pool(PoolHandle handle, const char* api) {
  Pool& p = pool(handle, api);
  if (!p.imported) throw invalid_value(api, "the pool was not imported");
  return p;
}

void SimBackend::unmap(Pool& p) noexcept {
  if (p.mapping) ::munmap(p.mapping, static_cast<std::size_t>(p.arena.size));
  if (p.memfd >= 0) ::close(p.memfd);
  p.mapping = nullptr;
  p.memfd = -1;
}

std::uint64_t SimBackend::reserved_on(int dev) const {
  std::uint64_t total = 0;
  for (const auto& [h, p] : pools_)
    if (!p.imported && p.device == dev && p.props.location == PoolProps::Location::device)
      total += p.usage.reserved_bytes;
  for (const auto& [address, m] : mappings_)
    if (m.own && m.device == dev) total += m.size;
  return total;
}

void SimBackend::settle(Pool& p) {
  if (p.usage.reserved_bytes <= p.settings.release_threshold) return;
  const std::uint64_t floor = round_up(p.usage.used_bytes, kGranule);
  p.usage.reserved_bytes = std::max(floor, round_up(p.settings.release_threshold, kGranule));
}

PoolHandle SimBackend::create_pool(int dev, const PoolProps& props) {
  enter("create_pool", std::to_string(dev));
  const DeviceReport& d = device(dev, "cuMemPoolCreate");
  if (!d.info.memory_pools)
    throw CudaError("cuMemPoolCreate", 801, "CUDA_ERROR_NOT_SUPPORTED", "the device has no memory pools");
  if ((props.handle_types & ~d.info.pool_handle_types) != 0)
    throw CudaError("cuMemPoolCreate", 801, "CUDA_ERROR_NOT_SUPPORTED", "handle type not supported");
  if (props.location == PoolProps::Location::host && props.handle_types != 0)
    throw CudaError("cuMemPoolCreate", 1, "CUDA_ERROR_INVALID_VALUE", "host pools are not IPC capable");
  std::uint64_t arena = props.max_size;
  if (arena == 0 && props.location == PoolProps::Location::device) arena = d.info.total_memory;
  if (arena == 0) arena = kDefaultArena;
  Pool p;
  p.device = dev;
  p.props = props;
  p.created = true;
  p.settings.release_threshold = 0;
  p.arena = Arena(std::min(round_up(arena, kGranule), kMaxArena));
  if (props.handle_types & static_cast<std::uint32_t>(HandleType::posix_fd)) {
    p.memfd = ::memfd_create("cupool-sim-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (p.memfd < 0) throw system_error("cuMemPoolCreate", "memfd_create", errno, "CUDA_ERROR_OUT_OF_MEMORY");
    if (::ftruncate(p.memfd, static_cast<off_t>(p.arena.size)) != 0) {
      const int code = errno;
      ::close(p.memfd);
      throw system_error("cuMemPoolCreate", "ftruncate of the pool's memfd", code, "CUDA_ERROR_OUT_OF_MEMORY");
    }
    // Importers get this descriptor: none of them may shrink the pool under the others' mappings
    // (they would die of SIGBUS), or grow it. A real pool's shareable handle can't be resized either.
    if (::fcntl(p.memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      const int code = errno;
      ::close(p.memfd);
      throw system_error("cuMemPoolCreate", "sealing the pool's memfd", code, "CUDA_ERROR_OUT_OF_MEMORY");
    }
  }
  pools_[++last_pool_] = std::move(p);
  return last_pool_;
}

void SimBackend::destroy_pool(PoolHandle handle) {
  enter("destroy_pool", std::to_string(handle));
  if (pool(handle, "cuMemPoolDestroy").borrowed)
    throw invalid_value("cuMemPoolDestroy", "a device's default pool is not destroyed");
  for (const auto& [dev, current] : current_pools_)
    if (current == handle)
      throw invalid_value("cuMemPoolDestroy", "the pool is device " + std::to_string(dev) + "'s current pool");
  unmap(pool(handle, "cuMemPoolDestroy"));
  pools_.erase(handle);
}

void SimBackend::set_pool_settings(PoolHandle handle, const PoolSettings& settings) {
  enter("set_pool_settings", std::to_string(handle));
  pool(handle, "cuMemPoolSetAttribute").settings = settings;
}

PoolSettings SimBackend::pool_settings(PoolHandle handle) {
  enter("pool_settings", std::to_string(handle));
  return pool(handle, "cuMemPoolGetAttribute").settings;
}

PoolUsage SimBackend::pool_usage(PoolHandle handle) {
  enter("pool_usage", std::to_string(handle));
  return pool(handle, "cuMemPoolGetAttribute").usage;
}

void SimBackend::reset_pool_peaks(PoolHandle handle) {
  enter("reset_pool_peaks", std::to_string(handle));
  PoolUsage& u = pool(handle, "cuMemPoolSetAttribute").usage;
  u.reserved_peak_bytes = u.reserved_bytes;
  u.used_peak_bytes = u.used_bytes;
}

void SimBackend::set_pool_access(PoolHandle handle, int peer) {
  enter("set_pool_access", std::to_string(handle) + "," + std::to_string(peer));
  Pool& p = pool(handle, "cuMemPoolSetAccess");
  // An importer's profile may know nothing of the devices (import paths don't need one); it is
  // only consulted where it does.
  const bool known = profile_.device(peer) && profile_.device(p.device);
  if (p.imported && !known) {
    if (peer < 0) throw CudaError("cuMemPoolSetAccess", 101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal");
  } else {
    device(peer, "cuMemPoolSetAccess");
    if (peer != p.device && !profile_.peer_access[static_cast<std::size_t>(peer)][static_cast<std::size_t>(p.device)])
      throw CudaError("cuMemPoolSetAccess", 1, "CUDA_ERROR_INVALID_VALUE", "peer access is not possible");
  }
  p.peers.push_back(peer);
}

std::uint64_t SimBackend::take(PoolHandle handle, Pool& p, std::uint64_t bytes, bool shared, const char* api) {
  if (bytes == 0) throw CudaError(api, 1, "CUDA_ERROR_INVALID_VALUE", "zero bytes");
  PoolUsage& u = p.usage;
  const std::uint64_t need = bytes > UINT64_MAX - u.used_bytes ? UINT64_MAX : round_up(u.used_bytes + bytes, kGranule);
  if (p.props.max_size && need > p.props.max_size)
    throw CudaError(api, 2, "CUDA_ERROR_OUT_OF_MEMORY", "the pool is at its max_size");
  if (need > u.reserved_bytes) {
    const std::uint64_t grow = need - u.reserved_bytes;
    const DeviceReport& d = device(p.device, api);
    const std::uint64_t free = d.memory ? d.memory->free : d.info.total_memory;
    if (p.props.location == PoolProps::Location::device && reserved_on(p.device) + grow > free)
      throw CudaError(api, 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of device memory");
  }
  const std::uint64_t span = round_up(bytes, kGranule);
  const std::optional<std::uint64_t> offset = p.arena.take(span);
  if (!offset)
    throw CudaError(api, 2, "CUDA_ERROR_OUT_OF_MEMORY", "no free range this large in the pool's address range");
  u.reserved_bytes = std::max(u.reserved_bytes, need);
  u.used_bytes += bytes;
  u.used_peak_bytes = std::max(u.used_peak_bytes, u.used_bytes);
  u.reserved_peak_bytes = std::max(u.reserved_peak_bytes, u.reserved_bytes);
  const std::uint64_t address = (handle << kAddressBits) | *offset;
  p.allocations[address] = Allocation{bytes, span, shared};
  return address;
}

std::uint64_t SimBackend::release(Pool& p, std::uint64_t address, bool shared, const char* api) {
  auto it = p.allocations.find(address);
  if (it == p.allocations.end() || it->second.shared != shared)
    throw CudaError(api, 1, "CUDA_ERROR_INVALID_VALUE",
                    shared ? "not a shared allocation of this pool" : "not an allocation of this pool");
  const Allocation a = it->second;
  p.allocations.erase(it);
  p.arena.give_back(address & (kMaxArena - 1), a.span);
  p.usage.used_bytes -= a.bytes;
  return a.bytes;
}

std::uint64_t SimBackend::allocate(PoolHandle handle, std::uint64_t bytes) {
  enter("allocate", std::to_string(handle) + "," + std::to_string(bytes));
  return take(handle, own_pool(handle, "cuMemAllocFromPoolAsync"), bytes, false, "cuMemAllocFromPoolAsync");
}

void SimBackend::free(PoolHandle handle, std::uint64_t address) {
  enter("free", std::to_string(handle));
  Pool& p = pool(handle, "cuMemFreeAsync");
  release(p, address, false, "cuMemFreeAsync");
  settle(p);
}

void SimBackend::trim_pool(PoolHandle handle, std::uint64_t keep) {
  enter("trim_pool", std::to_string(handle) + "," + std::to_string(keep));
  Pool& p = pool(handle, "cuMemPoolTrimTo");
  const std::uint64_t floor = round_up(p.usage.used_bytes, kGranule);
  p.usage.reserved_bytes = std::min(p.usage.reserved_bytes, std::max(floor, round_up(keep, kTrimChunk)));
}

// ---- sharing: the exporting side ----

int SimBackend::export_pool_fd(PoolHandle handle) {
  enter("export_pool_fd", std::to_string(handle));
  const char* api = "cuMemPoolExportToShareableHandle";
  Pool& p = own_pool(handle, api);
  if (p.memfd < 0) throw invalid_value(api, "the pool was not created with the posix_fd handle type");
  const int fd = ::fcntl(p.memfd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw system_error(api, "dup of the pool's memfd", errno, "CUDA_ERROR_UNKNOWN");
  return fd;
}

SharedAllocation SimBackend::allocate_shared(PoolHandle handle, std::uint64_t bytes, Readiness readiness) {
  // The journal says which way (",synchronized"): the simulated node's memory is ready at once.
  enter("allocate_shared", std::to_string(handle) + "," + std::to_string(bytes) +
                               (readiness == Readiness::synchronized ? ",synchronized" : ""));
  const char* api = "cuMemAllocFromPoolAsync";
  Pool& p = own_pool(handle, api);
  if (p.memfd < 0)
    throw invalid_value("cuMemPoolExportPointer", "the pool was not created with the posix_fd handle type");
  SharedAllocation shared;
  shared.address = take(handle, p, bytes, true, api);
  std::copy(std::begin(kExportMagic), std::end(kExportMagic), shared.export_data.begin());
  put_u64(shared.export_data, 16, p.arena.size);
  put_u64(shared.export_data, 24, shared.address & (kMaxArena - 1));
  put_u64(shared.export_data, 32, bytes);
  return shared;
}

Blob64 SimBackend::ready_event(int dev) {
  enter("ready_event", std::to_string(dev));
  device(dev, "cuEventCreate");
  Blob64 event{};
  std::copy(std::begin(kEventMagic), std::end(kEventMagic), event.begin());
  put_u64(event, 16, static_cast<std::uint64_t>(dev));
  return event;
}

void SimBackend::free_shared(PoolHandle handle, std::uint64_t address) {
  enter("free_shared", std::to_string(handle));
  // Stream-ordered: the memory stays reserved until the next synchronize.
  release(own_pool(handle, "cuMemFreeAsync"), address, true, "cuMemFreeAsync");
}

void SimBackend::synchronize(int dev) {
  enter("synchronize", std::to_string(dev));
  for (auto& [handle, p] : pools_)
    if (!p.imported && p.device == dev) settle(p);
}

GraphMemUsage SimBackend::graph_mem_usage(int dev) {
  enter("graph_mem_usage", std::to_string(dev));
  device(dev, "cuDeviceGetGraphMemAttribute");
  return GraphMemUsage{};
}

void SimBackend::trim_graph_mem(int dev) {
  enter("trim_graph_mem", std::to_string(dev));
  device(dev, "cuDeviceGraphMemTrim");
}

void SimBackend::reset_graph_mem_peaks(int dev) {
  enter("reset_graph_mem_peaks", std::to_string(dev));
  device(dev, "cuDeviceSetGraphMemAttribute");
}

// ---- sharing: the importing side (never consults the profile) ----

PoolHandle SimBackend::import_pool_fd(int dev, int fd) {
  enter("import_pool_fd", std::to_string(dev));
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
  pools_[++last_pool_] = std::move(p);
  return last_pool_;
}

std::uint64_t SimBackend::import_pointer(PoolHandle handle, const Blob64& export_data) {
  enter("import_pointer", std::to_string(handle));
  const char* api = "cuMemPoolImportPointer";
  Pool& p = imported_pool(handle, api);
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

void SimBackend::wait_ready(int dev, const Blob64& event) {
  enter("wait_ready", std::to_string(dev));
  if (!has_magic(event, kEventMagic)) throw invalid_value("cuIpcOpenEventHandle", "not a simulated ready event");
}

void SimBackend::free_imported(PoolHandle handle, std::uint64_t address) {
  enter("free_imported", std::to_string(handle));
  Pool& p = imported_pool(handle, "cuMemFreeAsync");
  if (p.imported_pointers.erase(address) == 0)
    throw invalid_value("cuMemFreeAsync", "not an imported pointer of this pool");
}

// ---- exported allocations ----

std::uint64_t SimBackend::allocation_granularity(int dev) {
  enter("allocation_granularity", std::to_string(dev));
  device(dev, "cuMemGetAllocationGranularity");
  return kGranule;  // as an H100's and an H200's (tests/gpu/RESULTS.md)
}

ExportedAllocation SimBackend::create_exported(int dev, std::uint64_t bytes) {
  enter("create_exported", std::to_string(dev) + "," + std::to_string(bytes));
  const char* api = "cuMemCreate";
  const DeviceReport& d = device(dev, api);
  if (bytes == 0 || bytes > kMaxArena) throw invalid_value(api, "no size, or more than a simulated device holds");
  const std::uint64_t size = round_up(bytes, kGranule);
  const std::uint64_t free = d.memory ? d.memory->free : d.info.total_memory;
  if (reserved_on(dev) + size > free) throw CudaError(api, 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of device memory");
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
  mappings_[address] = Mapping{dev, size, true};
  return {address, size, fd.release()};
}

std::uint64_t SimBackend::map_exported(int dev, int fd, std::uint64_t size, const std::vector<int>& peers) {
  enter("map_exported", std::to_string(dev) + "," + std::to_string(size));
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
  mappings_[address] = Mapping{dev, size, false};
  return address;
}

void SimBackend::grant_exported_access(std::uint64_t address, int peer) {
  enter("grant_exported_access", std::to_string(peer));
  if (!mappings_.count(address)) throw invalid_value("cuMemSetAccess", "not an exported allocation mapped here");
}

void SimBackend::unmap_exported(std::uint64_t address) {
  enter("unmap_exported");
  auto it = mappings_.find(address);
  if (it == mappings_.end()) throw invalid_value("cuMemUnmap", "not an exported allocation mapped here");
  ::munmap(reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), static_cast<std::size_t>(it->second.size));
  mappings_.erase(it);
}

std::uint8_t* SimBackend::host_view(std::uint64_t address, std::uint64_t bytes, const char* api) {
  if (bytes > UINT64_MAX - address) throw invalid_value(api, "the range wraps around");
  // An exported allocation mapped here.
  if (auto m = mappings_.upper_bound(address); m != mappings_.begin()) {
    --m;
    if (address - m->first <= m->second.size && bytes <= m->second.size - (address - m->first))
      return reinterpret_cast<std::uint8_t*>(static_cast<std::uintptr_t>(address));
  }
  // An imported pointer: a host address inside an imported arena.
  for (auto& [handle, p] : pools_) {
    if (!p.imported) continue;
    auto it = p.imported_pointers.upper_bound(address);
    if (it == p.imported_pointers.begin()) continue;
    --it;
    if (address - it->first <= it->second && bytes <= it->second - (address - it->first))
      return reinterpret_cast<std::uint8_t*>(static_cast<std::uintptr_t>(address));
  }
  // An allocation of an own pool: (pool << kAddressBits) | offset.
  auto found = pools_.find(address >> kAddressBits);
  if (found != pools_.end() && !found->second.imported) {
    Pool& p = found->second;
    auto it = p.allocations.upper_bound(address);
    if (it != p.allocations.begin()) {
      --it;
      const std::uint64_t bytes_in = it->second.bytes;
      if (address - it->first <= bytes_in && bytes <= bytes_in - (address - it->first)) {
        if (!p.mapping) {
          const auto size = static_cast<std::size_t>(p.arena.size);
          void* base =
              p.memfd >= 0
                  ? ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, p.memfd, 0)
                  : ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
          if (base == MAP_FAILED)
            throw system_error(api, "mmap of the pool's arena", errno, "CUDA_ERROR_OUT_OF_MEMORY");
          p.mapping = base;
        }
        return static_cast<std::uint8_t*>(p.mapping) + (address & (kMaxArena - 1));
      }
    }
  }
  throw invalid_value(api, "the address is not in memory this process can address");
}

void SimBackend::write(int dev, std::uint64_t address, const void* source, std::uint64_t bytes) {
  enter("write", std::to_string(dev) + "," + std::to_string(bytes));
  std::uint8_t* target = host_view(address, bytes, "cuMemcpyHtoD");
  if (bytes) std::memcpy(target, source, static_cast<std::size_t>(bytes));
}

// The same loader as the real node's (file_load.cpp: threads, chunks, O_DIRECT), with slots of
// ordinary memory copied straight into the simulated device's.
LoadReport SimBackend::load_file(int dev, int fd, const std::vector<FileRange>& ranges, const LoadOptions& options,
                                 const std::function<void(std::uint64_t)>& progress) {
  enter("load_file", std::to_string(dev) + "," + std::to_string(ranges.size()));
  // Every target is looked up here, on this thread; the workers only copy.
  std::vector<FileRange> into = ranges;
  for (FileRange& r : into)
    r.address = reinterpret_cast<std::uintptr_t>(host_view(r.address, r.bytes, "cuMemcpyHtoDAsync"));
  class MemorySink : public LoadSink {
   public:
    explicit MemorySink(std::uint64_t slot_bytes) {
      for (auto& s : slots_) {
        void* p = nullptr;
        if (::posix_memalign(&p, kDirectAlign, static_cast<std::size_t>(slot_bytes)) != 0) throw std::bad_alloc();
        s.reset(static_cast<unsigned char*>(p));
      }
    }
    unsigned char* slot(unsigned i) override { return slots_[i].get(); }
    void wait(unsigned) override {}
    void send(unsigned, const unsigned char* from, std::uint64_t address, std::uint64_t bytes) override {
      std::memcpy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), from, static_cast<std::size_t>(bytes));
    }
    void finish() override {}

   private:
    struct Free {
      void operator()(unsigned char* p) const { std::free(p); }
    };
    std::unique_ptr<unsigned char, Free> slots_[kSlots];
  };
  // GPUDirect Storage as the profile records it: chunks read (pread) straight into the memory.
  class PreadPath : public DirectPath {
   public:
    PreadPath(int fd, bool gpudirect) : fd_(fd), gpudirect_(gpudirect) {}
    bool gpudirect() const override { return gpudirect_; }
    bool direct_io() const override { return false; }
    std::unique_ptr<DirectReader> reader() override {
      struct Reader : DirectReader {
        int fd;
        explicit Reader(int f) : fd(f) {}
        void read(std::uint64_t file_offset, std::uint64_t address, std::uint64_t bytes) override {
          read_file_range(fd, reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), bytes, file_offset);
        }
      };
      return std::make_unique<Reader>(fd_);
    }

   private:
    int fd_;
    bool gpudirect_;
  };
  LoadPaths paths;
  paths.sink = [](std::uint64_t slot_bytes) { return std::make_unique<MemorySink>(slot_bytes); };
  const GdsReport gds = profile_.gds.value_or(GdsReport{});
  paths.nvidia_fs = gds.mode == GdsReport::Mode::gpudirect;
  paths.open_direct = [this, gds](int file, const std::vector<FileRange>&) -> std::unique_ptr<DirectPath> {
    enter("gds_open", to_string(gds.mode));
    if (gds.mode == GdsReport::Mode::unavailable)
      throw GdsError("dlopen", "",
                     "GPUDirect Storage is not available: " +
                         (gds.reason.empty() ? std::string("the simulated node has none") : gds.reason));
    return std::make_unique<PreadPath>(file, gds.mode == GdsReport::Mode::gpudirect);
  };
  return load_file_ranges(fd, into, options, paths, progress);
}

void SimBackend::read(int dev, std::uint64_t address, void* target, std::uint64_t bytes) {
  enter("read", std::to_string(dev) + "," + std::to_string(bytes));
  const std::uint8_t* source = host_view(address, bytes, "cuMemcpyDtoH");
  if (bytes) std::memcpy(target, source, static_cast<std::size_t>(bytes));
}

// ---- this process's own pools ----

PoolHandle SimBackend::default_pool(int dev) {
  enter("default_pool", std::to_string(dev));
  device(dev, "cuDeviceGetDefaultMemPool");
  auto it = default_pools_.find(dev);
  if (it != default_pools_.end()) return it->second;
  Pool p;
  p.device = dev;
  p.props.location_id = dev;
  p.borrowed = true;
  p.settings.release_threshold = 0;
  pools_[++last_pool_] = std::move(p);
  default_pools_[dev] = last_pool_;
  return last_pool_;
}

PoolHandle SimBackend::current_pool(int dev) {
  enter("current_pool", std::to_string(dev));
  device(dev, "cuDeviceGetMemPool");
  if (auto c = current_pools_.find(dev); c != current_pools_.end()) return c->second;
  auto it = default_pools_.find(dev);
  if (it != default_pools_.end()) return it->second;
  const std::size_t before = calls_.size();
  const PoolHandle h = default_pool(dev);
  calls_.resize(before);  // one call, as the driver's
  return h;
}

void SimBackend::set_current_pool(int dev, PoolHandle handle) {
  enter("set_current_pool", std::to_string(dev) + "," + std::to_string(handle));
  device(dev, "cuDeviceSetMemPool");
  const Pool& p = pool(handle, "cuDeviceSetMemPool");
  auto def = default_pools_.find(dev);
  if (def != default_pools_.end() && def->second == handle) {
    current_pools_.erase(dev);
    return;
  }
  if (!p.created || p.device != dev || p.props.location != PoolProps::Location::device || p.props.location_id != dev)
    throw invalid_value("cuDeviceSetMemPool", "only a device pool created on device " + std::to_string(dev) +
                                                  ", or its default pool, can be made current there");
  current_pools_[dev] = handle;
}

PoolHandle SimBackend::application_sets_current_pool(int dev) {
  const std::size_t before = calls_.size();
  PoolProps props;
  props.location_id = dev;
  const PoolHandle handle = create_pool(dev, props);
  pools_[handle].created = false;
  current_pools_[dev] = handle;
  calls_.resize(before);  // not cupool's calls
  return handle;
}

std::optional<PoolProps> SimBackend::created_props(PoolHandle handle) {
  enter("created_props", std::to_string(handle));
  const Pool& p = pool(handle, "cupool pool lookup");
  if (!p.created) return std::nullopt;
  return p.props;
}

bool SimBackend::pool_access(PoolHandle handle, int peer) {
  enter("pool_access", std::to_string(handle) + "," + std::to_string(peer));
  const Pool& p = pool(handle, "cuMemPoolGetAccess");
  if (peer == p.device) return true;
  return std::find(p.peers.begin(), p.peers.end(), peer) != p.peers.end();
}

bool SimBackend::context_active(int dev) {
  enter("context_active", std::to_string(dev));
  device(dev, "cuDevicePrimaryCtxGetState");
  for (const auto& [h, p] : pools_)
    if (p.device == dev) return true;
  return false;
}

// ---- measuring (a model, see the header) ----

std::vector<double> SimBackend::bench(int dev, const BenchCase& c) {
  enter("bench", std::to_string(dev) + "," + std::to_string(static_cast<int>(c.kind)) + "," + std::to_string(c.bytes));
  device(dev, "cuDevicePrimaryCtxRetain");
  const double mib = static_cast<double>(c.bytes) / double(1 << 20);
  double us = 0;
  switch (c.kind) {
    case BenchCase::Kind::malloc_free: us = 70.0 + 0.65 * mib; break;
    case BenchCase::Kind::async_alloc_free: us = 0.7; break;
    case BenchCase::Kind::alloc_free_sync:
      us = c.threshold >= c.bytes ? 1.75 : 144.0 + 2.26 * std::max(0.0, mib - 64.0);
      break;
    case BenchCase::Kind::trim: us = 38.0 + 1.67 * mib; break;
    case BenchCase::Kind::graph_alloc_free: us = 1.0 + 0.0023 * mib; break;
  }
  std::vector<double> ns;
  std::uint64_t state = 0x9e3779b97f4a7c15ULL ^ (c.bytes * 31 + static_cast<std::uint64_t>(c.kind));
  for (int i = 0; i < c.iterations; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const double jitter = 1.0 + 0.1 * static_cast<double>(state >> 40) / double(1ULL << 24);
    ns.push_back(us * 1000.0 * jitter);
  }
  return ns;
}

}  // namespace cupool
