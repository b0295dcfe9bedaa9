#include "client/connection.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "base/error.h"
#include "cupool/client.h"
#include "device/node.h"
#include "device/sim_backend.h"
#include "protocol/messages.h"
#include "protocol/protocol.h"

using cupool::client::EventUnusable;
using cupool::client::Failure;
using cupool::client::Json;
using cupool::client::read_typed;

namespace {

// The C status of an error code a holder sent (the table in core/base/error.cpp).
int status_of(const std::string& code) { return cupool::c_status_of_wire(code); }

// The Failure a reply whose "ok" is false stands for; nullopt for any other.
std::optional<Failure> refusal(const Json& reply) {
  if (auto e = cupool::proto::error_of_reply(reply)) return Failure{status_of(e->code), e->message};
  return std::nullopt;
}

}  // namespace

namespace cupool::client {

std::uint64_t next_serial() {
  static std::atomic<std::uint64_t> next{1};
  return next++;
}

}  // namespace cupool::client

cupool_conn::~cupool_conn() {
  stop_watcher();
  for (cupool_lease* lease : cache) delete lease;
}

// One request, its reply (notices in between are noted). Throws Failure on transport errors.
namespace {
// A connection the holder closed: it stopped, restarted or crashed. What this process mapped stays
// valid (held buffers outlive the holder); requests need a new connection.
Failure lost_connection(const std::string& detail) {
  return Failure{CUPOOL_E_UNREACHABLE,
                 "lost the connection to the holder (" + detail +
                     "): it stopped or restarted; buffers mapped on this connection stay valid, and the next "
                     "request connects again"};
}
}  // namespace

void cupool_conn::open() {
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) throw Failure{CUPOOL_E_INVALID, "socket path " + path + " is too long"};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  fd.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw Failure{CUPOOL_E_UNREACHABLE, std::string("socket: ") + std::strerror(errno)};
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    fd.reset();
    if (err == EACCES || err == EPERM)
      throw Failure{CUPOOL_E_REFUSED, "permission denied on " + path +
                                          ": this user may not open the holder's socket (see holder.mode and "
                                          "holder.group)"};
    throw Failure{CUPOOL_E_UNREACHABLE, "no holder is listening on " + path + " (" + std::strerror(err) +
                                            "); is 'cupool hold' running? Set --socket or CUPOOL_SOCKET for "
                                            "another path"};
  }
  cupool::proto::Hello hello{CUPOOL_PROTOCOL_VERSION, std::nullopt};
  if (!client_name.empty()) hello.client = client_name;
  Json reply = request(cupool::proto::to_json(hello));
  // An older holder: protocol 2 works (its buffers are pool allocations), and 1 without the cache.
  for (int older = CUPOOL_PROTOCOL_VERSION - 1; older >= 1; --older) {
    const auto error = cupool::proto::error_of_reply(reply);
    if (!error || error->code != "unsupported_protocol") break;
    hello.protocol = older;
    reply = request(cupool::proto::to_json(hello));
  }
  if (auto f = refusal(reply)) {
    close_socket();
    throw Failure{*f};
  }
  cupool::proto::HelloReply agreed;
  try {
    agreed = read_typed("hello reply", cupool::proto::hello_reply_from_json, reply);
  } catch (...) {
    close_socket();
    throw;
  }
  backend_kind = agreed.backend;
  protocol = agreed.protocol;
  session += 1;
  lost = false;
  told_lost = false;
}

void cupool_conn::reconnect() {
  // Cached blocks were the old holder's: unmapped here, nobody to tell.
  for (cupool_lease* lease : cache) {
    try {
      unmap(*lease);
    } catch (...) {
    }
    delete lease;
  }
  cache.clear();
  cached_bytes = 0;
  // Imports of the old holder's pools stay until disconnect (a lease may still map through one).
  for (auto& [key, imp] : pools) retired.push_back(imp.handle);
  pools.clear();
  holder_waits = true;
  draining = false;
  lost_fd.reset();
  open();
}

