// The one seam between cupool and CUDA. Everything cupool asks of the driver goes through the
// roles below (`Backend` is all of them); the real implementation (device/cuda/) is the only code
// that includes the CUDA headers, and a simulated node (sim_backend.h) answers the same questions
// from a node profile.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/units.h"
#include "device/file_load.h"
#include "device/gds.h"

namespace cupool {

// Pool IPC handle types, as in CUmemAllocationHandleType (bit values match the driver's).
enum class HandleType : std::uint32_t { none = 0x0, posix_fd = 0x1, fabric = 0x8 };

// "none", "posix_fd", "fabric".
const char* handle_type_name(HandleType type);
// The handle type names set in a CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES mask
// (Windows bits are reported as "win32" / "win32_kmt").
std::vector<std::string> handle_type_names(std::uint32_t mask);

// A failed driver call (Errc::cuda): the API, the CUresult value and its name
// ("CUDA_ERROR_NOT_PERMITTED").
class CudaError : public Error {
 public:
  CudaError(std::string api, int result, std::string name, std::string description);
  const std::string& api() const noexcept { return api_; }
  int result() const noexcept { return result_; }
  const std::string& name() const noexcept { return name_; }
  const std::string& description() const noexcept { return description_; }

 private:
  std::string api_;
  int result_;
  std::string name_;
  std::string description_;
};

// What one device reports through cuDeviceGet* attributes (no context needed for any of it).
struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  std::string uuid;        // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::string pci_bus_id;  // "0000:1b:00.0", lower case
  std::uint64_t total_memory = 0;
  int cc_major = 0;
  int cc_minor = 0;
  bool memory_pools = false;               // CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
  std::uint32_t pool_handle_types = 0;     // CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES
  bool fabric_handle = false;              // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED
  bool host_memory_pools = false;          // CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED
  bool host_numa_memory_pools = false;     // CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED
  int host_numa_id = -1;                   // CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID (-1: no NUMA)
  bool managed_memory = false;             // CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY
  bool concurrent_managed_access = false;  // CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
  bool pageable_memory_access = false;     // CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS
  bool vmm = false;                        // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  bool ipc_events = false;                 // CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED
  bool gpu_direct_rdma = false;            // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
};

// Free and total device memory, read without a CUDA context (through NVML on a real node).
struct MemoryInfo {
  std::uint64_t free = 0;
  std::uint64_t total = 0;
};

// A process that NVML lists on a device (it has a compute or graphics context there) and the device
// memory NVML counts for it: nullopt where NVML does not know (NVML_VALUE_NOT_AVAILABLE).
struct GpuProcess {
  std::uint32_t pid = 0;
  std::optional<std::uint64_t> used_bytes;
};

// What NVML says of one device's memory and of the processes using it (DeviceUsage::device_usage).
struct DeviceUsageReport {
  std::string source;  // "nvml", "simulated", or "unavailable" (then only note is set)
  std::string note;    // in words: why unavailable, or why the processes could not be listed; "" otherwise
  std::uint64_t total_bytes = 0;
  // reserved_bytes is the driver's and firmware's own, outside used_bytes: on driver 580 an idle
  // H200 answers nvmlDeviceGetMemoryInfo_v2 with used 0 and reserved 606 MiB (tests/gpu/RESULTS.md,
  // 2026-11-29), though NVML's header says used includes it. 0 where only v1 answers.
  std::uint64_t used_bytes = 0;
  std::uint64_t reserved_bytes = 0;
  std::uint64_t free_bytes = 0;
  bool processes_listed = false;      // false: NVML could not list them (note says why), processes is empty
  std::vector<GpuProcess> processes;  // compute and graphics processes, each pid once, in NVML's order
};

