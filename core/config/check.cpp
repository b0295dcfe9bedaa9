#include "config/check.h"

#include <algorithm>
#include <map>
#include <set>

#include "base/accounts.h"
#include "base/text.h"
#include "base/units.h"

namespace cupool {

namespace {

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%x", v);
  return buf;
}

class Checker {
 public:
  Checker(const Config& c, const Desired& w, const NodeReport& n, Diagnostics& d, const CheckOptions& o)
      : c_(c), w_(w), n_(n), d_(d), o_(o) {
    where_ = n_.source.simulated ? "the node in " + n_.source.profile_path : "this node";
  }

  void run() {
    check_process();
    std::map<std::string, const PoolSpec*> pools;
    for (std::size_t entry = 0; entry < c_.pools.size(); ++entry) {
      const PoolSpec& p = c_.pools[entry];
      unique_name(pools, "pool", p.name, &p);
      check_pool(p, entry);
    }
    check_buffers(pools);
    check_free_memory();
    check_accounts();
    report_unknown_devices();
  }

 private:
  // Records `item` under its name; a name taken before is a finding pointing at both places.
  template <class T>
  void unique_name(std::map<std::string, const T*>& seen, const std::string& kind, const At<std::string>& name,
                   const T* item) {
    if (!name.set) return;
    auto [it, fresh] = seen.emplace(name.value, item);
    if (fresh) return;
    d_.error("duplicate-name", name.loc, kind + " name '" + name.value + "' is used twice",
             "the first " + kind + " '" + name.value + "' is at line " + std::to_string(it->second->name.loc.line),
             kind + " names must be unique");
  }

  struct Reservation {
    std::string what;  // "pool 'kv-cache'"
    std::uint64_t bytes;
    Loc loc;
  };

  std::string label(int ordinal) const { return device_label(n_, ordinal); }

  std::string devices_fact() const {
    std::vector<std::string> parts;
    for (const auto& d : n_.devices)
      parts.push_back(std::to_string(d.info.ordinal) + " = " + d.info.name + " (" + d.info.uuid + ", " +
                      d.info.pci_bus_id + ")");
    const std::size_t count = n_.devices.size();
    return where_ + " has " + std::to_string(count) + (count == 1 ? " device: " : " devices: ") + join(parts, "; ");
  }

  // A selector that names no device on the node: one finding per device, at the place it is first
  // named, however often the file names it (an 8-GPU config on a 1-GPU node is 7 findings, not 28).
  void unknown_device(const At<DeviceSelector>& s) {
    const std::string& key = s.value.normalized;
    auto same = std::find_if(unknown_.begin(), unknown_.end(), [&](const UnknownDevice& u) {
      return u.places.front()->value.kind == s.value.kind && u.key == key;
    });
    if (same == unknown_.end())
      unknown_.push_back({key, {&s}});
    else if (std::find(same->places.begin(), same->places.end(), &s) == same->places.end())
      same->places.push_back(&s);  // (a selector resolved twice is one place)
  }

  std::optional<int> resolve_one(const At<DeviceSelector>& s) {
    if (auto ordinal = resolve_device(n_, s.value)) return ordinal;
    unknown_device(s);
    return std::nullopt;
  }

  void report_unknown_devices() {
    constexpr std::size_t kListed = 6;  // the other places a finding lists
    for (UnknownDevice& u : unknown_) {
      std::stable_sort(u.places.begin(), u.places.end(), [](const At<DeviceSelector>* a, const At<DeviceSelector>* b) {
        return a->loc.line != b->loc.line ? a->loc.line < b->loc.line : a->loc.column < b->loc.column;
      });
      const At<DeviceSelector>& s = *u.places.front();
      std::string message = "no device '" + s.value.text + "' on " + where_;
      if (u.places.size() > 1) {
        std::vector<std::string> also;
        for (std::size_t i = 1; i < u.places.size() && i <= kListed; ++i)
          also.push_back(std::to_string(u.places[i]->loc.line) + ":" + std::to_string(u.places[i]->loc.column));
        if (u.places.size() > kListed + 1)
          also.push_back("and " + std::to_string(u.places.size() - kListed - 1) + " more");
        message += " (named " + std::to_string(u.places.size()) + " times; also at " + join(also, ", ") + ")";
      }
      std::string help;
      if (s.value.kind == DeviceSelector::Kind::index && !n_.devices.empty())
        help = "device indexes here are 0 to " + std::to_string(n_.devices.size() - 1);
      else
        help = "run 'cupool query' to list the node's devices";
      d_.error("unknown-device", s.loc, message, devices_fact(), help);
    }
  }

