#include "model/model.h"

#include <limits>
#include <stdexcept>

#include "base/units.h"

namespace cupool::model {

namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

template <typename T>
Json or_null(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

template <typename T>
Json array_of(const std::vector<T>& items) {
  Json out = Json::array();
  for (const T& item : items) out.push_back(to_json(item));
  return out;
}

const Json& key(const Json& j, const char* name) {
  if (!j.is_object() || !j.contains(name)) throw std::invalid_argument(std::string("missing \"") + name + "\"");
  return j[name];
}

std::string text(const Json& j, const char* name) {
  const Json& v = key(j, name);
  if (!v.is_string()) throw std::invalid_argument(std::string("\"") + name + "\" is not a string");
  return v.get<std::string>();
}

std::optional<std::string> optional_text(const Json& j, const char* name) {
  if (!j.is_object() || !j.contains(name) || j[name].is_null()) return std::nullopt;
  return text(j, name);
}

}  // namespace

Threshold Threshold::of_bytes(std::uint64_t bytes) {
  if (bytes == kMax) return {format_threshold(bytes), std::nullopt};
  return {format_threshold(bytes), bytes};
}

Threshold Threshold::written(std::string text, std::uint64_t bytes) {
  if (bytes == kMax) return {"max", std::nullopt};
  if (text.empty()) text = format_threshold(bytes);
  return {std::move(text), bytes};
}

void put_identity(Json& out, const DeviceId& id) {
  out["device"] = id.device;
  out["uuid"] = id.uuid;
  out["pci_bus_id"] = id.pci_bus_id;
}

void put_identity(Json& out, const ProcessDeviceId& id) {
  out["process_device"] = id.process_device;
  out["uuid"] = id.uuid;
  out["pci_bus_id"] = id.pci_bus_id;
}

void put_threshold(Json& out, const Threshold& t) {
  out["release_threshold"] = t.text;
  out["release_threshold_bytes"] = or_null(t.bytes);
}

Json to_json(const Source& v) {
  Json out;
  out["simulated"] = v.simulated;
  out["backend"] = v.backend;
  if (v.profile) out["profile"] = *v.profile;
  if (v.synthetic) out["synthetic"] = *v.synthetic;
  if (v.recorded) out["recorded"] = *v.recorded;
  if (v.recorded_host) out["recorded_host"] = *v.recorded_host;
  return out;
}

Json to_json(const ErrorInfo& v) {
  Json out;
  out["code"] = v.code;
  out["message"] = v.message;
  if (v.api) out["api"] = *v.api;
  if (v.result) out["result"] = *v.result;
  return out;
}

Json to_json(const Usage& v) {
  return {{"reserved_bytes", v.reserved_bytes},
          {"reserved_peak_bytes", v.reserved_peak_bytes},
          {"used_bytes", v.used_bytes},
          {"used_peak_bytes", v.used_peak_bytes}};
}

Json to_json(const Reuse& v) {
  return {{"follow_event_dependencies", v.follow_event_dependencies},
          {"allow_opportunistic", v.allow_opportunistic},
          {"allow_internal_dependencies", v.allow_internal_dependencies}};
}

Json to_json(const Finding& v) {
  return {{"file", v.file},
          {"line", v.line},
          {"column", v.column},
          {"severity", v.severity},
          {"code", v.code},
          {"message", v.message},
          {"invalid_input", v.invalid_input},
          {"fact", or_null(v.fact)},
          {"help", or_null(v.help)}};
}

void put_pool(Json& out, const PoolInfo& p) {
  out["name"] = p.name;
  put_identity(out, p.id);
  out["location"] = p.location;
  out["handle_types"] = p.handle_types;
  out["max_size_bytes"] = or_null(p.max_size_bytes);
}

void put_leases(Json& out, const LeaseTotals& l) {
  out["lease_count"] = l.lease_count;
  out["leased_bytes"] = l.leased_bytes;
  out["cached_count"] = l.cached_count;
  out["cached_bytes"] = l.cached_bytes;
}

Json to_json(const PoolStatus& v) {
  Json out;
  put_pool(out, v.pool);
  put_threshold(out, v.release_threshold);
  put_leases(out, v.leases);
  out["buffer_count"] = v.buffer_count;
  out["buffer_bytes"] = v.buffer_bytes;
  return out;
}

Json to_json(const PoolListed& v) {
  Json out;
  put_pool(out, v.pool);
  out["permitted"] = v.permitted;
  return out;
}

Json to_json(const BufferInfo& v) {
  Json out;
  out["name"] = v.name;
  out["pool"] = v.pool;
  put_identity(out, v.id);
  out["size_bytes"] = v.size_bytes;
  out["part_count"] = v.part_count;
  out["open_count"] = v.open_count;
  out["state"] = v.state;
  out["tensor_count"] = or_null(v.tensor_count);
  out["allocation"] = v.allocation;
  out["kept"] = v.kept;
  out["adopted"] = v.adopted;
  if (v.permitted) out["permitted"] = *v.permitted;
  return out;
}

Json to_json(const ClientInfo& v) {
  Json out = {{"id", v.id}, {"pid", v.pid}, {"uid", v.uid}, {"user", or_null(v.user)}, {"name", or_null(v.name)}};
  put_leases(out, v.leases);
  out["asked_to_drop_count"] = v.asked_to_drop_count;
  out["protocol"] = or_null(v.protocol);
  out["open_buffer_count"] = v.open_buffer_count;
  out["connected_seconds"] = v.connected_seconds;
  return out;
}

Json to_json(const AdoptedBuffer& v) {
  Json out;
  out["name"] = v.name;
  out["pool"] = v.pool;
  put_identity(out, v.id);
  out["size_bytes"] = v.size_bytes;
  return out;
}

Json to_json(const RefusedBuffer& v) { return {{"name", v.name}, {"error", model::to_json(v.error)}}; }

Json to_json(const Adoption& v) {
  return {{"manifest_sequence", or_null(v.manifest_sequence)},
          {"buffers", array_of(v.buffers)},
          {"refused", array_of(v.refused)},
          {"released_count", v.released_count},
          {"fresh", v.fresh},
          {"elapsed_seconds", v.elapsed_seconds}};
}

Json to_json(const PoolStats& v) {
  Json out;
  out["name"] = v.name;
  put_identity(out, v.id);
  out.update(model::to_json(v.usage));
  put_threshold(out, v.release_threshold);
  put_leases(out, v.leases);
  return out;
}

Json to_json(const DeviceGraph& v) {
  Json out;
  put_identity(out, v.id);
  out["graph"] = model::to_json(v.graph);
  return out;
}

Json to_json(const PoolTrim& v) {
  Json out;
  out["name"] = v.name;
  put_identity(out, v.id);
  out["reserved_before_bytes"] = v.reserved_before_bytes;
  out["reserved_after_bytes"] = v.reserved_after_bytes;
  out["released_bytes"] = v.released_bytes;
  return out;
}

Json to_json(const GraphTrim& v) {
  Json out;
  put_identity(out, v.id);
  out["graph"] = {{"reserved_before_bytes", v.reserved_before_bytes},
                  {"reserved_after_bytes", v.reserved_after_bytes},
                  {"released_bytes", v.released_bytes}};
  return out;
}

Json to_json(const ProcessPool& v) {
  Json out;
  out["role"] = v.role;
  put_threshold(out, v.release_threshold);
  out["reuse"] = model::to_json(v.reuse);
  out.update(model::to_json(v.usage));
  return out;
}

Json to_json(const Custody& v) {
  return {{"kind", v.kind},
          {"where", or_null(v.where)},
          {"manifest_sequence", or_null(v.manifest_sequence)},
          {"kept_buffer_count", v.kept_buffer_count},
          {"error", v.error ? to_json(*v.error) : Json(nullptr)},
          {"adoption", v.adoption ? to_json(*v.adoption) : Json(nullptr)},
          {"survives_restart", v.survives_restart},
          {"made_again", v.made_again}};
}

Json to_json(const HolderInfo& v) {
  Json applied = nullptr;
  if (v.applied_config)
    applied = {{"path", v.applied_config->path},
               {"since", v.applied_config->since},
               {"user", or_null(v.applied_config->user)}};
  return {{"pid", v.pid},
          {"version", v.version},
          {"config", v.config},
          {"socket", v.socket},
          {"started", v.started},
          {"reload_count", v.reload_count},
          {"apply_count", v.apply_count},
          {"applied_config", applied},
          {"draining", v.draining},
          {"uptime_seconds", v.uptime_seconds}};
}

Json to_json(const Status& v) {
  return {{"source", to_json(v.source)},     {"holder", to_json(v.holder)},   {"pools", array_of(v.pools)},
          {"buffers", array_of(v.buffers)},  {"custody", to_json(v.custody)}, {"clients", array_of(v.clients)},
          {"client_count", v.clients.size()}};
}

Json to_json(const Stats& v) {
  return {{"pools", array_of(v.pools)}, {"dropped_bytes", v.dropped_bytes}, {"devices", array_of(v.devices)}};
}

Json to_json(const Trim& v) {
  return {{"released_bytes", v.released_bytes},
          {"dropped_bytes", v.dropped_bytes},
          {"pools", array_of(v.pools)},
          {"devices", array_of(v.devices)}};
}

Json to_json(const TensorEntry& v) {
  return {{"name", v.name},
          {"dtype", v.dtype},
          {"shape", v.shape},
          {"part", v.part},
          {"offset_bytes", v.offset_bytes},
          {"size_bytes", v.size_bytes}};
}

Json to_json(const BufferTensors& v) {
  Json parts = Json::array();
  for (std::size_t i = 0; i < v.part_sizes.size(); ++i) parts.push_back({{"part", i}, {"size_bytes", v.part_sizes[i]}});
  Json metadata = Json::object();
  for (const auto& [k, val] : v.metadata) metadata[k] = val;
  return {{"name", v.name}, {"size_bytes", v.size_bytes},     {"indexed", v.indexed},
          {"parts", parts}, {"tensors", array_of(v.tensors)}, {"metadata", metadata}};
}

Json to_json(const BufferMade& v) {
  Json out;
  out["name"] = v.name;
  out["pool"] = v.pool;
  put_identity(out, v.id);
  out["size_bytes"] = v.size_bytes;
  if (v.part_count) out["part_count"] = *v.part_count;
  if (v.loading) out["loading"] = *v.loading;
  if (v.tensor_count) out["tensor_count"] = *v.tensor_count;
  if (v.file) out["file"] = *v.file;
  if (v.tensor_bytes) out["tensor_bytes"] = *v.tensor_bytes;
  if (v.elapsed_seconds) out["elapsed_seconds"] = *v.elapsed_seconds;
  if (v.bytes_per_second) out["bytes_per_second"] = *v.bytes_per_second;
  if (v.stages) {
    const LoadStages& st = *v.stages;
    out["stages"] = {{"index_seconds", st.index_seconds},         {"create_seconds", st.create_seconds},
                     {"load_seconds", st.load_seconds},           {"read_seconds", st.read_seconds},
                     {"copy_wait_seconds", st.copy_wait_seconds}, {"ready_seconds", st.ready_seconds}};
  }
  if (v.read_thread_count) out["read_thread_count"] = *v.read_thread_count;
  if (v.direct_io) out["direct_io"] = *v.direct_io;
  if (v.page_cache_ratio) out["page_cache_ratio"] = *v.page_cache_ratio;
  if (v.read_method) out["read_method"] = *v.read_method;
  if (v.read_method) out["gds_note"] = v.gds_note ? Json(*v.gds_note) : Json(nullptr);
  return out;
}

Json to_json(const ProcessDevice& v) {
  Json out;
  put_identity(out, v.id);
  out["pools"] = array_of(v.pools);
  out["graph"] = to_json(v.graph);
  return out;
}

Json to_json(const PlanChange& v) {
  Json out;
  out["action"] = v.action;
  out["object"] = v.object;
  out["name"] = v.name;
  if (v.id) put_identity(out, *v.id);
  if (v.field) out["field"] = *v.field;
  if (v.from) {
    out["from"] = *v.from;
    out["from_value"] = v.from_value;
  }
  if (v.to) {
    out["to"] = *v.to;
    out["to_value"] = v.to_value;
  }
  if (v.blocked) out["blocked"] = *v.blocked;
  return out;
}

Json to_json(const BenchCase& v) {
  Json out;
  out["name"] = v.name;
  out["description"] = v.description;
  out["size_bytes"] = v.size_bytes;
  put_threshold(out, v.release_threshold);
  out["iteration_count"] = v.iteration_count;
  out["median_seconds"] = v.median_seconds;
  out["p99_seconds"] = v.p99_seconds;
  out["mean_seconds"] = v.mean_seconds;
  out["min_seconds"] = v.min_seconds;
  return out;
}

Json to_json(const BenchComparison& v) {
  return {{"size_bytes", v.size_bytes}, {"description", v.description}, {"ratio", v.ratio}};
}

Json to_json(const HandleProbe& v) {
  return {{"handle_type", v.handle_type}, {"ok", v.ok}, {"error", v.error ? to_json(*v.error) : Json(nullptr)}};
}

Json to_json(const DeviceFacts& v) {
  Json out;
  put_identity(out, v.id);
  out["name"] = v.name;
  out["compute_capability"] = v.compute_capability;
  out["memory"] = {{"total_bytes", v.memory_total_bytes}, {"free_bytes", or_null(v.memory_free_bytes)}};
  out["memory_pools"] = v.memory_pools;
  out["pool_handle_types"] = v.pool_handle_types;
  out["fabric_handle"] = v.fabric_handle;
  out["host_memory_pools"] = v.host_memory_pools;
  out["host_numa_memory_pools"] = v.host_numa_memory_pools;
  out["host_numa_id"] = or_null(v.host_numa_id);
  out["managed_memory"] = v.managed_memory;
  out["managed_pools"] = v.managed_pools;
  out["concurrent_managed_access"] = v.concurrent_managed_access;
  out["pageable_memory_access"] = v.pageable_memory_access;
  out["vmm"] = v.vmm;
  out["ipc_events"] = v.ipc_events;
  out["gpu_direct_rdma"] = v.gpu_direct_rdma;
  if (v.probes) out["probes"] = array_of(*v.probes);
  return out;
}

Json to_json(const GdsFacts& v) {
  return {{"mode", v.mode},
          {"library_version", or_null(v.library_version)},
          {"nvidia_fs_version", or_null(v.nvidia_fs_version)},
          {"file_systems", v.file_systems},
          {"note", or_null(v.note)},
          {"error", v.error ? to_json(*v.error) : Json(nullptr)}};
}

Json to_json(const NodeFacts& v) {
  Json out = {{"source", to_json(v.source)},
              {"driver",
               {{"cuda_version", v.cuda_version},
                {"cuda_version_int", v.cuda_version_int},
                {"kernel_module", or_null(v.kernel_module)}}},
              {"built_with_cuda", v.built_with_cuda},
              {"host", {{"numa_nodes", v.numa_nodes}}},
              {"devices", array_of(v.devices)},
              {"peer_access", v.peer_access},
              {"deep", v.deep}};
  if (v.gds) out["gds"] = to_json(*v.gds);
  return out;
}

Json to_json(const CheckReport& v) {
  return {{"file", v.file},
          {"verdict", v.verdict},
          {"exit_code", v.exit_code},
          {"source", v.source ? to_json(*v.source) : Json(nullptr)},
          {"summary",
           {{"error_count", v.error_count},
            {"warning_count", v.warning_count},
            {"note_count", v.note_count},
            {"not_listed_count", v.not_listed_count}}},
          {"findings", array_of(v.findings)}};
}

Json to_json(const ListReply& v) { return {{"pools", array_of(v.pools)}, {"buffers", array_of(v.buffers)}}; }

Json to_json(const PlanReply& v) {
  return {{"applied", v.applied},
          {"changes", array_of(v.changes)},
          {"warnings", array_of(v.warnings)},
          {"warnings_rendered", v.warnings_rendered},
          {"holder_config", or_null(v.holder_config)}};
}

Json to_json(const KeeperList& v) { return {{"socket", v.socket}, {"names", v.names}}; }

Json to_json(const BenchReport& v) {
  Json out;
  out["source"] = to_json(v.source);
  Json gpu;
  put_identity(gpu, v.gpu);
  gpu["name"] = v.gpu_name;
  out["gpu"] = gpu;
  if (v.note) out["note"] = *v.note;
  Json settings;
  settings["config"] = or_null(v.config);
  put_threshold(settings, v.release_threshold);
  settings["iteration_count"] = v.iteration_count;
  settings["seed"] = v.seed;
  settings["sizes_bytes"] = v.sizes_bytes;
  out["settings"] = settings;
  out["cases"] = array_of(v.cases);
  out["comparisons"] = array_of(v.comparisons);
  return out;
}

ErrorInfo error_from_json(const Json& j) {
  ErrorInfo out;
  out.code = text(j, "code");
  out.message = text(j, "message");
  out.api = optional_text(j, "api");
  out.result = optional_text(j, "result");
  return out;
}

Finding finding_from_json(const Json& j) {
  Finding out;
  out.file = text(j, "file");
  const Json& line = key(j, "line");
  const Json& column = key(j, "column");
  if (!line.is_number_integer() || !column.is_number_integer())
    throw std::invalid_argument("\"line\" and \"column\" must be integers");
  out.line = line.get<int>();
  out.column = column.get<int>();
  out.severity = text(j, "severity");
  out.code = text(j, "code");
  out.message = text(j, "message");
  const Json& invalid = key(j, "invalid_input");
  if (!invalid.is_boolean()) throw std::invalid_argument("\"invalid_input\" is not a boolean");
  out.invalid_input = invalid.get<bool>();
  out.fact = optional_text(j, "fact");
  out.help = optional_text(j, "help");
  return out;
}

}  // namespace cupool::model
