// The holder's state: the pools and buffers it keeps, the clients connected to it and their
// leases, and every protocol operation on them (docs/protocol.md). No sockets here: the server
// (server.h) moves frames, this class decides, so all of it is testable against a simulated node.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "base/fd.h"
#include "config/config.h"
#include "config/resolve.h"
#include "custody/custody.h"
#include "device/backend.h"
#include "device/node.h"
#include "holder/account_book.h"
#include "holder/client_table.h"
#include "holder/drop_asks.h"
#include "holder/lease_book.h"
#include "holder/reply.h"
#include "model/model.h"
#include "protocol/messages.h"
#include "protocol/protocol.h"
#include "tensors/safetensors.h"

namespace cupool {

namespace adoption {
class Allocations;  // adopt.cpp
}  // namespace adoption

using Json = nlohmann::ordered_json;

// One difference between what is held and what a config asks for.
// A value before or after a change: as the config writes it, and typed (null where absent).
struct ChangeValue {
  std::string text;
  Json value;
};

struct Change {
  std::string action;  // create, update, replace, remove
  std::string object;  // pool, buffer, holder
  std::string name;
  int device = -1;    // -1: not per device
  std::string field;  // for update and replace
  ChangeValue from;
  ChangeValue to;
  std::string blocked;  // why the change will not be made ("" when it will)
};

// Who may connect: the socket's mode and group, as the server's socket file sets them (a fake in
// tests). apply() goes through it, so an answer says "applied" only for what was made true.
class SocketPermissions {
 public:
  virtual ~SocketPermissions() = default;
  // Gives the socket `mode` and `group` ("": the holder's own group, as a new socket has) and
  // reads them back.
  // Throws cupool::Error saying what could not be done.
  virtual void set(unsigned mode, const std::string& group) = 0;
};

class Holder {
 public:
  using Limits = HolderLimits;

  // `self_uid`: the holder's user (admin along with root).
  Holder(Backend& backend, NodeReport node, std::uint32_t self_uid, Limits limits = {});
  Holder(const Holder&) = delete;
  Holder& operator=(const Holder&) = delete;
  // Frees what is still held, in order (leases, buffers, pools).
  ~Holder();
  // How plan and apply look up the users and groups a file names (tests give slow ones).
  void set_account_book(AccountBook book) { accounts_ = std::move(book); }

  // What apply(want) would change; nothing is touched.
  std::vector<Change> plan(const Desired& want) const;
  // Makes every change that is not blocked. Throws CudaError when the driver refuses one
  // (changes made before it stay made and are in the state). The second call with the same
  // `want` returns no changes and calls nothing on the backend.
  std::vector<Change> apply(const Desired& want);
  // apply() for a reload (SIGHUP): when cached blocks alone keep a pool from being replaced or
  // removed, asks for them first and applies once they are back (or their clients gone); `done`
  // gets the changes then. Returns whether it waits. Errors of a later apply are logged.
  bool apply_after_drops(const Desired& want, std::function<void(const std::vector<Change>&)> done);
  const HolderWant& holder_settings() const { return holder_; }
  // Takes the holder section as the current one (at start: the socket is made from it).
  void adopt_holder_settings(const HolderWant& h) { holder_ = h; }
  // The socket came from the command line (`hold --socket`), not the file: plan, apply and reload
  // then leave the file's holder.socket alone, as the start did.
  void keep_socket_from_command_line() { socket_from_command_line_ = true; }
  // The socket whose mode and group apply() changes. Without one (unit tests) apply records them.
  void attach_socket(SocketPermissions* socket) { socket_ = socket; }
  // Where notices to a client go (the server queues them on its connection): a pool it imported
  // was replaced or removed (docs/protocol.md, "Notices").
  void on_notice(std::function<void(std::uint64_t client, const Json& notice)> send) { notice_ = std::move(send); }
  // Where a deferred reply goes (a request that waited for clients to drop cached blocks): the
  // whole reply body, "id" and "ok" included. Queued by the server like a notice.
  void on_deferred(std::function<void(std::uint64_t client, const Json& reply)> send) { deferred_ = std::move(send); }
  // How long a client has to answer a `drop` notice before its connection is closed.
  void set_drop_timeout_ms(std::int64_t ms) { drops_.set_timeout_ms(ms); }
  // The connections that did not answer a `drop` notice in time (the server closes them, which
  // frees their leases); `now_ms` is the steady clock's.
  std::vector<std::uint64_t> overdue(std::int64_t now_ms) const;
  // The earliest deadline of an unanswered `drop` notice (steady clock, ms), if any.
  std::optional<std::int64_t> next_deadline() const;

