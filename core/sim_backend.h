// A simulated node: answers every Backend question from a node profile (recorded on a real
// machine with `query --profile-out`), records the calls made, and fails on request.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/node.h"

namespace cupool {

class SimBackend final : public Backend {
 public:
  explicit SimBackend(NodeReport profile);

  std::string describe() const override;
  bool simulated() const override { return true; }
  void init() override;
  int driver_version() override;
  std::string kernel_driver_version() override;
  int device_count() override;
  DeviceInfo device_info(int ordinal) override;
  std::optional<MemoryInfo> memory_info(int ordinal) override;
  bool can_access_peer(int device, int peer) override;
  std::vector<int> host_numa_nodes() override;
  ExportProbe probe_export(int ordinal, HandleType type) override;

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

  static constexpr std::uint64_t kGranule = 2ULL << 20;
  static constexpr std::uint64_t kTrimChunk = 32ULL << 20;

  // Failure injection: every later call of `call` ("init", "device_info", "probe_export", ...)
  // fails with the named driver error ("CUDA_ERROR_NOT_PERMITTED").
  void fail(const std::string& call, const std::string& error_name);
  // The calls made so far, e.g. "device_info(0)", in order.
  const std::vector<std::string>& calls() const { return calls_; }
  const NodeReport& profile() const { return profile_; }

 private:
  void enter(const std::string& call, const std::string& args = "");
  const DeviceReport& device(int ordinal, const char* api) const;

  struct Pool {
    int device = 0;
    PoolProps props;
    PoolSettings settings;
    PoolUsage usage;
    std::map<std::uint64_t, std::uint64_t> allocations;  // address -> bytes
    std::vector<int> peers;
  };
  Pool& pool(PoolHandle handle, const char* api);
  // Reserved bytes of all pools on a device.
  std::uint64_t reserved_on(int device) const;
  // The driver's release at a synchronize: keep at most max(used, threshold) reserved.
  static void settle(Pool& p);

  NodeReport profile_;
  std::map<PoolHandle, Pool> pools_;
  PoolHandle last_pool_ = 0;
  std::uint64_t next_address_ = 0x7f0000000000ULL;
  std::map<std::string, std::string> failures_;
  std::vector<std::string> calls_;
};

// The CUresult value of a driver error name; 999 (CUDA_ERROR_UNKNOWN) for names it doesn't know.
int cuda_error_code(const std::string& name);

}  // namespace cupool