  // Ordinals a device list selects (the resolver's answer); unknown devices are reported,
  // duplicates warned, in the order written.
  std::vector<int> resolve(const DeviceList& list) {
    const DeviceSelection selection = select_devices(list, n_);
    std::size_t unknown = 0, repeated = 0;
    for (const auto& s : list.items) {
      if (unknown < selection.unknown.size() && selection.unknown[unknown] == &s) {
        ++unknown;
        unknown_device(s);
      } else if (repeated < selection.repeated.size() && selection.repeated[repeated].first == &s) {
        const int ordinal = selection.repeated[repeated++].second;
        d_.warning("duplicate-device", s.loc,
                   "'" + s.value.text + "' names " + label(ordinal) + ", which is already listed");
      }
    }
    return selection.ordinals;
  }

  // The resolver's pool for config entry `entry` on `device`.
  const PoolWant& want(std::size_t entry, int device) const {
    for (const PoolWant& w : w_.pools)
      if (w.entry == entry && w.device == device) return w;
    throw std::logic_error("check: no resolved pool for entry " + std::to_string(entry) + " on device " +
                           std::to_string(device));
  }

  const DeviceInfo& info(int ordinal) const { return n_.device(ordinal)->info; }

  bool require_pools(int ordinal, Loc loc, const std::string& what) {
    if (info(ordinal).memory_pools) return true;
    d_.error("pools-unsupported", loc, label(ordinal) + " does not support memory pools, needed by " + what,
             "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 0 for " + label(ordinal) + " on " + where_,
             "drop this device from " + what + ", or update the driver (pools need CUDA 11.2+ and a supported GPU)");
    return false;
  }

  // Peers in `access` given to memory that lives on `owner`.
  void check_access(const DeviceList& access, int owner, const std::string& what) {
    if (access.all) {
      for (const auto& peer : n_.devices) {
        const int p = peer.info.ordinal;
        if (p != owner && !n_.peer_access[static_cast<std::size_t>(p)][static_cast<std::size_t>(owner)])
          d_.note("peer-access-skipped", access.loc,
                  "access: all leaves out " + label(p) + ", which cannot access " + label(owner) + " (" + what + ")",
                  "cuDeviceCanAccessPeer(" + std::to_string(p) + ", " + std::to_string(owner) + ") = 0 on " + where_);
      }
      return;
    }
    for (const auto& s : access.items) {
      auto p = resolve_device(n_, s.value);
      if (!p) continue;  // reported once by resolve()
      if (*p == owner) {
        d_.warning("self-access", s.loc, label(owner) + " is the device " + what + " lives on; it always has access",
                   "", "remove it from access");
        continue;
      }
      if (!n_.peer_access[static_cast<std::size_t>(*p)][static_cast<std::size_t>(owner)])
        d_.error("peer-access", s.loc,
                 label(*p) + " cannot access memory on " + label(owner) + " (" + what + "): peer access is impossible",
                 "cuDeviceCanAccessPeer(" + std::to_string(*p) + ", " + std::to_string(owner) + ") = 0 on " + where_,
                 "'cupool query' shows the peer matrix; give access only to devices that can reach " + label(owner));
    }
  }

  // The sizes of one pool (a declared pool or process.current_pool) as written, and its release
  // threshold on the device at hand as the resolver made it.
  struct Sizes {
    const At<std::uint64_t>& reserve;
    const At<std::uint64_t>& max_size;
    const At<Threshold>& threshold;
  };