  // ---- connections ----
  std::uint64_t connect(const Peer& peer);
  // Frees the client's leases (cached ones too) and closes its buffers; requests waiting on its
  // `drop` answers go on, and a request of its own that waited is forgotten.
  void disconnect(std::uint64_t client);
  std::size_t client_count() const { return clients_.size(); }
  // Root or the holder's user (false for a client it does not know).
  bool admin(std::uint64_t client) const;

  // Handles one request (the payload's JSON) from `client`. Returns the reply's fields (the
  // server adds "id" and "ok") and the descriptor that rides with it, or Reply::later() when the
  // request waits for clients to answer `drop` notices (docs/protocol.md, "Cached blocks"): its
  // reply comes through on_deferred. Throws cupool::Error with the document's error codes.
  // Custody is synced before it returns or throws.
  Reply handle(std::uint64_t client, const Json& request);

  // ---- for the server and the verbs ----
  void set_draining(bool draining) { draining_ = draining; }
  bool draining() const { return draining_; }
  // Describes the holder in `status` (pid, config path, socket, started, ...).
  void set_identity(model::HolderInfo identity) { identity_ = std::move(identity); }
  // What `cupool apply` put in place since the holder last read its file, forgotten (a reload
  // read the file again); none when nothing was applied.
  std::optional<model::AppliedConfig> forget_applied();
  model::Status status() const;
  model::PlanChange view(const Change& c) const;  // a change as plan/apply print it
  model::Stats stats(bool reset_peaks);
  model::Trim trim(std::uint64_t keep, const std::optional<std::string>& pool, bool graph);
  // The live state as a version 1 config (YAML text).
  std::string export_config() const;
  // Leases of all clients (cached ones included), and their bytes.
  std::size_t lease_count() const;
  std::uint64_t leased_bytes() const;
  // Leases that their clients released into their cache, and their bytes.
  std::size_t cached_count() const;
  std::uint64_t cached_bytes() const;
  // Frees everything (leases first, then buffers, then pools); the holder is empty afterwards.
  // Custody keeps what it holds: the next holder adopts it.
  void shutdown() noexcept;

  // ---- custody: held buffers outlive the holder (adopt.cpp) ----
  // Where the descriptors of exported buffers go as soon as they exist, with a manifest of them
  // (none: the buffers die with this process). `custody` outlives the holder's use of it.
  void attach_custody(custody::Custody* custody);
  // At start, before the first apply of `want`: adopts the buffers that custody kept (`kept`, what
  // it withdrew) as the newest manifest that opens describes them, each checked against the config
  // (its pool, a device pool on that device, is in `want`), the node (its device's UUID) and the
  // driver (its device, its size: each part mapped whole at the device's granularity, no
  // allocation under two names); refuses the rest and says why. Descriptors no manifest names, and
  // those of refused buffers, are removed from custody. Writes a manifest of what it adopted.
  // Returns the report `status` shows under custody.adopted.
  model::Adoption adopt(std::vector<custody::Kept> kept, const Desired& want);
  // `hold --fresh`: removes everything custody kept (`kept`) and closes it: the memory goes.
  // Returns how many descriptors were dropped.
  std::size_t forget_custody(std::vector<custody::Kept> kept);
  // A keeper that restarted (a container restarted by Kubernetes) keeps nothing: asks it what it
  // keeps and gives it again what is missing, then a new manifest; after a failure, tries again
  // what custody has not been given (systemd's store too). The server calls it about once a
  // second. Returns false when custody did not answer or took nothing (the server asks again
  // after 10 s).
  bool audit_custody() noexcept;
  // What custody may cost the serving thread: every sync, audit or removal gives custody at most
  // this long in all (kCustodyBudgetMs); after a failure, requests leave custody alone for
  // kCustodyRetryMs and the audit tries again. The start, which serves nobody yet, sets more.
  static constexpr int kCustodyBudgetMs = 500;
  static constexpr int kCustodyRetryMs = 10000;
  void set_custody_budget_ms(int ms) { custody_budget_ms_ = ms; }
  void set_custody_retry_ms(int ms) { custody_retry_ms_ = ms; }  // (tests)

