// Custody: the descriptors of the holder's exported buffers, kept outside it (systemd's
// file-descriptor store, or `cupool keeper`) with a manifest of what they are, so that a holder
// that restarts, is upgraded or crashes finds its buffers again (docs/protocol.md, "The keeper").
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "base/error.h"
#include "base/units.h"
#include "holder/holder.h"

namespace cupool {

void Holder::attach_custody(custody::Custody* custody) { custody_ = custody; }

void Holder::deposit_parts(const std::string& name) {
  if (!custody_) return;
  auto it = buffers_.find(name);
  if (it == buffers_.end() || !it->second.exported) return;
  try {
    for (std::size_t i = 0; i < it->second.parts.size(); ++i)
      custody_->deposit(custody::part_fd_name(name, i), it->second.parts[i].fd.get());
  } catch (const std::exception& e) {
    custody_error_ = std::string("buffer ") + name + " could not be given to " + custody_->where() + ": " + e.what();
    spdlog::error("{}; it will not outlive this holder", custody_error_);
  }
  manifest_stale_ = true;
}

void Holder::sync_custody() noexcept {
  if (!custody_ || (!manifest_stale_ && custody_removals_.empty())) return;
  try {
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
      mb.uuid = device_uuid(b.want.device);
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
    if (manifest_sequence_) custody_->remove(custody::manifest_fd_name(manifest_sequence_));
    manifest_sequence_ = m.sequence;
    manifest_stale_ = false;
    // Only now that no manifest names them.
    while (!custody_removals_.empty()) {
      custody_->remove(custody_removals_.back());
      custody_removals_.pop_back();
    }
    custody_error_.clear();
  } catch (const std::exception& e) {
    custody_error_ = "the manifest could not be given to " + custody_->where() + ": " + e.what();
    spdlog::error("{}; held buffers changed since the last manifest may not outlive this holder", custody_error_);
  }
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

model::Adoption Holder::adopt(std::vector<custody::Kept> kept) {
  const auto started = std::chrono::steady_clock::now();
  model::Adoption report;
  std::map<std::string, Fd> by_name;
  for (auto& k : kept) by_name[k.name] = std::move(k.fd);
  // The newest manifest that opens; the others (older, or refused) are removed.
  std::vector<std::pair<std::uint64_t, std::string>> manifests;
  for (const auto& [name, fd] : by_name)
    if (const auto seq = custody::parse_manifest_fd_name(name)) manifests.emplace_back(*seq, name);
  std::sort(manifests.rbegin(), manifests.rend());
  std::optional<custody::Manifest> manifest;
  std::uint64_t newest = 0;
  for (const auto& [seq, name] : manifests) {
    newest = std::max(newest, seq);
    if (manifest) continue;
    try {
      manifest = custody::open_manifest(by_name.at(name).get(), name);
    } catch (const std::exception& e) {
      spdlog::error("custody: refused {}: {}", name, e.what());
      report.refused.push_back({name, {"refused", e.what(), {}, {}}});
    }
  }
  std::set<std::string> taken;  // descriptor names now held by adopted buffers
  if (manifest) {
    report.manifest_sequence = manifest->sequence;
    for (const custody::ManifestBuffer& mb : manifest->buffers) {
      auto refuse = [&](const std::string& why) {
        spdlog::error("custody: not adopting buffer {}: {}", mb.name, why);
        report.refused.push_back({mb.name, {"refused", why, {}, {}}});
      };
      const int device = ordinal_of(node_, mb.uuid);
      if (device < 0) {
        refuse("its device " + mb.uuid + " is not on this node");
        continue;
      }
      if (buffers_.count(mb.name)) {
        refuse("a buffer of that name is held already");
        continue;
      }
      HeldBuffer b;
      b.want = BufferWant{mb.name, mb.pool, device, mb.size};
      b.exported = true;
      b.owner = mb.owner;
      b.from_config = mb.origin == "config";
      b.adopted = true;
      std::string why;
      for (std::size_t i = 0; i < mb.parts.size() && why.empty(); ++i) {
        const std::string fd_name = custody::part_fd_name(mb.name, i);
        auto fd = by_name.find(fd_name);
        if (fd == by_name.end() || !fd->second) {
          why = "part " + std::to_string(i) + " (" + fd_name + ") is not in custody";
          break;
        }
        try {
          HeldBuffer::Part part;
          part.allocation.address = backend_.map_exported(device, fd->second.get(), mb.mapped[i], {});
          part.size = mb.parts[i];
          part.mapped = mb.mapped[i];
          part.fd = std::move(fd->second);
          b.parts.push_back(std::move(part));
        } catch (const std::exception& e) {
          why = "part " + std::to_string(i) + " (" + fd_name + ", " + format_bytes(mb.mapped[i]) + " on " + mb.uuid +
                ") does not match what custody holds: " + e.what();
        }
      }
      if (why.empty() && !mb.index.is_null()) {
        try {
          b.index = tensors::from_json(tensor_entries(mb.index), mb.index.value("metadata", Json::object()), mb.parts);
        } catch (const std::exception& e) {
          why = std::string("its tensor index is not valid: ") + e.what();
        }
      }
      if (!why.empty()) {
        for (const auto& part : b.parts) {
          try {
            backend_.unmap_exported(part.allocation.address);
          } catch (...) {
          }
        }
        refuse(why);
        continue;
      }
      for (std::size_t i = 0; i < mb.parts.size(); ++i) taken.insert(custody::part_fd_name(mb.name, i));
      spdlog::info("custody: adopted buffer {} ({}{}, pool {}, device {})", mb.name, format_bytes(mb.size),
                   b.index ? ", " + std::to_string(b.index->tensors.size()) + " tensors" : std::string(), mb.pool,
                   device);
      report.buffers.push_back({mb.name, mb.pool, device_id(device), mb.size});
      buffers_[mb.name] = std::move(b);
    }
  }
  // What custody keeps and nobody adopted: the old manifests, and descriptors of buffers that were
  // not ready, refused, or named by no manifest. Removed once the new manifest is in.
  std::size_t released = 0;
  for (const auto& [name, fd] : by_name) {
    if (taken.count(name)) continue;
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

std::size_t Holder::forget_custody(std::vector<custody::Kept> kept) {
  std::size_t dropped = 0;
  for (auto& k : kept) {
    if (custody_) {
      try {
        custody_->remove(k.name);
      } catch (const std::exception& e) {
        spdlog::error("custody: could not remove {}: {}", k.name, e.what());
      }
    }
    if (!custody::parse_manifest_fd_name(k.name)) ++dropped;
  }
  adoption_ = model::Adoption{};
  adoption_->released_count = dropped;
  adoption_->fresh = true;
  return dropped;
}

bool Holder::audit_custody() noexcept {
  auto* keeper = dynamic_cast<custody::KeeperClient*>(custody_);
  if (!keeper) return true;
  try {
    const std::vector<std::string> names = keeper->list();
    const std::set<std::string> kept(names.begin(), names.end());
    bool missing = manifest_sequence_ && !kept.count(custody::manifest_fd_name(manifest_sequence_));
    for (const auto& [name, b] : buffers_) {
      if (!b.exported) continue;
      bool all = true;
      for (std::size_t i = 0; i < b.parts.size(); ++i) all = all && kept.count(custody::part_fd_name(name, i));
      if (!all) {
        spdlog::warn("custody: {} lost buffer {} (it restarted?): giving it again", custody_->where(), name);
        deposit_parts(name);
        missing = true;
      }
    }
    if (missing) {
      manifest_stale_ = true;
      sync_custody();
    } else if (!manifest_stale_ && custody_removals_.empty()) {
      custody_error_.clear();  // it has everything
    }
    return true;
  } catch (const std::exception& e) {
    if (custody_error_.empty()) spdlog::error("custody: {} does not answer: {}", custody_->where(), e.what());
    custody_error_ = custody_->where() + " does not answer: " + e.what();
    return false;
  }
}

model::Custody Holder::custody_status() const {
  model::Custody out;
  out.kind = custody_ ? custody_->kind() : "none";
  if (custody_) out.where = custody_->where();
  if (manifest_sequence_) out.manifest_sequence = manifest_sequence_;
  std::size_t kept = 0;
  for (const auto& [name, b] : buffers_)
    if (b.exported && !b.loading) ++kept;
  out.kept_buffer_count = custody_ ? kept : 0;
  if (!custody_error_.empty()) out.error = model::ErrorInfo{"custody_failed", custody_error_, {}, {}};
  out.adoption = adoption_;
  out.survives_restart = custody_ ? "held buffers and tensor sets of device pools, with their names, indexes "
                                    "and contents; clients keep their mappings and reconnect"
                                  : "nothing: no custody (run under systemd with FileDescriptorStoreMax=, or "
                                    "give --keeper)";
  out.made_again = "pools, leases and cached blocks (from the config); buffers of host pools are lost";
  return out;
}

}  // namespace cupool
