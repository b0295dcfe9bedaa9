// The client C API (include/cupool/client.h) over the protocol (docs/protocol.md). No exception
// crosses the C boundary: every entry point catches and turns failures into a status and a
// message on the connection.
#include "cupool/client.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <system_error>

#include "base/error.h"
#include "device/backend.h"
#include "device/node.h"
#include "device/sim_backend.h"
#include "process/process.h"
#include "protocol/protocol.h"
#include "spec/config.h"
#include "spec/diagnostics.h"

using cupool::proto::Json;

namespace {

thread_local std::string g_connect_error;

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
std::atomic<std::uint64_t> g_next_serial{1};

// A failure with its C status.
struct Failure {
  int status;
  std::string message;
};

// The holder's ready event can't be opened in this process (measured: cuIpcOpenEventHandle
// answers CUDA_ERROR_MAP_FAILED when the client runs as another user than the holder).
struct EventUnusable {
  std::string message;
};

// The C status of an error code a holder sent (the table in lib/base/error.cpp).
int status_of(const std::string& code) { return cupool::c_status_of_wire(code); }

}  // namespace

struct cupool_lease {
  std::uint64_t id = 0;  // holder lease id; 0 for a buffer
  bool buffer = false;
  std::string name;      // buffer name
  std::string pool;
  int holder_device = 0;
  int local_device = 0;
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  cupool::PoolHandle imported = 0;
};

struct cupool_conn {
  int fd = -1;
  mutable std::mutex mu;
  const std::uint64_t serial = g_next_serial++;
  std::string last_error;
  std::string backend_kind;
  std::uint64_t next_id = 1;
  bool draining = false;
  bool holder_waits = false;  // alloc with "synchronize": the ready event is unusable here
  std::unique_ptr<cupool::Backend> importer;
  struct Imported {
    cupool::PoolHandle handle = 0;
    int local_device = 0;
  };
  std::map<std::pair<std::string, int>, Imported> pools;  // by (pool, holder device)
  std::set<cupool_lease*> leases;

  ~cupool_conn() {
    if (fd >= 0) ::close(fd);
  }

  // One request, its reply (notices in between are noted). Throws Failure on transport errors.
  Json request(Json body, int* fd_out = nullptr) {
    if (fd < 0) throw Failure{CUPOOL_E_UNREACHABLE, "the connection to the holder is closed"};
    const std::uint64_t id = next_id++;
    body["id"] = id;
    try {
      cupool::proto::send_all(fd, cupool::proto::encode(cupool::proto::Kind::request, body));
      while (true) {
        int received = -1;
        auto [header, reply] = cupool::proto::receive_frame(fd, received);
        if (header.kind == cupool::proto::Kind::notice) {
          if (received >= 0) ::close(received);
          if (reply.value("notice", "") == "draining") draining = true;
          continue;
        }
        const auto rid = reply.find("id");
        if (rid == reply.end() || !rid->is_number_unsigned() || rid->get<std::uint64_t>() != id) {
          if (received >= 0) ::close(received);
          // A reply without our id is the holder telling us why it is closing the connection.
          if (reply.value("ok", true) == false && reply.contains("error")) {
            const Json& e = reply["error"];
            throw Failure{status_of(e.value("code", "")), e.value("message", "the holder refused the request")};
          }
          throw Failure{CUPOOL_E_PROTOCOL, "the holder answered a different request"};
        }
        if (fd_out) *fd_out = received;
        else if (received >= 0) ::close(received);
        return reply;
      }
    } catch (const cupool::Error& e) {
      // The frame layer: bad_frame, or unreachable when the holder closed the connection.
      close_socket();
      throw Failure{e.c_status(), e.what()};
    } catch (const std::system_error& e) {
      close_socket();
      throw Failure{CUPOOL_E_UNREACHABLE, std::string("lost the connection to the holder: ") + e.what()};
    }
  }

  // A request whose reply must be ok; a holder error becomes a Failure.
  Json call(Json body, int* fd_out = nullptr) {
    Json reply = request(std::move(body), fd_out);
    if (!reply.value("ok", false)) {
      const Json e = reply.value("error", Json::object());
      throw Failure{status_of(e.value("code", "")), e.value("message", "the holder refused the request")};
    }
    return reply;
  }