Json cupool_conn::request(Json body, int* fd_out) {
  if (!fd) throw lost_connection("closed before");
  const std::uint64_t id = next_id++;
  cupool::proto::address(body, id);
  // This library works in protocol 4's names; a holder that speaks 1 to 3 gets and sends the old.
  const std::string op = cupool::proto::request_head(body).op.value_or("");
  const bool old_names = protocol < cupool::proto::kNamedProtocol && op != "hello";
  if (old_names) cupool::proto::to_old_names(cupool::proto::Message::request, op, body);
  std::string frames;
  try {
    frames = cupool::proto::encode(cupool::proto::Kind::request, body);
  } catch (const cupool::Error& e) {
    throw Failure{CUPOOL_E_INVALID, e.what()};  // too long to send; the connection is fine
  }
  try {
    try {
      cupool::proto::send_all(fd.get(), frames);
    } catch (const std::system_error& e) {
      // The holder may have refused this connection (a limit) and closed it before reading what
      // we sent: its reason was sent first and is waiting here. Say that, not "unreachable".
      if (auto reason = closing_reason()) throw Failure{*reason};
      throw;
    }
    while (true) {
      int received = -1;
      auto [header, reply] = cupool::proto::receive_frame(fd.get(), received);
      cupool::Fd got(received);  // a descriptor that came with the frame
      if (header.kind == cupool::proto::Kind::notice) {
        on_notice(reply);
        continue;
      }
      const Json rid = cupool::proto::id_of(reply);
      const std::uint64_t of = rid.is_number_unsigned() ? rid.get<std::uint64_t>() : 0;
      if (rid.is_number_unsigned() && of != id && of < next_id &&
          (of < id || cupool::proto::ok_of(reply) == std::optional<bool>(false))) {
        // A quiet request of ours that failed (a quiet request is answered only then): one sent
        // before this request, or while it waited (a `dropped` answer).
        if (auto f = refusal(reply)) quiet_failure = f->message;
        continue;
      }
      if (!rid.is_number_unsigned() || of != id) {
        // A reply without our id is the holder telling us why it is closing the connection.
        if (auto f = refusal(reply)) throw Failure{*f};
        throw Failure{CUPOOL_E_PROTOCOL, "the holder answered a different request"};
      }
      if (fd_out) *fd_out = got.release();
      if (old_names) cupool::proto::to_new_names(cupool::proto::Message::reply, op, reply);
      return reply;
    }
  } catch (const cupool::Error& e) {
    // The frame layer: bad_frame, or unreachable when the holder closed the connection.
    close_socket();
    if (e.code() == cupool::Errc::unreachable) throw lost_connection(e.what());
    throw Failure{e.c_status(), e.what()};
  } catch (const std::system_error& e) {
    close_socket();
    throw lost_connection(e.what());
  }
}

void cupool_conn::retire(const std::pair<std::string, cupool::HolderDevice>& key) {
  auto it = pools.find(key);
  if (it == pools.end()) return;
  const cupool::PoolHandle handle = it->second.handle;
  pools.erase(it);
  for (cupool_lease* lease : leases)
    if (lease->imported == handle) {
      retired.push_back(handle);
      return;
    }
  try {
    backend().destroy_pool(handle);
  } catch (...) {
    // The import is gone from our books either way; the driver keeps what it can't release.
  }
}

// The error a holder sent before it closed the connection, if one is waiting to be read.
std::optional<Failure> cupool_conn::closing_reason() {
  try {
    int received = -1;
    auto [header, reply] = cupool::proto::receive_frame(fd.get(), received);
    const cupool::Fd got(received);  // nothing is expected with it: closed here
    if (header.kind == cupool::proto::Kind::reply)
      if (auto f = refusal(reply)) {
        close_socket();
        return f;
      }
  } catch (const std::exception&) {
    // Nothing was waiting, or it was not a frame: the connection is just gone.
  }
  return std::nullopt;
}

