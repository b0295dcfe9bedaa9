// The holder's buffers and their custody: each buffer it holds (made from the config or by a
// client, adopted from custody), made and freed through the device seam, and the descriptors of
// the exported ones kept in custody with a manifest of them, so they outlive the holder
// (docs/protocol.md, "The keeper"). Making and freeing is buffer_store.cpp; custody is adopt.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "base/fd.h"
#include "config/resolve.h"
#include "custody/custody.h"
#include "device/backend.h"
#include "device/node.h"
#include "holder/pool_table.h"
#include "model/model.h"
#include "tensors/safetensors.h"

namespace cupool {

using Json = nlohmann::ordered_json;

namespace adoption {
class Allocations;  // adopt.cpp
}  // namespace adoption

// One buffer the holder holds.
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
  // Adopted and not yet checked against the driver (it maps each part once it runs): served from
  // what custody and its manifest said until then (BufferStore::settle_adoption).
  bool unverified = false;
};

// An adopted buffer's part, to check against the driver off the serving thread (verify_adopted).
struct AdoptedPart {
  std::string buffer;
  std::size_t part = 0;
  int device = 0;
  int fd = -1;  // the store's: open until settle_adoption
  std::uint64_t size = 0;
  std::uint64_t mapped = 0;
};
// What the driver said of one: where it is mapped here, or why it is not what the manifest says.
struct AdoptedCheck {
  std::string buffer;
  std::size_t part = 0;
  std::uint64_t address = 0;
  std::string error;  // "" when it checked out
};

// Maps each part (the driver refuses a descriptor that is no exported allocation of that many
// bytes on that device) and checks its mapped size is the part's size in whole granules. Only
// `backend` is touched: it runs on the holder's starter thread while the serving thread answers
// from custody.
std::vector<AdoptedCheck> verify_adopted(Backend& backend, const std::vector<AdoptedPart>& parts);

class BufferStore {
 public:
  using Map = std::map<std::string, HeldBuffer>;
  using PoolKey = PoolTable::PoolKey;
  // What custody may cost the serving thread: every sync, audit or removal gives custody at most
  // this long in all; after a failure, requests leave custody alone for kCustodyRetryMs and the
  // audit tries again.
  static constexpr int kCustodyBudgetMs = 500;
  static constexpr int kCustodyRetryMs = 10000;

  // `pools`: where buffers are made (their pool's handle and properties); `self_uid` owns the
  // config's buffers.
  BufferStore(Backend& backend, const NodeReport& node, std::uint32_t self_uid, PoolTable& pools)
      : backend_(backend), node_(node), self_uid_(self_uid), pools_(pools) {}

  // ---- buffers (buffer_store.cpp) ----
  // Makes the buffer `w` from parts of `part_sizes` bytes (empty: one part of w.size); all or
  // nothing. Throws not_found (no such pool), invalid_input (too many parts) or CudaError.
  void create(const BufferWant& w, const std::vector<std::uint64_t>& part_sizes = {});
  // Frees the buffer `name` (none: nothing); its descriptors leave custody with the next sync.
  void destroy(const std::string& name);
  // The holder is stopping: closes this process's mapping of every buffer. A buffer custody keeps
  // for the next holder (in the manifest written last) is said to stay there; the rest are removed.
  void close_all_for_stop() noexcept;
  // The names of the buffers in pool `key`.
  std::vector<std::string> in_pool(const PoolKey& key) const;
  // Bytes of exported allocations charged to a pool (its buffers').
  std::uint64_t bytes_in(const std::string& pool, int device) const;
  // The buffer `name` for client `id` to read: not_found, or busy while another client loads it.
  HeldBuffer& readable(std::uint64_t id, const std::string& name);
  HeldBuffer* find(const std::string& name);
  const HeldBuffer* find(const std::string& name) const;
  std::size_t count(const std::string& name) const { return buffers_.count(name); }
  std::vector<std::string> names() const;
  Map::iterator begin() { return buffers_.begin(); }
  Map::iterator end() { return buffers_.end(); }
  Map::const_iterator begin() const { return buffers_.begin(); }
  Map::const_iterator end() const { return buffers_.end(); }
  // The buffer's view in list and status.
  model::BufferInfo view(const std::string& name, const HeldBuffer& b) const;
  // What the manifest says of the ready buffers changed (one made ready, one a client made).
  void changed() { manifest_stale_ = true; }

