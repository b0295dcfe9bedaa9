// Each object's fields and their JSON names, declared once (docs/naming.md): the machinery in
// json_fields.h makes each one's writer (write_json) and readers (read_json and its strict and
// lenient twins) from the declaration, and tests/unit/model holds the names against the schemas.
// A new field is one line here.
//
// A declaration is a function over a visitor `f` and the object `v` (const when written):
//   f("name", v.member)              a value: scalars, strings, arrays, declared objects; an empty
//                                    optional is written as null
//   f("name", v.member, omit_empty)  an optional left out when empty
//   f("name", v.member, rule)        a value with a rule (bounds, a name's shape) that a strict
//                                    reader of its own checks (custody's manifest reader); the
//                                    writer and the readers here pass over it
//   f("name", v.member, defaulted)   a value a strict reader does not require (the member's default
//                                    stands): one worked out again from others, or one that files
//                                    written by hand may leave out
//   f.flat(v.member)                 a declared object whose fields sit in this object (identity)
//   f.object("name", [&](auto& g))   a nested object made of this struct's own members
//   f.computed("name", value)        written, never read (a count of an array beside it)
//   f.custom("name", v.member, write, read)  a member with a shape of its own, converted by hand
//   f.only_if(cond, "name", v.member)  a value written, and read, only where `cond` holds (a
//                                    member declared before it); listed among the names always
//   f.old_name("name", v.member, write, read)  a renamed optional's old name (docs/naming.md):
//                                    written beside the new one as `write` gives it (left out
//                                    where it gives kLeftOut), read where the new name left the
//                                    member empty; its schema marks it deprecated
//   f.part("name", v, P{})           one key of a value type that keeps its members to itself
//                                    (base's ReleaseThreshold): written as P::get(v) gives it, read
//                                    as that type and given to P::set(v, part); a reader's `seen`
//                                    records it as the part P of v (Seen::has_part<P>)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/json_fields.h"
#include "model/model.h"

