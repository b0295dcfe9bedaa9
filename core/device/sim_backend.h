// A simulated node: answers every Backend question from a node profile (recorded on a real
// machine with `query --profile-out`), records the calls made, and fails on request.
//
// Sharing is real: a posix_fd pool is backed by a memfd the size of its address range, its
// exported "handle" is a dup of that memfd, and an importer (another process, with a SimBackend of
// its own made from any profile) maps it, so what one process writes another reads.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "device/backend.h"
#include "device/node.h"

namespace cupool {

class SimBackend final : public Backend {
 public:
  explicit SimBackend(NodeReport profile);
  // Unmaps every arena and closes every memfd.
  ~SimBackend() override;
  SimBackend(const SimBackend&) = delete;
  SimBackend& operator=(const SimBackend&) = delete;

  // The profile's source: its path and how it was recorded.
  ReportSource source() const override;
  void init() override;
  int driver_version() override;
  std::string kernel_driver_version() override;
  int device_count() override;
  DeviceInfo device_info(int ordinal) override;
  std::optional<MemoryInfo> memory_info(int ordinal) override;
  bool can_access_peer(int device, int peer) override;
  std::vector<int> host_numa_nodes() override;
  ExportProbe probe_export(int ordinal, HandleType type) override;
  // The profile's `gds` (a deep query recorded it), else unavailable.
  GdsReport gds_report() override;

  // Pools follow the driver's rules as measured on real GPUs (tests/gpu/RESULTS.md): memory is
  // reserved in 2 MiB granules and kept up to the release threshold at each synchronize (measured
  // for thresholds 0 and max); a trim releases whole 32 MiB chunks and keeps at least `keep`
  // (measured on an H100, driver 580: 64 MiB reserved, trim to 16 MiB keeps 32 MiB).
  PoolHandle create_pool(int device, const PoolProps& props) override;
  void destroy_pool(PoolHandle pool) override;
  void set_pool_settings(PoolHandle pool, const PoolSettings& settings) override;
  PoolSettings pool_settings(PoolHandle pool) override;
  PoolUsage pool_usage(PoolHandle pool) override;
  void reset_pool_peaks(PoolHandle pool) override;
  void set_pool_access(PoolHandle pool, int peer) override;
  std::uint64_t allocate(PoolHandle pool, std::uint64_t bytes) override;
  void free(PoolHandle pool, std::uint64_t address) override;
  void trim_pool(PoolHandle pool, std::uint64_t keep) override;

  // Each pool has an address range (its arena) of max_size bytes, or the device's total memory
  // when max_size is 0 (capped at kMaxArena; kDefaultArena for host pools), handed out first-fit
  // in 2 MiB granules; when it has no free range large enough, allocating fails with
  // OUT_OF_MEMORY even if the accounting above would allow it. A holder-side address is
  // (pool << kAddressBits) | offset; write/read map the arena into this process when first used
  // (a memfd for posix_fd pools, anonymous memory for the others).
  //
  // Sharing follows the stream-ordered rules: allocate_shared accounts like allocate; free_shared
  // lowers `used` but releases nothing until synchronize(device) settles the device's pools. The
  // ready event is a token (there is no asynchronous work to wait for; wait_ready only checks that
  // it is one) and graph memory is zero.
  //
  // Export data (Blob64), little-endian:
  //   bytes  0..9   "CUPOOLSIM1"
  //   bytes 16..23  the pool's arena size (the size of its memfd)
  //   bytes 24..31  the allocation's offset in the arena
  //   bytes 32..39  the allocation's size in bytes
  //   other bytes   zero
  // Ready event (Blob64): bytes 0..9 "CUPOOLEVT1", bytes 16..23 the device ordinal.
  //
  // The importing side never consults the profile: import_pool_fd maps the whole memfd
  // (MAP_SHARED), import_pointer checks the export data against it and returns the host address,
  // write/read copy within an imported pointer's range; destroy_pool unmaps.
  int export_pool_fd(PoolHandle pool) override;
  SharedAllocation allocate_shared(PoolHandle pool, std::uint64_t bytes, Readiness readiness) override;
  Blob64 ready_event(int device) override;
  void free_shared(PoolHandle pool, std::uint64_t address) override;
  void synchronize(int device) override;
  GraphMemUsage graph_mem_usage(int device) override;
  void trim_graph_mem(int device) override;
  void reset_graph_mem_peaks(int device) override;
  PoolHandle import_pool_fd(int device, int fd) override;
  std::uint64_t import_pointer(PoolHandle imported, const Blob64& export_data) override;
  void wait_ready(int device, const Blob64& event) override;
  void free_imported(PoolHandle imported, std::uint64_t address) override;
  void write(int device, std::uint64_t address, const void* source, std::uint64_t bytes) override;
  LoadReport load_file(int device, int fd, const std::vector<FileRange>& ranges, const LoadOptions& options,
                       const std::function<void(std::uint64_t)>& progress) override;
  void read(int device, std::uint64_t address, void* target, std::uint64_t bytes) override;