// A request whose reply must be ok; a holder error becomes a Failure.
Json cupool_conn::call(Json body, int* fd_out) {
  Json reply = request(std::move(body), fd_out);
  if (auto f = refusal(reply)) throw Failure{*f};
  if (!cupool::proto::reply_ok(reply))
    throw Failure{CUPOOL_E_PROTOCOL, "the holder's reply says neither ok nor an error"};
  return reply;
}

void cupool_conn::close_socket() {
  if (!fd) return;
  lost = true;
  if (watcher_here()) {
    // The watcher polls this descriptor: shut it down (the watcher wakes and ends), close it later,
    // so its number is not reused under the watcher.
    ::shutdown(fd.get(), SHUT_RDWR);
    lost_fd = std::move(fd);
  } else {
    fd.reset();
  }
}

namespace {

// The backend that imports for a holder of `kind`: a simulated node's memory is a memfd and needs
// no node description (the rest of its facts, its GPUDirect Storage for loads, come from the
// profile that CUPOOL_PROFILE names, where the caller names one); a real one's is the driver's.
std::unique_ptr<cupool::Backend> make_importer(const std::string& kind) {
  if (kind == "simulated") {
    const char* profile = std::getenv("CUPOOL_PROFILE");
    return std::make_unique<cupool::SimBackend>(profile && *profile ? cupool::load_profile(profile)
                                                                    : cupool::NodeReport{});
  }
  auto driver = cupool::make_cuda_backend();
  driver->init();
  return driver;
}

// This process's ordinal of the device with `uuid`; -1 when it does not see it.
int ordinal_of(cupool::Backend& b, const std::string& uuid) {
  for (int i = 0; i < b.device_count(); ++i)
    if (b.device_info(i).uuid == uuid) return i;
  return -1;
}

}  // namespace

cupool::Backend& cupool_conn::backend() {
  if (!importer) importer = make_importer(backend_kind);
  return *importer;
}

// This process's ordinal of the device with `uuid` (the holder's ordinal on a simulated node).
cupool::ProcessDevice cupool_conn::local_device(const std::string& uuid, cupool::HolderDevice holder_device) {
  // A simulated node's "devices" are the holder's own numbering: the memory is a memfd.
  if (backend_kind == "simulated") return cupool::ProcessDevice{holder_device.index};
  if (const int i = ordinal_of(backend(), uuid); i >= 0) return cupool::ProcessDevice{i};
  throw Failure{CUPOOL_E_NOT_FOUND, "device " + uuid + " (the holder's device " + std::to_string(holder_device.index) +
                                        ") is not visible in this process; check CUDA_VISIBLE_DEVICES"};
}

cupool_conn::Imported& cupool_conn::import_pool(const std::string& pool, cupool::HolderDevice device) {
  for (auto& [key, imp] : pools)
    if (key.first == pool && (device.index < 0 || key.second == device)) return imp;
  int fd_in = -1;
  const Json body = call(cupool::proto::to_json(cupool::proto::ImportPool{pool, device.index}), &fd_in);
  const cupool::Fd closer(fd_in);
  if (fd_in < 0) throw Failure{CUPOOL_E_PROTOCOL, "the holder's import_pool reply carried no file descriptor"};
  const auto reply = read_typed("import_pool reply", cupool::proto::import_pool_reply_from_json, body);
  const cupool::HolderDevice holder_device{reply.id.device};
  Imported imp;
  imp.local_device = local_device(reply.id.uuid, holder_device);
  imp.handle = backend().import_pool_fd(imp.local_device.ordinal, fd_in);
  imp.generation = reply.generation;
  Imported& kept = pools[{reply.pool, holder_device}] = imp;
  // An imported pool is reachable only from its own device until this process gives access:
  // give the peers the config names, where this process can see them.
  if (backend_kind != "simulated")
    for (const cupool::model::DeviceId& peer : reply.access) {
      cupool::Backend& b = backend();
      for (int i = 0; i < b.device_count(); ++i)
        if (i != kept.local_device.ordinal && b.device_info(i).uuid == peer.uuid) b.set_pool_access(kept.handle, i);
    }
  return kept;
}

