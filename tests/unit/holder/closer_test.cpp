#include "holder/closer.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

using namespace cupool;

namespace {

// Waits up to `seconds` for the closer to have nothing pending.
bool drained(const Closer& closer, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (closer.pending() != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Whether the write end of the pipe whose read end is `fd` is closed everywhere (read sees EOF).
bool writer_closed(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) != 1) return false;
  char c = 0;
  return ::read(fd, &c, 1) == 0;
}

}  // namespace

// The holder's one part with threads of its own: each user's descriptors are closed on that user's
// thread. Run under ThreadSanitizer too (scripts/test.sh), with several threads handing over.
TEST_CASE("Closer: descriptors handed over by several threads for several users are all closed") {
  Closer closer;
  constexpr int kThreads = 4;
  constexpr int kEach = 64;
  constexpr uid_t kUsers = 3;
  std::mutex mu;
  std::vector<int> readers;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        int p[2];
        if (::pipe2(p, O_CLOEXEC) != 0) {
          ++failures;
          continue;
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          readers.push_back(p[0]);
        }
        closer.close(static_cast<uid_t>(1000 + static_cast<uid_t>(t + i) % kUsers), p[1]);
        (void)closer.pending(static_cast<uid_t>(1000 + static_cast<uid_t>(i) % kUsers));
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(failures == 0);
  REQUIRE(readers.size() == kThreads * kEach);
  CHECK(drained(closer, 10));
  for (uid_t u = 0; u < kUsers; ++u) CHECK(closer.pending(1000 + u) == 0);
  int open_writers = 0;
  for (int fd : readers) {
    if (!writer_closed(fd)) ++open_writers;
    ::close(fd);
  }
  CHECK(open_writers == 0);
}

TEST_CASE("Closer: a negative descriptor is ignored; a user's thread comes back after it ended") {
  Closer closer;
  closer.close(1000, -1);
  CHECK(closer.pending() == 0);
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  closer.close(1000, p[1]);
  CHECK(drained(closer, 10));
  CHECK(writer_closed(p[0]));
  ::close(p[0]);
  // A thread stays a second for more, then ends; a later descriptor starts another.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  closer.close(1000, p[1]);
  CHECK(drained(closer, 10));
  CHECK(writer_closed(p[0]));
  ::close(p[0]);
}

TEST_CASE("Closer: make_close_quick leaves what is not a socket alone and sets SO_LINGER {1, 0} on one") {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  Closer::make_close_quick(p[0]);  // not a socket: nothing to do, nothing fails
  ::close(p[0]);
  ::close(p[1]);
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  Closer::make_close_quick(sv[0]);
  linger l{};
  socklen_t len = sizeof l;
  REQUIRE(::getsockopt(sv[0], SOL_SOCKET, SO_LINGER, &l, &len) == 0);
  CHECK(l.l_onoff == 1);
  CHECK(l.l_linger == 0);
  ::close(sv[0]);
  ::close(sv[1]);
}
