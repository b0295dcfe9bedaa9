// The C API's calls on a connection to the holder (include/cupool/client.h). No exception crosses
// the C boundary: every entry point catches and turns failures into a status and a message on the
// connection.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/text.h"
#include "client/api.h"
#include "client/connection.h"
#include "config/config.h"
#include "cupool/client.h"
#include "protocol/messages.h"
#include "protocol/protocol.h"

using cupool::client::Failure;
using cupool::client::Json;

namespace {

// The message of the last call this thread made on a connection. A connection may be used from
// several threads at once: the message one thread reads with cupool_last_error must be its own
// call's, not cleared or replaced by another thread's call in between (and not read while another
// thread writes it). `serial` tells a connection from a later one at the same address.
struct LastError {
  const cupool_conn* conn = nullptr;
  std::uint64_t serial = 0;
  std::string message;
};
thread_local LastError t_last_error;

}  // namespace

namespace {

template <class F>
int guarded_locked(cupool_conn* conn, F&& body) {
  conn->last_error.clear();
  try {
    body();
    return CUPOOL_OK;
  } catch (const Failure& f) {
    conn->last_error = f.message;
    if (f.status == CUPOOL_E_UNREACHABLE && conn->lost) conn->told_lost = true;
    return f.status;
  } catch (const cupool::Error& e) {
    conn->last_error = e.what();
    if (e.c_status() == CUPOOL_E_UNREACHABLE && conn->lost) conn->told_lost = true;
    return e.c_status();
  } catch (const std::bad_alloc&) {
    conn->last_error = "out of host memory";
    return CUPOOL_E_INTERNAL;
  } catch (const std::exception& e) {
    conn->last_error = e.what();
    return CUPOOL_E_INTERNAL;
  }
}

// Serialises calls on a connection and keeps the call's message for this thread.
template <class F>
int guarded(cupool_conn* conn, F&& body) {
  if (!conn) return CUPOOL_E_INVALID;
  std::lock_guard<std::mutex> lock(conn->mu);
  const int status = guarded_locked(conn, body);
  t_last_error.conn = conn;
  t_last_error.serial = conn->serial;
  t_last_error.message = conn->last_error;
  return status;
}

// guarded() for a call that talks to the holder: on a connection the holder closed (it stopped or
// restarted; the call that saw it failed with CUPOOL_E_UNREACHABLE), connects again first. What
// was mapped stays mapped; the old connection's leases are released here only.
template <class F>
int guarded_session(cupool_conn* conn, F&& body) {
  if (!conn) return CUPOOL_E_INVALID;
  const auto again = [conn] { return conn->lost.load() && conn->told_lost.load(); };
  if (again()) {
    // The watcher ends on its own once it sees the socket gone; it is joined without `mu` held.
    std::lock_guard<std::mutex> once(conn->reconnect_mu);
    bool stop = false;
    {
      std::lock_guard<std::mutex> lock(conn->mu);
      stop = again() && conn->watcher_here();
    }
    if (stop) conn->stop_watcher();
  }
  return guarded(conn, [&] {
    if (again()) conn->reconnect();
    body();
  });
}

}  // namespace

