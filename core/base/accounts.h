// The node's users and groups (the name service: /etc/passwd, /etc/group, or what nsswitch.conf
// names), looked up by name. A config's holder.group and share lists name them.
#pragma once

#include <string>

namespace cupool {

// Whether a user / a group of that name exists on this node. A lookup that fails for another
// reason than "no such name" (an unreachable directory service) counts as existing: `check` must
// not call a name unknown that it could not look up.
bool user_exists(const std::string& name);
bool group_exists(const std::string& name);

}  // namespace cupool
