// The fields of custody's JSON, declared once (core/model/fields.h's form): the manifest's
// objects, with the rule its strict reader (manifest.cpp) checks each by, and the keeper
// protocol's messages (docs/protocol.md, "The keeper"). Their writers are model::write_json.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "custody/custody.h"
#include "model/fields.h"
#include "protocol/protocol.h"

namespace cupool::custody {

// The rules of the manifest's fields (a manifest is untrusted input: a holder reads it at start).
struct Within {  // an integer in min..max
  std::uint64_t min;
  std::uint64_t max;
};
struct ObjectName {};  // a buffer's or a pool's name: [a-z0-9][a-z0-9._-]*, at most 64 bytes
struct DeviceUuid {};  // "GPU-..." or "MIG-...", at most 96 characters
struct OneOf {         // one of these words
  std::vector<std::string> words;
};
struct UtcTime {};  // "2025-01-31T12:00:00Z", a fraction of a second allowed
struct Sizes {      // an array of 1..max_count sizes, each >= 1
  std::size_t max_count;
};
struct TensorIndex {};  // an object (tensors' index) or null
struct Buffers {        // at most max_count buffers (and parts in all), no name twice
  std::size_t max_count;
};

CUPOOL_FIELDS(ManifestBuffer) {
  f("name", v.name, ObjectName{});
  f("pool", v.pool, ObjectName{});
  f("device", v.device, Within{0, proto::kMaxDevice});
  f("uuid", v.uuid, DeviceUuid{});
  f("size", v.size, Within{1, UINT64_MAX});
  f("parts", v.parts, Sizes{kMaxParts});
  f("mapped", v.mapped, Sizes{kMaxParts});
  f("owner", v.owner, Within{0, UINT32_MAX});
  f("origin", v.origin, OneOf{{"config", "client"}});
  f("index", v.index, TensorIndex{});
}
CUPOOL_FIELDS(Manifest) {
  f.computed("manifest", kManifestVersion);  // the version (manifest.cpp reads version 2 as 1)
  f("sequence", v.sequence, Within{1, kMaxManifestSequence});
  f.object("holder", [&](auto& g) {
    g("uid", v.holder_uid, Within{0, UINT32_MAX});
    g("pid", v.holder_pid, Within{1, INT32_MAX});
  });
  f("written", v.written, UtcTime{});
  f("backend", v.backend, OneOf{{"cuda", "simulated"}});
  f("buffers", v.buffers, Buffers{kMaxKept});
}

}  // namespace cupool::custody

namespace cupool::custody {

// ---- the keeper protocol (docs/protocol.md, "The keeper"): each request {"op", ...} has an id,
// each reply the request's id, "ok" and, when ok, the fields of its operation ----

struct KeeperRequest {
  std::uint64_t id = 0;
  std::string op;                   // hello, deposit, remove, withdraw, list, release, status
  std::optional<int> keeper;        // hello: the keeper protocol's version
  std::optional<std::string> name;  // deposit, remove, withdraw: the descriptor's name
};
CUPOOL_FIELDS(KeeperRequest) {
  f("op", v.op);
  f("keeper", v.keeper, model::omit_empty);
  f("name", v.name, model::omit_empty);
  f("id", v.id);
}
// What begins every reply: the request's id (null where the keeper could not read one), whether it
// was done, and why not.
struct KeeperReplyHead {
  model::Json id;
  bool ok = false;
  std::optional<model::ErrorInfo> error;
};
CUPOOL_FIELDS(KeeperReplyHead) {
  f("id", v.id);
  f("ok", v.ok);
  f("error", v.error, model::omit_empty);
}
struct KeeperHelloReply {
  int keeper = 0;  // the keeper protocol's version
  std::int64_t pid = 0;
  std::uint64_t kept_count = 0;
};
CUPOOL_FIELDS(KeeperHelloReply) {
  f("keeper", v.keeper);
  f("pid", v.pid);
  f("kept_count", v.kept_count);
}
struct KeeperDepositReply {
  std::string name;
  bool replaced = false;  // one of that name was kept before
  std::uint64_t kept_count = 0;
};
CUPOOL_FIELDS(KeeperDepositReply) {
  f("name", v.name);
  f("replaced", v.replaced);
  f("kept_count", v.kept_count);
}
struct KeeperRemoveReply {
  std::string name;
  bool removed = false;  // one of that name was kept
  std::uint64_t kept_count = 0;
};
CUPOOL_FIELDS(KeeperRemoveReply) {
  f("name", v.name);
  f("removed", v.removed);
  f("kept_count", v.kept_count);
}
struct KeeperWithdrawReply {  // the descriptor comes with it
  std::string name;
};
CUPOOL_FIELDS(KeeperWithdrawReply) { f("name", v.name); }
struct KeeperNamesReply {  // list
  std::vector<std::string> names;
};
CUPOOL_FIELDS(KeeperNamesReply) { f("names", v.names); }
struct KeeperReleaseReply {
  std::uint64_t released_count = 0;
};
CUPOOL_FIELDS(KeeperReleaseReply) { f("released_count", v.released_count); }
struct KeeperStatusReply {
  std::int64_t pid = 0;
  std::string socket;
  std::string started;  // ISO 8601 UTC
  std::int64_t uptime_seconds = 0;
  std::uint64_t kept_count = 0;
  std::uint64_t max_kept_count = 0;
  std::uint64_t connection_count = 0;
  std::uint64_t max_connection_count = 0;
  std::vector<std::string> names;
};
CUPOOL_FIELDS(KeeperStatusReply) {
  f("pid", v.pid);
  f("socket", v.socket);
  f("started", v.started);
  f("uptime_seconds", v.uptime_seconds);
  f("kept_count", v.kept_count);
  f("max_kept_count", v.max_kept_count);
  f("connection_count", v.connection_count);
  f("max_connection_count", v.max_connection_count);
  f("names", v.names);
}

}  // namespace cupool::custody