 private:
  struct HeldPool {
    PoolWant want;
    PoolHandle handle = 0;
    std::uint64_t generation = 0;              // unique per pool the holder made: a replaced pool gets a new one
    std::uint64_t reserved_after_reserve = 0;  // reserved bytes read back after mapping `reserve`
  };
  struct HeldBuffer {
    BufferWant want;  // want.size: all parts together
    // One allocation per part: a buffer from a config has one; `cupool buffer load` makes a tensor
    // set of parts no larger than the driver imports (tensors/safetensors.h, kDefaultPartSize).
    struct Part {
      SharedAllocation allocation;  // an exported allocation's: the address only
      std::uint64_t size = 0;
      std::uint64_t mapped = 0;  // an exported allocation's size (a multiple of the granularity)
      Fd fd;                     // an exported allocation's descriptor
    };
    std::vector<Part> parts;
    bool shared = true;  // false in a pool without an IPC handle type (nobody can open it)
    // Held as exported allocations (Backend::create_exported; the buffers of device pools): what a
    // restart of the holder keeps. Otherwise allocations of its pool (host pools).
    bool exported = false;
    std::uint64_t opens = 0;
    std::uint64_t loading = 0;            // the client filling it (buffer_create with "loading"); 0 once ready
    std::optional<tensors::Index> index;  // the tensors it holds (`cupool buffer load`)
    std::uint32_t owner = 0;              // who made it (the holder's user for the config's)
    bool from_config = true;              // the config's buffers:, or a client's buffer_create
    bool adopted = false;                 // taken over from custody at this holder's start
  };
  using Client = HeldClient;
  using PoolKey = std::pair<std::string, int>;

  Client& client(std::uint64_t id);
  // disconnect() and apply() but for custody, which they sync.
  void forget_client(std::uint64_t id);
  std::vector<Change> make_changes(const Desired& want);
  HeldPool& pool_for(const Client& c, const std::string& name, int device, bool for_use);
  bool permitted(const Client& c, const HeldPool& p) const;
  void require_admin(const Client& c, const char* op) const;
  void require_not_draining(const char* op) const;
  std::string device_uuid(int device) const;
  model::DeviceId device_id(int device) const;      // ordinal, UUID and PCI bus id
  std::string device_pci_bus_id(int device) const;  // "0000:1b:00.0"

  // One request being served: its connection and its arguments.
  struct Request {
    std::uint64_t id;
    const Json& request_id;  // the request's "id", for a deferred reply
    Client& client;
    proto::Args& args;
    const std::string& op;
  };
  // A row of the request table (requests.cpp): an operation's name and the member that serves it.
  struct Operation {
    const char* name;
    Reply (Holder::*serve)(Request&);
  };
  static const std::vector<Operation>& operations();

