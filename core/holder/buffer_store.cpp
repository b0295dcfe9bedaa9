#include "holder/buffer_store.h"

#include <spdlog/spdlog.h>

#include "base/error.h"
#include "base/limits.h"
#include "base/text.h"
#include "base/units.h"

namespace cupool {

void BufferStore::create(const BufferWant& w, const std::vector<std::uint64_t>& part_sizes) {
  const HeldPool* found = pools_.find({w.pool, w.device});
  if (!found) throw Error(Errc::not_found, "no pool " + w.pool + " on device " + std::to_string(w.device));
  const HeldPool& held = *found;
  const PoolHandle pool = held.handle;
  HeldBuffer b;
  b.want = w;
  // A buffer in a pool without an IPC handle type is only kept (check warns about it).
  b.shared = (held.want.props.handle_types & static_cast<std::uint32_t>(HandleType::posix_fd)) != 0;
  // A device pool's buffers are exported allocations charged to the pool: they outlive the holder.
  b.exported = held.want.props.location == PoolProps::Location::device;
  const std::vector<std::uint64_t> sizes = part_sizes.empty() ? std::vector<std::uint64_t>{w.size} : part_sizes;
  // What custody's manifest records and a new holder adopts: one bound for all (base/limits.h).
  if (sizes.size() > kMaxBufferParts)
    throw Error(Errc::invalid_input, "buffer " + w.name + " would have " + std::to_string(sizes.size()) +
                                         " parts; a buffer has at most " + std::to_string(kMaxBufferParts));
  if (b.exported && held.want.props.max_size) {
    const std::uint64_t granularity = backend_.allocation_granularity(w.device);
    std::uint64_t need = 0;
    for (const std::uint64_t size : sizes) need += (size + granularity - 1) / granularity * granularity;
    const std::uint64_t charged = bytes_in(w.pool, w.device);
    const std::uint64_t reserved = backend_.pool_usage(pool).reserved_bytes;
    // cupool's own bound, said in its words (a lease's in leasing.cpp), not as a driver's error.
    if (charged + reserved + need > held.want.props.max_size)
      throw Error(Errc::out_of_memory, "pool " + w.pool + " on device " + std::to_string(w.device) +
                                           " has no room for " + format_bytes(need) + ": its max_size " +
                                           format_bytes(held.want.props.max_size) + " holds " + format_bytes(charged) +
                                           " of buffers and " + format_bytes(reserved) + " reserved");
  }
  auto free_part = [&](const HeldBuffer::Part& part) noexcept {
    try {
      if (b.exported)
        backend_.unmap_exported(part.allocation.address);
      else if (b.shared)
        backend_.free_shared(pool, part.allocation.address);
      else
        backend_.free(pool, part.allocation.address);
    } catch (const std::exception& e) {
      spdlog::error("freeing a part of buffer {} failed: {}", w.name, e.what());
    }
  };
  try {
    for (const std::uint64_t size : sizes) {
      HeldBuffer::Part part;
      part.size = size;
      if (b.exported) {
        const ExportedAllocation a = backend_.create_exported(w.device, size);
        part.fd = Fd(a.fd);
        part.allocation.address = a.address;
        part.mapped = a.size;
      } else if (b.shared) {
        part.allocation = backend_.allocate_shared(pool, size, Backend::Readiness::event);
      } else {
        part.allocation.address = backend_.allocate(pool, size);
      }
      b.parts.push_back(std::move(part));
    }
    // Buffers are opened long after: make them ready now, so opening one needs no event.
    if (b.shared && !b.exported) backend_.synchronize(w.device);
  } catch (...) {
    for (const auto& part : b.parts) free_part(part);
    throw;
  }
  const std::size_t count = b.parts.size();
  b.owner = self_uid_;
  buffers_[w.name] = std::move(b);
  deposit_parts(w.name);
  if (count == 1)
    spdlog::info("created buffer {} ({}) in pool {} on device {}", w.name, format_bytes(w.size), w.pool, w.device);
  else
    spdlog::info("created buffer {} ({} in {} parts) in pool {} on device {}", w.name, format_bytes(w.size), count,
                 w.pool, w.device);
}

void BufferStore::destroy(const std::string& name) {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) return;
  const HeldBuffer& b = it->second;
  if (b.exported && custody_) {
    // Out of custody once a manifest without it is in (sync_custody).
    for (std::size_t i = 0; i < b.parts.size(); ++i) custody_removals_.push_back(custody::part_fd_name(name, i));
    manifest_stale_ = true;
  }
  unmap_and_erase(it);
  spdlog::info("removed buffer {}", name);
}

