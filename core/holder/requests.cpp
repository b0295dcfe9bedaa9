// The request table and its handlers: each request of docs/protocol.md parsed, checked against who
// sent it and answered. The state they read and change lives in the other files of holder/.
#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/error.h"
#include "base/text.h"
#include "base/units.h"
#include "config/load.h"
#include "holder/holder.h"
#include "holder/names.h"

namespace cupool {

namespace {

// A buffer_create's "part_sizes_bytes" (the size of each allocation, adding up to "size_bytes"), or
// one part of `size` when the request has none.
std::vector<std::uint64_t> part_sizes(const Json* parts, std::uint64_t size) {
  if (!parts) return {size};
  const auto fail = [&](const std::string& why) {
    throw Error(Errc::bad_request, "\"part_sizes_bytes\" " + why + " (an array of 1 to " +
                                       std::to_string(tensors::kMaxParts) +
                                       " sizes in bytes, each at least 1, adding up to \"size_bytes\")");
  };
  if (!parts->is_array() || parts->empty() || parts->size() > tensors::kMaxParts) fail("is not a list of parts");
  std::vector<std::uint64_t> out;
  std::uint64_t sum = 0;
  for (const Json& p : *parts) {
    // Unsigned off the wire; a request built in C++ may hold it signed.
    const bool count = p.is_number_unsigned() || (p.is_number_integer() && p.get<std::int64_t>() > 0);
    if (!count || p.get<std::uint64_t>() == 0 || p.get<std::uint64_t>() > proto::kMaxAllocation)
      fail("holds " + p.dump().substr(0, 40) + ", not a size");
    out.push_back(p.get<std::uint64_t>());
    sum += out.back();  // at most kMaxBufferParts x 2^48: no overflow
  }
  if (sum != size) fail("add up to " + std::to_string(sum) + " bytes, not " + std::to_string(size));
  return out;
}

}  // namespace

// The request table: every operation of docs/protocol.md and the member that serves it.
const std::vector<Holder::Operation>& Holder::operations() {
  static const std::vector<Operation> table = {
      {"hello", &Holder::op_hello},
      {"list", &Holder::op_list},
      {"import_pool", &Holder::op_import_pool},
      {"alloc", &Holder::op_alloc},
      {"free", &Holder::op_free},
      {"reuse", &Holder::op_reuse},
      {"dropped", &Holder::op_dropped},
      {"buffer_open", &Holder::op_buffer_open},
      {"buffer_close", &Holder::op_buffer_close},
      {"status", &Holder::op_status},
      {"stats", &Holder::op_stats},
      {"trim", &Holder::op_trim},
      {"plan", &Holder::op_plan},
      {"apply", &Holder::op_apply},
      {"export", &Holder::op_export},
      {"buffer_create", &Holder::op_buffer_create},
      {"buffer_remove", &Holder::op_buffer_remove},
      {"buffer_ready", &Holder::op_buffer_ready},
      {"buffer_tensors", &Holder::op_buffer_tensors},
  };
  return table;
}

Reply Holder::handle(std::uint64_t id, const Json& request) {
  return then_sync_custody([&] { return serve(id, request); });
}

Reply Holder::serve(std::uint64_t id, const Json& request) {
  Client& c = client(id);
  auto op_it = request.find("op");
  if (op_it == request.end() || !op_it->is_string()) throw Error(Errc::bad_request, "a request needs \"op\", a string");
  const std::string op = op_it->get<std::string>();
  // Every request is read in protocol 4's names; a connection of 1 to 3 sends the old ones.
  const bool old_names = c.greeted && c.protocol < proto::kNamedProtocol;
  Json renamed;
  if (old_names) {
    renamed = request;
    proto::to_new_names(proto::Message::request, op, renamed);
  } else if (c.greeted)  // an old name on protocol 4: say the new one (Args would only say "unknown")
    for (const auto& item : request.items())
      if (const char* now = proto::new_name(proto::Message::request, op, item.key()))
        throw Error(Errc::bad_request, "unknown argument \"" + item.key() + "\": protocol " +
                                           std::to_string(proto::kNamedProtocol) + " calls it \"" + now +
                                           "\" (docs/naming.md)");
  proto::Args a(old_names ? renamed : request);
  if (auto id_it = request.find("id"); id_it == request.end() || !id_it->is_number_integer() ||
                                       id_it->get<std::int64_t>() < 0 || id_it->get<std::int64_t>() >= (1LL << 53))
    throw Error(Errc::bad_request, "a request needs \"id\", an integer from 0 to 2^53-1");
  if (!c.greeted && op != "hello")
    throw Error(Errc::hello_required, "the first request on a connection must be \"hello\"");

  const std::vector<Operation>& table = operations();
  const auto it = std::find_if(table.begin(), table.end(), [&](const Operation& o) { return op == o.name; });
  if (it == table.end()) {
    std::vector<std::string> names;
    for (const Operation& o : table) names.emplace_back(o.name);
    const std::string hint = did_you_mean(op, names);
    throw Error(Errc::unknown_op, "unknown operation \"" + valid_utf8(op) + "\"" +
                                      (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
  }
  // "quiet": no reply when it succeeds (docs/protocol.md, "Quiet requests"): for the requests a
  // client's cache sends on its own, so the warm path never waits for the holder.
  if (a.boolean("quiet", false) && op != "free" && op != "reuse" && op != "dropped")
    throw Error(Errc::bad_request, "\"quiet\" is for free, reuse and dropped only");
  Request r{id, request["id"], c, a, op};
  Reply out;
  try {
    out = (this->*(it->serve))(r);
    if (out.waits) {
      run_ready_waiters();
      return out;
    }
    a.finish();
  } catch (const Error& e) {
    // An argument named in a refusal is named as this connection sent it.
    if (old_names && e.code() == Errc::bad_request) throw Error(e.code(), proto::in_old_names(op, e.what()));
    throw;
  }
  // An answer to a drop notice may be what another request waited for.
  run_ready_waiters();
  if (c.protocol < proto::kNamedProtocol) proto::to_old_names(proto::Message::reply, op, out.body);  // hello too
  return out;
}

Reply Holder::op_hello(Request& r) {
  Client& c = r.client;
  const proto::Hello hello = proto::read_hello(r.args);
  r.args.finish();
  const int version = hello.protocol;
  const auto& name = hello.client;
  if (version < proto::kOldestProtocol || version > proto::kProtocol)
    throw Error(Errc::unsupported_protocol,
                "this holder (cupool " CUPOOL_VERSION ") speaks protocol versions " +
                    std::to_string(proto::kOldestProtocol) + " to " + std::to_string(proto::kProtocol) + ", not " +
                    std::to_string(version) +
                    (version > proto::kProtocol ? "; the client is newer than the holder: upgrade cupool on this node"
                                                : "; upgrade the client library (libcupool-client)"));
  if (name) {
    // Shown to admins in `status`: no control characters (C0, DEL, C1), no bidirectional overrides.
    if (!displays_as_is(*name))
      throw Error(Errc::bad_request,
                  "\"client\" must be printable text (no control or bidirectional formatting characters)");
    c.name = *name;
  }
  c.greeted = true;
  c.protocol = version;
  proto::HelloReply out;
  out.protocol = version;  // what this connection speaks (the client's choice)
  out.oldest_protocol = proto::kOldestProtocol;
  out.newest_protocol = proto::kProtocol;
  out.version = std::string("cupool ") + CUPOOL_VERSION;
  out.pid = identity_.pid;
  out.backend = backend_.simulated() ? "simulated" : "cuda";
  out.peer = {c.peer.pid, c.peer.uid, c.peer.gid, c.peer.user, c.admin};
  out.limits.max_payload_bytes = proto::kMaxPayload;
  // A message longer than a frame comes in parts (docs/protocol.md, Frames): replies up to
  // max_reply; requests up to max_request (in parts from admins only).
  out.limits.max_reply_bytes = proto::kMaxReply;
  out.limits.max_request_bytes = c.admin ? proto::kMaxRequest : proto::kMaxPayload;
  out.limits.max_lease_count = limits_.max_leases_per_client;
  out.limits.max_open_buffer_count = limits_.max_open_buffers_per_client;
  out.limits.frame_timeout_seconds = 5.0;
  out.limits.max_queued_bytes = 1 << 20;
  out.limits.drop_timeout_seconds = static_cast<double>(drops_.timeout_ms()) / 1000.0;
  return proto::to_json(out);
}

Reply Holder::op_list(Request& r) {
  Client& c = r.client;
  proto::read_list(r.args);
  r.args.finish();
  model::ListReply out;
  for (const auto& [key, p] : pools_) {
    out.pools.push_back({pool_info(key, p), p.want.props.handle_types != 0 && permitted(c, p)});
  }
  for (const auto& [name, b] : buffers_) {
    auto p = pools_.find({b.want.pool, b.want.device});
    model::BufferInfo v = buffer_view(name, b);
    v.permitted = b.shared && p != pools_.end() && permitted(c, p->second);
    out.buffers.push_back(std::move(v));
  }
  return model::to_json(out);
}

std::vector<model::DeviceId> Holder::access_of(const HeldPool& p) const {
  std::vector<model::DeviceId> out;
  for (int peer : p.want.access) out.push_back(device_id(peer));
  return out;
}

Reply Holder::op_import_pool(Request& r) {
  Client& c = r.client;
  const proto::ImportPool want = proto::read_import_pool(r.args);
  r.args.finish();
  require_not_draining("import_pool");
  HeldPool& p = pool_for(c, want.pool, want.device, true);
  proto::ImportPoolReply out;
  out.pool = p.want.name;
  out.id = device_id(p.want.device);
  out.access = access_of(p);
  out.generation = p.generation;
  out.ready_event = backend_.ready_event(p.want.device);
  Fd descriptor(backend_.export_pool_fd(p.handle));
  c.imported[{p.want.name, p.want.device}] = p.generation;
  return {proto::to_json(out), std::move(descriptor)};
}

Reply Holder::op_alloc(Request& r) {
  const proto::Alloc want = proto::read_alloc(r.args);
  r.args.finish();
  const std::string& name = want.pool;
  const int device = want.device;
  const std::uint64_t size = want.size_bytes;
  const bool synchronize = want.synchronize;
  require_not_draining("alloc");
  const std::uint64_t client_id = r.id;
  auto attempt = [this, client_id, name, device, size, synchronize]() -> Json {
    Client& c = client(client_id);
    HeldPool& p = pool_for(c, name, device, true);
    const auto [lease, s] = grant_lease(client_id, c, p, size, synchronize);
    spdlog::debug("lease {}: {} of pool {} on device {} for client {}, {}", lease, format_bytes(size), p.want.name,
                  p.want.device, client_id,
                  synchronize ? "waited for (no IPC event)" : "the ready event recorded after it");
    proto::AllocReply out;
    out.lease = lease;
    out.size_bytes = size;
    out.pool = p.want.name;
    out.id = device_id(p.want.device);
    out.generation = p.generation;
    out.export_data = s.export_data;
    out.ready = synchronize;
    out.ready_event = backend_.ready_event(p.want.device);
    return proto::to_json(out);
  };
  try {
    return attempt();
  } catch (const Error& e) {
    // Pressure: blocks that clients keep cached in this pool are asked back, and the allocation
    // is tried once more when they are (docs/protocol.md, "Cached blocks").
    if (e.code() != Errc::out_of_memory && e.code() != Errc::quota_exceeded) throw;
    const HeldPool& p = pool_for(r.client, name, device, true);
    const PoolKey key{p.want.name, p.want.device};
    const bool quota = e.code() == Errc::quota_exceeded;
    std::uint64_t need = size;
    if (quota) {
      // Its own cached blocks count against its quota: enough of them to fit.
      const std::uint64_t held = r.client.bytes_in_pool[key];
      const std::uint64_t q = p.want.share.quota_per_client;
      if (size > q) throw;
      need = held + size - q;
    }
    const std::set<std::uint64_t> asks = ask_drops(
        [&](const Lease& l) {
          return l.pool == key.first && l.device == key.second && (!quota || l.client == client_id);
        },
        need, quota ? "quota" : "pressure");
    if (asks.empty()) throw;
    return defer(r, asks, attempt);
  }
}

Reply Holder::op_free(Request& r) {
  Client& c = r.client;
  // With "cache" (protocol 2) the client keeps its mapping of the block to use it again (op
  // reuse); the holder keeps it allocated and charged to this connection (docs/protocol.md,
  // "Cached blocks").
  const proto::Free want = proto::read_free(r.args);
  r.args.finish();
  const std::uint64_t lease = want.lease;
  const bool cache = want.cache;
  const Lease* l = leases_.find(lease);
  if (!l || !c.leases.count(lease))
    throw Error(Errc::not_found, "lease " + std::to_string(lease) + " is not held by this connection");
  const std::uint64_t size = l->size;
  if (cache) {
    if (c.protocol < 2)
      throw Error(Errc::bad_request, "\"cache\" needs protocol 2 (this connection said hello with 1)");
    if (l->cached) throw Error(Errc::bad_request, "lease " + std::to_string(lease) + " is cached already");
    cache_lease(lease);
    return proto::to_json(proto::FreeReply{lease, size, true});
  }
  free_lease(lease);
  return proto::to_json(proto::FreeReply{lease, size, false});
}

Reply Holder::op_buffer_open(Request& r) {
  Client& c = r.client;
  const proto::BufferOpen want = proto::read_buffer_open(r.args);
  r.args.finish();
  const std::string& name = want.name;
  const std::uint64_t part = want.part;
  require_not_draining("buffer_open");
  HeldBuffer& b = readable_buffer(r.id, name);
  HeldPool& p = pool_for(c, b.want.pool, b.want.device, true);
  if (part >= b.parts.size())
    throw Error(Errc::not_found, "buffer " + name + " has " + std::to_string(b.parts.size()) +
                                     (b.parts.size() == 1 ? " part" : " parts") + "; there is no part " +
                                     std::to_string(part));
  auto open = c.open_buffers.find(name);
  if (open == c.open_buffers.end() && c.open_buffers.size() >= limits_.max_open_buffers_per_client)
    throw Error(Errc::limit_exceeded, "a connection may have at most " +
                                          std::to_string(limits_.max_open_buffers_per_client) + " buffers open");
  if (b.exported && c.protocol < 3)
    throw Error(Errc::bad_request, "buffer " + name +
                                       " is held as an exported allocation, which protocol 3 opens; this connection "
                                       "speaks protocol " +
                                       std::to_string(c.protocol) + ": upgrade the client library (libcupool-client)");
  Fd descriptor;
  if (b.exported) {
    descriptor = Fd(::fcntl(b.parts[part].fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!descriptor) throw Error(Errc::internal, "can't duplicate buffer " + name + "'s descriptor: " + errno_text());
  }
  c.open_buffers[name] += 1;
  b.opens += 1;
  proto::BufferOpenReply out;
  out.name = name;
  out.pool = b.want.pool;
  out.id = device_id(b.want.device);
  out.size_bytes = b.parts[part].size;  // what the lease maps: the part
  out.part = part;
  out.part_count = b.parts.size();
  out.buffer_size_bytes = b.want.size;
  if (b.exported) {
    // The allocation's descriptor rides with the reply: the client maps it whole.
    out.exported = true;
    out.mapped_size_bytes = b.parts[part].mapped;
    out.access = access_of(p);  // the devices that may map it besides its own (the pool's access)
    return {proto::to_json(out), std::move(descriptor)};
  }
  out.generation = p.generation;
  out.export_data = b.parts[part].allocation.export_data;
  out.ready = true;
  out.ready_event = backend_.ready_event(p.want.device);
  return proto::to_json(out);
}

Holder::HeldBuffer& Holder::readable_buffer(std::uint64_t id, const std::string& name) {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) throw Error(Errc::not_found, "no buffer named \"" + valid_utf8(name) + "\"");
  // Nobody else sees a buffer half loaded: its loader opens it to fill it, then says buffer_ready.
  if (it->second.loading && it->second.loading != id)
    throw Error(Errc::busy,
                "buffer " + name + " is still being loaded; open it once `cupool buffer ls` shows it ready");
  return it->second;
}

Reply Holder::op_buffer_close(Request& r) {
  Client& c = r.client;
  const std::string name = proto::read_buffer_close(r.args).name;
  r.args.finish();
  auto open = c.open_buffers.find(name);
  if (open == c.open_buffers.end())
    throw Error(Errc::not_found, "buffer \"" + valid_utf8(name) + "\" is not open on this connection");
  if (--open->second == 0) c.open_buffers.erase(open);
  auto it = buffers_.find(name);
  if (it != buffers_.end() && it->second.opens > 0) it->second.opens -= 1;
  return proto::to_json(proto::BufferCloseReply{name});
}

Reply Holder::op_buffer_create(Request& r) {
  Client& c = r.client;
  const proto::BufferCreate want = proto::read_buffer_create(r.args);
  r.args.finish();
  const std::string& name = want.name;
  const std::string& pool = want.pool;
  const int device = want.device;
  const std::uint64_t size = want.size_bytes;
  const bool loading = want.loading;
  const auto& tensors = want.tensors;
  const auto& metadata = want.metadata;
  require_admin(c, "buffer_create");
  if (metadata && !tensors) throw Error(Errc::bad_request, "\"metadata\" comes with \"tensors\"");
  const std::vector<std::uint64_t> parts = part_sizes(want.part_sizes_bytes ? &*want.part_sizes_bytes : nullptr, size);
  std::optional<tensors::Index> index;
  if (tensors) index = tensors::from_json(*tensors, metadata ? *metadata : Json(), parts);
  require_not_draining("buffer_create");
  if (!valid_name(name))
    throw Error(Errc::bad_request,
                "buffer name \"" + valid_utf8(name) + "\" must match [a-z0-9][a-z0-9._-]* (at most 64 characters)");
  if (buffers_.count(name)) throw Error(Errc::exists, "a buffer named " + name + " exists");
  HeldPool& p = pool_for(c, pool, device, true);  // a buffer is for sharing: an IPC pool
  BufferWant w{name, pool, p.want.device, size};
  try {
    create_buffer(w, parts);
    HeldBuffer& b = buffers_.at(name);
    b.loading = loading ? r.id : 0;
    b.index = std::move(index);
    b.owner = c.peer.uid;
    b.from_config = false;
    manifest_stale_ = true;
  } catch (const CudaError& e) {
    if (e.name() == "CUDA_ERROR_OUT_OF_MEMORY")
      throw Error(Errc::out_of_memory,
                  "pool " + pool + " has no room for " + format_bytes(size) + " (" + e.what() + ")");
    throw;
  }
  model::BufferMade out;
  out.name = name;
  out.pool = pool;
  out.id = device_id(p.want.device);
  out.size_bytes = size;
  out.part_count = parts.size();
  out.loading = loading;
  if (tensors) out.tensor_count = tensors->size();
  return model::to_json(out);
}

Reply Holder::op_buffer_ready(Request& r) {
  const std::string name = proto::read_buffer_ready(r.args).name;
  r.args.finish();
  require_admin(r.client, "buffer_ready");
  auto it = buffers_.find(name);
  if (it == buffers_.end()) throw Error(Errc::not_found, "no buffer named \"" + valid_utf8(name) + "\"");
  HeldBuffer& b = it->second;
  if (b.loading != r.id)
    throw Error(Errc::bad_request, "buffer " + name + " is not being loaded by this connection (" +
                                       (b.loading ? "another one loads it" : "it is ready") + ")");
  // The loader waited for its own copies before it said so (cupool_lease_load returns when done).
  b.loading = 0;
  manifest_stale_ = true;  // ready now: in the next manifest
  const std::size_t count = b.index ? b.index->tensors.size() : 0;
  spdlog::info("buffer {} is ready ({}, {} tensor{})", name, format_bytes(b.want.size), count, count == 1 ? "" : "s");
  return Json{{"name", name}, {"tensor_count", b.index ? Json(count) : Json(nullptr)}};  // null: no index
}

Reply Holder::op_buffer_tensors(Request& r) {
  Client& c = r.client;
  const std::string name = proto::read_buffer_tensors(r.args).name;
  r.args.finish();
  HeldBuffer& b = readable_buffer(r.id, name);
  pool_for(c, b.want.pool, b.want.device, true);  // who may open it may read its index
  model::BufferTensors out;
  out.name = name;
  out.size_bytes = b.want.size;
  out.indexed = b.index.has_value();
  for (const auto& part : b.parts) out.part_sizes.push_back(part.size);
  if (b.index) {
    for (const tensors::Tensor& t : b.index->tensors) out.tensors.push_back(tensors::view(t));
    out.metadata = b.index->metadata;
  }
  return model::to_json(out);
}

Reply Holder::op_buffer_remove(Request& r) {
  Client& c = r.client;
  const proto::BufferRemove want = proto::read_buffer_remove(r.args);
  r.args.finish();
  const std::string& name = want.name;
  const bool force = want.force;
  require_admin(c, "buffer_remove");
  auto it = buffers_.find(name);
  if (it == buffers_.end()) throw Error(Errc::not_found, "no buffer named \"" + valid_utf8(name) + "\"");
  if (it->second.opens > 0 && !force)
    throw Error(Errc::busy, "buffer " + name + " is open " + std::to_string(it->second.opens) +
                                (it->second.opens == 1 ? " time" : " times") + "; close it first, or pass force");
  const BufferWant w = it->second.want;
  for (auto& [id, cl] : clients_) cl.open_buffers.erase(name);
  destroy_buffer(name);
  model::BufferMade out;
  out.name = w.name;
  out.pool = w.pool;
  out.id = device_id(w.device);
  out.size_bytes = w.size;
  return model::to_json(out);
}

Reply Holder::op_status(Request& r) {
  proto::read_status(r.args);
  r.args.finish();
  return model::to_json(status());
}

Reply Holder::op_stats(Request& r) {
  const bool reset = proto::read_stats(r.args).reset_peaks;
  if (reset) require_admin(r.client, "stats with reset_peaks");
  r.args.finish();
  return model::to_json(stats(reset));
}

Reply Holder::op_trim(Request& r) {
  require_admin(r.client, "trim");  // before its arguments are read
  const proto::Trim want = proto::read_trim(r.args);
  r.args.finish();
  const std::uint64_t keep = want.keep_bytes;
  const std::optional<std::string>& pool = want.pool;
  const bool graph = want.graph;
  const bool cached = want.cached;
  if (pool && std::none_of(pools_.begin(), pools_.end(), [&](const auto& kv) { return kv.first.first == *pool; }))
    throw Error(Errc::not_found, "no pool named \"" + valid_utf8(*pool) + "\"");
  // Cached blocks are memory nobody uses: asked back first, as far as `keep` needs, and the trim
  // runs once their clients answered.
  std::set<std::uint64_t> asks;
  if (cached)
    for (const auto& [key, p] : pools_) {
      const model::LeaseTotals t = leases_.of(key);
      if ((pool && key.first != *pool) || !t.cached_bytes) continue;
      const std::uint64_t used = t.leased_bytes;
      if (used <= keep) continue;
      const PoolKey k = key;
      const auto more =
          ask_drops([&](const Lease& l) { return l.pool == k.first && l.device == k.second; }, used - keep, "trim");
      asks.insert(more.begin(), more.end());
    }
  const std::uint64_t dropped_before = dropped_bytes_;
  auto run = [this, keep, pool, graph, dropped_before] {
    model::Trim out = trim(keep, pool, graph);
    out.dropped_bytes = dropped_bytes_ - dropped_before;
    return model::to_json(out);
  };
  if (!asks.empty()) return defer(r, asks, run);
  return run();
}

Reply Holder::op_export(Request& r) {
  proto::read_export(r.args);
  r.args.finish();
  return Json{{"config", export_config()}};
}

Reply Holder::op_plan(Request& r) { return plan_or_apply(r, false); }

Reply Holder::op_apply(Request& r) { return plan_or_apply(r, true); }

Reply Holder::plan_or_apply(Request& r, bool apply) {
  Client& c = r.client;
  // The config at most as long as what `cupool check` reads of a file.
  const proto::Plan want = proto::read_plan(r.args, apply, kMaxConfigBytes);
  r.args.finish();
  const std::string& text = want.config;
  // The name findings use (each finding repeats it): bounded, and shown without control characters.
  const std::string path = safe_for_display(want.path.value_or("<request>"));
  if (apply) {
    require_admin(c, "apply");
    require_not_draining("apply");
  }
  // A ConfigRejected goes up: the conversation answers invalid_config (or does_not_fit) with the findings.
  // The file's users and groups, looked up within this peer's time (holder/account_book.h).
  CheckOptions accounts;
  accounts.user_exists = [this, &c](const std::string& n) { return accounts_.user_exists(c.peer.uid, c.admin, n); };
  accounts.group_exists = [this, &c](const std::string& n) { return accounts_.group_exists(c.peer.uid, c.admin, n); };
  const Loaded loaded = load_config(SourceFile(path, text), node_, Scope::all, accounts);
  std::optional<std::string> user;
  if (!c.peer.user.empty()) user = c.peer.user;
  auto run = [this, apply, path, user, desired = loaded.desired, warnings = loaded.warnings,
              findings = loaded.warning_findings] {
    std::vector<Change> changes = apply ? this->apply(desired) : plan(desired);
    if (apply) {
      // Held until the holder reads its own file again (a reload or a restart), and said in status.
      ++apply_count_;
      applied_config_ = model::AppliedConfig{path, iso_now(), user};
      spdlog::info("apply: {} by {}; a reload or a restart goes back to {}", path, user.value_or("an unknown user"),
                   identity_.config.empty() ? std::string("the holder's file") : identity_.config);
    }
    model::PlanReply out;
    out.applied = apply;
    for (const auto& ch : changes) out.changes.push_back(view(ch));
    out.warnings = findings;
    out.warnings_rendered = warnings;
    if (!identity_.config.empty()) out.holder_config = identity_.config;
    return model::to_json(out);
  };
  // Pools that only cached blocks keep from being replaced or removed: asked back first.
  if (apply) {
    const std::set<std::uint64_t> asks = ask_drops_for(loaded.desired);
    if (!asks.empty()) return defer(r, asks, run);
  }
  return run();
}
}  // namespace cupool
