// Who may use what: admins (root and the holder's user), pools' share lists, and the pools a
// request names.
#include <algorithm>

#include "base/error.h"
#include "base/text.h"
#include "holder/holder.h"
#include "holder/names.h"

namespace cupool {

bool Holder::permitted(const Client& c, const HeldPool& p) const {
  if (c.admin) return true;
  if (!p.want.share.set) return false;
  const auto& s = p.want.share;
  if (!c.peer.user.empty() && std::find(s.users.begin(), s.users.end(), c.peer.user) != s.users.end()) return true;
  for (const auto& g : c.peer.group_names)
    if (std::find(s.groups.begin(), s.groups.end(), g) != s.groups.end()) return true;
  return false;
}

void Holder::require_admin(const Client& c, const char* op) const {
  if (c.admin) return;
  throw Error(Errc::not_permitted, std::string(op) + " needs the holder's user or root; you are " +
                                       (c.peer.user.empty() ? "uid " + std::to_string(c.peer.uid) : c.peer.user));
}

void Holder::require_not_draining(const char* op) const {
  if (draining_)
    throw Error(Errc::draining, std::string("the holder is stopping and takes no new ") + op + " requests");
}

Holder::HeldPool& Holder::pool_for(const Client& c, const std::string& name, int device, bool for_use) {
  HeldPool* found = nullptr;
  for (auto& [key, p] : pools_)
    if (key.first == name && (device < 0 || key.second == device)) {
      found = &p;
      break;
    }
  if (!found) {
    bool any = false;
    for (const auto& [key, p] : pools_) any = any || key.first == name;
    if (any) throw Error(Errc::not_found, "pool " + name + " is not held on device " + std::to_string(device));
    std::vector<std::string> names;
    for (const auto& [key, p] : pools_) names.push_back(key.first);
    const std::string hint = did_you_mean(name, names);
    throw Error(Errc::not_found, "no pool named \"" + valid_utf8(name) + "\"" +
                                     (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
  }
  if (for_use) {
    if (found->want.props.handle_types == 0)
      throw Error(Errc::bad_request,
                  "pool " + name + " has no IPC handle type, so it can't be shared with other processes");
    if (!permitted(c, *found))
      throw Error(Errc::not_permitted,
                  "pool " + name + " is not shared with " +
                      (c.peer.user.empty() ? "uid " + std::to_string(c.peer.uid) : "user " + c.peer.user) +
                      (found->want.share.set ? " (its share list names users [" + join(found->want.share.users, ", ") +
                                                   "] and groups [" + join(found->want.share.groups, ", ") + "])"
                                             : " (it has no share list: only the holder's user and root may use it)"));
    if ((found->want.props.handle_types & static_cast<std::uint32_t>(HandleType::posix_fd)) == 0)
      throw Error(Errc::bad_request,
                  "pool " + name + " is shared only through fabric handles, which this holder does not serve yet");
  }
  return *found;
}
}  // namespace cupool