// Imports an allocation and waits until it is ready.
void cupool_conn::map(cupool_lease& lease, const cupool::proto::Bytes64& export_data,
                      std::optional<std::uint64_t> in_generation, bool ready,
                      const cupool::proto::Bytes64& ready_event) {
  Imported* found = &import_pool(lease.pool, lease.holder_device);
  // The memory is in the pool the holder holds now; an import of one it replaced would map
  // something else (the notice comes first; this holds even if it did not).
  const std::uint64_t generation = in_generation.value_or(found->generation);
  if (found->generation != generation) {
    retire({lease.pool, lease.holder_device});
    found = &import_pool(lease.pool, lease.holder_device);
    if (found->generation != generation)
      throw Failure{CUPOOL_E_PROTOCOL, "the holder's pool " + lease.pool + " changed while it was being imported"};
  }
  Imported& imp = *found;
  lease.local_device = imp.local_device;
  lease.imported = imp.handle;
  lease.address = backend().import_pointer(imp.handle, export_data);
  if (ready) return;  // the holder waited for it
  try {
    backend().wait_ready(imp.local_device.ordinal, ready_event);
  } catch (const cupool::CudaError& e) {
    backend().free_imported(imp.handle, lease.address);
    if (e.api() == "cuIpcOpenEventHandle") throw EventUnusable{e.what()};
    throw;
  } catch (...) {
    backend().free_imported(imp.handle, lease.address);
    throw;
  }
}

void cupool_conn::map_exported(cupool_lease& lease, const cupool::proto::BufferOpenReply& reply, int descriptor,
                               std::optional<cupool::ProcessDevice> device) {
  const std::uint64_t mapped = reply.mapped_size_bytes;
  if (descriptor < 0 || mapped < lease.size || mapped == 0)
    throw Failure{CUPOOL_E_PROTOCOL, "the holder sent a buffer without its descriptor or size"};
  const cupool::ProcessDevice home = local_device(reply.id.uuid, lease.holder_device);
  std::vector<int> peers;
  if (device && *device != home) {
    // Only where the pool's access lets a device use the buffer (the config's `access`).
    const std::string uuid = backend().device_info(device->ordinal).uuid;
    bool allowed = false;
    for (const cupool::model::DeviceId& a : reply.access) allowed = allowed || a.uuid == uuid;
    if (!allowed)
      throw Failure{CUPOOL_E_REFUSED, "buffer " + lease.name + " is held on " + reply.id.uuid + " and its pool " +
                                          lease.pool + " gives no access to " + uuid + " (this process's device " +
                                          std::to_string(device->ordinal) + "); add it to the pool's access: list"};
    peers.push_back(device->ordinal);
  }
  lease.exported = true;
  lease.address = backend().map_exported(home.ordinal, descriptor, mapped, peers);
  lease.local_device = peers.empty() ? home : *device;
}

void cupool_conn::unmap(const cupool_lease& lease) {
  if (lease.exported)
    backend().unmap_exported(lease.address);
  else
    backend().free_imported(lease.imported, lease.address);
}

// Allocates and maps a lease. The holder waits for the allocation before it answers (holder_waits);
// were the library ever to ask without, and the ready event could not be used here, it asks the
// holder to wait from then on, for this connection.
std::unique_ptr<cupool_lease> cupool_conn::alloc(const std::string& pool, cupool::HolderDevice device,
                                                 std::uint64_t size) {
  for (int attempt = 0;; ++attempt) {
    const Json body = call(cupool::proto::to_json(cupool::proto::Alloc{pool, device.index, size, holder_waits}));
    const auto reply = read_typed("alloc reply", cupool::proto::alloc_reply_from_json, body);
    auto lease = std::make_unique<cupool_lease>();
    lease->session = session;
    lease->id = reply.lease;
    lease->pool = reply.pool;
    lease->holder_device = cupool::HolderDevice{reply.id.device};
    lease->size = reply.size_bytes;
    const cupool::proto::Free give_back{lease->id, false};
    try {
      map(*lease, reply.export_data, reply.generation, reply.ready, reply.ready_event);
      return lease;
    } catch (const EventUnusable& e) {
      call(cupool::proto::to_json(give_back));
      if (attempt > 0) throw Failure{CUPOOL_E_CUDA, e.message};
      holder_waits = true;
    } catch (...) {
      try {
        call(cupool::proto::to_json(give_back));
      } catch (...) {
      }
      throw;
    }
  }
}

