#include "holder/socket_file.h"

#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "base/error.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

namespace {

// A new folder of the unit tests' scratch folder (removed with all in it at exit, also after a failure).
struct ScratchDir {
  std::string path = test::temp_path("x");
  ScratchDir() { path.resize(path.rfind('/')); }
};

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("the lock file names the holder while it runs and goes when it stops") {
  ScratchDir dir;
  const std::string socket = dir.path + "/cupool.sock";
  {
    SocketFile file(socket);
    REQUIRE(exists(socket + ".lock"));
    std::ifstream lock(socket + ".lock");
    std::string pid;
    lock >> pid;
    CHECK(pid == std::to_string(::getpid()));
    // A second holder on the same path is refused while the first holds the lock.
    CHECK_THROWS_AS(SocketFile{socket}, Error);
    HolderWant want;
    want.mode = 0660;
    file.listen(want);
    CHECK(exists(socket));
  }
  CHECK_FALSE(exists(socket));
  CHECK_FALSE(exists(socket + ".lock"));  // a clean stop leaves nothing behind
  // And a holder that failed before it listened leaves no lock either.
  { SocketFile failed(socket); }
  CHECK_FALSE(exists(socket + ".lock"));
}

TEST_CASE("a holder removes only its own lock file") {
  ScratchDir dir;
  const std::string socket = dir.path + "/cupool.sock";
  auto first = std::make_unique<SocketFile>(socket);
  // The file was removed and another holder took a lock on a new one (a lock on a removed file
  // is no lock: SocketFile checks the file it locked is the one at the path).
  REQUIRE(::unlink((socket + ".lock").c_str()) == 0);
  SocketFile second(socket);
  first.reset();  // the first stops: the second's lock file stays
  CHECK(exists(socket + ".lock"));
  CHECK_THROWS_AS(SocketFile{socket}, Error);
}