  void check_reserve_vs_max(const Sizes& s, const std::string& what) {
    if (s.reserve.set && s.max_size.set && s.reserve.value > s.max_size.value)
      d_.error("reserve-above-max-size", s.reserve.loc,
               "reserve (" + format_bytes(s.reserve.value) + ") is above max_size (" + format_bytes(s.max_size.value) +
                   ") in " + what,
               "", "lower reserve or raise max_size");
  }

  // The rules that depend on device `d`'s memory; each reported once per pool (the flags).
  void check_sizes(const Sizes& s, const ReleaseThreshold& threshold, int d, const std::string& what,
                   bool device_located, bool& reported_threshold, bool& reported_max) {
    const std::uint64_t memory = info(d).total_memory;
    if (s.reserve.set && s.threshold.set && !reported_threshold) {
      if (s.reserve.value > threshold.bytes()) {
        reported_threshold = true;
        const std::string shown =
            s.threshold.value.kind == Threshold::Kind::percent
                ? threshold.text() + " of " + format_bytes(memory) + " = " + format_bytes(threshold.bytes())
                : format_bytes(threshold.bytes());
        d_.error(
            "reserve-above-threshold", s.reserve.loc,
            "reserve (" + format_bytes(s.reserve.value) + ") is above release_threshold (" + shown + ") in " + what +
                ": the pool would give the reserved memory back at the first synchronize",
            "a pool keeps at most release_threshold bytes across a synchronize (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)",
            "raise release_threshold (e.g. max) or lower reserve");
      }
    } else if (s.reserve.set && !s.threshold.set && s.reserve.value > 0 && !reported_threshold) {
      reported_threshold = true;
      d_.error("reserve-above-threshold", s.reserve.loc,
               "reserve (" + format_bytes(s.reserve.value) + ") is above the default release_threshold (0) in " + what +
                   ": the pool would give the reserved memory back at the first synchronize",
               "the release threshold defaults to 0 (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)",
               "set release_threshold to at least the reserve, or max");
    }
    if (device_located && s.max_size.set && s.max_size.value > memory && !reported_max) {
      reported_max = true;
      d_.warning("max-size-above-memory", s.max_size.loc,
                 "max_size (" + format_bytes(s.max_size.value) + ") is above " + label(d) + "'s memory (" +
                     format_bytes(memory) + ") in " + what,
                 "cuDeviceTotalMem = " + std::to_string(memory) + " on " + where_);
    }
  }

  void check_process() {
    if (!c_.process) return;
    const ProcessSpec& p = *c_.process;
    const std::vector<int> devices = resolve(p.devices);
    if (p.budget.set)
      for (int d : devices) {
        const std::uint64_t memory = info(d).total_memory;
        const std::uint64_t budget = p.budget.value.resolve(memory);
        if (budget > memory) {
          d_.error("budget-too-large", p.budget.loc,
                   "process.budget " + p.budget.value.text + " is more than " + label(d) + " has (" +
                       format_bytes(memory) + ")",
                   "", "give a size up to the device's memory, or a percentage of it (e.g. 40%)");
          break;
        }
      }
    if (p.default_pool) {
      if (p.default_pool->access) resolve(*p.default_pool->access);
      for (int d : devices) {
        if (!require_pools(d, p.devices.loc.line ? p.devices.loc : p.default_pool->loc, "process.default_pool"))
          continue;
        if (p.default_pool->access) check_access(*p.default_pool->access, d, "its default pool");
      }
    }
    if (!p.current_pool) return;
    const CurrentPoolSpec& cp = *p.current_pool;
    const std::string what = "process.current_pool";
    const Sizes sizes{cp.reserve, cp.max_size, cp.release_threshold};
    check_reserve_vs_max(sizes, what);
    if (cp.access) resolve(*cp.access);
    bool reported_threshold = false;
    bool reported_max = false;
    for (int d : devices) {
      if (!require_pools(d, p.devices.loc.line ? p.devices.loc : cp.loc, what)) continue;
      if (cp.access) check_access(*cp.access, d, "its current pool");
      check_sizes(sizes, current_threshold(d), d, what, true, reported_threshold, reported_max);
      if (cp.reserve.set && cp.reserve.value > 0)
        reservations_[d].push_back({what + " reserve", cp.reserve.value, cp.reserve.loc});
    }
  }

