#include "holder/peer.h"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/text.h"

namespace cupool {

namespace {

std::string user_name(uid_t uid) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* out = nullptr;
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &out) == 0 && out) return out->pw_name;
  return "";
}

std::string group_name(gid_t gid) {
  std::vector<char> buf(16384);
  group gr{};
  group* out = nullptr;
  if (getgrgid_r(gid, &gr, buf.data(), buf.size(), &out) == 0 && out) return out->gr_name;
  return "";
}

}  // namespace

Peer peer_of(int fd) {
  Peer p;
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    throw std::runtime_error("SO_PEERCRED: " + errno_text());
  p.pid = cred.pid;
  p.uid = cred.uid;
  p.gid = cred.gid;
  p.user = user_name(cred.uid);
  std::vector<gid_t> groups{cred.gid};
#ifdef SO_PEERGROUPS
  std::vector<gid_t> more(64);
  socklen_t glen = static_cast<socklen_t>(more.size() * sizeof(gid_t));
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, more.data(), &glen) != 0 && errno == ERANGE) {
    more.resize(glen / sizeof(gid_t) + 1);
    glen = static_cast<socklen_t>(more.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, more.data(), &glen) != 0) glen = 0;
  }
  more.resize(glen / sizeof(gid_t));
  groups.insert(groups.end(), more.begin(), more.end());
#endif
  for (gid_t g : groups) {
    const std::string name = group_name(g);
    if (!name.empty() && std::find(p.group_names.begin(), p.group_names.end(), name) == p.group_names.end())
      p.group_names.push_back(name);
  }
  return p;
}

}  // namespace cupool
