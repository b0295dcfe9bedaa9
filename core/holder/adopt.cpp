// Custody: the descriptors of the holder's exported buffers, kept outside it (systemd's
// file-descriptor store, or `cupool keeper`) with a manifest of what they are, so that a holder
// that restarts, is upgraded or crashes finds its buffers again (docs/protocol.md, "The keeper").
#include <linux/kcmp.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "base/error.h"
#include "base/units.h"
#include "holder/buffer_store.h"

namespace cupool {

void BufferStore::deposit_parts(const std::string& name) {
  if (!custody_) return;
  auto it = buffers_.find(name);
  if (it == buffers_.end() || !it->second.exported) return;
  custody_deposits_.insert(name);
  manifest_stale_ = true;
}

bool BufferStore::held_in_custody(const std::string& name) const {
  if (manifest_sequence_ && name == custody::manifest_fd_name(manifest_sequence_)) return true;
  if (name == custody::kNodeFdName) return node_deposited_;
  const auto part = custody::parse_part_fd_name(name);
  if (!part) return false;
  const auto it = buffers_.find(part->first);
  return it != buffers_.end() && it->second.exported && part->second < it->second.parts.size();
}

void BufferStore::sync_custody(bool retry) noexcept {
  synced_ = true;
  if (!custody_ || (!manifest_stale_ && custody_removals_.empty() && custody_deposits_.empty() &&
                    (!node_record_ || node_deposited_)))
    return;
  const auto now = std::chrono::steady_clock::now();
  if (!retry && now < custody_retry_at_) return;  // custody failed lately: the audit tries again
  custody_->limit_time(now + std::chrono::milliseconds(custody_budget_ms_));
  std::string what = "the manifest";
  try {
    if (node_record_ && !node_deposited_) {
      what = "the node report";
      const Fd sealed = custody::seal_node(*node_record_);
      custody_->deposit(custody::kNodeFdName, sealed.get());
      node_deposited_ = true;
    }
    // New buffers' parts first: a buffer that replaced one of its name (a reload or apply that
    // resized it) takes over the names, which custody then keeps for the new allocation.
    while (!custody_deposits_.empty()) {
      const std::string name = *custody_deposits_.begin();
      const auto it = buffers_.find(name);
      if (it != buffers_.end() && it->second.exported) {
        what = "buffer " + name;
        for (std::size_t i = 0; i < it->second.parts.size(); ++i)
          custody_->deposit(custody::part_fd_name(name, i), it->second.parts[i].fd.get());
      }
      custody_deposits_.erase(custody_deposits_.begin());
    }
    what = "the manifest";
    if (manifest_stale_) {
      custody::Manifest m;
      m.sequence = manifest_sequence_ + 1;
      m.holder_uid = self_uid_;
      m.holder_pid = ::getpid();
      m.backend = backend_.simulated() ? "simulated" : "cuda";
      for (const auto& [name, b] : buffers_) {
        // A buffer half loaded is its loader's: if the holder goes first, it goes too.
        if (!b.exported || b.loading) continue;
        custody::ManifestBuffer mb;
        mb.name = name;
        mb.pool = b.want.pool;
        mb.device = b.want.device;
        mb.uuid = device_uuid(node_, b.want.device);
        mb.size = b.want.size;
        for (const auto& part : b.parts) {
          mb.parts.push_back(part.size);
          mb.mapped.push_back(part.mapped);
        }
        mb.owner = b.owner;
        mb.origin = b.from_config ? "config" : "client";
        if (b.index) mb.index = tensors::to_json(*b.index);
        m.buffers.push_back(std::move(mb));
      }
      const Fd sealed = custody::seal_manifest(m);
      custody_->deposit(custody::manifest_fd_name(m.sequence), sealed.get());
      const std::uint64_t before = manifest_sequence_;
      manifest_sequence_ = m.sequence;
      manifest_stale_ = false;
      manifested_.clear();
      for (const custody::ManifestBuffer& mb : m.buffers) manifested_.insert(mb.name);
      if (before) custody_removals_.push_back(custody::manifest_fd_name(before));
    }
    // Only now that no manifest names them, and never what is held again under the same name.
    while (!custody_removals_.empty()) {
      const std::string name = custody_removals_.back();
      if (!held_in_custody(name)) {
        what = name;
        custody_->remove(name);
      }
      custody_removals_.pop_back();
    }
    custody_error_.clear();
    custody_retry_at_ = {};
  } catch (const std::exception& e) {
    const std::string error = what + " could not be given to " + custody_->where() + ": " + e.what();
    if (error != custody_error_)
      spdlog::error("custody: {}; what changed since may not outlive this holder (tried again within {} s)", error,
                    custody_retry_ms_ / 1000);
    custody_error_ = error;
    custody_retry_at_ = now + std::chrono::milliseconds(custody_retry_ms_);
  }
  custody_->limit_time(std::nullopt);
}

namespace {

// This node's ordinal of the device with `uuid`, -1 when it has none.
int ordinal_of(const NodeReport& node, const std::string& uuid) {
  for (const auto& d : node.devices)
    if (d.info.uuid == uuid) return d.info.ordinal;
  return -1;
}

// A manifest's tensors. A holder from before the names of v1 were amended (docs/naming.md) wrote
// each tensor's "offset" and "size": read as "offset_bytes" and "size_bytes", so a tensor set kept
// across the upgrade is adopted, not refused.
Json tensor_entries(const Json& index) {
  Json tensors = index.value("tensors", Json::array());
  if (!tensors.is_array()) return tensors;
  for (Json& t : tensors) {
    if (!t.is_object()) continue;
    for (const auto& [old_key, key] : {std::pair{"offset", "offset_bytes"}, std::pair{"size", "size_bytes"}})
      if (t.contains(old_key) && !t.contains(key)) {
        t[key] = t[old_key];
        t.erase(old_key);
      }
  }
  return tensors;
}

}  // namespace

namespace adoption {

// The allocations adopted so far, so that one kept under two names is seen, each in logarithmic
// time (custody may keep 8,192 descriptors: comparing every pair would cost tens of millions of
// system calls at the start). A memfd (the simulated node) is one allocation per inode. The
// driver's descriptors may share one anonymous inode: there the kernel orders their open file
// descriptions (kcmp), which a descriptor passed twice shares; where kcmp can't be asked, the
// descriptors' numbers order them (they count as different). Descriptors stay open while here.
class Allocations {
 public:
  // The name kept for the allocation behind `fd`, or nullptr when none is.
  const std::string* find(int fd) const {
    const auto it = by_.find(key(fd));
    return it == by_.end() ? nullptr : &it->second;
  }
  void add(int fd, const std::string& name) { by_.emplace(key(fd), name); }
  void erase(int fd) { by_.erase(key(fd)); }

