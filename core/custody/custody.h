// Custody (issue 23): the descriptors of the holder's buffers kept outside the holder, so that the
// memory outlives a holder that restarts or crashes, and the manifest that says what they are; the
// next holder withdraws both and adopts the buffers. Two custodians behind one interface: systemd's
// file-descriptor store (FDSTORE=1) and a keeper (`cupool keeper`, keeper.h) where there is no
// systemd, e.g. in a Kubernetes pod. docs/protocol.md, "The keeper".
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/fd.h"
#include "base/limits.h"

namespace cupool::custody {

constexpr std::size_t kMaxNameLength = 200;          // of a descriptor's name
constexpr std::size_t kMaxKept = 8192;               // descriptors a keeper keeps
constexpr std::size_t kMaxManifestBytes = 64 << 20;  // a manifest's JSON text
constexpr std::size_t kMaxParts = kMaxBufferParts;   // parts of one buffer (base/limits.h)
constexpr int kManifestVersion = 1;                  // the manifest's "manifest" field
constexpr const char* kDefaultKeeperSocket = "/run/cupool/keeper.sock";
// The highest manifest sequence taken (2^53: exact in any JSON reader). A holder writes one
// manifest a change, so no holder reaches it; a name above it is junk, refused.
constexpr std::uint64_t kMaxManifestSequence = std::uint64_t{1} << 53;

// The keeper's socket when none is given: kDefaultKeeperSocket for root; for another user
// $XDG_RUNTIME_DIR/cupool/keeper.sock (a directory only that user may write) where it is set,
// else kDefaultKeeperSocket.
std::string default_keeper_socket();

// Why a keeper's socket at `path` can't be trusted by user `self` ("" when it can): custody gives
// the keeper every held buffer's descriptor, so nobody but `self` and root may be able to put a
// socket there. Its directory must belong to `self` or root and be writable by nobody else, or be
// sticky (as /tmp), where a file at the path must then be self's or root's. Said as a clause:
// "its directory /x belongs to uid 1001 (eve), who could put another socket there".
std::string unsafe_keeper_path(const std::string& path, uid_t self);
// "uid 1001 (eve)"; "uid 1001" where the name service has no name for it.
std::string describe_uid(uid_t uid);
// The directory of a path: "/run/cupool" of "/run/cupool/keeper.sock", "." of "keeper.sock".
std::string directory_of(const std::string& path);

// A descriptor's name in custody: [A-Za-z0-9._-], 1..kMaxNameLength bytes (systemd's FDNAME allows more).
bool valid_fd_name(std::string_view name);

// One descriptor in custody under its name.
struct Kept {
  std::string name;
  Fd fd;
};

// The names of the descriptors, fixed so that every holder version agrees.
std::string part_fd_name(const std::string& buffer, std::size_t part);  // "cupool-buffer.<buffer>.<part>"
std::string manifest_fd_name(std::uint64_t sequence);                   // "cupool-manifest.<sequence>"
// The two forms read back: nullopt for any other name (a buffer name that is not valid included).
std::optional<std::pair<std::string, std::size_t>> parse_part_fd_name(const std::string& name);
std::optional<std::uint64_t> parse_manifest_fd_name(const std::string& name);

struct ManifestBuffer {
  std::string name;                   // the buffer's name ([a-z0-9][a-z0-9._-]*, <= 64)
  std::string pool;                   // the pool it is charged to (the same rule)
  int device = 0;                     // the holder's ordinal when written (informative)
  std::string uuid;                   // "GPU-..." (or "MIG-...") of its device: what adoption checks
  std::uint64_t size = 0;             // all parts together, bytes
  std::vector<std::uint64_t> parts;   // each part's size (sum == size, 1..kMaxParts parts)
  std::vector<std::uint64_t> mapped;  // each part's allocation size (>= its part size: granularity-rounded)
  std::uint32_t owner = 0;            // uid of who made it
  std::string origin;                 // "config" or "client"
  nlohmann::ordered_json index;       // the tensor index (tensors::to_json form: an object) or null
};

struct Manifest {
  std::uint64_t sequence = 0;  // grows with each manifest a holder writes (>= 1)
  std::uint32_t holder_uid = 0;
  std::int64_t holder_pid = 0;
  std::string written;  // ISO 8601 UTC, "2025-01-31T12:00:00Z" (fractions of a second allowed)
  std::string backend;  // "cuda" or "simulated"
  std::vector<ManifestBuffer> buffers;
};

// Now, as a manifest's "written" says it: "2025-01-31T12:00:00Z".
std::string iso_utc_now();

// The JSON form (to_json's keys, in this order): {"manifest": 1, "sequence", "holder": {"uid", "pid"},
// "written", "backend", "buffers": [{"name", "pool", "device", "uuid", "size", "parts", "mapped",
// "owner", "origin", "index"}]}. For `status`, tests, and what the digest is over.
nlohmann::ordered_json to_json(const Manifest& m);
// Manifest version 2 (docs/naming.md, "The manifest"): to_json's with each buffer's names as the
// rules have them (size_bytes, part_sizes_bytes, mapped_sizes_bytes, owner_uid, tensor_index) and
// "manifest": 2. open_manifest reads both versions; a holder writes version 1 until cupool 0.2, so
// that a holder rolled back to 0.1.0 still reads what a newer one kept.
nlohmann::ordered_json manifest_version2(const Manifest& m);
// "sha256:<64 hex digits>" of the canonical text of `body` (a manifest's JSON without "digest"):
// nlohmann's compact dump (no white space, keys in the object's order, non-ASCII as UTF-8).
std::string manifest_digest(const nlohmann::ordered_json& body);

// A sealed memfd (F_SEAL_WRITE|F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL) named manifest_fd_name(sequence),
// holding to_json(m) with "digest" added last ("written" is iso_utc_now() when m.written is empty). Throws
// Error(invalid_input) for a manifest whose fields open_manifest would refuse (the same checks), Error(internal) when
// the memfd can't be made.
Fd seal_manifest(const Manifest& m);
// Reads a manifest back from `fd` (what custody kept under `fd_name`). Throws Error(invalid_input),
// the message naming `fd_name` and what is wrong, for a descriptor that is not a memfd sealed against
// writing, is larger than kMaxManifestBytes, is not JSON, has no digest or a wrong one, says another
// sequence than its name, or has a field missing, unknown or out of bounds.
Manifest open_manifest(int fd, const std::string& fd_name);
// The same checks on JSON already parsed (the fuzz target's way in; open_manifest ends here).
Manifest manifest_from_json(const nlohmann::ordered_json& j, const std::string& fd_name);

// The node report a holder checked its config against, kept in custody beside the manifest with
// the node's fingerprint (device/fingerprint.h): the next holder checks its config against it
// before it loads the driver, while the fingerprint is the same, and asks the driver afterwards.
// A holder of an older version releases it as a descriptor nobody adopts.
inline constexpr const char* kNodeFdName = "cupool-node";
struct KeptNode {
  std::string fingerprint;        // "sha256:..." (NodeQuery::fingerprint)
  nlohmann::ordered_json report;  // the node report (device/node.h to_json)
  std::string written;            // ISO 8601 UTC; iso_utc_now() when empty at seal_node
};
// A sealed memfd named kNodeFdName: {"node": 1, "fingerprint", "written", "report", "digest"}.
// Throws Error(invalid_input) for an empty fingerprint or a report that is not an object.
Fd seal_node(const KeptNode& node);
// Reads it back. Throws Error(invalid_input) naming what is wrong (not a sealed memfd, over 64 MiB,
// not JSON, a wrong digest, a field missing, unknown or of the wrong kind). The report itself is
// the caller's to read (report_from_json checks it).
KeptNode open_node(int fd);

class Custody {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Custody() = default;
  virtual const char* kind() const = 0;   // "systemd" or "keeper"
  virtual std::string where() const = 0;  // "systemd's file-descriptor store" / "keeper at /run/cupool/keeper.sock"
  // Everything custody holds now, as descriptors of this process (called at the holder's start).
  virtual std::vector<Kept> withdraw() = 0;
  // Keeps a copy of fd under name (replacing one of the same name). Throws cupool::Error when custody
  // is unreachable (Errc::unreachable) or refuses (a bad name: invalid_input; a keeper's own codes).
  virtual void deposit(const std::string& name, int fd) = 0;
  // Removes what is kept under name (nothing when none). Throws when unreachable.
  virtual void remove(const std::string& name) = 0;
  // The names kept now, where custody can say (a keeper); nullopt where it can't (systemd's store
  // keeps what it is given and answers nothing). Throws as deposit does.
  virtual std::optional<std::vector<std::string>> list() { return std::nullopt; }
  // Calls from now on fail (Errc::unreachable) rather than wait past `deadline`; none: each call
  // has its own time-out only. The holder bounds what custody may cost its serving thread with it.
  virtual void limit_time(std::optional<Clock::time_point> deadline) { (void)deadline; }
};

// systemd's file-descriptor store (the unit needs FileDescriptorStoreMax=): nullptr unless
// $NOTIFY_SOCKET is set. withdraw() takes the descriptors systemd passed at start ($LISTEN_FDS from
// fd 3, only when $LISTEN_PID is this process; names from $LISTEN_FDNAMES), marks them close-on-exec
// and unsets the three variables; it returns them once (later calls: empty). deposit sends
// "FDSTORE=1\nFDNAME=<name>\nFDPOLL=0" with the fd (SCM_RIGHTS, one datagram to the notify socket: a
// path, or "@name" in the abstract namespace), after "FDSTOREREMOVE=1\nFDNAME=<name>" when the name
// may be in the store already (the store keeps several fds under one name); remove sends the latter.
std::unique_ptr<Custody> systemd_store();

// What systemd passed at start, as the environment said it (the parsing behind withdraw()).
struct ListenEnv {
  std::string pid;    // $LISTEN_PID
  std::string fds;    // $LISTEN_FDS
  std::string names;  // $LISTEN_FDNAMES, ':'-separated
};
// The descriptors from `first_fd` (3 under systemd) that `env` hands to process `self`, each marked
// close-on-exec and named from env.names ("unknown" where it names none, as systemd does). Nothing when
// env.pid is not `self` or env.fds is not a count; descriptors that are not open are left out.
std::vector<Kept> adopt_listen_fds(const ListenEnv& env, pid_t self, int first_fd);

// The keeper protocol's messages (custody/fields.h).
struct KeeperRequest;
struct KeeperStatusReply;
constexpr int kKeeperProtocolVersion = 1;  // hello's "keeper"

// A connection to a keeper (docs/protocol.md, "The keeper"). Connects on first use; when a request on
// an open connection fails for want of the keeper (it restarted), connects once more and repeats it.
// Each connection is checked first: the socket's place (unsafe_keeper_path) and the kernel's word
// on who listens (SO_PEERCRED: this process's user or root), so that descriptors go to no other
// user's process and nothing is taken from one. Throws Error(unreachable) when no keeper answers,
// Error(not_permitted) when the keeper can't be trusted or refuses this user.
class KeeperClient final : public Custody {
 public:
  // `timeout_ms`: how long one request may wait for the keeper (sending and receiving).
  explicit KeeperClient(std::string socket_path, int timeout_ms = 10000);
  const char* kind() const override { return "keeper"; }
  std::string where() const override { return "keeper at " + path_; }
  std::vector<Kept> withdraw() override;  // list, then withdraw each (the keeper keeps its own)
  void deposit(const std::string& name, int fd) override;
  void remove(const std::string& name) override;
  std::optional<std::vector<std::string>> list() override { return names(); }
  void limit_time(std::optional<Clock::time_point> deadline) override { deadline_ = deadline; }
  void set_timeout_ms(int timeout_ms) { timeout_ms_ = timeout_ms; }
  // The names kept, sorted.
  std::vector<std::string> names();
  // Drops everything kept (the memory goes): how many descriptors were released.
  std::size_t release();
  // The keeper's status reply (custody/fields.h).
  KeeperStatusReply status();

 private:
  // Sends `request` (with `fd` when >= 0) and returns the successful reply; a descriptor that came
  // with it goes to `received`.
  nlohmann::ordered_json call(const KeeperRequest& request, int fd = -1, Fd* received = nullptr);
  // One request and its reply on the open connection, no retry.
  nlohmann::ordered_json exchange(KeeperRequest request, int fd, Fd* received);
  void connect();
  // Sets the socket's time-outs for the next wait: timeout_ms_, or less to meet deadline_ (throws
  // Error(unreachable) once it has passed).
  void arm(int socket);

  std::string path_;
  int timeout_ms_;
  std::optional<Clock::time_point> deadline_;
  Fd socket_;
  std::uint64_t next_id_ = 1;
};

// A keeper at socket_path (a KeeperClient).
std::unique_ptr<Custody> keeper_at(const std::string& socket_path);

}  // namespace cupool::custody
