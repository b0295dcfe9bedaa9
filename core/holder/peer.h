// Who is on the other end of a connection, as the kernel says.
#pragma once

#include "holder/holder.h"

namespace cupool {

// The peer of a connected Unix socket: SO_PEERCRED (pid, uid, gid) and SO_PEERGROUPS (its other
// groups), with the user and group names. Throws std::runtime_error when the kernel won't say.
Peer peer_of(int socket);

}  // namespace cupool
