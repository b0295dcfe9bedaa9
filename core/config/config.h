// The config file, version 1: parsed strictly, every value kept with its line and column so
// that findings can point at it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/diagnostics.h"
#include "device/backend.h"
#include "device/node.h"

namespace cupool {

template <class T>
struct At {
  T value{};
  Loc loc;
  bool set = false;
};

// release_threshold: bytes, a percentage of the device's memory, or "max".
struct Threshold {
  enum class Kind { bytes, percent, max };
  Kind kind = Kind::bytes;
  std::uint64_t bytes = 0;
  double fraction = 0.0;  // for percent: 0 < fraction <= 1
  std::string text;       // as written

  // Bytes on a device with `device_memory` bytes; UINT64_MAX for max.
  std::uint64_t resolve(std::uint64_t device_memory) const;
};

// `all`, or a list of device selectors.
struct DeviceList {
  bool all = false;
  Loc loc;
  std::vector<At<DeviceSelector>> items;
};

struct Reuse {
  Loc loc;
  At<bool> follow_event_dependencies;
  At<bool> allow_opportunistic;
  At<bool> allow_internal_dependencies;
};

struct PoolLocation {
  enum class Kind { device, host, host_numa };
  Kind kind = Kind::device;
  int numa_id = -1;
};

enum class AllocType { pinned, managed };

struct Share {
  Loc loc;
  std::vector<At<std::string>> users;
  std::vector<At<std::string>> groups;
  At<std::uint64_t> quota_per_client;
};

struct PoolSpec {
  Loc loc;
  At<std::string> name;
  DeviceList devices;
  At<PoolLocation> location;  // default device
  At<AllocType> alloc_type;   // default pinned
  Loc handle_types_loc;
  std::vector<At<HandleType>> handle_types;  // empty: none
  At<std::uint64_t> max_size;                // unset: the driver's default (device memory)
  At<Threshold> release_threshold;           // unset: 0, the driver's default
  At<std::uint64_t> reserve;
  std::optional<Reuse> reuse;
  std::optional<DeviceList> access;
  std::optional<Share> share;

  // The IPC handle types other than none, as a driver mask.
  std::uint32_t handle_mask() const;
};

struct BufferSpec {
  Loc loc;
  At<std::string> name;
  At<std::string> pool;
  At<DeviceSelector> device;
  At<std::uint64_t> size;
};

struct HolderSpec {
  Loc loc;
  At<std::string> socket;  // default kDefaultSocket
  At<unsigned> mode;       // default 0660
  At<std::string> group;
};

struct DefaultPoolSpec {
  Loc loc;
  At<Threshold> release_threshold;
  std::optional<Reuse> reuse;
  std::optional<DeviceList> access;
};

// A pool cupool creates inside the application on each selected device and makes the device's
// current pool (cuDeviceSetMemPool), so that cudaMallocAsync / cuMemAllocAsync allocate from it.
// Always device-located, never exported.
struct CurrentPoolSpec {
  Loc loc;
  At<std::uint64_t> max_size;       // unset: the driver's default (device memory)
  At<Threshold> release_threshold;  // unset: 0, the driver's default
  At<std::uint64_t> reserve;        // allocated and freed once at creation, kept by the threshold
  std::optional<Reuse> reuse;
  std::optional<DeviceList> access;
};

struct ProcessSpec {
  Loc loc;
  DeviceList devices;  // default all
  std::optional<DefaultPoolSpec> default_pool;
  std::optional<CurrentPoolSpec> current_pool;
  // A budget on each selected device for `cupool exec` (docs/budgets.md): a size or a percentage of
  // the device's memory (kind max is never parsed here).
  At<Threshold> budget;
};

struct Config {
  At<int> version;
  HolderSpec holder;
  std::optional<ProcessSpec> process;
  Loc pools_loc;
  std::vector<PoolSpec> pools;
  Loc buffers_loc;
  std::vector<BufferSpec> buffers;
};

extern const char* const kDefaultSocket;  // /run/cupool/cupool.sock

// Limits on untrusted input.
constexpr std::size_t kMaxConfigBytes = 1 << 20;  // 1 MiB
constexpr int kMaxNesting = 32;                   // flow/block nesting depth
constexpr std::size_t kMaxPools = 1024;
constexpr std::size_t kMaxBuffers = 4096;
constexpr std::size_t kMaxValues = 100000;  // values read (map entries, list items), aliases repeated

// Parses and validates a config's shape (keys, types, units, enums). Every problem goes into
// `diags` as an invalid-input finding; the result holds everything that could be read.
Config parse_config(const SourceFile& file, Diagnostics& diags);

}  // namespace cupool