 private:
  struct Key {
    dev_t dev = 0;
    ino_t ino = 0;
    int fd = -1;  // -1: a regular file, which its inode names alone
  };
  struct Less {
    bool operator()(const Key& a, const Key& b) const {
      if (a.dev != b.dev || a.ino != b.ino) return a.dev != b.dev ? a.dev < b.dev : a.ino < b.ino;
      if (a.fd < 0 || b.fd < 0 || a.fd == b.fd) return false;
      const pid_t self = ::getpid();
      switch (::syscall(SYS_kcmp, self, self, KCMP_FILE, a.fd, b.fd)) {
        case 0: return false;  // one open file description
        case 1: return true;
        case 2: return false;
        default: return a.fd < b.fd;
      }
    }
  };
  static Key key(int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return Key{0, 0, fd};
    return Key{st.st_dev, st.st_ino, S_ISREG(st.st_mode) ? -1 : fd};
  }
  std::map<Key, std::string, Less> by_;
};

}  // namespace adoption

namespace {

// The newest manifest of `by_name` that opens (none: none does), and in `newest` the highest
// sequence of those that open or are older than it; those that don't open are in `report` as refused.
std::optional<custody::Manifest> newest_manifest(const std::map<std::string, Fd>& by_name, model::Adoption& report,
                                                 std::uint64_t& newest) {
  std::vector<std::pair<std::uint64_t, std::string>> manifests;
  for (const auto& [name, fd] : by_name)
    if (const auto seq = custody::parse_manifest_fd_name(name)) manifests.emplace_back(*seq, name);
  std::sort(manifests.rbegin(), manifests.rend());
  // Only a manifest that opens counts for the next sequence: junk named with a sequence that can't
  // be followed must not stop this holder from writing its own.
  std::optional<custody::Manifest> manifest;
  for (const auto& [seq, name] : manifests) {
    if (manifest) {
      newest = std::max(newest, seq);  // older, and opened by the holder that wrote the newest
      continue;
    }
    try {
      manifest = custody::open_manifest(by_name.at(name).get(), name);
      newest = std::max(newest, seq);
    } catch (const std::exception& e) {
      spdlog::error("custody: refused {}: {}", name, e.what());
      // error.code from the error table (docs/naming.md): a manifest that does not read is bad input.
      report.refused.push_back({name, {errc_info(Errc::invalid_input).wire, e.what(), {}, {}}});
    }
  }
  return manifest;
}

}  // namespace

model::Adoption BufferStore::adopt(std::vector<custody::Kept> kept, const Desired& want) {
  const auto started = std::chrono::steady_clock::now();
  model::Adoption report;
  std::map<std::string, Fd> by_name;
  for (auto& k : kept) by_name[k.name] = std::move(k.fd);
  // The newest manifest that opens; the others (older, or refused) are removed.
  std::uint64_t newest = 0;
  const std::optional<custody::Manifest> manifest = newest_manifest(by_name, report, newest);
  std::set<std::string> taken;        // descriptor names now held by adopted buffers
  adoption::Allocations allocations;  // the allocations of adopted buffers (and of the one being adopted)
  if (manifest) {
    report.manifest_sequence = manifest->sequence;
    for (const custody::ManifestBuffer& mb : manifest->buffers) {
      auto refuse = [&](const std::string& why) {
        spdlog::error("custody: not adopting buffer {}: {}", mb.name, why);
        // Kept memory that does not fit this node or config (its device, pool, size).
        report.refused.push_back({mb.name, {errc_info(Errc::does_not_fit).wire, why, {}, {}}});
      };
      const int device = ordinal_of(node_, mb.uuid);
      if (device < 0) {
        refuse("its device " + mb.uuid + " is not on this node");
        continue;
      }
      if (const std::string why = adoption_refusal(mb, device, want); !why.empty()) {
        refuse(why);
        continue;
      }
      HeldBuffer b;
      b.want = BufferWant{mb.name, mb.pool, device, mb.size};
      b.exported = true;
      b.owner = mb.owner;
      b.from_config = mb.origin == "config";
      b.adopted = true;
      b.unverified = true;
      if (const std::string why = adopt_parts(mb, by_name, allocations, b); !why.empty()) {
        refuse(why);
        continue;
      }
      for (std::size_t i = 0; i < mb.parts.size(); ++i) taken.insert(custody::part_fd_name(mb.name, i));
      spdlog::info("custody: adopted buffer {} ({}{}, pool {}, device {})", mb.name, format_bytes(mb.size),
                   b.index ? ", " + std::to_string(b.index->tensors.size()) + " tensors" : std::string(), mb.pool,
                   device);
      report.buffers.push_back({mb.name, mb.pool, device_id(node_, device), mb.size});
      buffers_[mb.name] = std::move(b);
      manifested_.insert(mb.name);  // custody keeps it, named by the manifest adopted
    }
  }
  // What custody keeps and nobody adopted: the old manifests, and descriptors of buffers that were
  // not ready, refused, or named by no manifest. Removed once the new manifest is in.
  std::size_t released = 0;
  for (const auto& [name, fd] : by_name) {
    if (taken.count(name) || name == custody::kNodeFdName) continue;  // the node report stays until replaced
    custody_removals_.push_back(name);
    if (!custody::parse_manifest_fd_name(name)) ++released;
  }
  report.released_count = released;
  // The next manifest's sequence is above every one seen; it goes in first, then the removals.
  manifest_sequence_ = newest;
  manifest_stale_ = true;
  sync_custody();
  report.elapsed_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();  // manifest included
  adoption_ = report;
  return report;
}

// Why the manifest's buffer `mb` on `device` is not adopted before its parts are looked at ("": it
// may be): a buffer of its name is held, or its pool is not a device pool of `want` there.
std::string BufferStore::adoption_refusal(const custody::ManifestBuffer& mb, int device, const Desired& want) const {
  if (buffers_.count(mb.name)) return "a buffer of that name is held already";
  // Charged to a pool the config holds, where it could have been made: a device pool on its device.
  const auto pool = std::find_if(want.pools.begin(), want.pools.end(),
                                 [&](const PoolWant& p) { return p.name == mb.pool && p.device == device; });
  if (pool == want.pools.end() || pool->props.location != PoolProps::Location::device)
    return "its pool " + mb.pool + " on device " + std::to_string(device) + " (" + mb.uuid +
           ") is not a device pool of the config: nothing would account for it (put the pool back in the "
           "config to keep such buffers)";
  // Each part mapped whole (its size rounded up to whole granules) is the driver's to check
  // (verify_adopted): asking the granularity needs it.
  return "";
}

// Takes the parts of `mb` from custody's descriptors (`by_name`, taken from there) into `b`, and its
// tensor index. Returns why not ("" when done).
std::string BufferStore::adopt_parts(const custody::ManifestBuffer& mb, std::map<std::string, Fd>& by_name,
                                     adoption::Allocations& allocations, HeldBuffer& b) {
  std::string why;
  for (std::size_t i = 0; i < mb.parts.size() && why.empty(); ++i) {
    const std::string fd_name = custody::part_fd_name(mb.name, i);
    auto fd = by_name.find(fd_name);
    if (fd == by_name.end() || !fd->second) {
      why = "part " + std::to_string(i) + " (" + fd_name + ") is not in custody";
      break;
    }
    // One allocation is one buffer's: a descriptor kept under two names would be held twice.
    if (const std::string* other = allocations.find(fd->second.get())) {
      why = fd_name + " is the same allocation as " + *other;
      break;
    }
    // Not mapped here: the driver checks it once it runs (verify_adopted); until then the
    // descriptor is served as custody kept it.
    HeldBuffer::Part part;
    part.size = mb.parts[i];
    part.mapped = mb.mapped[i];
    part.fd = std::move(fd->second);
    allocations.add(part.fd.get(), fd_name);
    b.parts.push_back(std::move(part));
  }
  if (why.empty() && !mb.index.is_null()) {
    try {
      b.index = tensors::from_json(tensor_entries(mb.index), mb.index.value("metadata", Json::object()), mb.parts);
    } catch (const std::exception& e) {
      why = std::string("its tensor index is not valid: ") + e.what();
    }
  }
  if (!why.empty())
    for (const auto& part : b.parts) allocations.erase(part.fd.get());  // before it closes
  return why;
}

std::vector<AdoptedPart> BufferStore::unverified() const {
  std::vector<AdoptedPart> out;
  for (const auto& [name, b] : buffers_)
    if (b.unverified)
      for (std::size_t i = 0; i < b.parts.size(); ++i)
        out.push_back({name, i, b.want.device, b.parts[i].fd.get(), b.parts[i].size, b.parts[i].mapped});
  return out;
}

std::vector<AdoptedCheck> verify_adopted(Backend& backend, const std::vector<AdoptedPart>& parts) {
  std::vector<AdoptedCheck> out;
  std::map<int, std::uint64_t> granularity;
  for (const AdoptedPart& p : parts) {
    AdoptedCheck c{p.buffer, p.part, 0, ""};
    const std::string fd_name = custody::part_fd_name(p.buffer, p.part);
    try {
      if (!granularity.count(p.device)) granularity[p.device] = backend.allocation_granularity(p.device);
      const std::uint64_t g = granularity[p.device];
      // An allocation is its size rounded up to whole granules, as made.
      if (g && p.mapped != (p.size + g - 1) / g * g)
        c.error = "part " + std::to_string(p.part) + " says " + std::to_string(p.mapped) + " bytes are mapped for " +
                  std::to_string(p.size) + ", not the allocation of " + format_bytes(g) + " granules that holds them";
      else
        c.address = backend.map_exported(p.device, p.fd, p.mapped, {});
    } catch (const std::exception& e) {
      c.error = "part " + std::to_string(p.part) + " (" + fd_name + ", " + format_bytes(p.mapped) + " on device " +
                std::to_string(p.device) + ") does not match what custody holds: " + e.what();
    }
    out.push_back(std::move(c));
  }
  return out;
}

void BufferStore::settle_adoption(const std::vector<AdoptedCheck>& checks) {
  std::map<std::string, std::string> refused;  // buffer -> the first part's error
  for (const AdoptedCheck& c : checks) {
    auto it = buffers_.find(c.buffer);
    if (it == buffers_.end() || c.part >= it->second.parts.size()) {
      // Removed while the driver checked it (nothing can remove one then: such requests wait).
      continue;
    }
    it->second.parts[c.part].allocation.address = c.address;
    if (!c.error.empty() && !refused.count(c.buffer)) refused[c.buffer] = c.error;
  }
  for (auto& [name, b] : buffers_) b.unverified = false;
  for (const auto& refusal : refused) {
    const std::string& name = refusal.first;
    const std::string& why = refusal.second;
    auto it = buffers_.find(name);
    spdlog::error(
        "custody: not adopting buffer {} after all: {}{}", name, why,
        it->second.opens ? " (" + std::to_string(it->second.opens) + " client(s) opened it meanwhile)" : std::string());
    if (adoption_) {
      // Kept memory that does not fit this node (as adopt() refuses it).
      adoption_->refused.push_back({name, {errc_info(Errc::does_not_fit).wire, why, {}, {}}});
      auto& kept = adoption_->buffers;
      kept.erase(std::remove_if(kept.begin(), kept.end(), [&](const auto& a) { return a.name == name; }), kept.end());
    }
    for (std::size_t i = 0; i < it->second.parts.size(); ++i)
      custody_removals_.push_back(custody::part_fd_name(name, i));
    manifested_.erase(name);
    manifest_stale_ = true;
    unmap_and_erase(it);
  }
  if (!refused.empty()) sync_custody();
}

void BufferStore::keep_node(custody::KeptNode node) {
  node_record_ = std::move(node);
  node_deposited_ = false;
}

std::size_t BufferStore::forget_custody(std::vector<custody::Kept> kept) {
  std::size_t dropped = 0;
  std::set<std::string> named;  // the buffers whose memory goes, as their parts name them
  for (auto& k : kept) {
    custody_removals_.push_back(k.name);
    if (custody::parse_manifest_fd_name(k.name) || k.name == custody::kNodeFdName) continue;
    ++dropped;
    if (const auto part = custody::parse_part_fd_name(k.name)) named.insert(part->first);
  }
  for (const std::string& name : named) spdlog::warn("--fresh: buffer {} goes (its memory is freed)", name);
  sync_custody(/*retry=*/true);
  kept.clear();  // this process's copies closed: nothing holds the memory any more
  adoption_ = model::Adoption{};
  adoption_->released_count = dropped;
  adoption_->fresh = true;
  return dropped;
}

bool BufferStore::audit_custody() noexcept {
  if (!custody_) return true;
  const auto now = std::chrono::steady_clock::now();
  if (now < custody_retry_at_) return false;  // it failed lately: left alone until then
  custody_->limit_time(now + std::chrono::milliseconds(custody_budget_ms_));
  bool answered = true;
  try {
    if (const auto names = custody_->list()) {
      const std::set<std::string> kept(names->begin(), names->end());
      if (manifest_sequence_ && !kept.count(custody::manifest_fd_name(manifest_sequence_))) manifest_stale_ = true;
      if (node_deposited_ && !kept.count(custody::kNodeFdName)) node_deposited_ = false;
      for (const auto& [name, b] : buffers_) {
        if (!b.exported || custody_deposits_.count(name)) continue;
        bool all = true;
        for (std::size_t i = 0; i < b.parts.size(); ++i) all = all && kept.count(custody::part_fd_name(name, i));
        if (!all) {
          spdlog::warn("custody: {} lost buffer {} (it restarted?): giving it again", custody_->where(), name);
          deposit_parts(name);
        }
      }
      // It answered and has everything: a refusal before (another user's keeper, since gone) is over.
      if (!manifest_stale_ && custody_removals_.empty() && custody_deposits_.empty() &&
          (!node_record_ || node_deposited_)) {
        custody_error_.clear();
        custody_retry_at_ = {};
      }
    }
  } catch (const std::exception& e) {
    const std::string error = custody_->where() + " does not answer: " + e.what();
    if (error != custody_error_) spdlog::error("custody: {}", error);
    custody_error_ = error;
    custody_retry_at_ = now + std::chrono::milliseconds(custody_retry_ms_);
    answered = false;
  }
  custody_->limit_time(std::nullopt);
  if (answered) sync_custody(/*retry=*/true);
  return custody_error_.empty();
}

bool BufferStore::kept(const std::string& name) const {
  const auto it = buffers_.find(name);
  // While custody can't be reached, what it keeps is not known (a stopped keeper closed it all).
  return custody_ && custody_error_.empty() && it != buffers_.end() && it->second.exported && !it->second.loading &&
         !custody_deposits_.count(name) && manifested_.count(name);
}

model::Custody BufferStore::custody_status() const {
  model::Custody out;
  out.kind = custody_ ? custody_->kind() : "none";
  if (custody_) out.where = custody_->where();
  if (manifest_sequence_) out.manifest_sequence = manifest_sequence_;
  std::size_t kept = 0;
  for (const auto& [name, b] : buffers_)
    if (this->kept(name)) ++kept;
  out.kept_buffer_count = kept;
  // Custody (the keeper, systemd's store) did not take it all: as a request that could not reach it.
  if (!custody_error_.empty()) out.error = model::ErrorInfo{errc_info(Errc::unreachable).wire, custody_error_, {}, {}};
  out.adoption = adoption_;
  out.survives_restart = custody_ ? "held buffers and tensor sets of device pools, with their names, indexes "
                                    "and contents; clients keep their mappings and reconnect"
                                  : "nothing: no custody (run under systemd with FileDescriptorStoreMax=, or "
                                    "give --keeper)";
  out.made_again = "pools, leases and cached blocks (from the config); buffers of host pools are lost";
  return out;
}

}  // namespace cupool