// The outcome of creating (and, for an IPC handle type, exporting) a small pool.
struct ExportProbe {
  HandleType handle_type = HandleType::none;
  bool ok = false;
  std::string error;        // e.g. "CUDA_ERROR_NOT_PERMITTED" (empty when ok)
  std::string api;          // the call that failed, e.g. "cuMemPoolExportToShareableHandle"
  std::string reason;       // plain words: what the failure means and what would fix it (build_report
                            // writes them; a recorded profile keeps those of the machine it was made on)
  std::string description;  // the driver's words for the error (cuGetErrorString), when it has them
};

// What a pool is created with (CUmemPoolProps).
struct PoolProps {
  enum class Location { device, host, host_numa };
  Location location = Location::device;
  int location_id = 0;             // device ordinal, or host NUMA node id
  bool managed = false;            // CU_MEM_ALLOCATION_TYPE_MANAGED instead of PINNED
  std::uint32_t handle_types = 0;  // HandleType bits
  std::uint64_t max_size = 0;      // 0: the driver's default
};

// A pool's settable attributes (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD and the reuse policies). The
// defaults are the driver's for a new pool. The one value that the config's settings become
// (config/resolve.h) and that the holder, the in-process apply and the backends use.
struct PoolSettings {
  // The resolver's is as the config wrote it; a backend sets the bytes and reads them back unwritten.
  ReleaseThreshold release_threshold;
  bool follow_event_dependencies = true;
  bool allow_opportunistic = true;
  bool allow_internal_dependencies = true;

  bool operator==(const PoolSettings& o) const {
    return release_threshold == o.release_threshold && follow_event_dependencies == o.follow_event_dependencies &&
           allow_opportunistic == o.allow_opportunistic && allow_internal_dependencies == o.allow_internal_dependencies;
  }
  bool operator!=(const PoolSettings& o) const { return !(*this == o); }
};

// One setting that differs between two PoolSettings: its name in the config
// ("release_threshold", "reuse.allow_opportunistic") and both values as text ("max", "true"; a
// threshold's bytes as a config would write them, "40GiB", not how one wrote it).
struct SettingChange {
  std::string field;
  std::string from;
  std::string to;
};
// The settings that differ, in the config's order.
std::vector<SettingChange> diff_settings(const PoolSettings& from, const PoolSettings& to);

// A pool's usage attributes, in bytes (CU_MEMPOOL_ATTR_{RESERVED,USED}_MEM_{CURRENT,HIGH}).
using PoolUsage = MemoryUsage;

// A pool the backend created or imported; 0 is no pool.
using PoolHandle = std::uint64_t;

// 64 opaque bytes that travel between processes: CUmemPoolPtrExportData (a pointer exported
// from a pool) or CUipcEventHandle (an IPC event). Both are 64 bytes in the driver API.
using Blob64 = std::array<std::uint8_t, 64>;

// An allocation made for another process: the address in this process and its export data.
struct SharedAllocation {
  std::uint64_t address = 0;
  Blob64 export_data{};
};

// An exported allocation (Backend::create_exported): its address here, its size (a multiple of the
// device's allocation granularity) and a descriptor of its shareable handle (the caller owns it).
struct ExportedAllocation {
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  int fd = -1;
};

// Graph memory of one device (CU_GRAPH_MEM_ATTR_{USED,RESERVED}_MEM_{CURRENT,HIGH}), in bytes.
// CU_GRAPH_MEM_ATTR_{RESERVED,USED}_MEM_{CURRENT,HIGH}: the same four figures.
using GraphMemUsage = MemoryUsage;

// One measured loop of `cupool bench` (see Backend::bench).
struct BenchCase {
  enum class Kind {
    malloc_free,       // cuMemAlloc + cuMemFree (cudaMalloc/cudaFree)
    async_alloc_free,  // cuMemAllocAsync + cuMemFreeAsync on the default pool, no synchronize
    alloc_free_sync,   // the same followed by a stream synchronize, at release threshold `threshold`
    trim,              // cuMemPoolTrimTo(0) after `bytes` were allocated, freed and kept (timed: the trim)
    graph_alloc_free,  // a captured graph of cuMemAllocAsync + cuMemFreeAsync, launched and synchronized
  };
  Kind kind = Kind::malloc_free;
  std::uint64_t bytes = 0;
  std::uint64_t threshold = 0;  // the default pool's release threshold during the loop
  int iterations = 0;
};

