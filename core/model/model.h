// The typed model of what cupool prints and sends: one struct per object, each with its one JSON
// conversion (YAML is written from the JSON: base/output.h). The names follow docs/naming.md and
// schemas/cupool-common-v1.schema.json describes the shared objects: every quantity carries its
// unit (_bytes, _seconds, _count), a plain plural is an array, every per-device object has the
// same identity, no sentinels. A verb, the holder, the process stats and the exporter build their
// output from these; none writes a key of these objects by hand. Each object's fields and JSON
// names are declared once, in fields.h, and its to_json and readers are made from there.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/units.h"

namespace cupool::model {

using Json = nlohmann::ordered_json;

// ---- shared objects (schemas/cupool-common-v1.schema.json) ----

// A device as the holder or the node numbers it: its CUDA ordinal there, its UUID and PCI bus id.
struct DeviceId {
  int device = 0;
  std::string uuid;
  std::string pci_bus_id;
};
// A device as a process numbers it (exec --report, cupool_stats): process_device is its ordinal in
// that process, which differs from the node's under CUDA_VISIBLE_DEVICES.
struct ProcessDeviceId {
  int process_device = 0;
  std::string uuid;
  std::string pci_bus_id;
};

// Where facts come from: the driver or a simulated node (a profile).
struct Source {
  bool simulated = false;
  std::string backend;  // in words: "CUDA driver (libcuda.so.1)", "simulated node (FILE)"
  std::optional<std::string> profile;
  std::optional<bool> synthetic;
  std::optional<std::string> recorded;
  std::optional<std::string> recorded_host;
};

// An error wherever one is reported: a snake_case code for programs, a message for people, and
// for a failed driver call the call and its result (CUDA_ERROR_...).
struct ErrorInfo {
  std::string code;
  std::string message;
  std::optional<std::string> api;
  std::optional<std::string> result;
};

// Memory of a pool or of a device's graph memory: now and the high-water marks (base/units.h).
using Usage = MemoryUsage;

struct Reuse {
  bool follow_event_dependencies = false;
  bool allow_opportunistic = false;
  bool allow_internal_dependencies = false;
};

// A finding about a config file (cupool check; plan/apply when the holder refuses a file).
struct Finding {
  std::string file;
  int line = 0;          // 1-based; 0: the whole file
  int column = 0;        // 1-based; 0: the whole file
  std::string severity;  // error, warning, note
  std::string code;      // the rule, as people type it (unknown-key)
  std::string message;
  bool invalid_input = false;
  std::optional<std::string> fact;
  std::optional<std::string> help;
};

// ---- the holder's objects (status, stats, trim, buffer ls, the buffer verbs) ----

// What a pool is, as every list of pools shows it.
struct PoolInfo {
  std::string name;
  DeviceId id;
  std::string location;                         // device, host, host_numa:N
  std::vector<std::string> handle_types;        // [] when it exports none
  std::optional<std::uint64_t> max_size_bytes;  // none: the driver's default (the device's memory)
};

// The leases of a pool or of a client, cached ones included, and of those the cached ones.
struct LeaseTotals {
  std::uint64_t lease_count = 0, leased_bytes = 0, cached_count = 0, cached_bytes = 0;
};

// The held buffers and tensor sets of a pool or a device: how many and their bytes (named buffers,
// their sizes). A device pool's are exported allocations, outside its reserved and used.
struct BufferTotals {
  std::uint64_t buffer_count = 0, buffer_bytes = 0;
};

struct PoolStatus {
  PoolInfo pool;
  ReleaseThreshold release_threshold;
  LeaseTotals leases;
  BufferTotals buffers;
};

// A pool as `list` shows it to one peer.
struct PoolListed {
  PoolInfo pool;
  bool permitted = false;  // whether this peer may import it
};

struct BufferInfo {
  std::string name;
  std::string pool;
  DeviceId id;
  std::uint64_t size_bytes = 0;
  std::uint64_t part_count = 0;
  std::uint64_t open_count = 0;
  std::string state;                          // loading, ready
  std::optional<std::uint64_t> tensor_count;  // none: no tensor index
  std::string allocation;                     // exported (cuMemCreate, kept in custody), pool
  bool kept = false;
  bool adopted = false;
  std::optional<bool> permitted;  // in `list` only: whether the peer who asked may open it
};

struct ClientInfo {
  std::uint64_t id = 0;
  std::int64_t pid = 0;
  std::int64_t uid = 0;
  std::optional<std::string> user;  // none: the uid has no name here
  std::optional<std::string> name;  // none: the client gave none in hello
  LeaseTotals leases;
  std::uint64_t asked_to_drop_count = 0;
  std::optional<int> protocol;  // none: before hello
  std::uint64_t open_buffer_count = 0;
  std::int64_t connected_seconds = 0;
};

struct AdoptedBuffer {
  std::string name;
  std::string pool;
  DeviceId id;
  std::uint64_t size_bytes = 0;
};
struct RefusedBuffer {
  std::string name;
  ErrorInfo error;
};
// What a holder found in custody at its start.
struct Adoption {
  std::optional<std::uint64_t> manifest_sequence;
  std::vector<AdoptedBuffer> buffers;
  std::vector<RefusedBuffer> refused;
  std::uint64_t released_count = 0;
  bool fresh = false;
  double elapsed_seconds = 0;
};
struct Custody {
  std::string kind;  // systemd, keeper, none
  std::optional<std::string> where;
  std::optional<std::uint64_t> manifest_sequence;
  std::uint64_t kept_buffer_count = 0;
  std::optional<ErrorInfo> error;
  std::optional<Adoption> adoption;  // none: the holder had no custody at its start
  std::string survives_restart;
  std::string made_again;
};

// What `cupool apply` put in place since the holder last read its own file (start or reload):
// a reload or a restart goes back to that file.
struct AppliedConfig {
  std::string path;                 // as the client named it
  std::string since;                // when, ISO 8601 UTC
  std::optional<std::string> user;  // who (null: unknown)
};

// The outcome of the holder's last reload of its file (SIGHUP, `systemctl reload`).
struct ReloadOutcome {
  std::string at;       // when, ISO 8601 UTC
  bool applied = true;  // false: the file was not applied and the holder kept its state
  std::string message;  // what changed, or why it was not applied (the log has every finding)
};

// Where the holder's start went (status's holder.start): it listens once custody and the config
// are read, before the driver is loaded; requests that need the driver wait until it is ready.
struct HolderStart {
  std::string state;                    // "starting" (the driver is coming up) or "ready"
  std::string node_report;              // what the config was checked against: "custody" (kept, same node) or "driver"
  double listening_seconds = 0;         // from the start of the holder's work to listening
  std::optional<double> ready_seconds;  // to serving every request (none while starting)
  double custody_seconds = 0;           // asking custody what it kept
  double node_report_seconds = 0;       // the node report before listening (custody's, or asked)
  double config_seconds = 0;            // the config read and checked, buffers adopted
  double driver_seconds = 0;            // loading the driver (cuInit), after listening
  double driver_report_seconds = 0;     // the driver's node report, after listening (with custody's)
  double mapping_seconds = 0;           // the adopted buffers mapped (the driver checks them)
  double devices_seconds = 0;           // the config's other devices opened (primary contexts)
  double pools_seconds = 0;             // pools and the config's buffers made
};

struct HolderInfo {
  std::int64_t pid = 0;
  std::string version;
  std::string config;  // the file it reads at start and on reload
  std::string socket;
  std::string started;
  std::uint64_t reload_count = 0;
  std::uint64_t apply_count = 0;
  std::optional<AppliedConfig> applied_config;  // none: what is held is `config`
  std::optional<ReloadOutcome> last_reload;     // none: no reload since the holder started
  std::optional<HolderStart> start;             // none: a holder before issue 38
  bool draining = false;
  std::int64_t uptime_seconds = 0;
};

struct Status {
  Source source;
  HolderInfo holder;
  std::vector<PoolStatus> pools;
  std::vector<BufferInfo> buffers;
  Custody custody;
  std::vector<ClientInfo> clients;
};

// The ledger (`cupool ledger`, and stats' "ledger"): every byte of each device as the holder
// accounts for it (docs/budgets.md). Each held buffer once, however many processes map it.
struct LedgerBuffer {
  std::string name;
  std::uint64_t size_bytes = 0;
  std::uint64_t mapper_count = 0;  // connections that have it open
};
struct LedgerPool {
  std::string name;
  std::uint64_t reserved_bytes = 0;
};
// A budget the holder granted (`cupool exec --budget`) on one device.
struct LedgerBudget {
  std::string grant;
  std::int64_t pid = 0;  // the process that holds it (the one exec started until a process claims it)
  std::string user;
  std::string command;
  bool claimed = false;  // a process's preload holds it and reports its use
  std::uint64_t budget_bytes = 0, used_bytes = 0, peak_bytes = 0;
  std::optional<std::uint64_t> device_bytes;  // NVML's figure for the process (its context included)
};
// A process NVML lists on the device: the holder, a budgeted process, a client of the holder, or
// one cupool does not know.
struct LedgerProcess {
  std::int64_t pid = 0;
  std::string role;  // "holder", "budgeted", "client", "unknown"
  std::string command;
  std::optional<std::uint64_t> used_bytes;  // NVML's (absent where NVML has no figure)
};
// The device's memory as NVML reports it.
struct LedgerMemory {
  std::uint64_t total_bytes = 0, used_bytes = 0, reserved_bytes = 0, free_bytes = 0;
};
struct LedgerDevice {
  DeviceId id;
  std::uint64_t total_bytes = 0;  // the driver's (cuDeviceTotalMem): what grants must fit
  std::uint64_t held_bytes = 0;   // held buffers and sets
  std::vector<LedgerBuffer> buffers;
  std::uint64_t pool_reserved_bytes = 0;  // the holder's device pools
  std::vector<LedgerPool> pools;
  std::uint64_t budget_bytes = 0;  // granted, all budgets together
  std::uint64_t budget_used_bytes = 0;
  std::vector<LedgerBudget> budgets;
  std::uint64_t context_bytes = 0;  // the allowance for each process's context: the holder and each budget
  std::uint64_t unknown_bytes = 0;  // processes cupool does not know, by NVML
  std::vector<LedgerProcess> processes;
  std::uint64_t committed_bytes = 0;  // held + pool reserves + budgets + contexts + unknown
  std::uint64_t available_bytes = 0;  // total - committed: what a new budget may take
  std::string usage_source;           // "nvml", "simulated" or "unavailable"
  std::string usage_note;             // why unavailable
  std::optional<LedgerMemory> memory;
  std::optional<std::uint64_t> accounted_bytes;   // what the ledger explains of NVML's used
  std::optional<std::int64_t> unexplained_bytes;  // NVML's used - accounted
};
struct Ledger {
  std::uint64_t context_allowance_bytes = 0;
  std::vector<LedgerDevice> devices;
};
// A budget granted (budget_grant's reply) or claimed (budget_claim's): its id, the process, and
// per device the bytes and what the kernel was told (the dmem cgroup's limit, or why not).
struct BudgetDevice {
  DeviceId id;
  std::uint64_t budget_bytes = 0;
  std::string kernel_limit;
};
struct BudgetGrant {
  std::string grant;
  std::int64_t pid = 0;
  std::uint64_t context_allowance_bytes = 0;
  std::vector<BudgetDevice> devices;
};

struct PoolStats {
  std::string name;
  DeviceId id;
  Usage usage;
  ReleaseThreshold release_threshold;
  LeaseTotals leases;
  BufferTotals buffers;
};
struct DeviceGraph {
  DeviceId id;
  Usage graph;
  BufferTotals buffers;  // its pools' together
};
struct Stats {
  std::vector<PoolStats> pools;
  std::uint64_t dropped_bytes = 0;
  std::vector<DeviceGraph> devices;
  std::optional<Ledger> ledger;  // every byte of each device (none from a holder before budgets)
};

struct PoolTrim {
  std::string name;
  DeviceId id;
  std::uint64_t reserved_before_bytes = 0, reserved_after_bytes = 0, released_bytes = 0;
};
struct GraphTrim {
  DeviceId id;
  std::uint64_t reserved_before_bytes = 0, reserved_after_bytes = 0, released_bytes = 0;
};
struct Trim {
  std::uint64_t released_bytes = 0;
  std::uint64_t dropped_bytes = 0;
  std::vector<PoolTrim> pools;
  std::vector<GraphTrim> devices;
};

// One tensor of a held buffer's index (and of the index a loader sends).
struct TensorEntry {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t part = 0;
  std::uint64_t offset_bytes = 0;
  std::uint64_t size_bytes = 0;
};
struct BufferTensors {
  std::string name;
  std::uint64_t size_bytes = 0;
  bool indexed = false;
  std::vector<std::uint64_t> part_sizes;  // printed as parts: [{part, size_bytes}]
  std::vector<TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
};

// What buffer create / load / rm print.
// Where a `buffer load` spent its time. Reading and copying overlap: read and copy_wait are the
// reading threads' busy times (averaged over the threads), inside load.
struct LoadStages {
  double index_seconds = 0;      // the file's header read and checked, the tensors placed
  double create_seconds = 0;     // the holder makes the buffer and keeps the index
  double load_seconds = 0;       // reading the file into the buffer, every part (wall clock)
  double open_seconds = 0;       // of load: opening each part here (this process's CUDA start, the mapping)
  double copy_seconds = 0;       // of load: the loader's own time, reading and copying (wall clock)
  double read_seconds = 0;       // of load: reading the file
  double copy_wait_seconds = 0;  // of load: waiting for copies to the GPU
  double ready_seconds = 0;      // the holder told the buffer is ready
};
// buffer load's GPUDirect Storage (query --deep's `gds` says what the node has).
struct LoadGds {
  std::optional<std::string> note;  // why it was not used (--gds auto); null when it was, or --gds never
};
struct BufferMade {
  std::string name;
  std::string pool;
  DeviceId id;
  std::uint64_t size_bytes = 0;
  std::optional<std::uint64_t> part_count;         // create and load
  std::optional<std::string> state;                // create: loading (a client fills it) or ready
  std::optional<bool> kept;                        // create: custody holds it (it outlives a holder restart)
  std::optional<std::uint64_t> tensor_count;       // load
  std::optional<std::string> file;                 // load
  std::optional<std::uint64_t> tensor_bytes;       // load
  std::optional<double> elapsed_seconds;           // load
  std::optional<std::uint64_t> bytes_per_second;   // load
  std::optional<LoadStages> stages;                // load
  std::optional<std::uint64_t> read_thread_count;  // load
  std::optional<bool> direct_io;                   // load: read with O_DIRECT
  std::optional<double> page_cache_ratio;          // load: of the file's tensor pages cached before
  std::optional<std::string> read_method;          // load: staged, gpudirect, gpudirect_compatibility
  std::optional<LoadGds> gds;                      // load: GPUDirect Storage's part
};
// What `buffer load NAME FILE FILE...` prints: one BufferMade per file (NAME-0, NAME-1, ...) and
// the loads together (they ran at once): their bytes, the wall clock from the first header read
// to the last buffer ready, and their bytes over it.
struct BuffersLoaded {
  std::vector<BufferMade> buffers;
  std::uint64_t tensor_bytes = 0;
  double elapsed_seconds = 0;
  std::uint64_t bytes_per_second = 0;
};

// ---- in a process (exec --report, cupool_stats) ----

struct ProcessPool {
  std::string role;  // default, current
  ReleaseThreshold release_threshold;
  Reuse reuse;
  Usage usage;
};
struct ProcessDevice {
  ProcessDeviceId id;
  std::vector<ProcessPool> pools;
  Usage graph;
};
// cupool_stats' document: the devices this process used.
struct ProcessStats {
  std::vector<ProcessDevice> devices;
};

// ---- plan / apply ----

// What a change does, and to what; change_word gives each its one spelling (PlanChange's action
// and object).
enum class ChangeAction { create, update, replace, remove };
enum class ChangeObject { pool, buffer, holder };
const char* change_word(ChangeAction a);
const char* change_word(ChangeObject o);

// A pool's share rule as a change's typed value (from_value, to_value).
struct ShareValue {
  std::vector<std::string> users;
  std::vector<std::string> groups;
  std::optional<std::uint64_t> quota_per_client_bytes;  // none: no quota (null)
};

struct PlanChange {
  std::string action;  // create, update, replace, remove
  std::string object;  // pool, buffer, holder
  std::string name;
  std::optional<DeviceId> id;  // pools and buffers
  std::optional<std::string> field;
  std::optional<std::string> from, to;  // in config syntax
  Json from_value, to_value;            // typed; null where absent
  std::optional<std::string> blocked;
};

// ---- export ----

// The config document `cupool export` writes (schemas/cupool-config-v1.schema.json): the holder's
// live state in the config's own syntax (sizes as exact sizes, devices by UUID); a member left
// empty is the config's default and is left out.
struct ExportedHolder {
  std::string socket;
  std::string mode;                  // octal, "0660"
  std::optional<std::string> group;  // none: the holder's own group
};
struct ExportedShare {
  std::optional<std::vector<std::string>> users, groups;
  std::optional<std::string> quota_per_client;
};
struct ExportedPool {
  std::string name;
  std::vector<std::string> devices;  // UUIDs
  std::string location;
  std::string alloc_type;
  std::vector<std::string> handle_types;  // ["none"]: no IPC handle
  std::optional<std::string> max_size;
  std::string release_threshold;  // as the config wrote it
  std::optional<std::string> reserve;
  Reuse reuse;
  std::optional<std::vector<std::string>> access;  // UUIDs
  std::optional<ExportedShare> share;
};
struct ExportedBuffer {
  std::string name;
  std::string pool;
  std::string device;  // UUID
  std::string size;
};
struct ExportedConfig {
  int version = 1;
  ExportedHolder holder;
  std::optional<std::vector<ExportedPool>> pools;
  std::optional<std::vector<ExportedBuffer>> buffers;
};

// ---- bench ----

struct BenchCase {
  std::string name;
  std::string description;
  std::uint64_t size_bytes = 0;
  ReleaseThreshold release_threshold;
  std::uint64_t iteration_count = 0;
  double median_seconds = 0, p99_seconds = 0, mean_seconds = 0, min_seconds = 0;
};
struct BenchComparison {
  std::uint64_t size_bytes = 0;
  std::string description;
  double ratio = 0;
};

// ---- query: what a node supports ----

struct HandleProbe {
  std::string handle_type;  // none, posix_fd, fabric
  bool ok = false;
  std::optional<ErrorInfo> error;  // when not ok
};
struct DeviceFacts {
  DeviceId id;
  std::string name;
  std::string compute_capability;  // "9.0"
  std::uint64_t memory_total_bytes = 0;
  std::optional<std::uint64_t> memory_free_bytes;  // none: not readable without a context
  bool memory_pools = false;
  std::vector<std::string> pool_handle_types;
  bool fabric_handle = false;
  bool host_memory_pools = false;
  bool host_numa_memory_pools = false;
  std::optional<int> host_numa_id;  // none: no NUMA node
  bool managed_memory = false;
  bool managed_pools = false;
  bool concurrent_managed_access = false;
  bool pageable_memory_access = false;
  bool vmm = false;
  bool ipc_events = false;
  bool gpu_direct_rdma = false;
  std::optional<std::vector<HandleProbe>> probes;  // with --deep
};
// GPUDirect Storage on the node (cuFile), with --deep.
struct GdsFacts {
  std::string mode;                              // unavailable, compatibility, gpudirect
  std::optional<std::string> library_version;    // libcufile's, "1.15"
  std::optional<std::string> nvidia_fs_version;  // the kernel module's; none: not loaded
  std::vector<std::string> file_systems;         // where nvidia-fs reads directly
  std::optional<std::string> note;               // why not gpudirect
  std::optional<ErrorInfo> error;                // the cuFile call that failed
};
// A region of device memory that a driver registered with the kernel's dmem cgroup controller.
struct DmemRegionFacts {
  std::string name;  // "drm/0000:03:00.0/vram0"
  std::uint64_t capacity_bytes = 0;
  std::optional<std::string> pci_bus_id;  // out of a drm/<pci>/... name
  std::optional<DeviceId> gpu;            // the node's CUDA device at pci_bus_id; none on a simulated node
};
// Whether this host's kernel can limit a cgroup's device memory (the dmem cgroup controller, Linux
// 6.14+): about the host cupool runs on, a simulated node's too.
struct DmemFacts {
  bool available = false;           // a limit can be set: the controller, and at least one region
  bool cgroup_v2 = false;           // cgroup v2 is mounted
  bool controller = false;          // the kernel has the dmem controller
  std::optional<std::string> note;  // why not available
  std::vector<DmemRegionFacts> regions;
};
struct NodeFacts {
  std::optional<Source> source;  // none in a profile's node section (its header says)
  std::string cuda_version;      // "13.0"
  int cuda_version_int = 0;      // 13000, as cuDriverGetVersion gives it
  std::optional<std::string> kernel_module;
  std::optional<std::string> built_with_cuda;  // "12.8"; none in a profile's node section
  std::vector<int> numa_nodes;
  std::vector<DeviceFacts> devices;
  std::vector<std::vector<bool>> peer_access;  // [device][peer]
  bool deep = false;
  std::optional<GdsFacts> gds;    // with --deep
  std::optional<DmemFacts> dmem;  // this host's kernel; none in a profile's node section
};

// `cupool query --format json|yaml` where no driver or device answers (exit 3): what is known
// without one (where the answer was sought, the host, its kernel's dmem controller), no driver, no
// devices, and why (the query schema's error).
struct QueryFailure {
  std::optional<Source> source;
  std::optional<Json> driver;  // null: no driver answered
  std::optional<std::string> built_with_cuda;
  std::vector<int> numa_nodes;
  std::vector<DeviceFacts> devices;            // none
  std::vector<std::vector<bool>> peer_access;  // none
  bool deep = false;
  std::optional<DmemFacts> dmem;
  ErrorInfo error;
};

// ---- node profiles: what `query --profile-out` writes and `--profile` reads ----

struct ProfileHeader {
  int version = 0;                  // 1
  std::string recorded;             // when, "2026-11-21T20:50:06Z"
  std::string host;                 // where
  std::string cupool;               // the version of cupool that wrote it
  bool synthetic = false;           // written by hand, not recorded
  std::string recorded_from;        // the backend it was recorded from
  std::optional<std::string> note;  // a synthetic profile's words on what it is
};
struct ProfileDocument {
  ProfileHeader profile;
  // NodeFacts without source and built_with_cuda; read by device/node.cpp (report_from_json), which
  // also takes the names of profiles written before v1 was amended.
  Json node;
};

// ---- check ----

struct CheckReport {
  std::string file;
  std::string verdict;  // fits, does_not_fit, invalid
  int exit_code = 0;
  std::optional<Source> source;  // none: the file was not judged against a node
  std::uint64_t error_count = 0, warning_count = 0, note_count = 0, not_listed_count = 0;
  std::vector<Finding> findings;
};

// ---- the holder's other replies ----

struct ListReply {
  std::vector<PoolListed> pools;
  std::vector<BufferInfo> buffers;  // with permitted
};
struct PlanReply {
  bool applied = false;
  std::vector<PlanChange> changes;
  std::vector<Finding> warnings;
  std::string warnings_rendered;
  // The holder's own file: what a reload or a restart holds again (an apply lasts until then).
  std::optional<std::string> config;
};
struct KeeperList {
  std::string socket;
  std::vector<std::string> names;
};
// `export`'s reply: the config the holder holds now, as the text of a config file.
struct ExportReply {
  std::string config;
};
// A refused request's reply as a client reads it (docs/protocol.md): its error and, for a config
// the holder judged (invalid_config, does_not_fit), the error's findings as compiler-style text.
struct Refusal {
  ErrorInfo error;
  std::optional<std::string> rendered;
};
// `buffer ls`: a list reply's buffers as the holder sent them (printed as they are).
struct BufferListing {
  Json buffers = Json::array();
};

// ---- bench ----

struct BenchReport {
  Source source;
  DeviceId gpu;
  std::string gpu_name;
  std::optional<std::string> note;
  std::optional<std::string> config;  // the config the threshold comes from; none: no config
  ReleaseThreshold release_threshold;
  std::uint64_t iteration_count = 0;
  std::uint64_t seed = 0;
  std::vector<std::uint64_t> sizes_bytes;
  std::vector<BenchCase> cases;
  std::vector<BenchComparison> comparisons;
};

// ---- conversions: each object's one JSON ----

Json to_json(const Source& v);
Json to_json(const ErrorInfo& v);
Json to_json(const Usage& v);
Json to_json(const Reuse& v);
Json to_json(const Finding& v);
Json to_json(const PoolStatus& v);
Json to_json(const PoolListed& v);
Json to_json(const BufferInfo& v);
Json to_json(const ClientInfo& v);
Json to_json(const AdoptedBuffer& v);
Json to_json(const RefusedBuffer& v);
Json to_json(const Adoption& v);
Json to_json(const PoolStats& v);
Json to_json(const DeviceGraph& v);
Json to_json(const PoolTrim& v);
Json to_json(const GraphTrim& v);
Json to_json(const ProcessPool& v);
Json to_json(const Custody& v);
Json to_json(const HolderInfo& v);
Json to_json(const Status& v);
Json to_json(const Stats& v);
Json to_json(const Ledger& v);
Json to_json(const BudgetGrant& v);
Json to_json(const Trim& v);
Json to_json(const TensorEntry& v);
Json to_json(const BufferTensors& v);
Json to_json(const BufferMade& v);
Json to_json(const BuffersLoaded& v);
Json to_json(const ProcessDevice& v);
Json to_json(const ProcessStats& v);
Json to_json(const ShareValue& v);
Json to_json(const ExportedConfig& v);
Json to_json(const PlanChange& v);
Json to_json(const BenchCase& v);
Json to_json(const BenchComparison& v);
Json to_json(const HandleProbe& v);
Json to_json(const DeviceFacts& v);
Json to_json(const GdsFacts& v);
Json to_json(const DmemFacts& v);
Json to_json(const NodeFacts& v);
Json to_json(const QueryFailure& v);
Json to_json(const CheckReport& v);
Json to_json(const ListReply& v);
Json to_json(const PlanReply& v);
Json to_json(const KeeperList& v);
Json to_json(const BenchReport& v);

// The identity keys, written into `out` in their one order.
void put_identity(Json& out, const DeviceId& id);
void put_identity(Json& out, const ProcessDeviceId& id);
// release_threshold (its text()) and release_threshold_bytes (null for max), written into `out`.
void put_threshold(Json& out, const ReleaseThreshold& t);
// A pool's fields and lease totals, written into `out` in their one order.
void put_pool(Json& out, const PoolInfo& p);
void put_leases(Json& out, const LeaseTotals& l);

// Readers of the objects the cupool binary reads back from the holder (its replies are these
// objects); each throws std::invalid_argument naming the missing or ill-typed key.
ErrorInfo error_from_json(const Json& j);
Finding finding_from_json(const Json& j);

}  // namespace cupool::model
