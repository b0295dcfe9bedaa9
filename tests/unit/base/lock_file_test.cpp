// The lock file beside a socket (core/base/lock_file.cpp): one owner at a time, its pid inside,
// removed when the owner stops; every refusal names the file or the socket.
#include "base/lock_file.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "base/error.h"
#include "tests/unit/fixtures.h"

namespace cupool::lock_file_test {

std::string contents(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// The message of the Error that taking `path` throws ("" when it is taken), checking its code.
std::string refusal(const std::string& path, const std::string& owner = "holder",
                    const std::string& socket = "/run/x.sock") {
  try {
    LockFile lock(path, owner, socket, 0600);
  } catch (const Error& e) {
    CHECK(e.code() == Errc::unreachable);
    return e.what();
  }
  return "";
}

TEST_CASE("lock_file: taking a lock makes the file, writes the owner's pid, and removes the file when released") {
  const std::string path = test::temp_path("x.sock.lock");
  {
    LockFile lock(path, "holder", "/run/x.sock", 0600);
    CHECK(lock.path() == path);
    CHECK(lock.pid_error().empty());
    CHECK(contents(path) == std::to_string(::getpid()) + "\n");
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK(S_ISREG(st.st_mode));
    CHECK((st.st_mode & 0777) == 0600);
  }
  CHECK_FALSE(exists(path));
  // Released: the next owner takes it.
  LockFile again(path, "holder", "/run/x.sock", 0600);
  CHECK(exists(path));
}

TEST_CASE("lock_file: a second taker is refused, naming the owner's kind, its pid and the socket") {
  const std::string path = test::temp_path("x.sock.lock");
  auto first = std::make_unique<LockFile>(path, "keeper", "/run/keeper.sock", 0600);
  CHECK(refusal(path, "keeper", "/run/keeper.sock") == "another keeper (pid " + std::to_string(::getpid()) +
                                                           ") is serving /run/keeper.sock; stop it first, or use "
                                                           "another --socket");
  // The refused taker leaves the owner's file alone.
  CHECK(contents(path) == std::to_string(::getpid()) + "\n");
  first.reset();
  CHECK(refusal(path).empty());
}

TEST_CASE("lock_file: a pid that is not digits is left out of the refusal") {
  const std::string path = test::temp_path("x.sock.lock");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, "oops\n", 5) == 5);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  CHECK(refusal(path) == "another holder is serving /run/x.sock; stop it first, or use another --socket");
  ::close(fd);  // the lock goes with the last descriptor
  CHECK(refusal(path).empty());
}

TEST_CASE("lock_file: an owner that died without removing its file does not hold the lock") {
  const std::string path = test::temp_path("x.sock.lock");
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Takes the lock and exits without the destructor (as a killed owner would: _exit unwinds nothing).
    try {
      LockFile lock(path, "holder", "/run/x.sock", 0600);
      ::_exit(0);
    } catch (...) {
      ::_exit(1);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK(contents(path) == std::to_string(child) + "\n");  // its file stays
  LockFile lock(path, "holder", "/run/x.sock", 0600);
  CHECK(contents(path) == std::to_string(::getpid()) + "\n");
}

TEST_CASE("lock_file: a lock held by another process is refused with that process's pid") {
  const std::string path = test::temp_path("x.sock.lock");
  int ready[2];
  int done[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(done) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    char byte = 0;
    try {
      LockFile lock(path, "holder", "/run/x.sock", 0600);
      byte = 1;
      (void)!::write(ready[1], &byte, 1);
      (void)!::read(done[0], &byte, 1);  // holds the lock until the parent has tried
    } catch (...) {
      (void)!::write(ready[1], &byte, 1);
      ::_exit(1);
    }
    ::_exit(0);
  }
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  CHECK(byte == 1);
  const std::string message = refusal(path);
  const char go = 0;
  REQUIRE(::write(done[1], &go, 1) == 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  for (int fd : {ready[0], ready[1], done[0], done[1]}) ::close(fd);
  CHECK(message == "another holder (pid " + std::to_string(child) +
                       ") is serving /run/x.sock; stop it first, or use another --socket");
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_FALSE(exists(path));  // the child removed its file when it stopped
}

TEST_CASE("lock_file: a file that can't be made, or is not a regular file, is refused naming the file") {
  SUBCASE("no such directory") {
    const std::string path = test::temp_path("missing") + "/x.sock.lock";
    CHECK(refusal(path) ==
          "can't open the lock file " + path + ": No such file or directory (is the socket directory writable?)");
  }
  SUBCASE("a FIFO") {
    const std::string path = test::temp_path("x.sock.lock");
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    CHECK(refusal(path) == "the lock file " + path + " is not a regular file; remove it, or choose another --socket");
    CHECK(exists(path));  // not removed by the refusal
  }
  SUBCASE("a symbolic link is not followed") {
    const std::string target = test::temp_path("target");
    std::ofstream(target) << "keep";
    const std::string path = test::temp_path("x.sock.lock");
    REQUIRE(::symlink(target.c_str(), path.c_str()) == 0);
    const std::string message = refusal(path);
    CHECK(message.rfind("can't open the lock file " + path + ": ", 0) == 0);
    CHECK(contents(target) == "keep");  // not truncated through the link
  }
}

TEST_CASE("lock_file: a file put in the lock's place is not removed by the owner that stops") {
  const std::string path = test::temp_path("x.sock.lock");
  {
    LockFile lock(path, "holder", "/run/x.sock", 0600);
    REQUIRE(::unlink(path.c_str()) == 0);
    std::ofstream(path) << "another owner's\n";
  }
  CHECK(contents(path) == "another owner's\n");
}

}  // namespace cupool::lock_file_test