  void close_socket() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  cupool::Backend& backend() {
    if (!importer) {
      if (backend_kind == "simulated") {
        // Importing needs no node description: the simulated pool's memory is the memfd.
        importer = std::make_unique<cupool::SimBackend>(cupool::NodeReport{});
      } else {
        importer = cupool::make_cuda_backend();
        importer->init();
      }
    }
    return *importer;
  }

  // This process's ordinal of the device with `uuid` (the holder's ordinal on a simulated node).
  int local_device(const std::string& uuid, int holder_device) {
    if (backend_kind == "simulated") return holder_device;
    cupool::Backend& b = backend();
    for (int i = 0; i < b.device_count(); ++i)
      if (b.device_info(i).uuid == uuid) return i;
    throw Failure{CUPOOL_E_NOT_FOUND, "device " + uuid + " (the holder's device " + std::to_string(holder_device) +
                                          ") is not visible in this process; check CUDA_VISIBLE_DEVICES"};
  }

  Imported& import_pool(const std::string& pool, int device) {
    for (auto& [key, imp] : pools)
      if (key.first == pool && (device < 0 || key.second == device)) return imp;
    int fd_in = -1;
    Json reply = call({{"op", "import_pool"}, {"pool", pool}, {"device", device}}, &fd_in);
    if (fd_in < 0) throw Failure{CUPOOL_E_PROTOCOL, "the holder's import_pool reply carried no file descriptor"};
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd_in};
    const int holder_device = reply.value("device", 0);
    Imported imp;
    imp.local_device = local_device(reply.value("uuid", ""), holder_device);
    imp.handle = backend().import_pool_fd(imp.local_device, fd_in);
    Imported& kept = pools[{reply.value("pool", pool), holder_device}] = imp;
    // An imported pool is reachable only from its own device until this process gives access:
    // give the peers the config names, where this process can see them.
    if (backend_kind != "simulated" && reply.contains("access") && reply["access"].is_array())
      for (const Json& peer : reply["access"]) {
        const std::string uuid = peer.value("uuid", "");
        cupool::Backend& b = backend();
        for (int i = 0; i < b.device_count(); ++i)
          if (i != kept.local_device && b.device_info(i).uuid == uuid) b.set_pool_access(kept.handle, i);
      }
    return kept;
  }

  // Imports an allocation and waits until it is ready.
  void map(cupool_lease& lease, const Json& reply) {
    const auto data = cupool::proto::from_hex(reply.value("export_data", ""));
    const auto event = cupool::proto::from_hex(reply.value("ready_event", ""));
    if (!data || !event) throw Failure{CUPOOL_E_PROTOCOL, "the holder sent malformed export data"};
    Imported& imp = import_pool(lease.pool, lease.holder_device);
    lease.local_device = imp.local_device;
    lease.imported = imp.handle;
    lease.address = backend().import_pointer(imp.handle, *data);
    if (reply.value("ready", false)) return;  // the holder waited for it
    try {
      backend().wait_ready(imp.local_device, *event);
    } catch (const cupool::CudaError& e) {
      backend().free_imported(imp.handle, lease.address);
      if (e.api() == "cuIpcOpenEventHandle") throw EventUnusable{e.what()};
      throw;
    } catch (...) {
      backend().free_imported(imp.handle, lease.address);
      throw;
    }
  }

  // Allocates and maps a lease; when the ready event can't be used here, asks the holder to
  // wait for its allocations instead (from then on, for this connection).
  std::unique_ptr<cupool_lease> alloc(const std::string& pool, int device, std::uint64_t size) {
    for (int attempt = 0;; ++attempt) {
      Json reply = call({{"op", "alloc"}, {"pool", pool}, {"device", device}, {"size", size}, {"synchronize", holder_waits}});
      auto lease = std::make_unique<cupool_lease>();
      lease->id = reply.value("lease", std::uint64_t{0});
      lease->pool = reply.value("pool", pool);
      lease->holder_device = reply.value("device", 0);
      lease->size = reply.value("size", size);
      try {
        map(*lease, reply);
        return lease;
      } catch (const EventUnusable& e) {
        call({{"op", "free"}, {"lease", lease->id}});
        if (attempt > 0) throw Failure{CUPOOL_E_CUDA, e.message};
        holder_waits = true;
      } catch (...) {
        try {
          call({{"op", "free"}, {"lease", lease->id}});
        } catch (...) {
        }
        throw;
      }
    }
  }

  // Frees the mapping here, then tells the holder.
  void release(cupool_lease* lease) {
    std::unique_ptr<cupool_lease> owned(lease);
    leases.erase(lease);
    std::string unmap_error;
    try {
      backend().free_imported(lease->imported, lease->address);
    } catch (const std::exception& e) {
      unmap_error = e.what();
    }
    if (fd >= 0) {
      if (lease->buffer) call({{"op", "buffer_close"}, {"name", lease->name}});
      else call({{"op", "free"}, {"lease", lease->id}});
    }
    if (!unmap_error.empty()) throw Failure{CUPOOL_E_CUDA, "unmapping the lease here failed: " + unmap_error};
  }
};

