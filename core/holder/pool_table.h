// The holder's pools: each pool it holds (the config's want, the driver's handle, a generation
// unique per pool made), made, updated and destroyed through the device seam, found by name and
// device for a request, and written as the pool's view. Buffers in a pool and the clients that
// imported it are not this table's (the holder destroys those first and tells them).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "config/resolve.h"
#include "device/backend.h"
#include "device/node.h"
#include "holder/client_table.h"
#include "model/model.h"

namespace cupool {

// One pool the holder holds.
struct HeldPool {
  PoolWant want;
  PoolHandle handle = 0;
  std::uint64_t generation = 0;              // unique per pool the holder made: a replaced pool gets a new one
  std::uint64_t reserved_after_reserve = 0;  // reserved bytes read back after mapping `reserve`
  // The used high-water mark from before the holder last mapped its reserve: the driver's is reset
  // after the reserve is freed (the reserve is no client's use), so stats report the larger of the
  // two; 0 again after a peak reset.
  std::uint64_t used_peak_before_reserve = 0;
};

// A device of the node by its holder ordinal: ordinal, UUID and PCI bus id ("" where unknown).
model::DeviceId device_id(const NodeReport& node, int device);
std::string device_uuid(const NodeReport& node, int device);

class PoolTable {
 public:
  using PoolKey = std::pair<std::string, int>;  // pool name, device
  using Map = std::map<PoolKey, HeldPool>;

  PoolTable(Backend& backend, const NodeReport& node) : backend_(backend), node_(node) {}

  // Makes the pool `w` (settings, peer access, reserve) and holds it under a new generation; all
  // or nothing. Throws CudaError when the driver refuses.
  void create(const PoolWant& w);
  // Changes what can change in place (settings, access given, share, reserve grown).
  void update(HeldPool& held, const PoolWant& w);
  // Destroys the pool `key` (its buffers gone already) and forgets it; returns its generation (0:
  // none held). Throws CudaError, then the pool is still held.
  std::uint64_t destroy(const PoolKey& key);
  // Forgets the pool `key` without asking the driver (a shutdown whose destroy failed).
  void forget(const PoolKey& key) { pools_.erase(key); }

  // The pool `name` on `device` (the first device that holds it for -1) that client `c` asks for:
  // not_found with a hint when none is held; with `for_use`, one it may import (IPC, shared with
  // it, POSIX descriptors).
  HeldPool& for_client(const HeldClient& c, const std::string& name, int device, bool for_use);
  // The config's pools before they are made (the holder's start, while the driver comes up): a
  // request for one finds it by name, share list and access, with no handle. made() ends it.
  void declare(const std::vector<PoolWant>& pools);
  void made() { declared_.clear(); }
  // Whether `c` may use `p` (an admin, or named by its share list).
  static bool permitted(const HeldClient& c, const HeldPool& p);
  // Whether any device holds a pool `name`.
  bool holds(const std::string& name) const;
  // The not_found error for a pool `name` this holder does not hold: the nearest name held, if one
  // is near, and the names it holds.
  Error no_such_pool(const std::string& name) const;

  HeldPool* find(const PoolKey& key);
  const HeldPool* find(const PoolKey& key) const;
  HeldPool& at(const PoolKey& key) { return pools_.at(key); }
  std::size_t count(const PoolKey& key) const { return pools_.count(key); }
  std::vector<PoolKey> keys() const;
  Map::iterator begin() { return pools_.begin(); }
  Map::iterator end() { return pools_.end(); }
  Map::const_iterator begin() const { return pools_.begin(); }
  Map::const_iterator end() const { return pools_.end(); }

  // The pool's view in list and status, and its peers.
  model::PoolInfo info(const PoolKey& key, const HeldPool& p) const;
  std::vector<model::DeviceId> access_of(const HeldPool& p) const;
  model::DeviceId device_id(int device) const { return cupool::device_id(node_, device); }

 private:
  // Maps `reserve` bytes of the pool and frees them, so they stay reserved.
  void map_reserve(HeldPool& held, std::uint64_t reserve);

  Backend& backend_;
  const NodeReport& node_;
  Map pools_;
  Map declared_;  // declare()'s, until made()
  std::uint64_t next_generation_ = 0;
};

}  // namespace cupool