  // The release threshold process.current_pool gets on `device` (a new pool: unset is the driver's 0).
  ReleaseThreshold current_threshold(int device) const {
    for (const ProcessDeviceWant& w : w_.process)
      if (w.device == device && w.current_pool) return w.current_pool->settings.over(PoolSettings{}).release_threshold;
    return ReleaseThreshold(0);
  }

  void check_pool(const PoolSpec& p, std::size_t entry) {
    const std::string what = p.name.set ? "pool '" + p.name.value + "'" : "this pool";
    const std::vector<int> devices = resolve(p.devices);
    const PoolShape shape{p.location.set ? p.location.value : PoolLocation{},
                          p.alloc_type.set && p.alloc_type.value == AllocType::managed, p.handle_mask(),
                          Sizes{p.reserve, p.max_size, p.release_threshold}};
    // Rules that need no node.
    check_pool_shape(p, what, shape);
    if (p.access) resolve(*p.access);
    PoolReported reported;
    for (int d : devices) check_pool_on(d, p, entry, what, shape, reported);
  }

  // What a pool entry is, as its rules need it.
  struct PoolShape {
    PoolLocation location;
    bool managed = false;
    std::uint32_t ipc = 0;  // its IPC handle types
    Sizes sizes;
  };
  // Rules reported once per pool, not once per device.
  struct PoolReported {
    bool threshold = false;
    bool quota = false;
    bool max = false;
  };

  // The rules that need no device: sizes against each other, sharing, the host's NUMA nodes.
  void check_pool_shape(const PoolSpec& p, const std::string& what, const PoolShape& shape) {
    const PoolLocation& location = shape.location;
    const std::uint32_t ipc = shape.ipc;
    const Sizes& sizes = shape.sizes;
    check_reserve_vs_max(sizes, what);
    if (p.share && ipc == 0)
      d_.error("share-without-handle-type", p.share->loc,
               what + " is shared but has no IPC handle type, so no other process can import it", "",
               "add handle_types: [posix_fd] (or fabric), or remove share");
    if (location.kind == PoolLocation::Kind::host && ipc != 0)
      d_.error("host-pool-ipc", p.handle_types_loc, what + " has location host, and host pools cannot be exported",
               "the driver requires handleTypes = none for CU_MEM_LOCATION_TYPE_HOST pools (cuMemPoolCreate)",
               "use location: host_numa:<id> for a shareable host pool, or drop handle_types");

    if (location.kind == PoolLocation::Kind::host_numa &&
        std::find(n_.host_numa_nodes.begin(), n_.host_numa_nodes.end(), location.numa_id) == n_.host_numa_nodes.end()) {
      std::vector<std::string> ids;
      for (int id : n_.host_numa_nodes) ids.push_back(std::to_string(id));
      d_.error(
          "unknown-numa-node", p.location.loc,
          "host NUMA node " + std::to_string(location.numa_id) + " does not exist on " + where_ + " (" + what + ")",
          "the host's NUMA nodes: " + (ids.empty() ? std::string("none (no NUMA)") : join(ids, ", ")) +
              " (/sys/devices/system/node/online)",
          ids.empty() ? "use location: host" : "use location: host_numa:" + ids.front());
    }
  }

