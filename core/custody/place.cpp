// Whose a keeper's socket path is: what the holder checks before it gives custody a descriptor,
// and the keeper before it takes the path (custody.h, unsafe_keeper_path; docs/security.md).
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "custody/custody.h"

namespace cupool::custody {

std::string describe_uid(uid_t uid) {
  std::string out = "uid " + std::to_string(uid);
  passwd pw{};
  passwd* found = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found && found->pw_name)
    out += std::string(" (") + found->pw_name + ")";
  return out;
}

std::string default_keeper_socket() {
  if (::geteuid() != 0)
    if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime && runtime[0] == '/')
      return std::string(runtime) + "/cupool/keeper.sock";
  return kDefaultKeeperSocket;
}

std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string unsafe_keeper_path(const std::string& path, uid_t self) {
  const std::string dir = directory_of(path);
  struct stat d {};
  if (::stat(dir.c_str(), &d) != 0) return "";  // nothing there yet: whoever makes it makes it theirs
  const auto mine = [self](uid_t owner) { return owner == self || owner == 0; };
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(d.st_mode & 07777));
  if (!mine(d.st_uid))
    return "its directory " + dir + " belongs to " + describe_uid(d.st_uid) + ", who could put another socket there";
  if ((d.st_mode & (S_IWGRP | S_IWOTH)) == 0) return "";
  if ((d.st_mode & S_ISVTX) == 0)
    return "its directory " + dir + " (mode " + mode +
           ") may be written by others and is not sticky: anyone "
           "could put another socket there";
  // A sticky directory (/tmp): only a file's owner may remove or rename it, so a socket that is
  // ours stays ours; one that is another user's was put there by that user.
  struct stat s {};
  if (::lstat(path.c_str(), &s) == 0 && !mine(s.st_uid))
    return "it belongs to " + describe_uid(s.st_uid) + " in the shared directory " + dir + " (mode " + mode + ")";
  return "";
}

}  // namespace cupool::custody
