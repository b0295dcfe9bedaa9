// The simulated node's shared state (SimState): recorded calls, injected failures, arenas and the pool table.
#include "device/sim/state.h"

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

SimState::SimState(NodeReport profile) : profile_(std::move(profile)) {}

SimState::~SimState() {
  for (auto& [handle, p] : pools_) unmap(p);
  for (auto& [address, m] : mappings_)
    ::munmap(reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), static_cast<std::size_t>(m.size));
}

void SimState::fail(const std::string& call, const std::string& error_name) { failures_[call] = error_name; }

void SimState::enter(const std::string& call, const std::string& args) {
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

PoolHandle SimState::add_pool(Pool p) {
  pools_[++last_pool_] = std::move(p);
  return last_pool_;
}

const DeviceReport& SimState::device(int ordinal, const char* api) const {
  const DeviceReport* d = profile_.device(ordinal);
  if (!d) throw CudaError(api, 101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal");
  return *d;
}

SimState::Arena::Arena(std::uint64_t bytes) : size(bytes) {
  if (size) free_ranges[0] = size;
}

std::optional<std::uint64_t> SimState::Arena::take(std::uint64_t span) {
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

void SimState::Arena::give_back(std::uint64_t offset, std::uint64_t span) {
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

SimState::Pool& SimState::pool(PoolHandle handle, const char* api) {
  auto it = pools_.find(handle);
  if (it == pools_.end()) throw CudaError(api, 400, "CUDA_ERROR_INVALID_HANDLE", "no such pool");
  return it->second;
}

SimState::Pool& SimState::own_pool(PoolHandle handle, const char* api) {
  Pool& p = pool(handle, api);
  if (p.imported) throw invalid_value(api, "the pool is imported from another process");
  return p;
}

SimState::Pool& SimState::imported_pool(PoolHandle handle, const char* api) {
  Pool& p = pool(handle, api);
  if (!p.imported) throw invalid_value(api, "the pool was not imported");
  return p;
}

void SimState::unmap(Pool& p) noexcept {
  if (p.mapping) ::munmap(p.mapping, static_cast<std::size_t>(p.arena.size));
  if (p.memfd >= 0) ::close(p.memfd);
  p.mapping = nullptr;
  p.memfd = -1;
}

std::uint64_t SimState::reserved_on(int dev) const {
  std::uint64_t total = 0;
  for (const auto& [h, p] : pools_)
    if (!p.imported && p.device == dev && p.props.location == PoolProps::Location::device)
      total += p.usage.reserved_bytes;
  for (const auto& [address, m] : mappings_)
    if (m.own && m.device == dev) total += m.size;
  return total;
}

bool SimState::has_context(int dev) const {
  for (const auto& [h, p] : pools_)
    if (p.device == dev) return true;
  for (const auto& [address, m] : mappings_)
    if (m.device == dev) return true;
  return false;
}

void SimState::settle(Pool& p) {
  if (p.usage.reserved_bytes <= p.settings.release_threshold.bytes()) return;
  const std::uint64_t floor = round_up(p.usage.used_bytes, kGranule);
  p.usage.reserved_bytes = std::max(floor, round_up(p.settings.release_threshold.bytes(), kGranule));
}

std::uint64_t SimState::take(PoolHandle handle, Pool& p, std::uint64_t bytes, bool shared, const char* api) {
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

std::uint64_t SimState::release(Pool& p, std::uint64_t address, bool shared, const char* api) {
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

}  // namespace cupool::sim