// Where a backend's answers come from: the driver, or a simulated node and the profile it was made
// from (and, for a recorded profile, how it was recorded).
struct ReportSource {
  bool simulated = false;
  std::string description;   // "CUDA driver (libcuda.so.1)" or "simulated node (configs/profiles/h100.yaml)"
  std::string profile_path;  // set when simulated
  bool synthetic = false;    // profile written by hand, not recorded
  std::string recorded;      // ISO date-time of the recording
  std::string recorded_host;
  std::string note;
  std::vector<std::string> warnings;  // about the profile read (old names): for the caller to print
};

// `bytes` bytes of a file from `file_offset`, to go to `address`.
struct FileRange {
  std::uint64_t file_offset = 0;
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
};

// Reads exactly `bytes` at `offset` of the file open at `fd` into `into`; throws InputError when
// the file ends first or a read fails.
void read_file_range(int fd, void* into, std::uint64_t bytes, std::uint64_t offset);

// ---- the roles ----
// What cupool asks of CUDA, split by who asks: each user takes the roles it needs (query only
// NodeQuery, a client of the holder PoolImport and Transfers, ...). Backend is all of them; the
// real one (device/cuda/) and the simulated node (sim_backend.h) implement each role in a class of
// its own. Every call throws CudaError naming the driver call that failed, unless it says
// otherwise; calls on a pool retain the primary context of the pool's device.

// What the node is: its driver, its devices and what they support.
class NodeQuery {
 public:
  virtual ~NodeQuery() = default;
  // Where the answers come from (every report and finding names it).
  virtual ReportSource source() const = 0;
  std::string describe() const { return source().description; }
  bool simulated() const { return source().simulated; }

  // Loads and initialises the driver. Throws NoDriverError when there is none or no device.
  virtual void init() = 0;
  // What identifies the node's driver and devices as the driver would report them, read without
  // loading the driver (node_fingerprint in device/fingerprint.h: this boot, the kernel module,
  // each GPU's /proc entry, MIG instances, the CUDA_ variables that pick devices), as
  // "sha256:<hex>"; "" when it can't be told. A report kept with this fingerprint may stand in for
  // asking the driver again while the fingerprint is the same (the holder's start, before cuInit).
  virtual std::string fingerprint() = 0;
  // cuDriverGetVersion: 13000 for CUDA 13.0.
  virtual int driver_version() = 0;
  // The kernel module's version ("580.159.04"), "" when unknown.
  virtual std::string kernel_driver_version() = 0;
  virtual int device_count() = 0;
  // All attributes of one device; creates no context. Throws CudaError.
  virtual DeviceInfo device_info(int ordinal) = 0;
  // Free/total memory without a context; nullopt when it can't be read that way.
  virtual std::optional<MemoryInfo> memory_info(int ordinal) = 0;
  // cuDeviceCanAccessPeer(device, peer).
  virtual bool can_access_peer(int device, int peer) = 0;
  // The host's NUMA node ids (empty when the host has no NUMA).
  virtual std::vector<int> host_numa_nodes() = 0;
  // Creates a small pool of `type` on `ordinal`, exports it (IPC types), destroys it.
  // This one creates a context (the device's primary context).
  virtual ExportProbe probe_export(int ordinal, HandleType type) = 0;
  // GPUDirect Storage on this node (`query --deep`): loads cuFile and opens its driver, so only
  // asked for deep.
  virtual GdsReport gds_report() = 0;
};