  Reply op_hello(Request& r);
  Reply op_list(Request& r);
  Reply op_import_pool(Request& r);
  Reply op_alloc(Request& r);
  Reply op_free(Request& r);
  Reply op_reuse(Request& r);
  Reply op_dropped(Request& r);
  Reply op_buffer_open(Request& r);
  Reply op_buffer_close(Request& r);
  Reply op_status(Request& r);
  Reply op_stats(Request& r);
  Reply op_trim(Request& r);
  Reply op_plan(Request& r);
  Reply op_apply(Request& r);
  Reply op_export(Request& r);
  Reply op_buffer_create(Request& r);
  Reply op_buffer_remove(Request& r);
  Reply op_buffer_ready(Request& r);
  Reply op_buffer_tensors(Request& r);
  // The buffer `name` for client `id` to read: not_found, or busy while another client loads it.
  HeldBuffer& readable_buffer(std::uint64_t id, const std::string& name);
  Reply plan_or_apply(Request& r, bool apply);
  // handle() but for custody, which it syncs.
  Reply serve(std::uint64_t client, const Json& request);

  // Allocates for client `id` from `p` and records the lease (leases.cpp); returns its id and the
  // allocation. Throws limit_exceeded, quota_exceeded, out_of_memory or CudaError.
  std::pair<std::uint64_t, SharedAllocation> grant_lease(std::uint64_t id, Client& c, HeldPool& p, std::uint64_t size,
                                                         bool synchronize);

  void free_lease(std::uint64_t lease) noexcept;

  // ---- cached blocks (cache.cpp) ----
  // A lease released into its client's cache, and back in use (or freed): the pool's counts of
  // cached blocks, and the `drop` notice that asked for it (answered once all its leases are).
  void cache_lease(std::uint64_t id);
  void uncache_lease(std::uint64_t id) noexcept;
  // Sends `drop` notices (saying `reason`) for cached leases that `pick` selects, largest first,
  // until they add up to `bytes` (UINT64_MAX: all), counting leases a notice already asked for.
  // Returns the asks to wait for (empty: nothing cached to ask for).
  std::set<std::uint64_t> ask_drops(const std::function<bool(const Lease&)>& pick, std::uint64_t bytes,
                                    const char* reason);
  // Asks back the cached blocks that alone keep `want` from replacing or removing a pool.
  std::set<std::uint64_t> ask_drops_for(const Desired& want);
  // Makes the current request's reply wait for `asks`, then answers with `then()`; returns
  // Reply::later() for the handler to return.
  Reply defer(const Request& r, std::set<std::uint64_t> asks, std::function<Json()> then);
  // An ask was answered or its client left: requests that waited only on it are answered.
  void finish_ask(std::uint64_t ask);
  void run_ready_waiters();
  // The steps of plan(): the holder section, the buffers that go or change, each held pool, and a
  // pool name replaced on all its devices or none.
  void plan_holder(const Desired& want, std::vector<Change>& changes) const;
  void plan_buffers_out(const Desired& want, std::vector<Change>& changes) const;
  void plan_pool(const PoolKey& key, const HeldPool& h, const Desired& want, std::vector<Change>& changes) const;
  static void keep_pools_whole(std::vector<Change>& changes);
  std::string lease_note(const HeldPool& h) const;
  std::vector<std::string> buffers_in(const PoolKey& key, const Desired* keep) const;
  std::string blocked_reason(const PoolKey& key, const HeldPool& h, const Desired& want) const;
  void create_pool(const PoolWant& w);
  void update_pool(HeldPool& held, const PoolWant& w);
  void destroy_pool(const PoolKey& key);
  // Makes the buffer `w` from parts of `part_sizes` bytes (empty: one part of w.size); all or nothing.
  void create_buffer(const BufferWant& w, const std::vector<std::uint64_t>& part_sizes = {});
  void destroy_buffer(const std::string& name);
  // Bytes of exported allocations charged to a pool (its buffers').
  std::uint64_t buffer_bytes(const std::string& pool, int device) const;
  // Custody after a change: the parts of new exported buffers are deposited (deposit_parts marks
  // them; a buffer that replaces one of its name takes over its names), then a new manifest of the
  // ready ones, then what went away and is not held again is removed. Failures are logged and
  // shown in `status` (custody.error), and what is left waits for the audit (`retry`: the audit's
  // call, made even while requests leave custody alone); the buffers stay held. Called at the end
  // of each request, apply and disconnect, before the reply: a buffer made or replaced is in
  // custody when its client hears so (the manifest is rewritten only when something changed).
  void deposit_parts(const std::string& name);
  void sync_custody(bool retry = false) noexcept;
  // Whether custody's descriptor `name` is one the holder holds now: the manifest written last, or
  // a part of a buffer it holds (never removed as left over).
  bool held_in_custody(const std::string& name) const;
  // Runs `body` then sync_custody(), on its exception path too: the end of a request, an apply,
  // a disconnect.
  template <class Body>
  auto then_sync_custody(Body&& body) -> decltype(body()) {
    try {
      if constexpr (std::is_void_v<decltype(body())>) {
        body();
        sync_custody();
      } else {
        auto out = body();
        sync_custody();
        return out;
      }
    } catch (...) {
      sync_custody();
      throw;
    }
  }
  // The steps of adopt() for one buffer of the manifest (adopt.cpp).
  std::string adoption_refusal(const custody::ManifestBuffer& mb, int device, const Desired& want) const;
  std::string adopt_parts(const custody::ManifestBuffer& mb, int device, std::map<std::string, Fd>& by_name,
                          adoption::Allocations& allocations, HeldBuffer& b);
  model::Custody custody_status() const;
  // Sends `notice` to `client` in the names its protocol speaks (proto::to_old_names below 4).
  void notify(std::uint64_t client, Json notice);
  model::BufferInfo buffer_view(const std::string& name, const HeldBuffer& b) const;
  model::PoolInfo pool_info(const PoolKey& key, const HeldPool& p) const;
  std::vector<model::DeviceId> access_of(const HeldPool& p) const;  // the pool's peers