  // The rules of one of the pool's devices: what the device supports, its memory, its reservations.
  void check_pool_on(int d, const PoolSpec& p, std::size_t entry, const std::string& what, const PoolShape& shape,
                     PoolReported& reported) {
    const PoolLocation& location = shape.location;
    const bool managed = shape.managed;
    const Sizes& sizes = shape.sizes;
    const DeviceInfo& dev = info(d);
    const Loc devices_loc = p.devices.loc;
    if (!require_pools(d, devices_loc, what)) return;

    if (location.kind == PoolLocation::Kind::host && !dev.host_memory_pools)
      d_.error("host-pools-unsupported", p.location.loc,
               label(d) + " does not support host-located pools (" + what + ")",
               "CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED = 0 for " + label(d) + " on " + where_);
    if (location.kind == PoolLocation::Kind::host_numa) {
      if (!dev.host_numa_memory_pools)
        d_.error("host-numa-pools-unsupported", p.location.loc,
                 label(d) + " does not support host-NUMA pools (" + what + ")",
                 "CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED = 0 for " + label(d) + " on " + where_);
    }

    if (managed) {
      if (n_.driver_version < 13000)
        d_.error("managed-pools-unsupported", p.alloc_type.loc,
                 "managed pools need a CUDA 13.0 driver; " + where_ + " has CUDA " +
                     cuda_version_string(n_.driver_version) + " (" + what + ")",
                 "cuDriverGetVersion = " + std::to_string(n_.driver_version),
                 "use alloc_type: pinned, or update the driver");
      else if (!dev.managed_memory)
        d_.error("managed-pools-unsupported", p.alloc_type.loc,
                 label(d) + " cannot allocate managed memory (" + what + ")",
                 "CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 0 for " + label(d) + " on " + where_);
    }

    for (const auto& h : p.handle_types) {
      if (h.value == HandleType::none || location.kind == PoolLocation::Kind::host) continue;
      const auto bit = static_cast<std::uint32_t>(h.value);
      const std::string type = handle_type_name(h.value);
      if ((dev.pool_handle_types & bit) == 0) {
        const auto supported = handle_type_names(dev.pool_handle_types);
        d_.error("handle-type-unsupported", h.loc,
                 label(d) + " does not support " + type + " handles for pools (" + what + ")",
                 "CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES = " + hex(dev.pool_handle_types) + " (" +
                     (supported.empty() ? "none" : join(supported, ", ")) + ") for " + label(d) + " on " + where_);
        continue;
      }
      if (h.value == HandleType::fabric) check_fabric(d, h.loc, what);
    }

    if (p.access && location.kind == PoolLocation::Kind::device) check_access(*p.access, d, what);

    const std::uint64_t memory = dev.total_memory;
    check_sizes(sizes, want(entry, d).settings.release_threshold, d, what, location.kind == PoolLocation::Kind::device,
                reported.threshold, reported.max);
    if (p.share && p.share->quota_per_client.set && !reported.quota) {
      const std::uint64_t quota = p.share->quota_per_client.value;
      if (p.max_size.set && quota > p.max_size.value) {
        reported.quota = true;
        d_.error("quota-above-size", p.share->quota_per_client.loc,
                 "quota_per_client (" + format_bytes(quota) + ") is above the pool's max_size (" +
                     format_bytes(p.max_size.value) + ") in " + what,
                 "", "lower quota_per_client to at most max_size");
      } else if (!p.max_size.set && location.kind == PoolLocation::Kind::device && quota > memory) {
        reported.quota = true;
        d_.error("quota-above-size", p.share->quota_per_client.loc,
                 "quota_per_client (" + format_bytes(quota) + ") is above " + label(d) + "'s memory (" +
                     format_bytes(memory) + "), the most the pool can hold (" + what + ")",
                 "cuDeviceTotalMem = " + std::to_string(memory) + " on " + where_);
      }
    }
    if (p.reserve.set && p.reserve.value > 0 && location.kind == PoolLocation::Kind::device)
      reservations_[d].push_back({what + " reserve", p.reserve.value, p.reserve.loc});
  }

