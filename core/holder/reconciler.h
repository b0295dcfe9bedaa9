// Reconciling: what a config asks for (config/resolve.h) against what the holder holds. plan()
// says what would change; apply() changes it, in order, and only what differs. Owns the holder
// section in force (socket, mode, group) and the socket whose mode and group apply changes.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/resolve.h"
#include "device/node.h"
#include "holder/buffer_store.h"
#include "holder/client_table.h"
#include "holder/leasing.h"
#include "holder/pool_table.h"
#include "model/model.h"

namespace cupool {

// One difference between what is held and what a config asks for.
// A value before or after a change: as the config writes it, and typed (null where absent).
struct ChangeValue {
  std::string text;
  Json value;
};

struct Change {
  model::ChangeAction action;
  model::ChangeObject object;
  std::string name;
  int device = -1;    // -1: not per device
  std::string field;  // for update and replace
  ChangeValue from;
  ChangeValue to;
  std::string blocked;  // why the change will not be made ("" when it will)
};

// A change as plan/apply print it (the device named by `node`).
model::PlanChange change_view(const Change& c, const NodeReport& node);

// Who may connect: the socket's mode and group, as the server's socket file sets them (a fake in
// tests). apply() goes through it, so an answer says "applied" only for what was made true.
class SocketPermissions {
 public:
  virtual ~SocketPermissions() = default;
  // Gives the socket `mode` and `group` ("": the holder's own group, as a new socket has) and
  // reads them back.
  // Throws cupool::Error saying what could not be done.
  virtual void set(unsigned mode, const std::string& group) = 0;
};

class Reconciler {
 public:
  using PoolKey = PoolTable::PoolKey;

  Reconciler(PoolTable& pools, BufferStore& buffers, ClientTable& clients, Leasing& leasing)
      : pools_(pools), buffers_(buffers), clients_(clients), leasing_(leasing) {}

  // What apply(want) would change; nothing is touched.
  std::vector<Change> plan(const Desired& want) const;
  // Makes every change that is not blocked (custody is the caller's to sync). Throws CudaError
  // when the driver refuses one (changes made before it stay made).
  std::vector<Change> apply(const Desired& want);
  // Destroys the pool `key`, the buffers left in it first, and tells the clients that imported it.
  void destroy_pool(const PoolKey& key);
  // Asks back the cached blocks that alone keep `want` from replacing or removing a pool; returns
  // the asks to wait for.
  std::set<std::uint64_t> ask_drops_for(const Desired& want);

  const HolderWant& settings() const { return holder_; }
  void adopt_settings(const HolderWant& h) { holder_ = h; }
  void keep_socket_from_command_line() { socket_from_command_line_ = true; }
  void attach_socket(SocketPermissions* socket) { socket_ = socket; }

 private:
  // The steps of plan(): the holder section, the buffers that go or change, each held pool, and a
  // pool name replaced on all its devices or none.
  void plan_holder(const Desired& want, std::vector<Change>& changes) const;
  void plan_buffers_out(const Desired& want, std::vector<Change>& changes) const;
  void plan_pool(const PoolKey& key, const HeldPool& h, const Desired& want, std::vector<Change>& changes) const;
  static void keep_pools_whole(std::vector<Change>& changes);
  std::string lease_note(const HeldPool& h) const;
  std::vector<std::string> buffers_in(const PoolKey& key, const Desired* keep) const;
  std::string blocked_reason(const PoolKey& key, const HeldPool& h, const Desired& want) const;

  PoolTable& pools_;
  BufferStore& buffers_;
  ClientTable& clients_;
  Leasing& leasing_;
  HolderWant holder_;
  bool socket_from_command_line_ = false;
  SocketPermissions* socket_ = nullptr;
};

}  // namespace cupool