  Backend& backend_;
  NodeReport node_;
  AccountBook accounts_;
  std::uint32_t self_uid_;
  Limits limits_;
  HolderWant holder_;
  bool socket_from_command_line_ = false;
  SocketPermissions* socket_ = nullptr;
  std::function<void(std::uint64_t, const Json&)> notice_;
  std::function<void(std::uint64_t, const Json&)> deferred_;
  DropAsks drops_;                   // `drop` asks and the requests waiting on them
  std::uint64_t dropped_bytes_ = 0;  // cached bytes clients gave back when asked, ever
  std::uint64_t next_generation_ = 0;
  std::map<PoolKey, HeldPool> pools_;
  std::map<std::string, HeldBuffer> buffers_;
  LeaseBook leases_;  // the leases' records and their totals per pool
  ClientTable clients_;
  bool draining_ = false;
  std::int64_t created_at_ = 0;
  model::HolderInfo identity_;
  std::uint64_t apply_count_ = 0;
  std::optional<model::AppliedConfig> applied_config_;
  // Custody (adopt.cpp).
  custody::Custody* custody_ = nullptr;
  std::uint64_t manifest_sequence_ = 0;        // the one in custody (0: none yet)
  bool manifest_stale_ = false;                // the ready buffers changed since it was written
  std::set<std::string> custody_deposits_;     // buffers whose parts custody is still to be given
  std::vector<std::string> custody_removals_;  // descriptor names to remove once the manifest is new
  std::string custody_error_;                  // the last failure ("" when custody has it all)
  int custody_budget_ms_ = kCustodyBudgetMs;
  int custody_retry_ms_ = kCustodyRetryMs;
  std::chrono::steady_clock::time_point custody_retry_at_{};  // requests leave custody alone until
  std::optional<model::Adoption> adoption_;                   // what adopt() reported (none: it did not run)
};

}  // namespace cupool
