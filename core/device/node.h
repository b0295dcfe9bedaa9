// A node's answer to "what does this machine support?": built by `query` from a Backend,
// recorded as a node profile (`query --profile-out`) and read back by the simulated node.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "device/backend.h"
#include "device/dmem.h"
#include "model/model.h"

namespace cupool {

struct DeviceReport {
  DeviceInfo info;
  std::optional<MemoryInfo> memory;  // free memory, when readable without a context
  std::vector<ExportProbe> probes;   // filled by --deep
};

struct NodeReport {
  ReportSource source;
  int driver_version = 0;             // cuDriverGetVersion (13000 = 13.0)
  std::string kernel_driver_version;  // "580.159.04"
  int built_with_cuda = 0;            // CUDA_VERSION of the headers cupool was built with
  std::vector<int> host_numa_nodes;
  std::vector<DeviceReport> devices;
  std::vector<std::vector<bool>> peer_access;  // [device][peer], true on the diagonal
  bool deep = false;
  std::optional<GdsReport> gds;     // GPUDirect Storage, with --deep
  std::optional<DmemSupport> dmem;  // this host's kernel (query asks it); never in a profile

  const DeviceReport* device(int ordinal) const;
  // Managed (alloc_type: managed) pools need a CUDA 13 driver and managed memory on the device.
  bool managed_pools_supported(int ordinal) const;
};

// "13.0" for 13000.
std::string cuda_version_string(int version);

// ---- device selectors: an index, a GPU UUID or a PCI bus id ----

struct DeviceSelector {
  enum class Kind { index, uuid, pci_bus_id };
  Kind kind = Kind::index;
  int index = -1;
  std::string text;        // as written
  std::string normalized;  // lower-case UUID or "dddd:bb:dd.f"
};

// Parses one selector. nullopt with `why` when it is none of the three forms.
std::optional<DeviceSelector> parse_device_selector(std::string_view text, std::string* why = nullptr);
// Normalises "00000000:1B:00.0" / "0000:1b:00.0" / "1b:00.0" to "0000:1b:00.0"; nullopt if invalid.
std::optional<std::string> normalize_pci_bus_id(std::string_view text);
// The ordinal the selector names on this node, or nullopt.
std::optional<int> resolve_device(const NodeReport& node, const DeviceSelector& selector);
// "GPU 0 (NVIDIA H100 80GB HBM3)".
std::string device_label(const NodeReport& node, int ordinal);
// The ordinal of the reported device a dmem region belongs to (by PCI bus id); nullopt when none
// is, and on a simulated node (the kernel is this host's, the devices the profile's).
std::optional<int> dmem_device(const DmemRegion& region, const NodeReport& report);

// ---- serialisation ----

// What `query` prints: the report as its typed view, and that view's JSON.
model::NodeFacts facts_of(const NodeReport& report);
nlohmann::ordered_json to_json(const NodeReport& report);
// Where a report's facts come from, as every verb's output says it (`source`).
model::Source source_of(const ReportSource& source);
// Reads what to_json wrote (a profile's `node` section). Throws InputError naming the key.
NodeReport report_from_json(const nlohmann::ordered_json& j, const std::string& origin);

// Loads a profile file (YAML or JSON). Throws InputError with file and reason.
NodeReport load_profile(const std::string& path);
// Writes `report` as a profile; `host` and the time are recorded in its header.
void save_profile(const NodeReport& report, const std::string& path);

}  // namespace cupool