// Pools this process creates (the holder's, cupool_configure's) or finds (a device's default
// pool), their settings, usage and allocations.
class Pools {
 public:
  virtual ~Pools() = default;
  // Creates a pool; `device` is the ordinal whose context serves it (its own location for
  // device pools). The backend destroys pools still alive when it is destroyed.
  virtual PoolHandle create_pool(int device, const PoolProps& props) = 0;
  // Retains the device's primary context now: what its first pool or mapping would pay otherwise
  // (about 120 ms on an H200), so that a holder pays it off its serving thread.
  virtual void open_device(int device) = 0;
  // Destroys the pool (its allocations must have been freed).
  virtual void destroy_pool(PoolHandle pool) = 0;
  virtual void set_pool_settings(PoolHandle pool, const PoolSettings& settings) = 0;
  virtual PoolSettings pool_settings(PoolHandle pool) = 0;
  virtual PoolUsage pool_usage(PoolHandle pool) = 0;
  // Resets the peaks (reserved_peak_bytes, used_peak_bytes) to the current values.
  virtual void reset_pool_peaks(PoolHandle pool) = 0;
  // Resets used_peak_bytes alone to the current value (CU_MEMPOOL_ATTR_USED_MEM_HIGH set to 0).
  virtual void reset_pool_used_peak(PoolHandle pool) = 0;
  // Gives device `peer` read-write access to the pool's memory (cuMemPoolSetAccess).
  virtual void set_pool_access(PoolHandle pool, int peer) = 0;
  // Whether `peer` may read and write the pool's memory (cuMemPoolGetAccess).
  virtual bool pool_access(PoolHandle pool, int peer) = 0;
  // Allocates `bytes` from the pool, stream-ordered on the legacy stream and synchronised;
  // returns the device address.
  virtual std::uint64_t allocate(PoolHandle pool, std::uint64_t bytes) = 0;
  // Frees an allocation and synchronises: the pool then keeps at most its release threshold.
  virtual void free(PoolHandle pool, std::uint64_t address) = 0;
  // Releases reserved memory beyond `keep` bytes (cuMemPoolTrimTo).
  virtual void trim_pool(PoolHandle pool, std::uint64_t keep) = 0;
};

// Sharing pool memory, the exporting side (the holder).
class PoolExport {
 public:
  virtual ~PoolExport() = default;
  // A new file descriptor for the pool's posix_fd shareable handle (the caller owns and closes
  // it). The pool must have been created with HandleType::posix_fd.
  virtual int export_pool_fd(PoolHandle pool) = 0;
  // How an importer learns that a shared allocation is complete: by waiting on the device's ready
  // event, which allocate_shared records after the allocation, or because allocate_shared waited
  // for it itself (cuStreamSynchronize) and recorded no event. Issue 26's A/B on the H100: an
  // importer's first write to memory the exporter had recorded an IPC event after cost 145-260 us,
  // and 9-12 us after an exporter's synchronize without one (tests/gpu/RESULTS.md, 2026-11-27).
  enum class Readiness { event, synchronized };
  // Allocates `bytes` from an exportable pool on the backend's own stream for the pool's device,
  // then records the device's ready event after it or waits for it (`readiness`); exports the
  // pointer.
  virtual SharedAllocation allocate_shared(PoolHandle pool, std::uint64_t bytes, Readiness readiness) = 0;
  // The IPC handle of the device's ready event (created on first use, one per device), which
  // allocate_shared records after each allocation. An importer waits on it before first use.
  virtual Blob64 ready_event(int device) = 0;
  // Frees an allocation made by allocate_shared, stream-ordered on the device's stream, without
  // synchronising. Every importer must have freed its mapping first.
  virtual void free_shared(PoolHandle pool, std::uint64_t address) = 0;
  // Waits until the device's stream is idle (before measuring usage).
  virtual void synchronize(int device) = 0;
};