void BufferStore::unmap_and_erase(Map::iterator it) {
  const HeldBuffer& b = it->second;
  const HeldPool* p = pools_.find({b.want.pool, b.want.device});
  for (const auto& part : b.parts) {
    if (b.exported) {
      // An adopted part not yet checked against the driver is not mapped here (its descriptor is all).
      if (part.allocation.address) backend_.unmap_exported(part.allocation.address);
    } else if (!p)
      continue;
    else if (b.shared)
      backend_.free_shared(p->handle, part.allocation.address);
    else
      backend_.free(p->handle, part.allocation.address);
  }
  buffers_.erase(it);
}

void BufferStore::close_all_for_stop() noexcept {
  // What custody keeps (kept(): its parts given, the newest manifest naming it) is the next
  // holder's; the rest goes with this holder.
  const std::string where = custody_ ? custody_->where() : std::string();
  while (!buffers_.empty()) {
    auto it = buffers_.begin();
    const std::string name = it->first;
    const bool stays = kept(name);
    try {
      unmap_and_erase(it);
      if (stays) {
        spdlog::info("buffer {} stays in custody ({}): the next holder adopts it", name, where);
      } else {
        spdlog::info("removed buffer {} (its memory is freed)", name);
      }
    } catch (const std::exception& e) {
      spdlog::error("freeing buffer {}: {}", name, e.what());
      buffers_.erase(name);
    }
  }
  custody_ = nullptr;  // what custody keeps stays there: the next holder adopts it
}

std::uint64_t BufferStore::bytes_in(const std::string& pool, int device) const {
  std::uint64_t total = 0;
  for (const auto& [name, b] : buffers_)
    if (b.exported && b.want.pool == pool && b.want.device == device)
      for (const auto& part : b.parts) total += part.mapped;
  return total;
}

std::vector<std::string> BufferStore::in_pool(const PoolKey& key) const {
  std::vector<std::string> names;
  for (const auto& [name, b] : buffers_)
    if (b.want.pool == key.first && b.want.device == key.second) names.push_back(name);
  return names;
}

HeldBuffer& BufferStore::readable(std::uint64_t id, const std::string& name) {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) throw Error(Errc::not_found, "no buffer named \"" + valid_utf8(name) + "\"");
  // Nobody else sees a buffer half loaded: its loader opens it to fill it, then says buffer_ready.
  if (it->second.loading && it->second.loading != id)
    throw Error(Errc::busy,
                "buffer " + name + " is still being loaded; open it once `cupool buffer ls` shows it ready");
  return it->second;
}

HeldBuffer* BufferStore::find(const std::string& name) {
  auto it = buffers_.find(name);
  return it == buffers_.end() ? nullptr : &it->second;
}

const HeldBuffer* BufferStore::find(const std::string& name) const {
  auto it = buffers_.find(name);
  return it == buffers_.end() ? nullptr : &it->second;
}

std::vector<std::string> BufferStore::names() const {
  std::vector<std::string> out;
  for (const auto& [name, b] : buffers_) out.push_back(name);
  return out;
}

model::BufferInfo BufferStore::view(const std::string& name, const HeldBuffer& b) const {
  model::BufferInfo v;
  v.name = name;
  v.pool = b.want.pool;
  v.id = device_id(node_, b.want.device);
  v.size_bytes = b.want.size;
  v.part_count = b.parts.size();
  v.open_count = b.opens;
  v.state = b.loading ? "loading" : "ready";
  if (b.index) v.tensor_count = b.index->tensors.size();
  v.allocation = b.exported ? "exported" : "pool";
  v.kept = kept(name);
  v.adopted = b.adopted;
  return v;
}

}  // namespace cupool
