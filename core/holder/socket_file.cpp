#include "holder/socket_file.h"

#include <fcntl.h>
#include <grp.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "base/lock_file.h"
#include "base/text.h"

namespace cupool {

SocketFile::SocketFile(const std::string& socket) : path_(socket), lock_path_(socket + ".lock") {
  // What listen() will need is checked here, before the holder creates anything.
  if (socket.size() >= sizeof(sockaddr_un::sun_path))
    throw Error(Errc::invalid_input, "socket path " + socket + " is longer than " +
                                         std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
  const std::string dir = socket.substr(0, socket.rfind('/') == std::string::npos ? 0 : socket.rfind('/'));
  if (!dir.empty()) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      if (::mkdir(dir.c_str(), 0755) != 0)
        throw Error(Errc::unreachable, "can't create the socket directory " + dir + ": " + errno_text() +
                                           " (create it, run as a user who may, or choose another path with --socket)");
    }
  }
  lock_ = std::make_unique<LockFile>(lock_path_, "holder", socket, 0644);
  if (!lock_->pid_error().empty()) spdlog::warn("can't write the pid into {}: {}", lock_path_, lock_->pid_error());
}

void SocketFile::listen(const HolderWant& h) {
  const std::string& socket = path_;
  sockaddr_un addr{};
  if (socket.size() >= sizeof(addr.sun_path))
    throw Error(Errc::invalid_input,
                "socket path " + socket + " is longer than " + std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket.c_str(), socket.size() + 1);

  // We hold the lock, so a socket file left here belongs to a holder that died: remove it.
  struct stat st {};
  if (::lstat(socket.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      throw Error(Errc::unreachable, socket + " exists and is not a socket; remove it or choose another --socket");
    spdlog::info("removing the stale socket {} left by a holder that did not stop cleanly", socket);
    if (::unlink(socket.c_str()) != 0)
      throw Error(Errc::unreachable, "can't remove the stale socket " + socket + ": " + errno_text());
  }
  listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!listener_) throw Error(Errc::unreachable, "socket: " + errno_text());
  // Nobody may connect before the mode and group are set.
  const mode_t old = ::umask(0177);
  const int rc = ::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  const int bind_errno = errno;
  ::umask(old);
  if (rc != 0)
    throw Error(Errc::unreachable, "can't bind " + socket + ": " + std::strerror(bind_errno) +
                                       " (is the directory writable by this user?)");
  // From here on, the socket file is changed through this descriptor (its inode), never through
  // the path: whoever can write the directory could put a link to another file there.
  file_.reset(::open(socket.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  struct stat made {};
  if (!file_ || ::fstat(file_.get(), &made) != 0 || !S_ISSOCK(made.st_mode) || made.st_uid != ::geteuid())
    throw Error(Errc::unreachable,
                socket + " was replaced while the holder made it; check who can write its directory");
  inode_ = made.st_ino;
  device_ = made.st_dev;
  set(h.mode, h.group);
  if (::listen(listener_.get(), 128) != 0) throw Error(Errc::unreachable, "listen: " + errno_text());
}

void SocketFile::set(unsigned mode, const std::string& group_name) {
  if (!file_) throw Error(Errc::internal, "the socket " + path_ + " is not made yet");
  gid_t gid = ::getegid();  // no group named: the holder's own, as a new socket has
  if (!group_name.empty()) {
    std::vector<char> buf(16384);
    group gr{};
    group* out = nullptr;
    if (getgrnam_r(group_name.c_str(), &gr, buf.data(), buf.size(), &out) != 0 || !out)
      throw Error(Errc::does_not_fit, "holder.group: no group named " + group_name + " on this node");
    gid = out->gr_gid;
  }
  if (::fchownat(file_.get(), "", static_cast<uid_t>(-1), gid, AT_EMPTY_PATH) != 0)
    throw Error(Errc::unreachable, "can't give " + path_ + " to group " +
                                       (group_name.empty() ? std::to_string(gid) : group_name) + ": " + errno_text());
  // chmod through /proc/self/fd reaches the inode this descriptor holds (there is no fchmod for an
  // O_PATH descriptor before Linux 6.6); a link planted at the path is not followed.
  const std::string self = "/proc/self/fd/" + std::to_string(file_.get());
  if (::chmod(self.c_str(), static_cast<mode_t>(mode)) != 0)
    throw Error(Errc::unreachable, "can't set the mode of " + path_ + ": " + errno_text() + " (is /proc mounted?)");
  // Read back: the answer says what is true of the file now.
  struct stat st {};
  if (::fstat(file_.get(), &st) != 0)
    throw Error(Errc::unreachable, "can't read back the mode of " + path_ + ": " + errno_text());
  if ((st.st_mode & 07777) != (mode & 07777) || st.st_gid != gid) {
    char want[8], got[8];
    std::snprintf(want, sizeof want, "%04o", mode & 07777);
    std::snprintf(got, sizeof got, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw Error(Errc::unreachable, path_ + " reads back mode " + got + " group " + std::to_string(st.st_gid) +
                                       " after setting " + want + (group_name.empty() ? "" : " " + group_name));
  }
  if (!still_at_path())
    spdlog::warn(
        "{} is no longer the holder's socket (it was replaced or removed); the holder's socket has mode {:04o}", path_,
        mode & 07777);
}

bool SocketFile::still_at_path() const {
  struct stat st {};
  return ::lstat(path_.c_str(), &st) == 0 && st.st_ino == inode_ && st.st_dev == device_;
}

void SocketFile::close() {
  if (!listener_) return;
  listener_.reset();
  // Only our own socket file is removed, not whatever was put at its path since.
  if (still_at_path()) ::unlink(path_.c_str());
  file_.reset();
}

}  // namespace cupool