// Frees the mapping here, then tells the holder; with protocol 2, an allocation goes into the
// cache instead (still mapped, still charged to this connection) while it fits cache_limit.
void cupool_conn::release(cupool_lease* lease) {
  std::unique_ptr<cupool_lease> owned(lease);
  leases.erase(lease);
  if (protocol >= 2 && !lease->buffer && fd && lease->session == session && lease->size <= cache_limit) {
    try {
      shrink_cache(cache_limit - lease->size);
      tell(cupool::proto::to_json(cupool::proto::Free{lease->id, true}));
    } catch (...) {
      try {
        backend().free_imported(lease->imported, lease->address);
      } catch (...) {
      }
      throw;
    }
    cache.push_back(owned.release());
    cached_bytes += lease->size;
    start_watcher();
    return;
  }
  std::string unmap_error;
  try {
    unmap(*lease);
  } catch (const std::exception& e) {
    unmap_error = e.what();
  }
  if (fd && lease->session == session) {
    if (lease->buffer)
      call(cupool::proto::to_json(cupool::proto::BufferClose{lease->name}));
    else if (protocol >= 2)
      tell(
          cupool::proto::to_json(cupool::proto::Free{lease->id, false}));  // unmapped here already: nothing to wait for
    else
      call(cupool::proto::to_json(cupool::proto::Free{lease->id, false}));
  }
  if (!unmap_error.empty()) throw Failure{CUPOOL_E_CUDA, "unmapping the lease here failed: " + unmap_error};
}

// ---- protocol 2: quiet requests, notices, the cache and its watcher ----

void cupool_conn::tell(Json body) {
  if (!fd) throw lost_connection("closed before");
  cupool::proto::address(body, next_id++, /*quiet=*/true);
  if (protocol < cupool::proto::kNamedProtocol)
    cupool::proto::to_old_names(cupool::proto::Message::request, cupool::proto::request_head(body).op.value_or(""),
                                body);
  const std::string frames = cupool::proto::encode(cupool::proto::Kind::request, body);
  try {
    cupool::proto::send_all(fd.get(), frames);
  } catch (const std::system_error& e) {
    if (auto reason = closing_reason()) throw Failure{*reason};
    close_socket();
    throw lost_connection(e.what());
  }
}

void cupool_conn::on_notice(Json notice) {
  const std::string what = read_typed("notice", cupool::proto::notice_name, notice);
  if (protocol < cupool::proto::kNamedProtocol)
    cupool::proto::to_new_names(cupool::proto::Message::notice, what, notice);
  if (what == "draining") draining = true;
  if (what == "pool_gone") {
    // A pool we imported was replaced or removed: our import maps the old pool's memory.
    const auto gone = read_typed("pool_gone notice", cupool::proto::pool_gone_from_json, notice);
    const std::pair<std::string, cupool::HolderDevice> key{gone.pool, cupool::HolderDevice{gone.id.device}};
    auto imp = pools.find(key);
    if (imp != pools.end() && imp->second.generation == gone.generation.value_or(imp->second.generation)) retire(key);
  }
  if (what == "drop") {
    // The holder wants cached blocks back: unmap those still cached here (one taken again since is
    // in use: the holder saw its reuse first), then say which.
    const auto drop = read_typed("drop notice", cupool::proto::drop_from_json, notice);
    const std::set<std::uint64_t> wanted(drop.leases.begin(), drop.leases.end());
    cupool::proto::Dropped dropped{drop.ask, {}};
    for (auto it = cache.begin(); it != cache.end();) {
      cupool_lease* lease = *it;
      if (!wanted.count(lease->id)) {
        ++it;
        continue;
      }
      try {
        backend().free_imported(lease->imported, lease->address);
      } catch (...) {
        // Unmapped or not, this process will not use it again.
      }
      dropped.leases.push_back(lease->id);
      cached_bytes -= lease->size;
      delete lease;
      it = cache.erase(it);
    }
    tell(cupool::proto::to_json(dropped));
  }
}

