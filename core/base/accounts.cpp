#include "base/accounts.h"

#include <grp.h>
#include <pwd.h>

#include <cerrno>
#include <vector>

namespace cupool {

namespace {

// getpwnam_r / getgrnam_r with a buffer that grows while the entry does not fit (ERANGE).
template <typename Entry, typename Lookup>
bool exists(const std::string& name, Lookup lookup) {
  if (name.empty()) return false;
  std::vector<char> buf(16384);
  while (true) {
    Entry entry{};
    Entry* out = nullptr;
    const int rc = lookup(name.c_str(), &entry, buf.data(), buf.size(), &out);
    if (rc == ERANGE && buf.size() < (1u << 20)) {
      buf.resize(buf.size() * 2);
      continue;
    }
    if (out) return true;
    // 0 and ENOENT, ESRCH, EBADF, EPERM: the name is not there (getpwnam_r(3), "RETURN VALUE").
    return !(rc == 0 || rc == ENOENT || rc == ESRCH || rc == EBADF || rc == EPERM);
  }
}

}  // namespace

bool user_exists(const std::string& name) { return exists<passwd>(name, getpwnam_r); }

bool group_exists(const std::string& name) { return exists<group>(name, getgrnam_r); }

}  // namespace cupool
