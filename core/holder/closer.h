// Closing what a peer controls, away from the serving thread. close() can wait on the peer: a TCP
// socket it sent with SO_LINGER waits out the linger time, a file on its FUSE mount waits for its
// daemon, and a connection socket with descriptors still queued in it closes those too. So the
// holder hands every connection socket and every descriptor a peer sent to a Closer, which closes
// them on a thread of the peer's user: one user's stuck close holds up only that user.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

namespace cupool {

class Closer {
 public:
  Closer();
  // Leaves threads that are still waiting in close() to end with the process.
  ~Closer();
  Closer(const Closer&) = delete;
  Closer& operator=(const Closer&) = delete;

  // Closes `fd` on `uid`'s thread (started when needed). Takes ownership of `fd`.
  void close(uid_t uid, int fd);
  // Descriptors of `uid` handed over and not closed yet; and of all users.
  std::size_t pending(uid_t uid) const;
  std::size_t pending() const;

  // Makes closing a socket `fd` quick: SO_LINGER {on, 0 s}, so close() resets the connection
  // instead of waiting for unsent data. Does nothing to other kinds of file.
  static void make_close_quick(int fd) noexcept;

  struct State;  // (defined in closer.cpp; shared with the threads)

 private:
  std::shared_ptr<State> state_;  // shared with the threads, which may outlive this object
};

}  // namespace cupool