namespace {

template <class F>
int guarded_locked(cupool_conn* conn, F&& body) {
  conn->last_error.clear();
  try {
    body();
    return CUPOOL_OK;
  } catch (const Failure& f) {
    conn->last_error = f.message;
    return f.status;
  } catch (const cupool::Error& e) {
    conn->last_error = e.what();
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

}  // namespace

extern "C" {

int cupool_abi_version(void) { return CUPOOL_CLIENT_ABI_VERSION; }

const char* cupool_status_name(int status) {
  switch (status) {
    case CUPOOL_OK: return "CUPOOL_OK";
    case CUPOOL_E_UNREACHABLE: return "CUPOOL_E_UNREACHABLE";
    case CUPOOL_E_REFUSED: return "CUPOOL_E_REFUSED";
    case CUPOOL_E_NOT_FOUND: return "CUPOOL_E_NOT_FOUND";
    case CUPOOL_E_QUOTA: return "CUPOOL_E_QUOTA";
    case CUPOOL_E_OUT_OF_MEMORY: return "CUPOOL_E_OUT_OF_MEMORY";
    case CUPOOL_E_INVALID: return "CUPOOL_E_INVALID";
    case CUPOOL_E_PROTOCOL: return "CUPOOL_E_PROTOCOL";
    case CUPOOL_E_CUDA: return "CUPOOL_E_CUDA";
    case CUPOOL_E_BUSY: return "CUPOOL_E_BUSY";
    case CUPOOL_E_EXISTS: return "CUPOOL_E_EXISTS";
    case CUPOOL_E_INTERNAL: return "CUPOOL_E_INTERNAL";
    default: return "CUPOOL_E_UNKNOWN";
  }
}

int cupool_connect(const char* socket_path, const char* client_name, cupool_conn** out) {
  if (!out) return CUPOOL_E_INVALID;
  *out = nullptr;
  g_connect_error.clear();
  std::string path = socket_path && *socket_path ? socket_path : "";
  if (path.empty()) {
    const char* env = std::getenv("CUPOOL_SOCKET");
    path = env && *env ? env : cupool::kDefaultSocket;
  }
  try {
    auto conn = std::make_unique<cupool_conn>();
    sockaddr_un addr{};
    if (path.size() >= sizeof addr.sun_path) {
      g_connect_error = "socket path " + path + " is too long";
      return CUPOOL_E_INVALID;
    }
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    conn->fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (conn->fd < 0) {
      g_connect_error = std::string("socket: ") + std::strerror(errno);
      return CUPOOL_E_UNREACHABLE;
    }
    if (::connect(conn->fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      const int err = errno;
      if (err == EACCES || err == EPERM) {
        g_connect_error = "permission denied on " + path + ": this user may not open the holder's socket (see holder.mode and holder.group)";
        return CUPOOL_E_REFUSED;
      }
      g_connect_error = "no holder is listening on " + path + " (" + std::strerror(err) +
                        "); is 'cupool hold' running? Set --socket or CUPOOL_SOCKET for another path";
      return CUPOOL_E_UNREACHABLE;
    }
    Json hello = {{"op", "hello"}, {"protocol", CUPOOL_PROTOCOL_VERSION}};
    if (client_name) hello["client"] = std::string(client_name).substr(0, 64);
    try {
      Json reply = conn->call(hello);
      conn->backend_kind = reply.value("backend", "cuda");
    } catch (const Failure& f) {
      g_connect_error = f.message;
      return f.status;
    }
    *out = conn.release();
    return CUPOOL_OK;
  } catch (const std::exception& e) {
    g_connect_error = e.what();
    return CUPOOL_E_INTERNAL;
  }
}

void cupool_disconnect(cupool_conn* conn) {
  if (!conn) return;
  {
    std::lock_guard<std::mutex> lock(conn->mu);
    // Unmap everything here first; closing the socket then makes the holder free its side.
    for (cupool_lease* lease : conn->leases) {
      try {
        if (conn->importer) conn->importer->free_imported(lease->imported, lease->address);
      } catch (...) {
      }
      delete lease;
    }
    conn->leases.clear();
    for (auto& [key, imp] : conn->pools) {
      try {
        if (conn->importer) conn->importer->destroy_pool(imp.handle);
      } catch (...) {
      }
    }
    conn->pools.clear();
    conn->close_socket();
  }
  delete conn;
}

const char* cupool_last_error(const cupool_conn* conn) {
  if (!conn) return g_connect_error.c_str();
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
  return guarded(conn, [&] {
    if (!pool || !out) throw Failure{CUPOOL_E_INVALID, "pool and out must not be NULL"};
    if (size == 0) throw Failure{CUPOOL_E_INVALID, "size must be at least 1 byte"};
    // Import the pool before asking for memory, so a refusal costs the holder nothing.
    conn->import_pool(pool, device);
    std::unique_ptr<cupool_lease> lease = conn->alloc(pool, device, size);
    conn->leases.insert(lease.get());
    *out = lease.release();
  });
}

int cupool_open_buffer(cupool_conn* conn, const char* name, cupool_lease** out) {
  if (out) *out = nullptr;
  return guarded(conn, [&] {
    if (!name || !out) throw Failure{CUPOOL_E_INVALID, "name and out must not be NULL"};
    Json reply = conn->call({{"op", "buffer_open"}, {"name", name}});
    auto lease = std::make_unique<cupool_lease>();
    lease->buffer = true;
    lease->name = name;
    lease->pool = reply.value("pool", "");
    lease->holder_device = reply.value("device", 0);
    lease->size = reply.value("size", std::uint64_t{0});
    try {
      conn->map(*lease, reply);
    } catch (...) {
      try {
        conn->call({{"op", "buffer_close"}, {"name", name}});
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

uint64_t cupool_lease_address(const cupool_lease* lease) { return lease ? lease->address : 0; }
uint64_t cupool_lease_size(const cupool_lease* lease) { return lease ? lease->size : 0; }
uint64_t cupool_lease_id(const cupool_lease* lease) { return lease ? lease->id : 0; }
int cupool_lease_device(const cupool_lease* lease) { return lease ? lease->local_device : -1; }

int cupool_write(cupool_conn* conn, const cupool_lease* lease, uint64_t offset, const void* source, uint64_t bytes) {
  return guarded(conn, [&] {
    if (!lease || (!source && bytes)) throw Failure{CUPOOL_E_INVALID, "lease and source must not be NULL"};
    if (offset > lease->size || bytes > lease->size - offset)
      throw Failure{CUPOOL_E_INVALID, "the range is outside the lease (" + std::to_string(lease->size) + " bytes)"};
    if (bytes) conn->backend().write(lease->local_device, lease->address + offset, source, bytes);
  });
}

int cupool_read(cupool_conn* conn, const cupool_lease* lease, uint64_t offset, void* target, uint64_t bytes) {
  return guarded(conn, [&] {
    if (!lease || (!target && bytes)) throw Failure{CUPOOL_E_INVALID, "lease and target must not be NULL"};
    if (offset > lease->size || bytes > lease->size - offset)
      throw Failure{CUPOOL_E_INVALID, "the range is outside the lease (" + std::to_string(lease->size) + " bytes)"};
    if (bytes) conn->backend().read(lease->local_device, lease->address + offset, target, bytes);
  });
}

int cupool_request(cupool_conn* conn, const char* request_json, char** reply) {
  if (reply) *reply = nullptr;
  return guarded(conn, [&] {
    if (!request_json || !reply) throw Failure{CUPOOL_E_INVALID, "request and reply must not be NULL"};
    Json body = Json::parse(request_json, nullptr, false);
    if (body.is_discarded() || !body.is_object()) throw Failure{CUPOOL_E_INVALID, "the request is not a JSON object"};
    const std::string op = body.value("op", "");
    if (op == "hello" || op == "import_pool" || op == "alloc" || op == "free" || op == "buffer_open" || op == "buffer_close")
      throw Failure{CUPOOL_E_INVALID, "use cupool_connect, cupool_alloc, cupool_open_buffer or cupool_release for \"" + op + "\""};
    const std::string text = conn->request(body).dump(-1, ' ', false, Json::error_handler_t::replace);
    char* copy = static_cast<char*>(std::malloc(text.size() + 1));
    if (!copy) throw std::bad_alloc();
    std::memcpy(copy, text.c_str(), text.size() + 1);
    *reply = copy;
  });
}

void cupool_free_string(char* text) { std::free(text); }

}  // extern "C"

namespace {

// The process's own backend for cupool_configure and cupool_stats, made once and never destroyed:
// an application's exit must not race a destructor that talks to the driver.
std::mutex g_process_mutex;
cupool::Backend* g_process_backend = nullptr;

cupool::Backend& process_backend() {
  if (!g_process_backend) {
    const char* profile = std::getenv("CUPOOL_PROFILE");
    std::unique_ptr<cupool::Backend> b;
    if (profile && *profile) b = std::make_unique<cupool::SimBackend>(cupool::load_profile(profile));
    else b = cupool::make_cuda_backend();
    b->init();
    g_process_backend = b.release();
  }
  return *g_process_backend;
}

char* copy_string(const std::string& text) {
  char* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (!copy) throw std::bad_alloc();
  std::memcpy(copy, text.c_str(), text.size() + 1);
  return copy;
}

// Runs `body` for the process-level calls: failures become a status and g_connect_error.
template <class F>
int process_guarded(F&& body) {
  std::lock_guard<std::mutex> lock(g_process_mutex);
  g_connect_error.clear();
  try {
    body();
    return CUPOOL_OK;
  } catch (const cupool::ConfigRejected& e) {
    g_connect_error = e.rendered() + e.what();
    return e.c_status();
  } catch (const cupool::Error& e) {
    g_connect_error = e.what();
    return e.c_status();
  } catch (const std::exception& e) {
    g_connect_error = e.what();
    return CUPOOL_E_INTERNAL;
  }
}

}  // namespace

extern "C" {

int cupool_configure(const char* path, char** report) {
  if (report) *report = nullptr;
  return process_guarded([&] {
    if (!path || !*path) throw cupool::InputError("cupool_configure: no config file given");
    const cupool::SourceFile file = cupool::SourceFile::read(path, cupool::kMaxConfigBytes);
    const cupool::ConfigureResult r = cupool::configure_process(process_backend(), file.text(), file.path());
    if (report) *report = copy_string(r.to_json().dump(-1, ' ', false, Json::error_handler_t::replace));
  });
}

int cupool_stats(char** json) {
  if (json) *json = nullptr;
  return process_guarded([&] {
    if (!json) throw cupool::InputError("cupool_stats: json must not be NULL");
    *json = copy_string(cupool::process_stats(process_backend()).dump(-1, ' ', false, Json::error_handler_t::replace));
  });
}

}  // extern "C"
