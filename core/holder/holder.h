// The holder: the composition of the units that own its state (the pool table, the buffer store
// with its custody, the clients, the leases with their `drop` asks, the reconciler) and of the
// request handlers that borrow them, behind the one interface the server and the tests use
// (docs/architecture.md, "The holder"). No sockets here: the server (server.h) moves frames, this
// class decides, so all of it is testable against a simulated node.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/resolve.h"
#include "custody/custody.h"
#include "device/backend.h"
#include "device/node.h"
#include "holder/account_book.h"
#include "holder/admin_requests.h"
#include "holder/budget_requests.h"
#include "holder/budgets.h"
#include "holder/buffer_requests.h"
#include "holder/buffer_store.h"
#include "holder/client_requests.h"
#include "holder/client_table.h"
#include "holder/leasing.h"
#include "holder/pool_table.h"
#include "holder/reconciler.h"
#include "holder/reply.h"
#include "holder/request.h"
#include "model/model.h"

namespace cupool {

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
  void set_account_book(AccountBook book) { admin_requests_.set_account_book(std::move(book)); }

  // What apply(want) would change; nothing is touched.
  std::vector<Change> plan(const Desired& want) const { return reconciler_.plan(want); }
  // Makes every change that is not blocked. Throws CudaError when the driver refuses one
  // (changes made before it stay made and are in the state). The second call with the same
  // `want` returns no changes and calls nothing on the backend.
  std::vector<Change> apply(const Desired& want);
  // apply() for a reload (SIGHUP): when cached blocks alone keep a pool from being replaced or
  // removed, asks for them first and applies once they are back (or their clients gone); `done`
  // gets the changes then. Returns whether it waits. Errors of a later apply are logged.
  bool apply_after_drops(const Desired& want, std::function<void(const std::vector<Change>&)> done);
  const HolderWant& holder_settings() const { return reconciler_.settings(); }
  // Takes the holder section as the current one (at start: the socket is made from it).
  void adopt_holder_settings(const HolderWant& h) { reconciler_.adopt_settings(h); }
  // The socket came from the command line (`hold --socket`), not the file: plan, apply and reload
  // then leave the file's holder.socket alone, as the start did.
  void keep_socket_from_command_line() { reconciler_.keep_socket_from_command_line(); }
  // The socket whose mode and group apply() changes. Without one (unit tests) apply records them.
  void attach_socket(SocketPermissions* socket) { reconciler_.attach_socket(socket); }
  // Where notices to a client go (the server queues them on its connection): a pool it imported
  // was replaced or removed (docs/protocol.md, "Notices").
  void on_notice(std::function<void(std::uint64_t client, const Json& notice)> send) {
    leasing_.on_notice(std::move(send));
  }
  // Where a deferred reply goes (a request that waited for clients to drop cached blocks): the
  // whole reply body, "id" and "ok" included. Queued by the server like a notice.
  void on_deferred(std::function<void(std::uint64_t client, const Json& reply)> send) {
    leasing_.on_deferred(std::move(send));
  }
  // How long a client has to answer a `drop` notice before its connection is closed.
  void set_drop_timeout_ms(std::int64_t ms) { leasing_.set_drop_timeout_ms(ms); }
  // The connections that did not answer a `drop` notice in time (the server closes them, which
  // frees their leases); `now_ms` is the steady clock's.
  std::vector<std::uint64_t> overdue(std::int64_t now_ms) const { return leasing_.overdue(now_ms); }
  // The earliest deadline of an unanswered `drop` notice (steady clock, ms), if any.
  std::optional<std::int64_t> next_deadline() const { return leasing_.next_deadline(); }

  // ---- connections ----
  std::uint64_t connect(const Peer& peer) { return clients_.connect(peer); }
  // Frees the client's leases (cached ones too) and closes its buffers; requests waiting on its
  // `drop` answers go on, and a request of its own that waited is forgotten.
  void disconnect(std::uint64_t client);
  std::size_t client_count() const { return clients_.size(); }
  // Whether the client `id` would lose something if the holder stopped now: a lease in use (not
  // one it only caches), a buffer it is loading, or a buffer open through a pool's import (not an
  // exported allocation, which its own descriptor keeps). Exporters, watchers and engines that
  // only map held sets need nothing: a stopping holder does not wait for them.
  bool needs_holder(std::uint64_t id) const;
  // Frees the budgets granted to processes that ended before one of them claimed it (the server
  // calls it on each turn of its loop).
  void expire_budgets();
  // The ledger: every byte of each device (`cupool ledger`).
  model::Ledger ledger() const { return budget_requests_.ledger(); }
  // Root or the holder's user (false for a client it does not know).
  bool admin(std::uint64_t client) const { return clients_.admin(client); }

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
  std::optional<model::AppliedConfig> forget_applied() { return admin_requests_.forget_applied(); }
  model::Status status() const { return admin_requests_.status(); }
  model::PlanChange view(const Change& c) const { return change_view(c, node_); }  // as plan/apply print it
  model::Stats stats(bool reset_peaks) { return admin_requests_.stats(reset_peaks); }
  model::Trim trim(std::uint64_t keep, const std::optional<std::string>& pool, bool graph) {
    return admin_requests_.trim(keep, pool, graph);
  }
  // The live state as a version 1 config (YAML text).
  std::string export_config() const { return admin_requests_.export_config(); }
  // Leases of all clients (cached ones included), and their bytes.
  std::size_t lease_count() const { return leasing_.book().count(); }
  std::uint64_t leased_bytes() const { return leasing_.book().bytes(); }
  // Leases that their clients released into their cache, and their bytes.
  std::size_t cached_count() const { return leasing_.book().cached_count(); }
  std::uint64_t cached_bytes() const { return leasing_.book().cached_bytes(); }
  // Frees everything (leases first, then buffers, then pools); the holder is empty afterwards.
  // Custody keeps what it holds: the next holder adopts it.
  void shutdown() noexcept;

