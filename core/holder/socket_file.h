// The holder's socket in the file system: its lock file (SOCKET.lock, holding the holder's pid:
// one holder per socket path; removed when the holder stops), the socket itself, and who may
// connect to it (mode and group).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "base/fd.h"
#include "base/lock_file.h"
#include "config/resolve.h"
#include "holder/holder.h"

namespace cupool {

class SocketFile final : public SocketPermissions {
 public:
  // Takes the lock of `socket` (creating the socket's directory if it is missing). Throws
  // Error(unreachable) when another holder holds it or the lock file can't be made.
  explicit SocketFile(const std::string& socket);
  SocketFile(const SocketFile&) = delete;
  SocketFile& operator=(const SocketFile&) = delete;
  // Removes the socket file and the lock file (the lock goes with the object).
  ~SocketFile() { close(); }

  // Binds the socket (a stale one left by a holder that died is removed: we hold the lock), gives
  // it `h`'s mode and group before anyone can connect, and listens. Throws cupool::Error.
  void listen(const HolderWant& h);
  // Gives the socket file the holder made `mode` and `group` ("": the holder's own group) and reads
  // them back, through the file it opened, never through the path. Throws cupool::Error.
  void set(unsigned mode, const std::string& group) override;
  // Stops listening and removes the socket file; new clients can no longer connect.
  void close();

  const std::string& path() const { return path_; }
  bool listening() const { return static_cast<bool>(listener_); }
  int fd() const { return listener_.get(); }

 private:
  // Whether the path still names the socket file the holder made.
  bool still_at_path() const;

  std::string path_;
  std::string lock_path_;
  std::unique_ptr<LockFile> lock_;
  Fd listener_;
  Fd file_;  // the socket file, O_PATH: what mode and group changes are made on
  ino_t inode_ = 0;
  dev_t device_ = 0;
};

}  // namespace cupool
