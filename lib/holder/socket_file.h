// The holder's socket in the file system: its lock file (SOCKET.lock, holding the holder's pid:
// one holder per socket path), the socket itself, and who may connect to it (mode and group).
#pragma once

#include <string>

#include "base/fd.h"
#include "config/resolve.h"

namespace cupool {

class SocketFile {
 public:
  // Takes the lock of `socket` (creating the socket's directory if it is missing). Throws
  // Error(unreachable) when another holder holds it or the lock file can't be made.
  explicit SocketFile(const std::string& socket);
  SocketFile(const SocketFile&) = delete;
  SocketFile& operator=(const SocketFile&) = delete;
  // Removes the socket file (the lock goes with the object).
  ~SocketFile() { close(); }

  // Binds the socket (a stale one left by a holder that died is removed: we hold the lock), gives
  // it `h`'s mode and group before anyone can connect, and listens. Throws cupool::Error.
  void listen(const HolderWant& h);
  // Gives the socket `h`'s mode and group. Throws cupool::Error.
  void set_permissions(const HolderWant& h);
  // Stops listening and removes the socket file; new clients can no longer connect.
  void close();

  const std::string& path() const { return path_; }
  bool listening() const { return static_cast<bool>(listener_); }
  int fd() const { return listener_.get(); }

 private:
  std::string path_;
  std::string lock_path_;
  Fd lock_;
  Fd listener_;
};

}  // namespace cupool