// Sharing pool memory, the importing side (a client of the holder).
class PoolImport {
 public:
  virtual ~PoolImport() = default;
  // Imports a pool from a posix_fd handle; `device` is this process's ordinal of the pool's
  // device (whose primary context is retained). Does not take ownership of `fd`.
  // Release with Pools::destroy_pool once every imported pointer is freed.
  virtual PoolHandle import_pool_fd(int device, int fd) = 0;
  // Maps an exported allocation into this process; returns its address here.
  virtual std::uint64_t import_pointer(PoolHandle imported, const Blob64& export_data) = 0;
  // Blocks until the work recorded on an exporter's ready event has finished (the event is
  // opened once per handle and kept).
  virtual void wait_ready(int device, const Blob64& event) = 0;
  // Frees an imported mapping (synchronously: the exporter may free right after).
  virtual void free_imported(PoolHandle imported, std::uint64_t address) = 0;
};

// A device's graph memory (CUDA graphs' allocations): its figures, releasing its unused part
// (cuDeviceGraphMemTrim) and resetting its peaks.
class GraphMemory {
 public:
  virtual ~GraphMemory() = default;
  virtual GraphMemUsage graph_mem_usage(int device) = 0;
  virtual void trim_graph_mem(int device) = 0;
  virtual void reset_graph_mem_peaks(int device) = 0;
};

// Exported allocations (VMM): held buffers.
// A held buffer is physical memory of one device made for sharing (cuMemCreate, pinned, with a
// POSIX-fd shareable handle), not a pool allocation: whoever holds its descriptor keeps it alive
// (a process with no CUDA context too), so it outlives the process that made it, and an importer
// maps it whole at any size, for peer devices too.
class ExportedMemory {
 public:
  virtual ~ExportedMemory() = default;
  // The allocation granularity of the device (cuMemGetAllocationGranularity, minimum): sizes of
  // exported allocations are multiples of it.
  virtual std::uint64_t allocation_granularity(int device) = 0;
  // Makes an allocation of at least `bytes` (rounded up to the granularity) on `device`, maps it
  // read-write here for that device, and exports it. Throws CudaError (OUT_OF_MEMORY when the
  // device has no room).
  virtual ExportedAllocation create_exported(int device, std::uint64_t bytes) = 0;
  // Maps the allocation behind `fd` (a descriptor create_exported gave, in this process or
  // another; not taken) here: all `size` bytes (its rounded size), read-write for `device`, where
  // the memory must be, and for each of `peers`. Throws CudaError when `fd` is no exported
  // allocation, its memory is on another device, or it is not `size` bytes: driver 580 maps an
  // imported allocation whole or not at all (cuMemMap of 2 of its 3 granules fails; measured on an
  // H200), so a size that says less than the descriptor holds can't hide memory from an account.
  virtual std::uint64_t map_exported(int device, int fd, std::uint64_t size, const std::vector<int>& peers) = 0;
  // Gives `peer` read-write access to a mapping made here, after the fact (cuMemSetAccess).
  virtual void grant_exported_access(std::uint64_t address, int peer) = 0;
  // Unmaps an allocation that create_exported made or map_exported mapped here. The memory goes
  // when its last mapping and descriptor, in any process, are gone.
  virtual void unmap_exported(std::uint64_t address) = 0;
};

// Moving bytes into and out of device memory this process can address (allocated, imported or
// mapped): from host memory, and from files.
class Transfers {
 public:
  virtual ~Transfers() = default;
  // Copies between host memory and memory this process can address.
  virtual void write(int device, std::uint64_t address, const void* source, std::uint64_t bytes) = 0;
  virtual void read(int device, std::uint64_t address, void* target, std::uint64_t bytes) = 0;
  // Copies each range of the file open at `fd` to memory this process can address on `device`:
  // several threads read chunks into pinned staging slots of their own while asynchronous copies
  // of the slots read before run (the simulated node copies the slots into its memory); see
  // file_load.h. Where the node has GPUDirect Storage (options.gds), cuFile reads the chunks
  // straight into device memory instead. Returns once the copies are done, with where the time
  // went. `progress` (may be empty) is told the bytes read so far, about ten times a second. A file
  // that ends early, or a read that fails, throws InputError (GdsError when cuFile said no).
  virtual LoadReport load_file(int device, int fd, const std::vector<FileRange>& ranges, const LoadOptions& options,
                               const std::function<void(std::uint64_t)>& progress) = 0;
};

