#include "holder/client_table.h"

#include <algorithm>

#include "base/error.h"
#include "holder/names.h"

namespace cupool {

std::uint64_t ClientTable::connect(const Peer& peer) {
  const bool admin = peer.uid == 0 || peer.uid == self_uid_;
  if (clients_.size() >= limits_.max_clients + (admin ? limits_.admin_reserve : 0))
    throw Error(Errc::limit_exceeded,
                "the holder serves at most " + std::to_string(limits_.max_clients) + " connections" +
                    (admin ? " (and " + std::to_string(limits_.admin_reserve) + " more for admins)" : ""));
  if (!admin) {
    const auto same_user =
        std::count_if(clients_.begin(), clients_.end(), [&](const auto& kv) { return kv.second.peer.uid == peer.uid; });
    if (static_cast<std::size_t>(same_user) >= limits_.max_clients_per_user)
      throw Error(Errc::limit_exceeded, "the holder serves at most " + std::to_string(limits_.max_clients_per_user) +
                                            " connections per user, and user " + peer.user + " (uid " +
                                            std::to_string(peer.uid) + ") has them all");
  }
  HeldClient c;
  c.peer = peer;
  c.admin = admin;
  c.connected_at = now_s();
  clients_[++next_client_] = std::move(c);
  return next_client_;
}

HeldClient& ClientTable::at(std::uint64_t id) {
  HeldClient* c = find(id);
  if (!c) throw Error(Errc::internal, "unknown connection");
  return *c;
}

HeldClient* ClientTable::find(std::uint64_t id) {
  auto it = clients_.find(id);
  return it == clients_.end() ? nullptr : &it->second;
}

const HeldClient* ClientTable::find(std::uint64_t id) const {
  auto it = clients_.find(id);
  return it == clients_.end() ? nullptr : &it->second;
}

bool ClientTable::admin(std::uint64_t id) const {
  const HeldClient* c = find(id);
  return c && c->admin;
}

}  // namespace cupool
