// What the simulated node's role classes share (device/sim/): the profile, the pools and their
// arenas, the exported allocations mapped here, the calls made and the failures asked for. Owned
// by SimBackend (sim_backend.h) and referenced by each role. Not for use outside device/sim/.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "device/backend.h"
#include "device/node.h"

namespace cupool::sim {

class SimState {
 public:
  static constexpr std::uint64_t kGranule = 2ULL << 20;
  static constexpr std::uint64_t kTrimChunk = 32ULL << 20;
  static constexpr unsigned kAddressBits = 44;
  static constexpr std::uint64_t kMaxArena = 1ULL << kAddressBits;
  // The arena of a pool with no max_size and no device size to go by (host pools).
  static constexpr std::uint64_t kDefaultArena = 1ULL << 40;

  struct Allocation {
    std::uint64_t bytes = 0;  // as asked
    std::uint64_t span = 0;   // taken from the arena (whole granules)
    bool shared = false;      // made by allocate_shared
  };
  // First-fit offsets within [0, size).
  struct Arena {
    std::uint64_t size = 0;
    std::map<std::uint64_t, std::uint64_t> free_ranges;  // offset -> length, never adjacent
    explicit Arena(std::uint64_t bytes = 0);
    // The offset of `span` free bytes, or nullopt.
    std::optional<std::uint64_t> take(std::uint64_t span);
    void give_back(std::uint64_t offset, std::uint64_t span);
  };
  struct Pool {
    int device = 0;
    PoolProps props;
    PoolSettings settings;
    PoolUsage usage;
    std::map<std::uint64_t, Allocation> allocations;  // address -> allocation
    std::vector<int> peers;
    Arena arena;
    int memfd = -1;           // posix_fd pools (owned); for imported ones, not kept
    void* mapping = nullptr;  // the arena in this process: lazy for own pools, the import itself
    bool imported = false;
    bool borrowed = false;                                     // a device's default pool: never destroyed
    bool created = false;                                      // made by create_pool
    std::map<std::uint64_t, std::uint64_t> imported_pointers;  // host address -> bytes
  };
  // An exported allocation mapped here.
  struct Mapping {
    int device = 0;
    std::uint64_t size = 0;
    bool own = false;  // made by create_exported here (counted in reserved_on)
  };

  explicit SimState(NodeReport profile);
  // Unmaps every arena and closes every memfd (the pools first), then unmaps every exported
  // allocation mapped here.
  ~SimState();
  SimState(const SimState&) = delete;
  SimState& operator=(const SimState&) = delete;

  const NodeReport& profile() const noexcept { return profile_; }

  // Records a call ("device_info" with "0": "device_info(0)") and throws what fail() asked for it.
  void enter(const std::string& call, const std::string& args = "");
  // See SimBackend::fail.
  void fail(const std::string& call, const std::string& error_name);
  const std::vector<std::string>& calls() const noexcept { return calls_; }
  // Forgets the calls recorded after the first `count` (a call made of others is one call).
  void keep_calls(std::size_t count) { calls_.resize(count); }

  const DeviceReport& device(int ordinal, const char* api) const;
  // Whether init() has run once (a slow init, CUPOOL_SIM_INIT_MS, waits only the first time).
  bool initialised() const noexcept { return initialised_; }
  void set_initialised() noexcept { initialised_ = true; }

  std::map<PoolHandle, Pool>& pools() noexcept { return pools_; }
  // Records a pool under the next handle.
  PoolHandle add_pool(Pool p);
  Pool& pool(PoolHandle handle, const char* api);
  Pool& imported_pool(PoolHandle handle, const char* api);
  Pool& own_pool(PoolHandle handle, const char* api);
  std::map<int, PoolHandle>& default_pools() noexcept { return default_pools_; }  // made on first use
  std::map<int, PoolHandle>& current_pools() noexcept { return current_pools_; }  // set by set_current_pool
  std::map<std::uint64_t, Mapping>& mappings() noexcept { return mappings_; }     // host address -> mapping

  // Allocation shared by allocate and allocate_shared: the accounting, then the arena.
  std::uint64_t take(PoolHandle handle, Pool& p, std::uint64_t bytes, bool shared, const char* api);
  // Forgets an allocation and gives its range back; returns its size. Doesn't settle.
  std::uint64_t release(Pool& p, std::uint64_t address, bool shared, const char* api);
  static void unmap(Pool& p) noexcept;
  // Reserved bytes of all pools on a device.
  std::uint64_t reserved_on(int device) const;
  // Whether this process has a context on the device: a pool there (made, found or imported), or an
  // exported allocation mapped there.
  bool has_context(int device) const;
  // Processes of other users of the node that NVML would list on a device (a test hook:
  // SimBackend::add_gpu_process); device_usage reports them and counts their bytes as used.
  std::map<int, std::vector<GpuProcess>>& strangers() noexcept { return strangers_; }
  // The driver's release at a synchronize: keep at most max(used, threshold) reserved.
  static void settle(Pool& p);

 private:
  NodeReport profile_;
  std::map<PoolHandle, Pool> pools_;
  std::map<std::uint64_t, Mapping> mappings_;
  std::map<int, PoolHandle> default_pools_;
  std::map<int, PoolHandle> current_pools_;
  PoolHandle last_pool_ = 0;
  bool initialised_ = false;
  std::map<int, std::vector<GpuProcess>> strangers_;
  std::map<std::string, std::string> failures_;
  std::vector<std::string> calls_;
};

// What each role class of the simulated node holds: the shared state, and its names.
class SimRole {
 protected:
  using Pool = SimState::Pool;
  using Arena = SimState::Arena;
  using Mapping = SimState::Mapping;
  static constexpr std::uint64_t kGranule = SimState::kGranule;
  static constexpr std::uint64_t kTrimChunk = SimState::kTrimChunk;
  static constexpr unsigned kAddressBits = SimState::kAddressBits;
  static constexpr std::uint64_t kMaxArena = SimState::kMaxArena;
  static constexpr std::uint64_t kDefaultArena = SimState::kDefaultArena;
  explicit SimRole(SimState& state) : s_(state) {}
  SimState& s_;
};

// Owns the SimState the roles share. The first base of SimBackend, so the state is made before
// the roles that reference it and outlives them.
class SimStateOwner {
 protected:
  explicit SimStateOwner(NodeReport profile) : state_(std::move(profile)) {}
  SimState state_;
};

}  // namespace cupool::sim