// This process's own pools (cupool_configure, cupool_stats): the pools CUDA's allocator uses.
class ProcessPools {
 public:
  virtual ~ProcessPools() = default;
  // The device's default pool (cuDeviceGetDefaultMemPool). Creates no context. Works with the pool
  // calls that need none (settings, usage, peaks, access); never destroyed by the backend.
  virtual PoolHandle default_pool(int device) = 0;
  // The device's current pool (cuDeviceGetMemPool): the default pool unless the process set another.
  virtual PoolHandle current_pool(int device) = 0;
  // Makes `pool` the device's current pool (cuDeviceSetMemPool): cudaMallocAsync and cuMemAllocAsync
  // on the device then allocate from it. `pool` is a device pool this backend created on `device`,
  // or the device's default pool (to go back). The backend never destroys a pool while it is
  // current, not even when the backend itself is destroyed: the process's own allocations live in
  // it until the process ends.
  virtual void set_current_pool(int device, PoolHandle pool) = 0;
  // The properties this backend's create_pool made the pool with; nullopt for a pool it did not
  // create (a device's default pool, a current pool someone else set, an imported pool).
  virtual std::optional<PoolProps> created_props(PoolHandle pool) = 0;
  // Whether this process has an active primary context on the device (cuDevicePrimaryCtxGetState).
  virtual bool context_active(int device) = 0;
};

// The device's memory as the driver sees it across every process of the node (NVML), read without
// a CUDA context: how much is used, and by which processes. The holder's ledger sets this beside
// what it knows of (its buffers and pools, budgeted clients).
class DeviceUsage {
 public:
  virtual ~DeviceUsage() = default;
  // NVML's memory figures (nvmlDeviceGetMemoryInfo_v2, or v1 where v2 is missing) and process lists
  // (compute and graphics) for the device, matched by UUID. Never throws for a missing or failing
  // NVML: source "unavailable" with the reason in note. Throws CudaError only for an ordinal the
  // driver does not know. A simulated node answers from its profile and what this process holds
  // (device/sim/usage.h).
  virtual DeviceUsageReport device_usage(int ordinal) = 0;
};

// Measuring (cupool bench).
class Bench {
 public:
  virtual ~Bench() = default;
  // Runs one measured loop on the device (its primary context) and returns each iteration's time
  // in nanoseconds. The default pool's settings are restored afterwards. A simulated node returns
  // figures from a model of measurements on a real H100 (see sim_backend.h), not measurements.
  virtual std::vector<double> bench(int device, const BenchCase& c) = 0;
};

// Every role: what a backend is. Code takes the roles it uses (a Backend& converts to each).
// The roles are virtual bases, so an implementation may compose role classes that each derive from
// their role (device/cuda/, device/sim/): each role's functions are then its role class's.
class Backend : public virtual NodeQuery,
                public virtual Pools,
                public virtual PoolExport,
                public virtual PoolImport,
                public virtual GraphMemory,
                public virtual ExportedMemory,
                public virtual Transfers,
                public virtual ProcessPools,
                public virtual DeviceUsage,
                public virtual Bench {
 public:
  using Readiness = PoolExport::Readiness;
};

// CUDA_VERSION of the headers cupool was built with (13000 for 13.0).
int built_with_cuda_version();

// Where a backend's debug lines go (the CLI sends them to its log); none when empty. The libraries
// that other processes load log nothing.
using DebugLog = std::function<void(const std::string&)>;

// The real backend over the CUDA driver API, loaded at run time from libcuda.so.1.
std::unique_ptr<Backend> make_cuda_backend(DebugLog debug = {});

}  // namespace cupool
