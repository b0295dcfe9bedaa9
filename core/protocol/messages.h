// The messages between the holder and those who talk to it, typed: the requests of a client's
// connection that the client library sends (hello, import_pool, alloc, free, reuse, dropped,
// buffer_open, buffer_close), their replies and the notices, and the requests of the CLI's verbs
// (list, status, stats, trim, plan, apply, export, buffer_create, buffer_ready, buffer_tensors,
// buffer_remove: most of them an admin's; their replies are core/model/'s) (docs/protocol.md). Each
// has its one JSON, in protocol 4's names (docs/naming.md): the sender writes it with to_json, the
// receiver reads it with one reader, so the holder, the client library and the CLI spell every
// field the same way because none of them spells it.
//
// Requests are read at the holder from proto::Args, which bounds every value and refuses unknown
// arguments (the holder then calls Args::finish). Replies and notices are read in the client
// library: each reader throws std::invalid_argument naming the field that is missing or ill-typed
// (the library turns that into CUPOOL_E_PROTOCOL). A field that an older holder (protocol 1 to 3)
// did not send is optional here, with the value that older holder meant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "protocol/protocol.h"

namespace cupool::proto {

// The longest pool or buffer name (names: [a-z0-9][a-z0-9._-]*).
constexpr std::size_t kMaxName = 64;
// The largest allocation a request may ask for (256 TiB).
constexpr std::uint64_t kMaxAllocation = 1ULL << 48;
// The highest part number buffer_open takes (the C API's part is 32 bits); the holder says when
// its buffer has fewer parts.
constexpr std::uint64_t kMaxPartNumber = UINT32_MAX;

// ---- requests ----

struct Hello {
  int protocol = kProtocol;
  std::optional<std::string> client;  // a name shown to admins in status
};
struct ImportPool {
  std::string pool;
  int device = -1;  // -1: the pool's only or first device
};
struct Alloc {
  std::string pool;
  int device = -1;
  std::uint64_t size_bytes = 0;
  bool synchronize = false;  // the holder waits for the allocation before it replies
};
struct Free {
  std::uint64_t lease = 0;
  bool cache = false;  // protocol 2: keep it mapped and charged to this connection
};
struct Reuse {
  std::uint64_t lease = 0;
};
struct Dropped {
  std::uint64_t ask = 0;
  std::vector<std::uint64_t> leases;
};
struct BufferOpen {
  std::string name;
  std::uint64_t part = 0;
};
struct BufferClose {
  std::string name;
};

Json to_json(const Hello& v);
Json to_json(const ImportPool& v);
Json to_json(const Alloc& v);
Json to_json(const Free& v);
Json to_json(const Reuse& v);
Json to_json(const Dropped& v);
Json to_json(const BufferOpen& v);
Json to_json(const BufferClose& v);

// The holder's readers; `max_leases`: the most lease ids a dropped may name.
Hello read_hello(Args& a);
ImportPool read_import_pool(Args& a);
Alloc read_alloc(Args& a);
Free read_free(Args& a);
Reuse read_reuse(Args& a);
Dropped read_dropped(Args& a, std::size_t max_leases);
BufferOpen read_buffer_open(Args& a);
BufferClose read_buffer_close(Args& a);

// ---- the CLI's requests (the verbs' own; their replies are core/model/'s) ----
//
// A value the holder reads as JSON and checks itself (a buffer's index) is carried as JSON.

struct List {};
struct Status {};
struct Export {};
struct Stats {
  bool reset_peaks = false;  // admin: reset the peaks after reading them
};
struct Trim {
  std::uint64_t keep_bytes = 0;     // what each pool may keep reserved
  std::optional<std::string> pool;  // none: every pool
  bool graph = true;                // trim the devices' graph memory too
  bool cached = true;               // ask clients for their cached blocks first
};
// "plan" or, with `apply`, "apply".
struct Plan {
  std::string config;               // the config file's text
  std::optional<std::string> path;  // the name the findings give the file
  bool apply = false;
};
struct BufferCreate {
  std::string name;
  std::string pool;
  int device = -1;  // -1: the pool's only or first device
  std::uint64_t size_bytes = 0;
  bool loading = false;                  // nobody else may open it until its loader says buffer_ready
  std::optional<Json> tensors;           // the index (tensors::from_json checks it at the holder)
  std::optional<Json> metadata;          // the index's metadata; with tensors only
  std::optional<Json> part_sizes_bytes;  // none: one part
};
struct BufferReady {
  std::string name;
};
struct BufferTensors {
  std::string name;
};
struct BufferRemove {
  std::string name;
  bool force = false;  // even while it is open
};

// ---- budgets (docs/budgets.md): exec asks, the process's preload claims and reports ----

// One device of a budget: bytes, or a percentage of the device's total memory.
struct BudgetAsk {
  int device = 0;  // the holder's ordinal
  std::optional<std::uint64_t> budget_bytes;
  std::optional<double> budget_percent;  // (0, 100]
};
// exec, for the process it is about to run the command in (the peer's pid): a grant, or a refusal
// with the ledger's figures.
struct BudgetGrant {
  std::vector<BudgetAsk> devices;
  std::string command;  // shown in the ledger
};
// The preload, inside the process: the grant is now this connection's (it lives as long as it).
struct BudgetClaim {
  std::string grant;
};
// The preload's figures, per device (by UUID): what the process holds and its peak.
struct BudgetUse {
  std::string uuid;
  std::uint64_t used_bytes = 0;
  std::uint64_t peak_bytes = 0;
};
struct BudgetUsage {
  std::vector<BudgetUse> devices;
};
struct LedgerAsk {};
constexpr std::size_t kMaxBudgetDevices = 64;  // devices in one budget request
constexpr std::size_t kMaxCommand = 4096;      // a budget's command line, as shown

Json to_json(const BudgetGrant& v);
Json to_json(const BudgetClaim& v);
Json to_json(const BudgetUsage& v);
Json to_json(const LedgerAsk& v);
BudgetGrant read_budget_grant(Args& a);
BudgetClaim read_budget_claim(Args& a);
BudgetUsage read_budget_usage(Args& a);
LedgerAsk read_ledger(Args& a);

Json to_json(const List& v);
Json to_json(const Status& v);
Json to_json(const Export& v);
Json to_json(const Stats& v);
Json to_json(const Trim& v);
Json to_json(const Plan& v);
Json to_json(const BufferCreate& v);
Json to_json(const BufferReady& v);
Json to_json(const BufferTensors& v);
Json to_json(const BufferRemove& v);

// The holder's readers. read_plan is told which of "plan" and "apply" the request's op is, and how
// long a config it takes (`max_config_bytes`: config/'s kMaxConfigBytes, which protocol/ does not
// see).
List read_list(Args& a);
Status read_status(Args& a);
Export read_export(Args& a);
Stats read_stats(Args& a);
Trim read_trim(Args& a);
Plan read_plan(Args& a, bool apply, std::size_t max_config_bytes);
BufferCreate read_buffer_create(Args& a);
BufferReady read_buffer_ready(Args& a);
BufferTensors read_buffer_tensors(Args& a);
BufferRemove read_buffer_remove(Args& a);

// ---- replies ----

// Who the holder sees at the other end of the socket (SO_PEERCRED) and whether that is an admin.
struct PeerInfo {
  std::int64_t pid = 0;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::string user;
  bool admin = false;
};
// The holder's limits for this connection.
struct Limits {
  std::uint64_t max_payload_bytes = 0;
  std::uint64_t max_reply_bytes = 0;
  std::uint64_t max_request_bytes = 0;
  std::uint64_t max_lease_count = 0;
  std::uint64_t max_open_buffer_count = 0;
  double frame_timeout_seconds = 0;
  std::uint64_t max_queued_bytes = 0;
  double drop_timeout_seconds = 0;
};
struct HelloReply {
  int protocol = 1;         // what this connection speaks (the client's choice)
  int oldest_protocol = 1;  // the versions the holder speaks ("protocols": [oldest, newest])
  int newest_protocol = 1;
  std::string version;           // "cupool 0.1.0"
  std::int64_t pid = 0;          // the holder's
  std::string backend = "cuda";  // "cuda" or "simulated"
  PeerInfo peer;
  Limits limits;
};
struct ImportPoolReply {
  std::string pool;
  model::DeviceId id;
  std::string handle_type = "posix_fd";
  std::vector<model::DeviceId> access;  // the devices besides its own that may use the pool
  std::uint64_t generation = 0;         // 0: a holder that did not say
  Bytes64 ready_event{};
};
struct AllocReply {
  std::uint64_t lease = 0;
  std::uint64_t size_bytes = 0;
  std::string pool;
  model::DeviceId id;
  std::optional<std::uint64_t> generation;
  Bytes64 export_data{};
  bool ready = false;  // the holder waited for the allocation
  Bytes64 ready_event{};
};
struct FreeReply {
  std::uint64_t lease = 0;
  std::uint64_t size_bytes = 0;
  bool cached = false;
};
struct ReuseReply {
  std::uint64_t lease = 0;
  std::uint64_t size_bytes = 0;
};
struct DroppedReply {
  std::uint64_t ask = 0;
  std::uint64_t freed_count = 0;
  std::uint64_t freed_bytes = 0;
};
// A buffer opened: held as an exported allocation (protocol 3; its descriptor rides with the
// reply and `exported` holds) or as a pool allocation (export data and a ready event).
struct BufferOpenReply {
  std::string name;
  std::string pool;
  model::DeviceId id;
  std::uint64_t size_bytes = 0;  // what the lease maps: the part
  std::uint64_t part = 0;
  std::uint64_t part_count = 1;
  std::uint64_t buffer_size_bytes = 0;
  bool exported = false;                    // "mapping": "exported"
  std::uint64_t mapped_size_bytes = 0;      // exported: the allocation's size
  std::vector<model::DeviceId> access;      // exported: the devices that may map it besides its own
  std::optional<std::uint64_t> generation;  // a pool allocation's
  Bytes64 export_data{};
  bool ready = true;
  Bytes64 ready_event{};
};
struct BufferCloseReply {
  std::string name;
};
// A loaded buffer said ready (buffer_ready, an admin's).
struct BufferReadyReply {
  std::string name;
  std::optional<std::uint64_t> tensor_count;  // none (null): a buffer without an index
};

Json to_json(const HelloReply& v);
Json to_json(const ImportPoolReply& v);
Json to_json(const AllocReply& v);
Json to_json(const FreeReply& v);
Json to_json(const ReuseReply& v);
Json to_json(const DroppedReply& v);
Json to_json(const BufferOpenReply& v);
Json to_json(const BufferCloseReply& v);
Json to_json(const BufferReadyReply& v);

HelloReply hello_reply_from_json(const Json& j);
ImportPoolReply import_pool_reply_from_json(const Json& j);
AllocReply alloc_reply_from_json(const Json& j);
BufferOpenReply buffer_open_reply_from_json(const Json& j);

// A failed request's reply: {"id": id, "ok": false, "error": {...}} (id null when the holder
// answers no request: it closes the connection and says why). The reader takes the error of any
// reply whose "ok" is false (nullopt when "ok" is true or absent); one without a readable error
// object is an error of code "internal" that says so.
Json error_reply(const Json& id, const model::ErrorInfo& error);
std::optional<model::ErrorInfo> error_of_reply(const Json& reply);

// A config the holder judged and refused (plan, apply: invalid_config, does_not_fit): the error
// object carries the findings too (docs/protocol.md, "plan"; schemas/cupool-plan-v1's refusal).
struct ConfigRefusal {
  model::ErrorInfo error;
  std::uint64_t finding_count = 0;  // all of them, even when `findings` was cut to fit a reply
  Json findings = Json::array();    // model::Finding's JSON, as `cupool check` writes them
  std::string rendered;             // the findings as compiler-style text
};
Json refusal_reply(const Json& id, const ConfigRefusal& refusal);

// ---- the envelope: what every request and reply carries besides its own fields ----
//
// A request: "id" (the client's; its reply carries it back), "op", and "quiet" (no reply when it
// succeeds). A reply: "id" and "ok", then its body's fields or "error". Spelled here only.

// A request's envelope read leniently, for answering even a malformed request: `id` null unless a
// non-negative integer, `op` none unless a string, `quiet` only when true.
struct RequestHead {
  Json id;
  std::optional<std::string> op;
  bool quiet = false;
};
RequestHead request_head(const Json& request);
// {"id": id, "ok": true, ...the body's fields}.
Json ok_reply(const Json& id, const Json& body);
// Whether a reply says "ok": true (false when it says otherwise or nothing).
bool reply_ok(const Json& reply);
// A reply's "ok" when it is a boolean; none when it is absent or of another type (not a reply).
std::optional<bool> ok_of(const Json& reply);
// A reply's or a request's "id" (null when it has none).
Json id_of(const Json& message);
// Gives a request written by to_json its "id" and, with `quiet`, "quiet": true (after its fields).
void address(Json& request, std::uint64_t id, bool quiet = false);

// ---- notices ----

// The pool a client imported was replaced or removed: drop the import.
struct PoolGone {
  std::string pool;
  model::DeviceId id;
  std::optional<std::uint64_t> generation;  // none: any import of it
  std::string message;
};
// The holder asks for cached blocks back (protocol 2); the client answers with dropped.
struct Drop {
  std::uint64_t ask = 0;
  std::vector<std::uint64_t> leases;
  std::uint64_t requested_bytes = 0;
  std::string reason;  // "pressure" or "quota"
  double timeout_seconds = 0;
};
// The holder is stopping.
struct Draining {
  std::string message;
};

Json to_json(const PoolGone& v);
Json to_json(const Drop& v);
Json to_json(const Draining& v);

// What a notice is ("pool_gone", "drop", "draining", or one this version does not know: a client
// ignores those); std::invalid_argument when it has no "notice".
std::string notice_name(const Json& j);
PoolGone pool_gone_from_json(const Json& j);
Drop drop_from_json(const Json& j);

}  // namespace cupool::proto