  // The users and groups the file names are this machine's facts (a profile describes devices,
  // not accounts): holder.group must exist for the socket to be given to it; a share list's entry
  // that names nobody grants nothing. Each name is reported once, where it is first written.
  void check_accounts() {
    // A lookup may ask a directory service (nsswitch.conf), and the holder judges files any peer
    // sends (plan): at most kMaxAccountLookups names are looked up per file, the first ones written.
    std::size_t lookups = 0;
    const auto ask = [&lookups](const std::function<bool(const std::string&)>& f, bool (*fallback)(const std::string&),
                                const std::string& n) {
      if (++lookups > kMaxAccountLookups) return true;
      return f ? f(n) : fallback(n);
    };
    const auto user = [&](const std::string& n) { return ask(o_.user_exists, user_exists, n); };
    const auto group = [&](const std::string& n) { return ask(o_.group_exists, group_exists, n); };
    const std::string here =
        "looked up in this machine's users and groups (getpwnam, getgrnam)" +
        std::string(o_.accounts_here ? "" : ", not the profiled node's: check it on the node to be sure");
    const At<std::string>& g = c_.holder.group;
    if (g.set && !g.value.empty() && !group(g.value)) {
      const std::string message = "holder.group names group '" + g.value +
                                  "', which does not exist here: the holder can't give its socket to it";
      const std::string help = "create it first (groupadd --system " + g.value +
                               ") and add the users of the holder's clients to it, or remove holder.group (the "
                               "socket keeps the holder's own group)";
      if (o_.accounts_here)
        d_.error("unknown-group", g.loc, message, here, help);
      else
        d_.warning("unknown-group", g.loc, message, here, help);
    }
    std::set<std::string> users_seen;
    std::set<std::string> groups_seen;
    for (const PoolSpec& p : c_.pools) {
      if (!p.share) continue;
      const std::string what = p.name.set ? "pool '" + p.name.value + "'" : "this pool";
      for (const At<std::string>& u : p.share->users)
        if (u.set && users_seen.insert(u.value).second && !user(u.value))
          d_.warning("unknown-user", u.loc,
                     "share.users of " + what + " names '" + u.value +
                         "', which is no user here: it grants nothing until that user exists",
                     here, "create the user (useradd --system " + u.value + "), or drop it from share.users");
      for (const At<std::string>& gr : p.share->groups)
        if (gr.set && groups_seen.insert(gr.value).second && !group(gr.value))
          d_.warning("unknown-group", gr.loc,
                     "share.groups of " + what + " names '" + gr.value +
                         "', which is no group here: it grants nothing until that group exists",
                     here, "create the group (groupadd --system " + gr.value + "), or drop it from share.groups");
    }
  }

  void check_fabric(int d, Loc loc, const std::string& what) {
    const DeviceInfo& dev = info(d);
    if (!dev.fabric_handle) {
      d_.error("handle-type-unsupported", loc, label(d) + " cannot export fabric handles (" + what + ")",
               "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 0 for " + label(d) + " on " + where_);
      return;
    }
    if (!o_.deep) {
      d_.note("fabric-unverified", loc,
              "fabric support for " + label(d) + " is only an attribute; run 'check --deep' to try an export (" + what +
                  ")",
              "the attribute reads 1 even where export fails with CUDA_ERROR_NOT_PERMITTED because no IMEX channel is "
              "reachable");
      return;
    }
    for (const auto& probe : n_.device(d)->probes) {
      if (probe.handle_type != HandleType::fabric || probe.ok) continue;
      d_.error("fabric-not-exportable", loc,
               label(d) + " cannot export a fabric handle (" + what + "): " + probe.reason,
               "--deep: " + probe.api + " failed with " + probe.error + " on " + where_,
               "use handle_types: [posix_fd] for processes on this node; fabric is for multi-node NVLink with IMEX");
    }
  }