std::unique_ptr<cupool_lease> cupool_conn::reuse(const std::string& pool, cupool::HolderDevice device,
                                                 std::uint64_t size) {
  for (auto it = cache.rbegin(); it != cache.rend(); ++it) {
    cupool_lease* lease = *it;
    if (lease->pool != pool || lease->size != size || lease->holder_device != device) continue;
    auto imp = pools.find({lease->pool, lease->holder_device});
    if (imp == pools.end() || imp->second.handle != lease->imported) continue;  // its pool was replaced
    std::unique_ptr<cupool_lease> owned(lease);
    cache.erase(std::next(it).base());
    cached_bytes -= size;
    try {
      tell(cupool::proto::to_json(cupool::proto::Reuse{owned->id}));
    } catch (...) {
      // The holder can't be told: the block may be freed there; never hand it out.
      try {
        backend().free_imported(owned->imported, owned->address);
      } catch (...) {
      }
      throw;
    }
    return owned;
  }
  return nullptr;
}

void cupool_conn::shrink_cache(std::uint64_t keep) {
  while (cached_bytes > keep && !cache.empty()) {
    std::unique_ptr<cupool_lease> lease(cache.front());
    cache.erase(cache.begin());
    cached_bytes -= lease->size;
    try {
      backend().free_imported(lease->imported, lease->address);
    } catch (...) {
    }
    if (fd) tell(cupool::proto::to_json(cupool::proto::Free{lease->id, false}));
  }
}

void cupool_conn::read_waiting_frame() {
  if (!fd) return;
  pollfd p{fd.get(), POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return;  // a call read it first
  try {
    int received = -1;
    auto [header, body] = cupool::proto::receive_frame(fd.get(), received);
    const cupool::Fd got(received);  // nothing is expected with it: closed here
    if (header.kind == cupool::proto::Kind::notice) {
      on_notice(body);
    } else if (auto f = refusal(body)) {
      // A quiet request that failed, or the holder saying why it closes the connection.
      quiet_failure = f->message;
      if (cupool::proto::id_of(body).is_null()) close_socket();
    }
  } catch (...) {
    close_socket();  // the holder is gone (or closed this connection): calls will say so
  }
}

bool cupool_conn::watcher_here() const { return watching && ::getpid() == watcher_pid; }

void* cupool_conn::watch(void* self) {
  cupool_conn* conn = static_cast<cupool_conn*>(self);
  pollfd fds[2] = {{conn->watched_fd, POLLIN, 0}, {conn->watcher_wake.get(), POLLIN, 0}};
  while (true) {
    fds[0].revents = fds[1].revents = 0;
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return nullptr;
    if (fds[1].revents) return nullptr;
    std::lock_guard<std::mutex> lock(conn->mu);
    if (!conn->fd) return nullptr;
    conn->read_waiting_frame();
  }
}

void cupool_conn::start_watcher() {
  if (watching || !fd) return;
  watcher_wake.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!watcher_wake) return;  // no watcher: drop notices are answered at the next call
  watched_fd = fd.get();
  // Signals are for the application's threads: the watcher starts with all of them blocked.
  sigset_t all, before;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &before);
  const int rc = ::pthread_create(&watcher, nullptr, &cupool_conn::watch, this);
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  if (rc != 0) {
    watcher_wake.reset();
    return;
  }
  watching = true;
  watcher_pid = ::getpid();
}

void cupool_conn::stop_watcher() {
  if (!watching) return;
  watching = false;
  // In a forked child the thread is the parent's: the eventfd is shared, so it is not written.
  if (::getpid() != watcher_pid) {
    watcher_wake.reset();  // this process's copy
    return;
  }
  const std::uint64_t one = 1;
  (void)!::write(watcher_wake.get(), &one, sizeof one);
  ::pthread_join(watcher, nullptr);
  watcher_wake.reset();
}