  // ---- custody (adopt.cpp): Holder's functions of the same names say what they do ----
  void attach_custody(custody::Custody* custody) { custody_ = custody; }
  // Takes what custody kept: the buffers of the newest manifest that fit this node and `want`,
  // each marked unverified (no driver call: their descriptors are served as custody gave them),
  // and the rest released. The kept node report (custody::kNodeFdName) is left in custody.
  model::Adoption adopt(std::vector<custody::Kept> kept, const Desired& want);
  // The parts adopt() took and the driver has not checked yet.
  std::vector<AdoptedPart> unverified() const;
  // The driver's word on them (verify_adopted): addresses kept; a buffer with a part that failed is
  // refused (logged, in the adoption report, released from custody) even if clients opened it.
  void settle_adoption(const std::vector<AdoptedCheck>& checks);
  // Keeps the node report in custody beside the manifest (and again when custody lost it).
  void keep_node(custody::KeptNode node);
  std::size_t forget_custody(std::vector<custody::Kept> kept);
  bool audit_custody() noexcept;
  model::Custody custody_status() const;
  // Whether custody holds buffer `name`, so that it outlives a restart of the holder: its parts
  // given and a manifest in custody that names it (false without custody, for a host pool's
  // buffer, one still loading, and while custody can't be reached).
  bool kept(const std::string& name) const;
  void set_custody_budget_ms(int ms) { custody_budget_ms_ = ms; }
  void set_custody_retry_ms(int ms) { custody_retry_ms_ = ms; }
  // Custody after a change: the parts of new exported buffers are deposited (a buffer that
  // replaces one of its name takes over its names), then a new manifest of the ready ones, then
  // what went away and is not held again is removed. Failures are logged and shown in `status`
  // (custody.error), and what is left waits for the audit (`retry`: the audit's call, made even
  // while requests leave custody alone); the buffers stay held. Called at the end of each request,
  // apply and disconnect, before the reply: a buffer made or replaced is in custody when its
  // client hears so (the manifest is rewritten only when something changed).
  void sync_custody(bool retry = false) noexcept;
  // Runs `body` then sync_custody(), on its exception path too: the end of a request, an apply,
  // a disconnect.
  // A body that synced custody itself as its last step (buffer_create, to say in its reply whether
  // custody has the buffer) is not synced again: a slow custody holds the request up once.
  template <class Body>
  auto then_sync_custody(Body&& body) -> decltype(body()) {
    synced_ = false;
    try {
      if constexpr (std::is_void_v<decltype(body())>) {
        body();
        if (!synced_) sync_custody();
      } else {
        auto out = body();
        if (!synced_) sync_custody();
        return out;
      }
    } catch (...) {
      sync_custody();
      throw;
    }
  }

 private:
  // Unmaps or frees buffer `name`'s parts and forgets it (destroy() without custody or the log).
  void unmap_and_erase(Map::iterator it);
  // The parts of exported buffer `name` go to custody with the next sync.
  void deposit_parts(const std::string& name);
  // Whether custody's descriptor `name` is one the holder holds now: the manifest written last, or
  // a part of a buffer it holds (never removed as left over).
  bool held_in_custody(const std::string& name) const;
  // The steps of adopt() for one buffer of the manifest.
  std::string adoption_refusal(const custody::ManifestBuffer& mb, int device, const Desired& want) const;
  std::string adopt_parts(const custody::ManifestBuffer& mb, std::map<std::string, Fd>& by_name,
                          adoption::Allocations& allocations, HeldBuffer& b);

  Backend& backend_;
  const NodeReport& node_;
  std::uint32_t self_uid_;
  PoolTable& pools_;
  Map buffers_;
  custody::Custody* custody_ = nullptr;
  std::uint64_t manifest_sequence_ = 0;        // the one in custody (0: none yet)
  bool manifest_stale_ = false;                // the ready buffers changed since it was written
  std::set<std::string> custody_deposits_;     // buffers whose parts custody is still to be given
  std::vector<std::string> custody_removals_;  // descriptor names to remove once the manifest is new
  std::string custody_error_;                  // the last failure ("" when custody has it all)
  std::set<std::string> manifested_;           // the buffers the manifest in custody names
  bool synced_ = false;                        // sync_custody ran since then_sync_custody's body began
  int custody_budget_ms_ = kCustodyBudgetMs;
  int custody_retry_ms_ = kCustodyRetryMs;
  std::chrono::steady_clock::time_point custody_retry_at_{};  // requests leave custody alone until
  std::optional<model::Adoption> adoption_;                   // what adopt() reported (none: it did not run)
  std::optional<custody::KeptNode> node_record_;              // the node report given to custody
  bool node_deposited_ = false;                               // custody has node_record_
};

}  // namespace cupool
