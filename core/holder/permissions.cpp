// Who may ask what: admins (root and the holder's user), and nothing new while the holder stops.
// Who may use a pool is the pool table's (PoolTable::permitted, PoolTable::for_client).
#include "base/error.h"
#include "holder/request.h"

namespace cupool {

void require_admin(const HeldClient& c, const char* op) {
  if (c.admin) return;
  throw Error(Errc::not_permitted, std::string(op) + " needs the holder's user or root; you are " +
                                       (c.peer.user.empty() ? "uid " + std::to_string(c.peer.uid) : c.peer.user));
}

void require_not_draining(bool draining, const char* op) {
  if (draining) throw Error(Errc::draining, std::string("the holder is stopping and takes no new ") + op + " requests");
}

}  // namespace cupool