namespace cupool::model {

// What an old name's writer gives where the old name is not written.
inline const Json kLeftOut = Json(Json::value_t::discarded);

// ---- shared objects ----

CUPOOL_FIELDS(DeviceId) {
  f("device", v.device);
  f("uuid", v.uuid);
  f("pci_bus_id", v.pci_bus_id);
}
CUPOOL_FIELDS(ProcessDeviceId) {
  f("process_device", v.process_device);
  f("uuid", v.uuid);
  f("pci_bus_id", v.pci_bus_id);
}
CUPOOL_FIELDS(Source) {
  f("simulated", v.simulated);
  f("backend", v.backend);
  f("profile", v.profile, omit_empty);
  f("synthetic", v.synthetic, omit_empty);
  f("recorded", v.recorded, omit_empty);
  f("recorded_host", v.recorded_host, omit_empty);
}
CUPOOL_FIELDS(ErrorInfo) {
  f("code", v.code);
  f("message", v.message);
  f("api", v.api, omit_empty);
  f("result", v.result, omit_empty);
}
// A release threshold's two keys, the parts of base's ReleaseThreshold: its text ("75%", "max", "0B"),
// read back as written, and its bytes, null for max.
struct ThresholdText {
  static std::string get(const ReleaseThreshold& t) { return t.text(); }
  static void set(ReleaseThreshold& t, std::string text) { t = ReleaseThreshold(t.bytes(), std::move(text)); }
};
struct ThresholdBytes {
  static std::optional<std::uint64_t> get(const ReleaseThreshold& t) {
    return t.is_max() ? std::nullopt : std::optional<std::uint64_t>(t.bytes());
  }
  static void set(ReleaseThreshold& t, const std::optional<std::uint64_t>& bytes) {
    t = ReleaseThreshold(bytes.value_or(ReleaseThreshold::max().bytes()), t.written());
  }
};
CUPOOL_FIELDS(ReleaseThreshold) {
  f.part("release_threshold", v, ThresholdText{});
  f.part("release_threshold_bytes", v, ThresholdBytes{});  // null: max
}
CUPOOL_FIELDS(Usage) {
  f("reserved_bytes", v.reserved_bytes);
  f("reserved_peak_bytes", v.reserved_peak_bytes);
  f("used_bytes", v.used_bytes);
  f("used_peak_bytes", v.used_peak_bytes);
}
CUPOOL_FIELDS(Reuse) {
  f("follow_event_dependencies", v.follow_event_dependencies);
  f("allow_opportunistic", v.allow_opportunistic);
  f("allow_internal_dependencies", v.allow_internal_dependencies);
}
CUPOOL_FIELDS(Finding) {
  f("file", v.file);
  f("line", v.line);
  f("column", v.column);
  f("severity", v.severity);
  f("code", v.code);
  f("message", v.message);
  f("invalid_input", v.invalid_input);
  f("fact", v.fact);
  f("help", v.help);
}

// ---- the holder's objects ----

CUPOOL_FIELDS(PoolInfo) {
  f("name", v.name);
  f.flat(v.id);
  f("location", v.location);
  f("handle_types", v.handle_types);
  f("max_size_bytes", v.max_size_bytes);  // null: the driver's default
}
CUPOOL_FIELDS(LeaseTotals) {
  f("lease_count", v.lease_count);
  f("leased_bytes", v.leased_bytes);
  f("cached_count", v.cached_count);
  f("cached_bytes", v.cached_bytes);
}
CUPOOL_FIELDS(BufferTotals) {
  f("buffer_count", v.buffer_count);
  f("buffer_bytes", v.buffer_bytes);
}
CUPOOL_FIELDS(PoolStatus) {
  f.flat(v.pool);
  f.flat(v.release_threshold);
  f.flat(v.leases);
  f.flat(v.buffers);
}
CUPOOL_FIELDS(PoolListed) {
  f.flat(v.pool);
  f("permitted", v.permitted);
}
CUPOOL_FIELDS(BufferInfo) {
  f("name", v.name);
  f("pool", v.pool);
  f.flat(v.id);
  f("size_bytes", v.size_bytes);
  f("part_count", v.part_count);
  f("open_count", v.open_count);
  f("state", v.state);
  f("tensor_count", v.tensor_count);
  f("allocation", v.allocation);
  f("kept", v.kept);
  f("adopted", v.adopted);
  f("permitted", v.permitted, omit_empty);
}
CUPOOL_FIELDS(ClientInfo) {
  f("id", v.id);
  f("pid", v.pid);
  f("uid", v.uid);
  f("user", v.user);
  f("name", v.name);
  f.flat(v.leases);
  f("asked_to_drop_count", v.asked_to_drop_count);
  f("protocol", v.protocol);
  f("open_buffer_count", v.open_buffer_count);
  f("connected_seconds", v.connected_seconds);
}
CUPOOL_FIELDS(AdoptedBuffer) {
  f("name", v.name);
  f("pool", v.pool);
  f.flat(v.id);
  f("size_bytes", v.size_bytes);
}
CUPOOL_FIELDS(RefusedBuffer) {
  f("name", v.name);
  f("error", v.error);
}
CUPOOL_FIELDS(Adoption) {
  f("manifest_sequence", v.manifest_sequence);
  f("buffers", v.buffers);
  f("refused", v.refused);
  f("released_count", v.released_count);
  f("fresh", v.fresh);
  f("elapsed_seconds", v.elapsed_seconds);
}
CUPOOL_FIELDS(Custody) {
  f("kind", v.kind);
  f("where", v.where);
  f("manifest_sequence", v.manifest_sequence);
  f("kept_buffer_count", v.kept_buffer_count);
  f("error", v.error);
  f("adoption", v.adoption);
  f("survives_restart", v.survives_restart);
  f("made_again", v.made_again);
}
CUPOOL_FIELDS(AppliedConfig) {
  f("path", v.path);
  f("since", v.since);
  f("user", v.user);
}
CUPOOL_FIELDS(ReloadOutcome) {
  f("at", v.at);
  f("applied", v.applied);
  f("message", v.message);
}
CUPOOL_FIELDS(HolderStart) {
  f("state", v.state);
  f("node_report", v.node_report);
  f("listening_seconds", v.listening_seconds);
  f("ready_seconds", v.ready_seconds);
  f("custody_seconds", v.custody_seconds);
  f("node_report_seconds", v.node_report_seconds);
  f("config_seconds", v.config_seconds);
  f("driver_seconds", v.driver_seconds);
  f("driver_report_seconds", v.driver_report_seconds);
  f("mapping_seconds", v.mapping_seconds);
  f("devices_seconds", v.devices_seconds);
  f("pools_seconds", v.pools_seconds);
}
CUPOOL_FIELDS(HolderInfo) {
  f("pid", v.pid);
  f("version", v.version);
  f("config", v.config);
  f("socket", v.socket);
  f("started", v.started);
  f("reload_count", v.reload_count);
  f("apply_count", v.apply_count);
  f("applied_config", v.applied_config);
  f("last_reload", v.last_reload);
  f("start", v.start);
  f("draining", v.draining);
  f("uptime_seconds", v.uptime_seconds);
}
CUPOOL_FIELDS(Status) {
  f("source", v.source);
  f("holder", v.holder);
  f("pools", v.pools);
  f("buffers", v.buffers);
  f("custody", v.custody);
  f("clients", v.clients);
  f.computed("client_count", v.clients.size());
}
CUPOOL_FIELDS(LedgerBuffer) {
  f("name", v.name);
  f("size_bytes", v.size_bytes);
  f("mapper_count", v.mapper_count);
}
CUPOOL_FIELDS(LedgerPool) {
  f("name", v.name);
  f("reserved_bytes", v.reserved_bytes);
}
CUPOOL_FIELDS(LedgerBudget) {
  f("grant", v.grant);
  f("pid", v.pid);
  f("user", v.user);
  f("command", v.command);
  f("claimed", v.claimed);
  f("budget_bytes", v.budget_bytes);
  f("used_bytes", v.used_bytes);
  f("peak_bytes", v.peak_bytes);
  f("device_bytes", v.device_bytes);
}
CUPOOL_FIELDS(LedgerProcess) {
  f("pid", v.pid);
  f("role", v.role);
  f("command", v.command);
  f("used_bytes", v.used_bytes);
}
CUPOOL_FIELDS(LedgerMemory) {
  f("total_bytes", v.total_bytes);
  f("used_bytes", v.used_bytes);
  f("reserved_bytes", v.reserved_bytes);
  f("free_bytes", v.free_bytes);
}
CUPOOL_FIELDS(LedgerDevice) {
  f.flat(v.id);
  f("total_bytes", v.total_bytes);
  f("held_bytes", v.held_bytes);
  f("buffers", v.buffers);
  f("pool_reserved_bytes", v.pool_reserved_bytes);
  f("pools", v.pools);
  f("budget_bytes", v.budget_bytes);
  f("budget_used_bytes", v.budget_used_bytes);
  f("budgets", v.budgets);
  f("context_bytes", v.context_bytes);
  f("unknown_bytes", v.unknown_bytes);
  f("processes", v.processes);
  f("committed_bytes", v.committed_bytes);
  f("available_bytes", v.available_bytes);
  f.object("usage", [&](auto& g) {
    g("reader", v.usage_source);
    g("note", v.usage_note);
    g("memory", v.memory);
    g("accounted_bytes", v.accounted_bytes);
    g("unexplained_bytes", v.unexplained_bytes);
  });
}
CUPOOL_FIELDS(Ledger) {
  f("context_allowance_bytes", v.context_allowance_bytes);
  f("devices", v.devices);
}
CUPOOL_FIELDS(BudgetDevice) {
  f.flat(v.id);
  f("budget_bytes", v.budget_bytes);
  f("kernel_limit", v.kernel_limit);
}
CUPOOL_FIELDS(BudgetGrant) {
  f("grant", v.grant);
  f("pid", v.pid);
  f("context_allowance_bytes", v.context_allowance_bytes);
  f("devices", v.devices);
}
CUPOOL_FIELDS(PoolStats) {
  f("name", v.name);
  f.flat(v.id);
  f.flat(v.usage);
  f.flat(v.release_threshold);
  f.flat(v.leases);
  f.flat(v.buffers);
}
CUPOOL_FIELDS(DeviceGraph) {
  f.flat(v.id);
  f("graph", v.graph);
  f.flat(v.buffers);
}
CUPOOL_FIELDS(Stats) {
  f("pools", v.pools);
  f("dropped_bytes", v.dropped_bytes);
  f("devices", v.devices);
  f("ledger", v.ledger, omit_empty);
}
CUPOOL_FIELDS(PoolTrim) {
  f("name", v.name);
  f.flat(v.id);
  f("reserved_before_bytes", v.reserved_before_bytes);
  f("reserved_after_bytes", v.reserved_after_bytes);
  f("released_bytes", v.released_bytes);
}
CUPOOL_FIELDS(GraphTrim) {
  f.flat(v.id);
  f.object("graph", [&](auto& g) {
    g("reserved_before_bytes", v.reserved_before_bytes);
    g("reserved_after_bytes", v.reserved_after_bytes);
    g("released_bytes", v.released_bytes);
  });
}
CUPOOL_FIELDS(Trim) {
  f("released_bytes", v.released_bytes);
  f("dropped_bytes", v.dropped_bytes);
  f("pools", v.pools);
  f("devices", v.devices);
}
CUPOOL_FIELDS(TensorEntry) {
  f("name", v.name);
  f("dtype", v.dtype);
  f("shape", v.shape);
  f("part", v.part);
  f("offset_bytes", v.offset_bytes);
  f("size_bytes", v.size_bytes);
}
// A buffer's part sizes as `parts`: [{part, size_bytes}], the part its index.
Json parts_to_json(const std::vector<std::uint64_t>& sizes);
std::vector<std::uint64_t> parts_from_json(const Json& parts);
CUPOOL_FIELDS(BufferTensors) {
  f("name", v.name);
  f("size_bytes", v.size_bytes);
  f("indexed", v.indexed);
  f.custom("parts", v.part_sizes, parts_to_json, parts_from_json);
  f("tensors", v.tensors);
  f("metadata", v.metadata);
}
CUPOOL_FIELDS(LoadGds) { f("note", v.note); }
CUPOOL_FIELDS(LoadStages) {
  f("index_seconds", v.index_seconds);
  f("create_seconds", v.create_seconds);
  f("load_seconds", v.load_seconds);
  f("open_seconds", v.open_seconds);
  f("copy_seconds", v.copy_seconds);
  f("read_seconds", v.read_seconds);
  f("copy_wait_seconds", v.copy_wait_seconds);
  f("ready_seconds", v.ready_seconds);
}
CUPOOL_FIELDS(BufferMade) {
  f("name", v.name);
  f("pool", v.pool);
  f.flat(v.id);
  f("size_bytes", v.size_bytes);
  f("part_count", v.part_count, omit_empty);
  f("state", v.state, omit_empty);  // create
  // Until cupool 0.2: create's `state` as the boolean it was.
  f.old_name(
      "loading", v.state, [](const std::optional<std::string>& s) { return s ? Json(*s == "loading") : kLeftOut; },
      [](const Json& j) { return std::optional<std::string>(j.get<bool>() ? "loading" : "ready"); });
  f("kept", v.kept, omit_empty);  // create
  f("tensor_count", v.tensor_count, omit_empty);
  f("file", v.file, omit_empty);
  f("tensor_bytes", v.tensor_bytes, omit_empty);
  f("elapsed_seconds", v.elapsed_seconds, omit_empty);
  f("bytes_per_second", v.bytes_per_second, omit_empty);
  f("stages", v.stages, omit_empty);
  f("read_thread_count", v.read_thread_count, omit_empty);
  f("direct_io", v.direct_io, omit_empty);
  f("page_cache_ratio", v.page_cache_ratio, omit_empty);
  f("read_method", v.read_method, omit_empty);
  f.only_if(v.read_method.has_value(), "gds", v.gds);
  // Until cupool 0.2: gds.note under its old name (null when GPUDirect Storage was used).
  f.old_name(
      "gds_note", v.gds,
      [&v](const std::optional<LoadGds>& g) {
        if (!v.read_method) return kLeftOut;
        return g && g->note ? Json(*g->note) : Json(nullptr);
      },
      [](const Json& j) {
        return j.is_null() ? std::optional<LoadGds>() : std::optional<LoadGds>(LoadGds{j.get<std::string>()});
      });
}
CUPOOL_FIELDS(BuffersLoaded) {
  f("buffers", v.buffers);
  f("tensor_bytes", v.tensor_bytes);
  f("elapsed_seconds", v.elapsed_seconds);
  f("bytes_per_second", v.bytes_per_second);
}

// ---- in a process ----

CUPOOL_FIELDS(ProcessPool) {
  f("role", v.role);
  f.flat(v.release_threshold);
  f("reuse", v.reuse);
  f.flat(v.usage);
}
CUPOOL_FIELDS(ProcessDevice) {
  f.flat(v.id);
  f("pools", v.pools);
  f("graph", v.graph);
}
CUPOOL_FIELDS(ProcessStats) { f("devices", v.devices); }

// ---- plan / apply ----

CUPOOL_FIELDS(ShareValue) {
  f("users", v.users);
  f("groups", v.groups);
  f("quota_per_client_bytes", v.quota_per_client_bytes);  // null: no quota
}
CUPOOL_FIELDS(PlanChange) {
  f("action", v.action);
  f("object", v.object);
  f("name", v.name);
  f.flat(v.id);  // pools and buffers only
  f("field", v.field, omit_empty);
  f("from", v.from, omit_empty);
  f.only_if(v.from.has_value(), "from_value", v.from_value);
  f("to", v.to, omit_empty);
  f.only_if(v.to.has_value(), "to_value", v.to_value);
  f("blocked", v.blocked, omit_empty);
}

// ---- export ----

CUPOOL_FIELDS(ExportedHolder) {
  f("socket", v.socket);
  f("mode", v.mode);
  f("group", v.group, omit_empty);
}
CUPOOL_FIELDS(ExportedShare) {
  f("users", v.users, omit_empty);
  f("groups", v.groups, omit_empty);
  f("quota_per_client", v.quota_per_client, omit_empty);
}
CUPOOL_FIELDS(ExportedPool) {
  f("name", v.name);
  f("devices", v.devices);
  f("location", v.location);
  f("alloc_type", v.alloc_type);
  f("handle_types", v.handle_types);
  f("max_size", v.max_size, omit_empty);
  f("release_threshold", v.release_threshold);
  f("reserve", v.reserve, omit_empty);
  f("reuse", v.reuse);
  f("access", v.access, omit_empty);
  f("share", v.share, omit_empty);
}
CUPOOL_FIELDS(ExportedBuffer) {
  f("name", v.name);
  f("pool", v.pool);
  f("device", v.device);
  f("size", v.size);
}
CUPOOL_FIELDS(ExportedConfig) {
  f("version", v.version);
  f("holder", v.holder);
  f("pools", v.pools, omit_empty);
  f("buffers", v.buffers, omit_empty);
}

// ---- bench ----

CUPOOL_FIELDS(BenchCase) {
  f("name", v.name);
  f("description", v.description);
  f("size_bytes", v.size_bytes);
  f.flat(v.release_threshold);
  f("iteration_count", v.iteration_count);
  f("median_seconds", v.median_seconds);
  f("p99_seconds", v.p99_seconds);
  f("mean_seconds", v.mean_seconds);
  f("min_seconds", v.min_seconds);
}
CUPOOL_FIELDS(BenchComparison) {
  f("size_bytes", v.size_bytes);
  f("description", v.description);
  f("ratio", v.ratio);
}

// ---- query ----

CUPOOL_FIELDS(HandleProbe) {
  f("handle_type", v.handle_type);
  f("ok", v.ok);
  f("error", v.error);
}
CUPOOL_FIELDS(DeviceFacts) {
  f.flat(v.id);
  f("name", v.name);
  f("compute_capability", v.compute_capability);
  f.object("memory", [&](auto& g) {
    g("total_bytes", v.memory_total_bytes);
    g("free_bytes", v.memory_free_bytes);
  });
  f("memory_pools", v.memory_pools);
  f("pool_handle_types", v.pool_handle_types);
  f("fabric_handle", v.fabric_handle);
  f("host_memory_pools", v.host_memory_pools);
  f("host_numa_memory_pools", v.host_numa_memory_pools);
  f("host_numa_id", v.host_numa_id);
  f("managed_memory", v.managed_memory);
  f("managed_pools", v.managed_pools, defaulted);  // worked out from the driver and managed_memory
  f("concurrent_managed_access", v.concurrent_managed_access);
  f("pageable_memory_access", v.pageable_memory_access);
  f("vmm", v.vmm);
  f("ipc_events", v.ipc_events);
  f("gpu_direct_rdma", v.gpu_direct_rdma);
  f("probes", v.probes, omit_empty);  // with --deep
}
CUPOOL_FIELDS(GdsFacts) {
  f("mode", v.mode);
  f("library_version", v.library_version);
  f("nvidia_fs_version", v.nvidia_fs_version);
  f("file_systems", v.file_systems, defaulted);
  f("note", v.note);
  f("error", v.error);
}
CUPOOL_FIELDS(DmemRegionFacts) {
  f("name", v.name);
  f("capacity_bytes", v.capacity_bytes);
  f("pci_bus_id", v.pci_bus_id);
  f("gpu", v.gpu);
}
CUPOOL_FIELDS(DmemFacts) {
  f("available", v.available);
  f("cgroup_v2", v.cgroup_v2);
  f("controller", v.controller);
  f("note", v.note);
  f("regions", v.regions);
}
CUPOOL_FIELDS(NodeFacts) {
  f("source", v.source, omit_empty);  // left out of a profile
  f.object("driver", [&](auto& g) {
    g("cuda_version", v.cuda_version, defaulted);  // worked out from cuda_version_int
    g("cuda_version_int", v.cuda_version_int);
    g("kernel_module", v.kernel_module);
  });
  f("built_with_cuda", v.built_with_cuda, omit_empty);  // left out of a profile
  f.object("host", [&](auto& g) { g("numa_nodes", v.numa_nodes); });
  f("devices", v.devices);
  f("peer_access", v.peer_access);
  f("deep", v.deep, defaulted);
  f("gds", v.gds, omit_empty);    // with --deep
  f("dmem", v.dmem, omit_empty);  // left out of a profile
}
CUPOOL_FIELDS(QueryFailure) {
  f("source", v.source, omit_empty);
  f("driver", v.driver);
  f("built_with_cuda", v.built_with_cuda, omit_empty);
  f.object("host", [&](auto& g) { g("numa_nodes", v.numa_nodes); });
  f("devices", v.devices);
  f("peer_access", v.peer_access);
  f("deep", v.deep);
  f("dmem", v.dmem, omit_empty);
  f("error", v.error);
}
CUPOOL_FIELDS(ProfileHeader) {
  f("version", v.version);
  f("recorded", v.recorded, defaulted);
  f("host", v.host, defaulted);
  f("cupool", v.cupool, defaulted);
  f("synthetic", v.synthetic, defaulted);
  f("recorded_from", v.recorded_from, defaulted);
  f("note", v.note, omit_empty);
}
CUPOOL_FIELDS(ProfileDocument) {
  f("profile", v.profile);
  f("node", v.node);
}

// ---- check ----

CUPOOL_FIELDS(CheckReport) {
  f("file", v.file);
  f("verdict", v.verdict);
  f("exit_code", v.exit_code);
  f("source", v.source);
  f.object("summary", [&](auto& g) {
    g("error_count", v.error_count);
    g("warning_count", v.warning_count);
    g("note_count", v.note_count);
    g("not_listed_count", v.not_listed_count);
  });
  f("findings", v.findings);
}

// ---- the holder's other replies ----

CUPOOL_FIELDS(ListReply) {
  f("pools", v.pools);
  f("buffers", v.buffers);
}
CUPOOL_FIELDS(PlanReply) {
  f("applied", v.applied);
  f("changes", v.changes);
  f("warnings", v.warnings);
  f("warnings_rendered", v.warnings_rendered);
  f("config", v.config);
  // Until cupool 0.2: `config` under its old name.
  f.old_name(
      "holder_config", v.config, [](const std::optional<std::string>& c) { return c ? Json(*c) : Json(nullptr); },
      [](const Json& j) { return j.is_null() ? std::nullopt : std::optional<std::string>(j.get<std::string>()); });
}
CUPOOL_FIELDS(KeeperList) {
  f("socket", v.socket);
  f("names", v.names);
}
CUPOOL_FIELDS(ExportReply) { f("config", v.config); }
CUPOOL_FIELDS(Refusal) {
  f.object("error", [&](auto& g) {
    g.flat(v.error);
    g("rendered", v.rendered, omit_empty);
  });
}
CUPOOL_FIELDS(BufferListing) { f("buffers", v.buffers); }
CUPOOL_FIELDS(BenchReport) {
  f("source", v.source);
  f.object("gpu", [&](auto& g) {
    g.flat(v.gpu);
    g("name", v.gpu_name);
  });
  f("note", v.note, omit_empty);
  f.object("settings", [&](auto& g) {
    g("config", v.config);
    g.flat(v.release_threshold);
    g("iteration_count", v.iteration_count);
    g("seed", v.seed);
    g("sizes_bytes", v.sizes_bytes);
  });
  f("cases", v.cases);
  f("comparisons", v.comparisons);
}

}  // namespace cupool::model

namespace cupool {
// model::Usage is base's MemoryUsage and a release threshold base's ReleaseThreshold (so the device
// seam needs no model): nlohmann looks for their readers in the types' own namespace.
inline void from_json(const model::Json& j, MemoryUsage& v) { v = model::read_json<MemoryUsage>(j); }
inline void from_json(const model::Json& j, ReleaseThreshold& v) { v = model::read_json<ReleaseThreshold>(j); }
}  // namespace cupool
