// The requests on held buffers: buffer_open, buffer_close, buffer_tensors (anyone the pool is
// shared with), buffer_create, buffer_ready, buffer_remove (admins).
#include "holder/buffer_requests.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>

#include "base/error.h"
#include "base/text.h"
#include "base/units.h"
#include "holder/names.h"
#include "protocol/messages.h"

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

Reply BufferRequests::open(Request& r) {
  HeldClient& c = r.client;
  const proto::BufferOpen want = proto::read_buffer_open(r.args);
  r.args.finish();
  const std::string& name = want.name;
  const std::uint64_t part = want.part;
  require_not_draining(draining_, "buffer_open");
  HeldBuffer& b = buffers_.readable(r.id, name);
  HeldPool& p = pools_.for_client(c, b.want.pool, b.want.device, true);
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
  out.id = pools_.device_id(b.want.device);
  out.size_bytes = b.parts[part].size;  // what the lease maps: the part
  out.part = part;
  out.part_count = b.parts.size();
  out.buffer_size_bytes = b.want.size;
  if (b.exported) {
    // The allocation's descriptor rides with the reply: the client maps it whole.
    out.exported = true;
    out.mapped_size_bytes = b.parts[part].mapped;
    out.access = pools_.access_of(p);  // the devices that may map it besides its own (the pool's access)
    return {proto::to_json(out), std::move(descriptor)};
  }
  out.generation = p.generation;
  out.export_data = b.parts[part].allocation.export_data;
  out.ready = true;
  out.ready_event = backend_.ready_event(p.want.device);
  return proto::to_json(out);
}

Reply BufferRequests::close(Request& r) {
  HeldClient& c = r.client;
  const std::string name = proto::read_buffer_close(r.args).name;
  r.args.finish();
  auto open = c.open_buffers.find(name);
  if (open == c.open_buffers.end())
    throw Error(Errc::not_found, "buffer \"" + valid_utf8(name) + "\" is not open on this connection");
  if (--open->second == 0) c.open_buffers.erase(open);
  HeldBuffer* b = buffers_.find(name);
  if (b && b->opens > 0) b->opens -= 1;
  return proto::to_json(proto::BufferCloseReply{name});
}

Reply BufferRequests::tensors(Request& r) {
  HeldClient& c = r.client;
  const std::string name = proto::read_buffer_tensors(r.args).name;
  r.args.finish();
  HeldBuffer& b = buffers_.readable(r.id, name);
  pools_.for_client(c, b.want.pool, b.want.device, true);  // who may open it may read its index
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

Reply BufferRequests::create(Request& r) {
  HeldClient& c = r.client;
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
  require_not_draining(draining_, "buffer_create");
  if (!valid_name(name))
    throw Error(Errc::bad_request,
                "buffer name \"" + valid_utf8(name) + "\" must match [a-z0-9][a-z0-9._-]* (at most 64 characters)");
  if (buffers_.count(name)) throw Error(Errc::exists, "a buffer named " + name + " exists");
  HeldPool& p = pools_.for_client(c, pool, device, true);  // a buffer is for sharing: an IPC pool
  BufferWant w{name, pool, p.want.device, size};
  try {
    buffers_.create(w, parts);
    HeldBuffer& b = *buffers_.find(name);
    b.loading = loading ? r.id : 0;
    b.index = std::move(index);
    b.owner = c.peer.uid;
    b.from_config = false;
    buffers_.changed();
  } catch (const CudaError& e) {
    // The driver's refusal, said once: the call and its result.
    if (e.name() == "CUDA_ERROR_OUT_OF_MEMORY")
      throw Error(Errc::out_of_memory, "pool " + pool + " on device " + std::to_string(p.want.device) +
                                           " has no room for " + format_bytes(size) + ": " + e.api() + " returned " +
                                           e.name());
    throw;
  }
  // Custody now rather than after the reply (as every request's end does): the reply says whether
  // the buffer outlives a restart of the holder, so that a caller hears when custody can't have it.
  buffers_.sync_custody();
  model::BufferMade out;
  out.name = name;
  out.pool = pool;
  out.id = pools_.device_id(p.want.device);
  out.size_bytes = size;
  out.part_count = parts.size();
  out.state = loading ? "loading" : "ready";
  if (tensors) out.tensor_count = tensors->size();
  out.kept = buffers_.kept(name);
  return model::to_json(out);
}

Reply BufferRequests::ready(Request& r) {
  const std::string name = proto::read_buffer_ready(r.args).name;
  r.args.finish();
  require_admin(r.client, "buffer_ready");
  HeldBuffer* found = buffers_.find(name);
  if (!found) throw Error(Errc::not_found, "no buffer named \"" + valid_utf8(name) + "\"");
  HeldBuffer& b = *found;
  if (b.loading != r.id)
    throw Error(Errc::bad_request, "buffer " + name + " is not being loaded by this connection (" +
                                       (b.loading ? "another one loads it" : "it is ready") + ")");
  // The loader waited for its own copies before it said so (cupool_lease_load returns when done).
  b.loading = 0;
  buffers_.changed();  // ready now: in the next manifest
  const std::size_t count = b.index ? b.index->tensors.size() : 0;
  spdlog::info("buffer {} is ready ({}, {} tensor{})", name, format_bytes(b.want.size), count, count == 1 ? "" : "s");
  proto::BufferReadyReply out{name, {}};
  if (b.index) out.tensor_count = count;
  return proto::to_json(out);
}

Reply BufferRequests::remove(Request& r) {
  HeldClient& c = r.client;
  const proto::BufferRemove want = proto::read_buffer_remove(r.args);
  r.args.finish();
  const std::string& name = want.name;
  const bool force = want.force;
  require_admin(c, "buffer_remove");
  const HeldBuffer* b = buffers_.find(name);
  if (!b) throw Error(Errc::not_found, "no buffer named \"" + valid_utf8(name) + "\"");
  if (b->opens > 0 && !force)
    throw Error(Errc::busy, "buffer " + name + " is open " + std::to_string(b->opens) +
                                (b->opens == 1 ? " time" : " times") + "; close it first, or pass force");
  const BufferWant w = b->want;
  for (auto& [id, cl] : clients_) cl.open_buffers.erase(name);
  buffers_.destroy(name);
  model::BufferMade out;
  out.name = w.name;
  out.pool = w.pool;
  out.id = pools_.device_id(w.device);
  out.size_bytes = w.size;
  return model::to_json(out);
}

}  // namespace cupool
