// The requests a client library sends: hello, list, import_pool, alloc, free, reuse, dropped.
#include "holder/client_requests.h"

#include <spdlog/spdlog.h>

#include "base/error.h"
#include "base/text.h"
#include "base/units.h"
#include "protocol/messages.h"

namespace cupool {

Reply ClientRequests::hello(Request& r) {
  HeldClient& c = r.client;
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
  out.limits.drop_timeout_seconds = static_cast<double>(leasing_.drop_timeout_ms()) / 1000.0;
  return proto::to_json(out);
}

Reply ClientRequests::list(Request& r) {
  HeldClient& c = r.client;
  proto::read_list(r.args);
  r.args.finish();
  model::ListReply out;
  for (const auto& [key, p] : pools_) {
    out.pools.push_back({pools_.info(key, p), p.want.props.handle_types != 0 && PoolTable::permitted(c, p)});
  }
  for (const auto& [name, b] : buffers_) {
    const HeldPool* p = pools_.find({b.want.pool, b.want.device});
    model::BufferInfo v = buffers_.view(name, b);
    v.permitted = b.shared && p && PoolTable::permitted(c, *p);
    out.buffers.push_back(std::move(v));
  }
  return model::to_json(out);
}

Reply ClientRequests::import_pool(Request& r) {
  HeldClient& c = r.client;
  const proto::ImportPool want = proto::read_import_pool(r.args);
  r.args.finish();
  require_not_draining(draining_, "import_pool");
  HeldPool& p = pools_.for_client(c, want.pool, want.device, true);
  proto::ImportPoolReply out;
  out.pool = p.want.name;
  out.id = pools_.device_id(p.want.device);
  out.access = pools_.access_of(p);
  out.generation = p.generation;
  out.ready_event = backend_.ready_event(p.want.device);
  Fd descriptor(backend_.export_pool_fd(p.handle));
  c.imported[{p.want.name, p.want.device}] = p.generation;
  return {proto::to_json(out), std::move(descriptor)};
}

Reply ClientRequests::alloc(Request& r) {
  const proto::Alloc want = proto::read_alloc(r.args);
  r.args.finish();
  const std::string& name = want.pool;
  const int device = want.device;
  const std::uint64_t size = want.size_bytes;
  const bool synchronize = want.synchronize;
  require_not_draining(draining_, "alloc");
  const std::uint64_t client_id = r.id;
  auto attempt = [this, client_id, name, device, size, synchronize]() -> Json {
    HeldClient& c = clients_.at(client_id);
    HeldPool& p = pools_.for_client(c, name, device, true);
    const auto [lease, s] = leasing_.grant(client_id, c, p, size, synchronize);
    spdlog::debug("lease {}: {} of pool {} on device {} for client {}, {}", lease, format_bytes(size), p.want.name,
                  p.want.device, client_id,
                  synchronize ? "waited for (no IPC event)" : "the ready event recorded after it");
    proto::AllocReply out;
    out.lease = lease;
    out.size_bytes = size;
    out.pool = p.want.name;
    out.id = pools_.device_id(p.want.device);
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
    const HeldPool& p = pools_.for_client(r.client, name, device, true);
    const PoolTable::PoolKey key{p.want.name, p.want.device};
    const bool quota = e.code() == Errc::quota_exceeded;
    std::uint64_t need = size;
    if (quota) {
      // Its own cached blocks count against its quota: enough of them to fit.
      const std::uint64_t held = r.client.bytes_in_pool[key];
      const std::uint64_t q = p.want.share.quota_per_client;
      if (size > q) throw;
      need = held + size - q;
    }
    const std::set<std::uint64_t> asks = leasing_.ask_drops(
        [&](const Lease& l) {
          return l.pool == key.first && l.device == key.second && (!quota || l.client == client_id);
        },
        need, quota ? "quota" : "pressure");
    if (asks.empty()) throw;
    return leasing_.defer(r, asks, attempt);
  }
}

Reply ClientRequests::free(Request& r) {
  HeldClient& c = r.client;
  // With "cache" (protocol 2) the client keeps its mapping of the block to use it again (op
  // reuse); the holder keeps it allocated and charged to this connection (docs/protocol.md,
  // "Cached blocks").
  const proto::Free want = proto::read_free(r.args);
  r.args.finish();
  const std::uint64_t lease = want.lease;
  const bool cache = want.cache;
  const Lease* l = leasing_.book().find(lease);
  if (!l || !c.leases.count(lease))
    throw Error(Errc::not_found, "lease " + std::to_string(lease) + " is not held by this connection");
  const std::uint64_t size = l->size;
  if (cache) {
    if (c.protocol < 2)
      throw Error(Errc::bad_request, "\"cache\" needs protocol 2 (this connection said hello with 1)");
    if (l->cached) throw Error(Errc::bad_request, "lease " + std::to_string(lease) + " is cached already");
    leasing_.cache(lease);
    return proto::to_json(proto::FreeReply{lease, size, true});
  }
  leasing_.free(lease);
  return proto::to_json(proto::FreeReply{lease, size, false});
}

Reply ClientRequests::reuse(Request& r) {
  const std::uint64_t lease = proto::read_reuse(r.args).lease;
  r.args.finish();
  const Lease* l = leasing_.book().find(lease);
  if (!l || l->client != r.id || !l->cached)
    throw Error(Errc::not_found, "lease " + std::to_string(lease) + " is not a cached lease of this connection");
  leasing_.uncache(lease);
  return proto::to_json(proto::ReuseReply{lease, l->size});
}

Reply ClientRequests::dropped(Request& r) {
  const proto::Dropped answer = proto::read_dropped(r.args, limits_.max_leases_per_client);
  r.args.finish();
  const std::uint64_t ask = answer.ask;
  const std::vector<std::uint64_t>& ids = answer.leases;
  const std::uint64_t bytes = leasing_.dropped(r.id, ask, ids);
  return proto::to_json(proto::DroppedReply{ask, ids.size(), bytes});
}

}  // namespace cupool