extern "C" {

int cupool_connect(const char* socket_path, const char* client_name, cupool_conn** out) {
  if (!out) return CUPOOL_E_INVALID;
  *out = nullptr;
  cupool::client::no_connection_error().clear();
  std::string path = socket_path && *socket_path ? socket_path : "";
  if (path.empty()) {
    const char* env = std::getenv("CUPOOL_SOCKET");
    path = env && *env ? env : cupool::kDefaultSocket;
  }
  try {
    auto conn = std::make_unique<cupool_conn>();
    conn->path = path;
    // The holder takes at most 64 bytes: cut at a character boundary, not inside one.
    if (client_name) conn->client_name = cupool::utf8_prefix(client_name, 64);
    conn->open();
    // CUPOOL_CLIENT_CACHE=0 turns the cache off (every release goes back to the holder).
    if (const char* env = std::getenv("CUPOOL_CLIENT_CACHE"); env && std::string(env) == "0") conn->cache_limit = 0;
    *out = conn.release();
    return CUPOOL_OK;
  } catch (const Failure& f) {
    cupool::client::no_connection_error() = f.message;
    return f.status;
  } catch (const std::exception& e) {
    cupool::client::no_connection_error() = e.what();
    return CUPOOL_E_INTERNAL;
  }
}

void cupool_disconnect(cupool_conn* conn) {
  if (!conn) return;
  conn->stop_watcher();
  {
    std::lock_guard<std::mutex> lock(conn->mu);
    // Unmap everything here first (cached leases too); closing the socket then makes the holder
    // free its side.
    auto unmap = [conn](cupool_lease* lease) {
      try {
        if (conn->importer) conn->unmap(*lease);
      } catch (...) {
      }
      delete lease;
    };
    for (cupool_lease* lease : conn->cache) unmap(lease);
    for (cupool_lease* lease : conn->leases) unmap(lease);
    conn->cache.clear();
    conn->cached_bytes = 0;
    conn->leases.clear();
    for (auto& [key, imp] : conn->pools) {
      try {
        if (conn->importer) conn->importer->destroy_pool(imp.handle);
      } catch (...) {
      }
    }
    conn->pools.clear();
    for (cupool::PoolHandle handle : conn->retired) {
      try {
        if (conn->importer) conn->importer->destroy_pool(handle);
      } catch (...) {
      }
    }
    conn->retired.clear();
    conn->close_socket();
  }
  delete conn;
}

const char* cupool_last_error(const cupool_conn* conn) {
  if (!conn) return cupool::client::no_connection_error().c_str();
  // This thread's last call on `conn`; a thread that made none gets the connection's latest.
  if (t_last_error.conn != conn || t_last_error.serial != conn->serial) {
    std::lock_guard<std::mutex> lock(conn->mu);
    t_last_error.conn = conn;
    t_last_error.serial = conn->serial;
    t_last_error.message = conn->last_error;
  }
  return t_last_error.message.c_str();
}

const char* cupool_backend(const cupool_conn* conn) { return conn ? conn->backend_kind.c_str() : ""; }

int cupool_alloc(cupool_conn* conn, const char* pool, int device, uint64_t size, cupool_lease** out) {
  if (out) *out = nullptr;
  return guarded_session(conn, [&] {
    if (!pool || !out) throw Failure{CUPOOL_E_INVALID, "pool and out must not be NULL"};
    if (size == 0) throw Failure{CUPOOL_E_INVALID, "size must be at least 1 byte"};
    // Import the pool before asking for memory, so a refusal costs the holder nothing.
    // `device` is the holder's numbering (-1: the pool's first device).
    const cupool::HolderDevice on{device};
    cupool_conn::Imported& imp = conn->import_pool(pool, on);
    std::unique_ptr<cupool_lease> lease;
    if (!conn->cache.empty()) {
      // A block of this size released here before, still mapped: no holder round trip.
      for (const auto& [key, i] : conn->pools)
        if (&i == &imp) lease = conn->reuse(pool, key.second, size);
    }
    if (!lease) lease = conn->alloc(pool, on, size);
    conn->leases.insert(lease.get());
    *out = lease.release();
  });
}

int cupool_open_buffer(cupool_conn* conn, const char* name, cupool_lease** out) {
  return cupool_open_buffer_part(conn, name, 0, out);
}

int cupool_open_buffer_part(cupool_conn* conn, const char* name, uint32_t part, cupool_lease** out) {
  return cupool_open_buffer_on(conn, name, part, -1, out);
}

int cupool_open_buffer_on(cupool_conn* conn, const char* name, uint32_t part, int device, cupool_lease** out) {
  if (out) *out = nullptr;
  return guarded_session(conn, [&] {
    if (!name || !out) throw Failure{CUPOOL_E_INVALID, "name and out must not be NULL"};
    if (device < -1) throw Failure{CUPOOL_E_INVALID, "device must be a device of this process, or -1"};
    // `device` is this process's numbering (-1: where the buffer is held).
    const std::optional<cupool::ProcessDevice> here =
        device < 0 ? std::nullopt : std::optional<cupool::ProcessDevice>(cupool::ProcessDevice{device});
    int received = -1;
    const Json body = conn->call(cupool::proto::to_json(cupool::proto::BufferOpen{name, part}), &received);
    cupool::Fd descriptor(received);
    auto lease = std::make_unique<cupool_lease>();
    lease->session = conn->session;
    lease->buffer = true;
    lease->name = name;
    try {
      const auto reply =
          cupool::client::read_typed("buffer_open reply", cupool::proto::buffer_open_reply_from_json, body);
      lease->pool = reply.pool;
      lease->holder_device = cupool::HolderDevice{reply.id.device};
      lease->size = reply.size_bytes;
      if (reply.exported)
        conn->map_exported(*lease, reply, descriptor.get(), here);
      else if (here && *here != conn->local_device(reply.id.uuid, lease->holder_device))
        throw Failure{CUPOOL_E_INVALID, "this holder (protocol " + std::to_string(conn->protocol) +
                                            ") holds buffers in pools: open them on their own device"};
      else
        conn->map(*lease, reply.export_data, reply.generation, reply.ready, reply.ready_event);
    } catch (...) {
      try {
        conn->call(cupool::proto::to_json(cupool::proto::BufferClose{name}));
      } catch (...) {
      }
      throw;
    }
    conn->leases.insert(lease.get());
    *out = lease.release();
  });
}

int cupool_release(cupool_conn* conn, cupool_lease* lease) {
  if (!lease) return CUPOOL_OK;
  return guarded(conn, [&] {
    if (!conn->leases.count(lease)) throw Failure{CUPOOL_E_INVALID, "the lease does not belong to this connection"};
    conn->release(lease);
  });
}

int cupool_set_cache_limit(cupool_conn* conn, uint64_t bytes) {
  return guarded(conn, [&] {
    conn->cache_limit = bytes;
    conn->shrink_cache(bytes);
  });
}

uint64_t cupool_cached_bytes(const cupool_conn* conn) {
  if (!conn) return 0;
  std::lock_guard<std::mutex> lock(conn->mu);
  return conn->cached_bytes;
}

uint64_t cupool_lease_address(const cupool_lease* lease) { return lease ? lease->address : 0; }
uint64_t cupool_lease_size(const cupool_lease* lease) { return lease ? lease->size : 0; }
uint64_t cupool_lease_id(const cupool_lease* lease) { return lease ? lease->id : 0; }
int cupool_lease_device(const cupool_lease* lease) { return lease ? lease->local_device.ordinal : -1; }

int cupool_write(cupool_conn* conn, const cupool_lease* lease, uint64_t offset, const void* source, uint64_t bytes) {
  return guarded(conn, [&] {
    if (!lease || (!source && bytes)) throw Failure{CUPOOL_E_INVALID, "lease and source must not be NULL"};
    if (offset > lease->size || bytes > lease->size - offset)
      throw Failure{CUPOOL_E_INVALID, "the range is outside the lease (" + std::to_string(lease->size) + " bytes)"};
    if (bytes) conn->backend().write(lease->local_device.ordinal, lease->address + offset, source, bytes);
  });
}

int cupool_read(cupool_conn* conn, const cupool_lease* lease, uint64_t offset, void* target, uint64_t bytes) {
  return guarded(conn, [&] {
    if (!lease || (!target && bytes)) throw Failure{CUPOOL_E_INVALID, "lease and target must not be NULL"};
    if (offset > lease->size || bytes > lease->size - offset)
      throw Failure{CUPOOL_E_INVALID, "the range is outside the lease (" + std::to_string(lease->size) + " bytes)"};
    if (bytes) conn->backend().read(lease->local_device.ordinal, lease->address + offset, target, bytes);
  });
}

// These structs cross the stable ABI (client.h): a field added to one would break every program
// built against an older header, so what a load says or asks beyond them comes in new structs and
// functions (cupool_load_path, cupool_load_file_gds).
static_assert(sizeof(cupool_load_options) == 8 && sizeof(cupool_load_report) == 48 && sizeof(cupool_file_range) == 24,
              "the layout of ABI version 1");

int cupool_load_file(cupool_conn* conn, const cupool_lease* lease, int fd, const cupool_file_range* ranges,
                     size_t count, cupool_progress_fn progress, void* arg) {
  return cupool_load_file_with(conn, lease, fd, ranges, count, nullptr, nullptr, progress, arg);
}

int cupool_load_file_with(cupool_conn* conn, const cupool_lease* lease, int fd, const cupool_file_range* ranges,
                          size_t count, const cupool_load_options* options, cupool_load_report* report,
                          cupool_progress_fn progress, void* arg) {
  return cupool_load_file_gds(conn, lease, fd, ranges, count, options, CUPOOL_GDS_AUTO, report, nullptr, progress, arg);
}

int cupool_load_file_gds(cupool_conn* conn, const cupool_lease* lease, int fd, const cupool_file_range* ranges,
                         size_t count, const cupool_load_options* options, cupool_gds gds, cupool_load_report* report,
                         cupool_load_path* path, cupool_progress_fn progress, void* arg) {
  return guarded(conn, [&] {
    if (!lease || (!ranges && count)) throw Failure{CUPOOL_E_INVALID, "lease and ranges must not be NULL"};
    if (fd < 0) throw Failure{CUPOOL_E_INVALID, "fd must be an open file"};
    cupool::LoadOptions how;
    if (options) {
      if (options->threads > 64)
        throw Failure{CUPOOL_E_INVALID, "threads is " + std::to_string(options->threads) + "; at most 64"};
      how.threads = options->threads;
      switch (options->direct_io) {
        case CUPOOL_DIRECT_IO_AUTO: how.direct = cupool::DirectIo::automatic; break;
        case CUPOOL_DIRECT_IO_ALWAYS: how.direct = cupool::DirectIo::always; break;
        case CUPOOL_DIRECT_IO_NEVER: how.direct = cupool::DirectIo::never; break;
        default:
          throw Failure{CUPOOL_E_INVALID, "direct_io is " + std::to_string(static_cast<int>(options->direct_io)) +
                                              "; one of CUPOOL_DIRECT_IO_AUTO, _ALWAYS, _NEVER"};
      }
    }
    switch (gds) {
      case CUPOOL_GDS_AUTO: how.gds = cupool::Gds::automatic; break;
      case CUPOOL_GDS_ALWAYS: how.gds = cupool::Gds::always; break;
      case CUPOOL_GDS_NEVER: how.gds = cupool::Gds::never; break;
      default:
        throw Failure{CUPOOL_E_INVALID,
                      "gds is " + std::to_string(static_cast<int>(gds)) + "; one of CUPOOL_GDS_AUTO, _ALWAYS, _NEVER"};
    }
    std::vector<cupool::FileRange> copies;
    std::uint64_t total = 0;
    for (size_t i = 0; i < count; ++i) {
      const cupool_file_range& r = ranges[i];
      if (r.lease_offset > lease->size || r.bytes > lease->size - r.lease_offset)
        throw Failure{CUPOOL_E_INVALID, "range " + std::to_string(i) + " is outside the lease (" +
                                            std::to_string(lease->size) + " bytes)"};
      if (r.bytes) copies.push_back({r.file_offset, lease->address + r.lease_offset, r.bytes});
      total += r.bytes;
    }
    std::function<void(std::uint64_t)> told;
    if (progress) told = [&](std::uint64_t done) { progress(done, total, arg); };
    cupool::LoadReport done;
    try {
      done = conn->backend().load_file(lease->local_device.ordinal, fd, copies, how, told);
    } catch (const cupool::InputError& e) {
      throw Failure{CUPOOL_E_INVALID, e.what()};
    }
    if (report) {
      report->bytes = done.bytes;
      report->seconds = done.seconds;
      report->read_seconds = done.read_seconds;
      report->copy_wait_seconds = done.copy_wait_seconds;
      report->threads = done.threads;
      report->direct_io = done.direct_io ? 1 : 0;
      report->resident_fraction = done.resident_fraction;
    }
    if (path) {
      switch (done.method) {
        case cupool::ReadMethod::staged: path->read_method = CUPOOL_READ_STAGED; break;
        case cupool::ReadMethod::gpudirect: path->read_method = CUPOOL_READ_GPUDIRECT; break;
        case cupool::ReadMethod::gpudirect_compatibility:
          path->read_method = CUPOOL_READ_GPUDIRECT_COMPATIBILITY;
          break;
      }
      std::snprintf(path->gds_note, sizeof path->gds_note, "%s", done.gds_note.c_str());
    }
  });
}

int cupool_budget_claim(cupool_conn* conn, const char* grant) {
  return guarded_session(conn, [&] {
    if (!grant) throw Failure{CUPOOL_E_INVALID, "grant must not be NULL"};
    conn->call(cupool::proto::to_json(cupool::proto::BudgetClaim{grant}));
  });
}

int cupool_budget_report(cupool_conn* conn, const cupool_budget_use* uses, size_t count) {
  return guarded_session(conn, [&] {
    if (!uses || count == 0 || count > cupool::proto::kMaxBudgetDevices)
      throw Failure{CUPOOL_E_INVALID,
                    "uses must name 1 to " + std::to_string(cupool::proto::kMaxBudgetDevices) + " devices"};
    cupool::proto::BudgetUsage report;
    for (size_t i = 0; i < count; ++i)
      report.devices.push_back({std::string(uses[i].uuid, strnlen(uses[i].uuid, sizeof uses[i].uuid)),
                                uses[i].used_bytes, uses[i].peak_bytes});
    conn->call(cupool::proto::to_json(report));
  });
}

int cupool_request(cupool_conn* conn, const char* request_json, char** reply) {
  if (reply) *reply = nullptr;
  return guarded_session(conn, [&] {
    if (!request_json || !reply) throw Failure{CUPOOL_E_INVALID, "request and reply must not be NULL"};
    Json body = Json::parse(request_json, nullptr, false);
    if (body.is_discarded() || !body.is_object()) throw Failure{CUPOOL_E_INVALID, "the request is not a JSON object"};
    const std::string op = cupool::proto::request_head(body).op.value_or("");
    if (op == "hello" || op == "import_pool" || op == "alloc" || op == "free" || op == "buffer_open" ||
        op == "buffer_close")
      throw Failure{CUPOOL_E_INVALID,
                    "use cupool_connect, cupool_alloc, cupool_open_buffer or cupool_release for \"" + op + "\""};
    const std::string text = conn->request(body).dump(-1, ' ', false, Json::error_handler_t::replace);
    char* copy = static_cast<char*>(std::malloc(text.size() + 1));
    if (!copy) throw std::bad_alloc();
    std::memcpy(copy, text.c_str(), text.size() + 1);
    *reply = copy;
  });
}

}  // extern "C"
