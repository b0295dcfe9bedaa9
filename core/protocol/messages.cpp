#include "protocol/messages.h"

#include <stdexcept>

namespace cupool::proto {

namespace {

// ---- readers of what the holder sent (replies, notices): std::invalid_argument names the field ----

const Json* find(const Json& j, const char* name) {
  if (!j.is_object()) throw std::invalid_argument("not a JSON object");
  const auto it = j.find(name);
  return it == j.end() ? nullptr : &*it;
}

const Json& field(const Json& j, const char* name) {
  const Json* v = find(j, name);
  if (!v) throw std::invalid_argument(std::string("no \"") + name + "\"");
  return *v;
}

[[noreturn]] void ill_typed(const char* name, const char* want) {
  throw std::invalid_argument(std::string("\"") + name + "\" is not " + want);
}

std::string text(const Json& j, const char* name) {
  const Json& v = field(j, name);
  if (!v.is_string()) ill_typed(name, "a string");
  return v.get<std::string>();
}

std::string text_or(const Json& j, const char* name, const std::string& fallback) {
  return find(j, name) ? text(j, name) : fallback;
}

bool non_negative(const Json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
}

std::uint64_t count(const Json& j, const char* name) {
  const Json& v = field(j, name);
  if (!non_negative(v)) ill_typed(name, "an integer of 0 or more");
  return v.get<std::uint64_t>();
}

std::optional<std::uint64_t> optional_count(const Json& j, const char* name) {
  if (const Json* v = find(j, name); !v || v->is_null()) return std::nullopt;
  return count(j, name);
}

std::int64_t integer(const Json& j, const char* name) {
  const Json& v = field(j, name);
  if (!v.is_number_integer()) ill_typed(name, "an integer");
  return v.get<std::int64_t>();
}

int ordinal(const Json& j, const char* name) {
  const std::int64_t v = integer(j, name);
  if (v < 0 || v > kMaxDevice) ill_typed(name, "a device ordinal");
  return static_cast<int>(v);
}

bool flag(const Json& j, const char* name) {
  const Json& v = field(j, name);
  if (!v.is_boolean()) ill_typed(name, "true or false");
  return v.get<bool>();
}

bool flag_or(const Json& j, const char* name, bool fallback) { return find(j, name) ? flag(j, name) : fallback; }

double seconds(const Json& j, const char* name) {
  const Json& v = field(j, name);
  if (!v.is_number() || v.get<double>() < 0) ill_typed(name, "a number of seconds");
  return v.get<double>();
}

Bytes64 blob(const Json& j, const char* name) {
  const auto b = from_hex(text(j, name));
  if (!b) ill_typed(name, "128 hex digits");
  return *b;
}

std::vector<std::uint64_t> counts(const Json& j, const char* name) {
  const Json& v = field(j, name);
  if (!v.is_array()) ill_typed(name, "an array");
  std::vector<std::uint64_t> out;
  for (const Json& item : v) {
    if (!non_negative(item)) ill_typed(name, "an array of integers of 0 or more");
    out.push_back(item.get<std::uint64_t>());
  }
  return out;
}

// A device's identity; an older holder sent no pci_bus_id (protocol 1 to 3).
model::DeviceId identity(const Json& j) {
  model::DeviceId id;
  id.device = ordinal(j, "device");
  id.uuid = text_or(j, "uuid", "");
  id.pci_bus_id = text_or(j, "pci_bus_id", "");
  return id;
}

std::vector<model::DeviceId> devices(const Json& j, const char* name) {
  const Json* v = find(j, name);
  if (!v) return {};
  if (!v->is_array()) ill_typed(name, "an array of devices");
  std::vector<model::DeviceId> out;
  for (const Json& item : *v) out.push_back(identity(item));
  return out;
}

Json identities(const std::vector<model::DeviceId>& ids) {
  Json out = Json::array();
  for (const model::DeviceId& id : ids) {
    Json device;
    model::put_identity(device, id);
    out.push_back(std::move(device));
  }
  return out;
}

Json request(const char* op) { return {{"op", op}}; }

}  // namespace

// ---- requests ----

Json to_json(const Hello& v) {
  Json out = request("hello");
  out["protocol"] = v.protocol;
  if (v.client) out["client"] = *v.client;
  return out;
}

Json to_json(const ImportPool& v) {
  Json out = request("import_pool");
  out["pool"] = v.pool;
  out["device"] = v.device;
  return out;
}

Json to_json(const Alloc& v) {
  Json out = request("alloc");
  out["pool"] = v.pool;
  out["device"] = v.device;
  out["size_bytes"] = v.size_bytes;
  out["synchronize"] = v.synchronize;
  return out;
}

Json to_json(const Free& v) {
  Json out = request("free");
  out["lease"] = v.lease;
  if (v.cache) out["cache"] = true;  // protocol 1 knows no "cache"
  return out;
}

Json to_json(const Reuse& v) {
  Json out = request("reuse");
  out["lease"] = v.lease;
  return out;
}

Json to_json(const Dropped& v) {
  Json out = request("dropped");
  out["ask"] = v.ask;
  out["leases"] = v.leases;
  return out;
}

Json to_json(const BufferOpen& v) {
  Json out = request("buffer_open");
  out["name"] = v.name;
  if (v.part) out["part"] = v.part;  // a holder from before parts knows no "part"
  return out;
}

Json to_json(const BufferClose& v) {
  Json out = request("buffer_close");
  out["name"] = v.name;
  return out;
}

Hello read_hello(Args& a) {
  Hello v;
  v.protocol = static_cast<int>(a.u64("protocol", 0, 65535));
  v.client = a.optional_string("client", kMaxName);
  return v;
}

ImportPool read_import_pool(Args& a) {
  ImportPool v;
  v.pool = a.string("pool", kMaxName);
  v.device = a.device("device", -1);
  return v;
}

Alloc read_alloc(Args& a) {
  Alloc v;
  v.pool = a.string("pool", kMaxName);
  v.device = a.device("device", -1);
  v.size_bytes = a.u64("size_bytes", 1, kMaxAllocation);
  v.synchronize = a.boolean("synchronize", false);
  return v;
}

Free read_free(Args& a) {
  Free v;
  v.lease = a.u64("lease", 1, UINT64_MAX);
  v.cache = a.boolean("cache", false);
  return v;
}

Reuse read_reuse(Args& a) { return {a.u64("lease", 1, UINT64_MAX)}; }

Dropped read_dropped(Args& a, std::size_t max_leases) {
  Dropped v;
  v.ask = a.u64("ask", 0, UINT64_MAX);
  v.leases = a.ids("leases", max_leases);
  return v;
}

BufferOpen read_buffer_open(Args& a) {
  BufferOpen v;
  v.name = a.string("name", kMaxName);
  v.part = a.optional_u64("part", 0, kMaxPartNumber).value_or(0);
  return v;
}

BufferClose read_buffer_close(Args& a) { return {a.string("name", kMaxName)}; }

// ---- the CLI's requests ----

Json to_json(const List&) { return request("list"); }

Json to_json(const Status&) { return request("status"); }

Json to_json(const Export&) { return request("export"); }

Json to_json(const Stats& v) {
  Json out = request("stats");
  if (v.reset_peaks) out["reset_peaks"] = true;  // absent: false
  return out;
}

Json to_json(const Trim& v) {
  Json out = request("trim");
  out["keep_bytes"] = v.keep_bytes;
  if (v.pool) out["pool"] = *v.pool;
  out["graph"] = v.graph;
  if (!v.cached) out["cached"] = false;  // absent: true
  return out;
}

Json to_json(const Plan& v) {
  Json out = request(v.apply ? "apply" : "plan");
  out["config"] = v.config;
  if (v.path) out["path"] = *v.path;
  return out;
}

Json to_json(const BufferCreate& v) {
  Json out = request("buffer_create");
  out["name"] = v.name;
  out["pool"] = v.pool;
  if (v.device >= 0) out["device"] = v.device;  // absent: the pool's only or first device
  out["size_bytes"] = v.size_bytes;
  if (v.loading) out["loading"] = true;
  if (v.tensors) out["tensors"] = *v.tensors;
  if (v.metadata) out["metadata"] = *v.metadata;
  if (v.part_sizes_bytes) out["part_sizes_bytes"] = *v.part_sizes_bytes;
  return out;
}

Json to_json(const BufferReady& v) {
  Json out = request("buffer_ready");
  out["name"] = v.name;
  return out;
}

Json to_json(const BufferTensors& v) {
  Json out = request("buffer_tensors");
  out["name"] = v.name;
  return out;
}

Json to_json(const BufferRemove& v) {
  Json out = request("buffer_remove");
  out["name"] = v.name;
  out["force"] = v.force;
  return out;
}

List read_list(Args&) { return {}; }

Status read_status(Args&) { return {}; }

Export read_export(Args&) { return {}; }

Stats read_stats(Args& a) { return {a.boolean("reset_peaks", false)}; }

Trim read_trim(Args& a) {
  Trim v;
  v.keep_bytes = a.optional_u64("keep_bytes", 0, UINT64_MAX).value_or(0);
  v.pool = a.optional_string("pool", kMaxName);
  v.graph = a.boolean("graph", true);
  v.cached = a.boolean("cached", true);
  return v;
}

Plan read_plan(Args& a, bool apply, std::size_t max_config_bytes) {
  Plan v;
  v.config = a.string("config", max_config_bytes);
  v.path = a.optional_string("path", kMaxConfigName);
  v.apply = apply;
  return v;
}

BufferCreate read_buffer_create(Args& a) {
  BufferCreate v;
  v.name = a.string("name", kMaxName);
  v.pool = a.string("pool", kMaxName);
  v.device = a.device("device", -1);
  v.size_bytes = a.u64("size_bytes", 1, kMaxAllocation);
  v.loading = a.boolean("loading", false);
  // Any JSON here: the holder checks the index and the parts (after it knows who asks).
  if (const Json* tensors = a.value("tensors")) v.tensors = *tensors;
  if (const Json* metadata = a.value("metadata")) v.metadata = *metadata;
  if (const Json* parts = a.value("part_sizes_bytes")) v.part_sizes_bytes = *parts;
  return v;
}

BufferReady read_buffer_ready(Args& a) { return {a.string("name", kMaxName)}; }

BufferTensors read_buffer_tensors(Args& a) { return {a.string("name", kMaxName)}; }

BufferRemove read_buffer_remove(Args& a) {
  BufferRemove v;
  v.name = a.string("name", kMaxName);
  v.force = a.boolean("force", false);
  return v;
}

// ---- replies ----

Json to_json(const HelloReply& v) {
  Json out;
  out["protocol"] = v.protocol;
  out["protocols"] = {v.oldest_protocol, v.newest_protocol};
  out["version"] = v.version;
  out["pid"] = v.pid;
  out["backend"] = v.backend;
  out["peer"] = {
      {"pid", v.peer.pid}, {"uid", v.peer.uid}, {"gid", v.peer.gid}, {"user", v.peer.user}, {"admin", v.peer.admin}};
  out["limits"] = {{"max_payload_bytes", v.limits.max_payload_bytes},
                   {"max_reply_bytes", v.limits.max_reply_bytes},
                   {"max_request_bytes", v.limits.max_request_bytes},
                   {"max_lease_count", v.limits.max_lease_count},
                   {"max_open_buffer_count", v.limits.max_open_buffer_count},
                   {"frame_timeout_seconds", v.limits.frame_timeout_seconds},
                   {"max_queued_bytes", v.limits.max_queued_bytes},
                   {"drop_timeout_seconds", v.limits.drop_timeout_seconds}};
  return out;
}

Json to_json(const ImportPoolReply& v) {
  Json out;
  out["pool"] = v.pool;
  model::put_identity(out, v.id);
  out["handle_type"] = v.handle_type;
  out["access"] = identities(v.access);
  out["generation"] = v.generation;
  out["ready_event"] = to_hex(v.ready_event);
  return out;
}

Json to_json(const AllocReply& v) {
  Json out;
  out["lease"] = v.lease;
  out["size_bytes"] = v.size_bytes;
  out["pool"] = v.pool;
  model::put_identity(out, v.id);
  if (v.generation) out["generation"] = *v.generation;
  out["export_data"] = to_hex(v.export_data);
  out["ready"] = v.ready;
  out["ready_event"] = to_hex(v.ready_event);
  return out;
}

Json to_json(const FreeReply& v) { return {{"lease", v.lease}, {"size_bytes", v.size_bytes}, {"cached", v.cached}}; }

Json to_json(const ReuseReply& v) { return {{"lease", v.lease}, {"size_bytes", v.size_bytes}}; }

Json to_json(const DroppedReply& v) {
  return {{"ask", v.ask}, {"freed_count", v.freed_count}, {"freed_bytes", v.freed_bytes}};
}

Json to_json(const BufferOpenReply& v) {
  Json out;
  out["name"] = v.name;
  out["pool"] = v.pool;
  model::put_identity(out, v.id);
  out["size_bytes"] = v.size_bytes;
  out["part"] = v.part;
  out["part_count"] = v.part_count;
  out["buffer_size_bytes"] = v.buffer_size_bytes;
  if (v.exported) {
    out["mapping"] = "exported";
    out["mapped_size_bytes"] = v.mapped_size_bytes;
    out["access"] = identities(v.access);
    return out;
  }
  if (v.generation) out["generation"] = *v.generation;
  out["export_data"] = to_hex(v.export_data);
  out["ready"] = v.ready;
  out["ready_event"] = to_hex(v.ready_event);
  return out;
}

Json to_json(const BufferCloseReply& v) { return {{"name", v.name}}; }
Json to_json(const BufferReadyReply& v) {
  return {{"name", v.name}, {"tensor_count", v.tensor_count ? Json(*v.tensor_count) : Json(nullptr)}};
}

HelloReply hello_reply_from_json(const Json& j) {
  HelloReply v;
  v.protocol = static_cast<int>(integer(j, "protocol"));
  if (const Json* range = find(j, "protocols"); range && range->is_array() && range->size() == 2 &&
                                                (*range)[0].is_number_integer() && (*range)[1].is_number_integer()) {
    v.oldest_protocol = (*range)[0].get<int>();
    v.newest_protocol = (*range)[1].get<int>();
  } else {
    v.oldest_protocol = v.newest_protocol = v.protocol;  // a holder of protocol 1 said no range
  }
  v.version = text_or(j, "version", "");
  if (find(j, "pid")) v.pid = integer(j, "pid");
  v.backend = text_or(j, "backend", "cuda");
  if (const Json* peer = find(j, "peer"); peer && peer->is_object()) {
    v.peer.pid = find(*peer, "pid") ? integer(*peer, "pid") : 0;
    v.peer.uid = static_cast<std::uint32_t>(optional_count(*peer, "uid").value_or(0));
    v.peer.gid = static_cast<std::uint32_t>(optional_count(*peer, "gid").value_or(0));
    v.peer.user = text_or(*peer, "user", "");
    v.peer.admin = flag_or(*peer, "admin", false);
  }
  if (const Json* limits = find(j, "limits"); limits && limits->is_object()) {
    const Json& l = *limits;
    v.limits.max_payload_bytes = optional_count(l, "max_payload_bytes").value_or(kMaxPayload);
    v.limits.max_reply_bytes = optional_count(l, "max_reply_bytes").value_or(kMaxPayload);
    v.limits.max_request_bytes = optional_count(l, "max_request_bytes").value_or(kMaxPayload);
    v.limits.max_lease_count = optional_count(l, "max_lease_count").value_or(0);
    v.limits.max_open_buffer_count = optional_count(l, "max_open_buffer_count").value_or(0);
    v.limits.frame_timeout_seconds = find(l, "frame_timeout_seconds") ? seconds(l, "frame_timeout_seconds") : 0;
    v.limits.max_queued_bytes = optional_count(l, "max_queued_bytes").value_or(0);
    v.limits.drop_timeout_seconds = find(l, "drop_timeout_seconds") ? seconds(l, "drop_timeout_seconds") : 0;
  }
  return v;
}

ImportPoolReply import_pool_reply_from_json(const Json& j) {
  ImportPoolReply v;
  v.pool = text(j, "pool");
  v.id = identity(j);
  v.handle_type = text_or(j, "handle_type", "posix_fd");
  v.access = devices(j, "access");
  v.generation = optional_count(j, "generation").value_or(0);
  v.ready_event = blob(j, "ready_event");
  return v;
}

AllocReply alloc_reply_from_json(const Json& j) {
  AllocReply v;
  v.lease = count(j, "lease");
  v.size_bytes = count(j, "size_bytes");
  v.pool = text(j, "pool");
  v.id = identity(j);
  v.generation = optional_count(j, "generation");
  v.export_data = blob(j, "export_data");
  v.ready = flag_or(j, "ready", false);
  v.ready_event = blob(j, "ready_event");
  return v;
}

BufferOpenReply buffer_open_reply_from_json(const Json& j) {
  BufferOpenReply v;
  v.name = text_or(j, "name", "");
  v.pool = text(j, "pool");
  v.id = identity(j);
  v.size_bytes = count(j, "size_bytes");
  v.part = optional_count(j, "part").value_or(0);
  v.part_count = optional_count(j, "part_count").value_or(1);
  v.buffer_size_bytes = optional_count(j, "buffer_size_bytes").value_or(v.size_bytes);
  const std::string mapping = text_or(j, "mapping", "pool");
  if (mapping != "exported" && mapping != "pool") ill_typed("mapping", "\"exported\" or \"pool\"");
  v.exported = mapping == "exported";
  if (v.exported) {
    v.mapped_size_bytes = count(j, "mapped_size_bytes");
    v.access = devices(j, "access");
    return v;
  }
  v.generation = optional_count(j, "generation");
  v.export_data = blob(j, "export_data");
  v.ready = flag_or(j, "ready", true);
  v.ready_event = blob(j, "ready_event");
  return v;
}

Json error_reply(const Json& id, const model::ErrorInfo& error) {
  Json out;
  out["id"] = id;
  out["ok"] = false;
  out["error"] = model::to_json(error);
  return out;
}

Json refusal_reply(const Json& id, const ConfigRefusal& refusal) {
  Json out = error_reply(id, refusal.error);
  Json& error = out["error"];
  error["finding_count"] = refusal.finding_count;
  error["findings"] = refusal.findings;
  error["rendered"] = refusal.rendered;
  return out;
}

RequestHead request_head(const Json& request) {
  RequestHead head;
  if (auto it = request.find("id"); it != request.end() && it->is_number_integer() && it->get<std::int64_t>() >= 0)
    head.id = *it;
  if (auto it = request.find("op"); it != request.end() && it->is_string()) head.op = it->get<std::string>();
  const auto quiet = request.find("quiet");
  head.quiet = quiet != request.end() && quiet->is_boolean() && quiet->get<bool>();
  return head;
}

Json ok_reply(const Json& id, const Json& body) {
  Json reply;
  reply["id"] = id;
  reply["ok"] = true;
  for (auto& [k, v] : body.items()) reply[k] = v;
  return reply;
}

bool reply_ok(const Json& reply) { return reply.value("ok", false); }

std::optional<bool> ok_of(const Json& reply) {
  const auto ok = reply.is_object() ? reply.find("ok") : reply.end();
  return ok != reply.end() && ok->is_boolean() ? std::optional<bool>(ok->get<bool>()) : std::nullopt;
}

Json id_of(const Json& message) { return message.value("id", Json()); }

void address(Json& request, std::uint64_t id, bool quiet) {
  request["id"] = id;
  if (quiet) request["quiet"] = true;
}

std::optional<model::ErrorInfo> error_of_reply(const Json& reply) {
  if (!reply.is_object()) return model::ErrorInfo{"internal", "the holder sent something that is not a reply", {}, {}};
  const auto ok = reply.find("ok");
  if (ok == reply.end() || !ok->is_boolean() || ok->get<bool>()) return std::nullopt;
  const auto e = reply.find("error");
  if (e != reply.end() && e->is_object()) {
    try {
      return model::error_from_json(*e);
    } catch (const std::invalid_argument& bad) {
      return model::ErrorInfo{"internal", std::string("the holder's error is malformed: ") + bad.what(), {}, {}};
    }
  }
  return model::ErrorInfo{"internal", "the holder refused the request without saying why", {}, {}};
}

// ---- notices ----

Json to_json(const PoolGone& v) {
  Json out = {{"notice", "pool_gone"}, {"pool", v.pool}};
  model::put_identity(out, v.id);
  if (v.generation) out["generation"] = *v.generation;
  out["message"] = v.message;
  return out;
}

Json to_json(const Drop& v) {
  return {{"notice", "drop"},   {"ask", v.ask},
          {"leases", v.leases}, {"requested_bytes", v.requested_bytes},
          {"reason", v.reason}, {"timeout_seconds", v.timeout_seconds}};
}

Json to_json(const Draining& v) { return {{"notice", "draining"}, {"message", v.message}}; }

std::string notice_name(const Json& j) { return text(j, "notice"); }

PoolGone pool_gone_from_json(const Json& j) {
  PoolGone v;
  v.pool = text(j, "pool");
  v.id = identity(j);
  v.generation = optional_count(j, "generation");
  v.message = text_or(j, "message", "");
  return v;
}

Drop drop_from_json(const Json& j) {
  Drop v;
  v.ask = count(j, "ask");
  v.leases = counts(j, "leases");
  v.requested_bytes = optional_count(j, "requested_bytes").value_or(0);
  v.reason = text_or(j, "reason", "");
  v.timeout_seconds = find(j, "timeout_seconds") ? seconds(j, "timeout_seconds") : 0;
  return v;
}

}  // namespace cupool::proto
