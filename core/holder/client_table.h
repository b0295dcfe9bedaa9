// The holder's clients: who is connected (by the kernel's word), what each connection said in
// hello, and what it holds (leases, open buffers, imported pools), with the connection limits
// that keep one user, or all of them, from taking every connection.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace cupool {

// Who is on the other end of a connection, as the kernel says (SO_PEERCRED, SO_PEERGROUPS).
struct Peer {
  int pid = 0;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::string user;                      // name of uid ("" when unknown)
  std::vector<std::string> group_names;  // names of the primary and supplementary groups
};

// Bounds on what clients can make the holder keep.
struct HolderLimits {
  std::size_t max_leases_per_client = 65536;
  std::size_t max_open_buffers_per_client = 4096;
  std::size_t max_clients = 1024;
  // Connections of one user (by the kernel's word, SO_PEERCRED) who is not an admin, so that one
  // user can't take every connection.
  std::size_t max_clients_per_user = 256;
  // Admins (root, the holder's user) may connect beyond max_clients by this many, so the operator
  // can always run `cupool status` on a full holder; they have no per-user limit.
  std::size_t admin_reserve = 16;
  // The allowance for a CUDA context that a budget is charged beside its bytes on each device (and
  // the holder's own where it holds memory): docs/budgets.md.
  std::uint64_t budget_context_bytes = 768ULL << 20;
};

// One connection, as the holder knows it.
struct HeldClient {
  Peer peer;
  bool admin = false;
  bool greeted = false;
  int protocol = 0;  // the version hello agreed on
  std::string name;
  std::int64_t connected_at = 0;  // steady clock, seconds
  std::set<std::uint64_t> leases;
  std::map<std::pair<std::string, int>, std::uint64_t> bytes_in_pool;
  std::map<std::string, std::uint64_t> open_buffers;              // name -> opens
  std::map<std::pair<std::string, int>, std::uint64_t> imported;  // pools it imported -> generation
};

class ClientTable {
 public:
  using Map = std::map<std::uint64_t, HeldClient>;

  // `self_uid`: the holder's user (admin along with root); `limits`: max_clients, admin_reserve
  // and max_clients_per_user are this table's.
  ClientTable(std::uint32_t self_uid, const HolderLimits& limits) : self_uid_(self_uid), limits_(limits) {}

  // Records a connection of `peer` and returns its id (from 1, never reused). Throws
  // limit_exceeded when the holder or the peer's user has all the connections it may have.
  std::uint64_t connect(const Peer& peer);
  // The connection `id`; throws internal for one the holder does not know.
  HeldClient& at(std::uint64_t id);
  // The connection `id`, or null.
  HeldClient* find(std::uint64_t id);
  const HeldClient* find(std::uint64_t id) const;
  // Root or the holder's user (false for a connection it does not know).
  bool admin(std::uint64_t id) const;
  void erase(std::uint64_t id) { clients_.erase(id); }
  std::size_t size() const { return clients_.size(); }
  Map::iterator begin() { return clients_.begin(); }
  Map::iterator end() { return clients_.end(); }
  Map::const_iterator begin() const { return clients_.begin(); }
  Map::const_iterator end() const { return clients_.end(); }

 private:
  std::uint32_t self_uid_;
  HolderLimits limits_;
  Map clients_;
  std::uint64_t next_client_ = 0;
};

}  // namespace cupool
