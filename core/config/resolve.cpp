#include "config/resolve.h"

#include <algorithm>

namespace cupool {

DeviceSelection select_devices(const DeviceList& list, const NodeReport& node) {
  DeviceSelection out;
  if (list.all) {
    for (const auto& d : node.devices) out.ordinals.push_back(d.info.ordinal);
    return out;
  }
  for (const auto& s : list.items) {
    const auto ordinal = resolve_device(node, s.value);
    if (!ordinal) {
      out.unknown.push_back(&s);
    } else if (std::find(out.ordinals.begin(), out.ordinals.end(), *ordinal) != out.ordinals.end()) {
      out.repeated.emplace_back(&s, *ordinal);
    } else {
      out.ordinals.push_back(*ordinal);
    }
  }
  return out;
}

PoolSettings SettingsPatch::over(PoolSettings base) const {
  if (release_threshold) base.release_threshold = *release_threshold;
  if (follow_event_dependencies) base.follow_event_dependencies = *follow_event_dependencies;
  if (allow_opportunistic) base.allow_opportunistic = *allow_opportunistic;
  if (allow_internal_dependencies) base.allow_internal_dependencies = *allow_internal_dependencies;
  return base;
}

SettingsPatch resolve_settings(const At<Threshold>& threshold, const std::optional<Reuse>& reuse,
                               std::uint64_t device_memory) {
  SettingsPatch out;
  if (threshold.set)
    out.release_threshold = ReleaseThreshold(threshold.value.resolve(device_memory), threshold.value.text);
  if (reuse) {
    if (reuse->follow_event_dependencies.set) out.follow_event_dependencies = reuse->follow_event_dependencies.value;
    if (reuse->allow_opportunistic.set) out.allow_opportunistic = reuse->allow_opportunistic.value;
    if (reuse->allow_internal_dependencies.set)
      out.allow_internal_dependencies = reuse->allow_internal_dependencies.value;
  }
  return out;
}

namespace {

std::uint64_t memory_of(const NodeReport& node, int device) {
  const DeviceReport* d = node.device(device);
  return d ? d->info.total_memory : 0;
}

// The peers of a list other than `device`, in the list's order.
std::vector<int> peers_of(const std::optional<DeviceList>& access, const NodeReport& node, int device) {
  std::vector<int> out;
  if (!access) return out;
  for (int peer : select_devices(*access, node).ordinals)
    if (peer != device) out.push_back(peer);
  return out;
}

PoolProps props_of(const PoolSpec& p, int device) {
  PoolProps props;
  const PoolLocation loc = p.location.set ? p.location.value : PoolLocation{};
  switch (loc.kind) {
    case PoolLocation::Kind::device:
      props.location = PoolProps::Location::device;
      props.location_id = device;
      break;
    case PoolLocation::Kind::host:
      props.location = PoolProps::Location::host;
      props.location_id = 0;
      break;
    case PoolLocation::Kind::host_numa:
      props.location = PoolProps::Location::host_numa;
      props.location_id = loc.numa_id;
      break;
  }
  props.managed = p.alloc_type.set && p.alloc_type.value == AllocType::managed;
  props.handle_types = p.handle_mask();
  props.max_size = p.max_size.set ? p.max_size.value : 0;
  return props;
}

ShareRule share_of(const PoolSpec& p) {
  ShareRule share;
  if (!p.share) return share;
  for (const auto& u : p.share->users) share.users.push_back(u.value);
  for (const auto& g : p.share->groups) share.groups.push_back(g.value);
  share.quota_per_client = p.share->quota_per_client.set ? p.share->quota_per_client.value : 0;
  // A share that names nobody and no quota (`share: {quota_per_client: 0B}`) is no share: only
  // admins may use the pool either way, and `export` would write an empty `share`, which no config
  // may hold.
  share.set = !share.users.empty() || !share.groups.empty() || share.quota_per_client != 0;
  return share;
}

}  // namespace

Desired resolve(const Config& config, const NodeReport& node) {
  Desired want;
  if (config.holder.socket.set) want.holder.socket = config.holder.socket.value;
  if (config.holder.mode.set) want.holder.mode = config.holder.mode.value;
  if (config.holder.group.set) want.holder.group = config.holder.group.value;

  for (std::size_t entry = 0; entry < config.pools.size(); ++entry) {
    const PoolSpec& p = config.pools[entry];
    for (int device : select_devices(p.devices, node).ordinals) {
      PoolWant w;
      w.name = p.name.value;
      w.device = device;
      w.entry = entry;
      w.props = props_of(p, device);
      w.settings = resolve_settings(p.release_threshold, p.reuse, memory_of(node, device)).over(PoolSettings{});
      w.access = peers_of(p.access, node, device);
      std::sort(w.access.begin(), w.access.end());
      w.share = share_of(p);
      w.reserve = p.reserve.set ? p.reserve.value : 0;
      want.pools.push_back(std::move(w));
    }
  }

  for (const BufferSpec& b : config.buffers) {
    BufferWant w;
    w.name = b.name.value;
    w.pool = b.pool.value;
    w.size = b.size.value;
    if (b.device.set) {
      w.device = resolve_device(node, b.device.value).value_or(0);
    } else {
      // A buffer without a device lives on its pool's first device.
      for (const auto& p : want.pools)
        if (p.name == w.pool) {
          w.device = p.device;
          break;
        }
    }
    want.buffers.push_back(std::move(w));
  }

  if (config.process) {
    const ProcessSpec& spec = *config.process;
    for (int device : select_devices(spec.devices, node).ordinals) {
      ProcessDeviceWant w;
      w.device = device;
      const std::uint64_t memory = memory_of(node, device);
      if (spec.default_pool) {
        const DefaultPoolSpec& d = *spec.default_pool;
        w.default_pool = ProcessDeviceWant::DefaultPool{resolve_settings(d.release_threshold, d.reuse, memory),
                                                        peers_of(d.access, node, device)};
      }
      if (spec.current_pool) {
        const CurrentPoolSpec& c = *spec.current_pool;
        ProcessDeviceWant::CurrentPool cp;
        cp.max_size = c.max_size.set ? c.max_size.value : 0;
        cp.settings = resolve_settings(c.release_threshold, c.reuse, memory);
        cp.reserve = c.reserve.set ? c.reserve.value : 0;
        cp.access = peers_of(c.access, node, device);
        w.current_pool = cp;
      }
      if (spec.budget.set) w.budget_bytes = spec.budget.value.resolve(memory);
      want.process.push_back(std::move(w));
    }
  }
  return want;
}

}  // namespace cupool