  void check_buffers(const std::map<std::string, const PoolSpec*>& pools) {
    std::map<std::string, const BufferSpec*> names;
    std::vector<std::string> pool_names;
    for (const auto& [name, pool] : pools) pool_names.push_back(name);
    // pool name -> device -> bytes of buffers
    std::map<std::string, std::map<int, std::uint64_t>> used;
    for (const auto& b : c_.buffers) {
      const std::string what = b.name.set ? "buffer '" + b.name.value + "'" : "this buffer";
      unique_name(names, "buffer", b.name, &b);
      std::optional<int> device;
      if (b.device.set) device = resolve_one(b.device);
      if (!b.pool.set) continue;
      auto it = pools.find(b.pool.value);
      if (it == pools.end()) {
        const std::string guess = did_you_mean(b.pool.value, pool_names);
        d_.error("unknown-pool", b.pool.loc,
                 what + " names pool '" + b.pool.value + "', which the file does not declare", "",
                 guess.empty() ? (pool_names.empty() ? "declare the pool under 'pools'"
                                                     : "pools declared: " + join(pool_names, ", "))
                               : "did you mean '" + guess + "'?");
        continue;
      }
      const PoolSpec& pool = *it->second;
      if (pool.handle_mask() == 0)
        d_.warning("buffer-not-shareable", b.pool.loc,
                   what + " lives in pool '" + pool.name.value +
                       "', which has no IPC handle type: no other process can open it",
                   "", "add handle_types: [posix_fd] to pool '" + pool.name.value + "'");
      if (!device) continue;
      // The pool must be on the buffer's device.
      bool on_device = pool.devices.all;
      for (const auto& s : pool.devices.items)
        if (resolve_device(n_, s.value) == device) on_device = true;
      if (!on_device) {
        d_.error("buffer-device", b.device.loc,
                 what + " is on " + label(*device) + ", but pool '" + pool.name.value + "' has no pool there", "",
                 "add the device to the pool's devices, or put the buffer on one of them");
        continue;
      }
      if (!b.size.set) continue;
      std::uint64_t& total = used[pool.name.value][*device];
      total += b.size.value;
      if (pool.max_size.set && total > pool.max_size.value) {
        d_.error("buffers-above-max-size", b.size.loc,
                 "buffers in pool '" + pool.name.value + "' on " + label(*device) + " add up to " +
                     format_bytes(total) + ", above its max_size (" + format_bytes(pool.max_size.value) + ")",
                 "", "raise the pool's max_size or shrink the buffers");
      }
      const bool device_located = !pool.location.set || pool.location.value.kind == PoolLocation::Kind::device;
      if (device_located) reservations_[*device].push_back({what, b.size.value, b.size.loc});
    }
  }

  void check_free_memory() {
    for (const auto& [d, items] : reservations_) {
      const DeviceReport* dev = n_.device(d);
      if (!dev) continue;
      std::uint64_t total = 0;
      for (const auto& r : items) total += r.bytes;
      const bool known = dev->memory.has_value();
      const std::uint64_t available = known ? dev->memory->free : dev->info.total_memory;
      if (total <= available) continue;
      std::vector<std::string> parts;
      for (const auto& r : items)
        parts.push_back(r.what + " " + format_bytes(r.bytes) + " (line " + std::to_string(r.loc.line) + ")");
      d_.error("reserve-above-free", items.front().loc,
               "reserves and buffers on " + label(d) + " need " + format_bytes(total) + ", but it has " +
                   format_bytes(available) + (known ? " free" : " in all"),
               join(parts, " + ") + "; " +
                   (known ? "free memory read through NVML on "
                          : "free memory unknown; compared with cuDeviceTotalMem on ") +
                   where_,
               "lower the reserves or buffers, or free memory on the device");
    }
  }

  const Config& c_;
  const Desired& w_;
  const NodeReport& n_;
  Diagnostics& d_;
  CheckOptions o_;
  std::string where_;
  std::map<int, std::vector<Reservation>> reservations_;
  // The devices named that the node lacks, in the order first named (reported at the end of run()).
  struct UnknownDevice {
    std::string key;                                // the selector, normalized
    std::vector<const At<DeviceSelector>*> places;  // where the file names it
  };
  std::vector<UnknownDevice> unknown_;
};

}  // namespace

void check_config(const Config& config, const Desired& desired, const NodeReport& node, Diagnostics& diags,
                  const CheckOptions& options) {
  Checker(config, desired, node, diags, options).run();
}

}  // namespace cupool