  // ---- the start: serving from custody while the driver comes up (server.cpp) ----
  // A holder starts serving before it has asked the driver anything: it checks its config against
  // the node report custody kept (when the node's fingerprint is the same), adopts the buffers
  // custody kept without mapping them, and listens; meanwhile another thread loads the driver,
  // asks the node, maps the adopted buffers (verify_adopted) and opens the devices. Until that is
  // over (set_starting(false)), only requests that need no driver are served
  // (serves_while_starting); the others wait in their connection, in order.
  void set_starting(bool starting) { starting_ = starting; }
  bool starting() const { return starting_; }
  // hello, status, buffer_open, buffer_close, buffer_tensors (and a request without an op, which
  // is refused at once).
  static bool serves_while_starting(const std::optional<std::string>& op);
  // The config's pools, found by requests before they are made (buffer_open's share list).
  void declare_pools(const Desired& want) { pools_.declare(want.pools); }
  std::vector<AdoptedPart> unverified() const { return buffers_.unverified(); }
  void settle_adoption(const std::vector<AdoptedCheck>& checks) {
    buffers_.then_sync_custody([&] { buffers_.settle_adoption(checks); });
  }
  // The node report goes to custody beside the manifest, for the next start.
  void keep_node(custody::KeptNode node) {
    buffers_.then_sync_custody([&] { buffers_.keep_node(std::move(node)); });
  }
  // The driver's report of the node, for the one the start used (custody's); every unit sees it.
  void update_node(NodeReport node) { node_ = std::move(node); }
  const NodeReport& node() const { return node_; }

  // ---- custody: held buffers outlive the holder (adopt.cpp) ----
  // Where the descriptors of exported buffers go as soon as they exist, with a manifest of them
  // (none: the buffers die with this process). `custody` outlives the holder's use of it.
  void attach_custody(custody::Custody* custody) { buffers_.attach_custody(custody); }
  // At start, before the first apply of `want`: adopts the buffers that custody kept (`kept`, what
  // it withdrew) as the newest manifest that opens describes them, each checked against the config
  // (its pool, a device pool on that device, is in `want`), the node (its device's UUID) and the
  // driver (its device, its size: each part mapped whole at the device's granularity, no
  // allocation under two names); refuses the rest and says why. Descriptors no manifest names, and
  // those of refused buffers, are removed from custody. Writes a manifest of what it adopted.
  // Returns the report `status` shows under custody.adopted.
  model::Adoption adopt(std::vector<custody::Kept> kept, const Desired& want) {
    return buffers_.adopt(std::move(kept), want);
  }
  // `hold --fresh`: removes everything custody kept (`kept`) and closes it: the memory goes.
  // Returns how many descriptors were dropped.
  std::size_t forget_custody(std::vector<custody::Kept> kept) { return buffers_.forget_custody(std::move(kept)); }
  // A keeper that restarted (a container restarted by Kubernetes) keeps nothing: asks it what it
  // keeps and gives it again what is missing, then a new manifest; after a failure, tries again
  // what custody has not been given (systemd's store too). The server calls it about once a
  // second. Returns false when custody did not answer or took nothing (the server asks again
  // after 10 s).
  bool audit_custody() noexcept { return buffers_.audit_custody(); }
  // What custody may cost the serving thread: every sync, audit or removal gives custody at most
  // this long in all (kCustodyBudgetMs); after a failure, requests leave custody alone for
  // kCustodyRetryMs and the audit tries again. The start, which serves nobody yet, sets more.
  static constexpr int kCustodyBudgetMs = BufferStore::kCustodyBudgetMs;
  static constexpr int kCustodyRetryMs = BufferStore::kCustodyRetryMs;
  void set_custody_budget_ms(int ms) { buffers_.set_custody_budget_ms(ms); }
  void set_custody_retry_ms(int ms) { buffers_.set_custody_retry_ms(ms); }  // (tests)

 private:
  // disconnect() but for custody, which it syncs.
  void forget_client(std::uint64_t id);
  // handle() but for custody, which it syncs.
  Reply serve(std::uint64_t client, const Json& request);
  // A row of the request table (requests.cpp): an operation's name and the handler that serves it.
  struct Operation {
    const char* name;
    std::function<Reply(Request&)> serve;
  };
  std::vector<Operation> operations();

  NodeReport node_;
  bool starting_ = false;
  Limits limits_;
  model::HolderInfo identity_;
  bool draining_ = false;
  ClientTable clients_;
  PoolTable pools_;
  BufferStore buffers_;  // and their custody
  Leasing leasing_;      // the leases, cached blocks and `drop` asks
  Reconciler reconciler_;
  ClientRequests client_requests_;
  BufferRequests buffer_requests_;
  Budgets budgets_;
  BudgetRequests budget_requests_;
  AdminRequests admin_requests_;
  std::vector<Operation> operations_;
};

}  // namespace cupool
