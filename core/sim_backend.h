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

  // Failure injection: every later call of `call` ("init", "device_info", "probe_export", ...)
  // fails with the named driver error ("CUDA_ERROR_NOT_PERMITTED").
  void fail(const std::string& call, const std::string& error_name);
  // The calls made so far, e.g. "device_info(0)", in order.
  const std::vector<std::string>& calls() const { return calls_; }
  const NodeReport& profile() const { return profile_; }

 private:
  void enter(const std::string& call, const std::string& args = "");
  const DeviceReport& device(int ordinal, const char* api) const;

  NodeReport profile_;
  std::map<std::string, std::string> failures_;
  std::vector<std::string> calls_;
};

// The CUresult value of a driver error name; 999 (CUDA_ERROR_UNKNOWN) for names it doesn't know.
int cuda_error_code(const std::string& name);

}  // namespace cupool