  // Exported allocations are memfds too: the allocation's bytes, then one page that says what it
  // is (bytes 0..9 "CUPOOLVMM1", 16..23 the device ordinal, 24..31 the size), sealed against
  // growing and shrinking. Their address here is where the memfd is mapped; create_exported
  // counts them as the device's used memory (an allocation that would pass the profile's free
  // memory fails with OUT_OF_MEMORY), map_exported checks the page against what it is asked.
  std::uint64_t allocation_granularity(int device) override;
  ExportedAllocation create_exported(int device, std::uint64_t bytes) override;
  std::uint64_t map_exported(int device, int fd, std::uint64_t size, const std::vector<int>& peers) override;
  void grant_exported_access(std::uint64_t address, int peer) override;
  void unmap_exported(std::uint64_t address) override;

  static constexpr std::uint64_t kGranule = 2ULL << 20;
  static constexpr std::uint64_t kTrimChunk = 32ULL << 20;
  static constexpr unsigned kAddressBits = 44;
  static constexpr std::uint64_t kMaxArena = 1ULL << kAddressBits;
  // The arena of a pool with no max_size and no device size to go by (host pools).
  static constexpr std::uint64_t kDefaultArena = 1ULL << 40;

  // Failure injection: every later call of `call` ("init", "device_info", "probe_export", ...)
  // fails with the named driver error ("CUDA_ERROR_NOT_PERMITTED"). `call` may also name one call
  // as calls() records it ("create_pool(1)"): only that one fails.
  void fail(const std::string& call, const std::string& error_name);

  // The device's default pool: threshold 0 and all reuse policies on, as the driver's.
  PoolHandle default_pool(int device) override;
  // The default pool unless set_current_pool made another current.
  PoolHandle current_pool(int device) override;
  void set_current_pool(int device, PoolHandle pool) override;
  std::optional<PoolProps> created_props(PoolHandle pool) override;
  bool pool_access(PoolHandle pool, int peer) override;
  bool context_active(int device) override;

  // Not a measurement: a model fitted to `cupool bench` on an H100 with driver 580
  // (tests/gpu/results/bench-h100-2026-11-21.txt), so that `bench` runs everywhere and its tests
  // have something to check. Per iteration: cuMemAlloc+cuMemFree 70 us + 0.65 us/MiB;
  // cuMemAllocAsync+cuMemFreeAsync 0.7 us; with a synchronize 1.75 us when the pool keeps the memory
  // (threshold >= size), else 144 us + 2.26 us per MiB above 64 MiB; a trim 38 us + 1.67 us/MiB; a
  // captured graph's alloc/free launch 1 us + 0.0023 us/MiB. Each iteration varies by up to 10%,
  // deterministically.
  std::vector<double> bench(int device, const BenchCase& c) override;
  // Test hook: the application makes a pool of its own the device's current pool, through its own
  // runtime (cudaMemPoolCreate + cudaDeviceSetMemPool), so created_props knows nothing of it.
  PoolHandle application_sets_current_pool(int device);
  // The calls made so far, e.g. "device_info(0)", in order.
  const std::vector<std::string>& calls() const { return calls_; }
  const NodeReport& profile() const { return profile_; }

 private:
  void enter(const std::string& call, const std::string& args = "");
  const DeviceReport& device(int ordinal, const char* api) const;

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
  Pool& pool(PoolHandle handle, const char* api);
  Pool& imported_pool(PoolHandle handle, const char* api);
  Pool& own_pool(PoolHandle handle, const char* api);
  // Allocation shared by allocate and allocate_shared: the accounting, then the arena.
  std::uint64_t take(PoolHandle handle, Pool& p, std::uint64_t bytes, bool shared, const char* api);
  // Forgets an allocation and gives its range back; returns its size. Doesn't settle.
  std::uint64_t release(Pool& p, std::uint64_t address, bool shared, const char* api);
  // `bytes` at `address` in this process's memory: an imported pointer, or an allocation of an
  // own pool (whose arena is mapped on first use).
  std::uint8_t* host_view(std::uint64_t address, std::uint64_t bytes, const char* api);
  static void unmap(Pool& p) noexcept;
  // Reserved bytes of all pools on a device.
  std::uint64_t reserved_on(int device) const;
  // The driver's release at a synchronize: keep at most max(used, threshold) reserved.
  static void settle(Pool& p);

  // An exported allocation mapped here.
  struct Mapping {
    int device = 0;
    std::uint64_t size = 0;
    bool own = false;  // made by create_exported here (counted in reserved_on)
  };

  NodeReport profile_;
  std::map<PoolHandle, Pool> pools_;
  std::map<std::uint64_t, Mapping> mappings_;  // host address -> mapping
  std::map<int, PoolHandle> default_pools_;    // device -> its default pool, made on first use
  std::map<int, PoolHandle> current_pools_;    // device -> the pool set_current_pool made current
  PoolHandle last_pool_ = 0;
  std::map<std::string, std::string> failures_;
  std::vector<std::string> calls_;
};

// The CUresult value of a driver error name; 999 (CUDA_ERROR_UNKNOWN) for names it doesn't know.
int cuda_error_code(const std::string& name);

}  // namespace cupool
