// A lock file beside a socket (SOCKET.lock): flock'ed for as long as its owner (the holder, the
// keeper) runs, holding the owner's pid, and removed when the owner stops. One owner per socket.
#pragma once

#include <sys/types.h>

#include <string>

#include "base/fd.h"

namespace cupool {

class LockFile {
 public:
  // Takes the lock of `path` for an owner of kind `owner` ("holder") that serves `socket`.
  // Throws Error(unreachable) when another owner holds it ("another holder (pid N) is serving
  // SOCKET; ...") or the file can't be made or is not a regular file. A file removed by the owner
  // that had it, after it was opened here, is opened again: a lock on a removed file is no lock.
  LockFile(std::string path, const std::string& owner, const std::string& socket, mode_t mode);
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;
  // Removes the file while it is still locked, and only if it is still the one at the path.
  ~LockFile();
  const std::string& path() const { return path_; }
  // Why the owner's pid could not be written into the file ("" when it was): for the owner's log.
  const std::string& pid_error() const { return pid_error_; }

 private:
  // Opens and locks the file; false when the file locked is no longer the one at the path.
  bool take(const std::string& owner, const std::string& socket, mode_t mode);

  std::string path_;
  Fd fd_;
  std::string pid_error_;
};

}  // namespace cupool
