// Whose a keeper's socket path is (core/custody/place.cpp): what the holder checks before it gives
// custody a descriptor, and the keeper before it takes the path (issue 34).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "base/error.h"
#include "custody/custody.h"
#include "custody/keeper.h"
#include "tests/unit/fixtures.h"

using namespace cupool;
using namespace cupool::custody;

namespace place_test {

constexpr uid_t kNobody = 65534;

// A new directory of `mode` (chmod, past the umask), owned by `owner` where that can be set.
std::string directory(const std::string& name, mode_t mode, uid_t owner = ::geteuid()) {
  const std::string dir = test::temp_path(name);
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  REQUIRE(::chmod(dir.c_str(), mode) == 0);
  if (owner != ::geteuid()) REQUIRE(::chown(dir.c_str(), owner, owner) == 0);
  return dir;
}

void file_of(const std::string& path, uid_t owner) {
  std::ofstream(path) << "x";
  if (owner != ::geteuid()) REQUIRE(::chown(path.c_str(), owner, owner) == 0);
}

}  // namespace place_test

using namespace place_test;

TEST_CASE("unsafe_keeper_path: a directory only its owner writes is safe; one others may write is not, unless sticky") {
  const uid_t self = ::geteuid();
  CHECK(unsafe_keeper_path(directory("private", 0700) + "/keeper.sock", self).empty());
  CHECK(unsafe_keeper_path(directory("shared-read", 0755) + "/keeper.sock", self).empty());
  CHECK(unsafe_keeper_path(test::temp_path("missing") + "/keeper.sock", self).empty());  // made by whoever comes
  const std::string open = directory("open", 0777);
  CHECK(unsafe_keeper_path(open + "/keeper.sock", self) ==
        "its directory " + open +
            " (mode 0777) may be written by others and is not sticky: anyone could put "
            "another socket there");
  CHECK(unsafe_keeper_path(directory("group", 0770) + "/k.sock", self).find("not sticky") != std::string::npos);
  const std::string sticky = directory("sticky", 01777);
  CHECK(unsafe_keeper_path(sticky + "/keeper.sock", self).empty());  // nothing there yet
  file_of(sticky + "/mine.sock", self);
  CHECK(unsafe_keeper_path(sticky + "/mine.sock", self).empty());
  if (self != 0) return;  // the rest gives files to another user
  file_of(sticky + "/theirs.sock", kNobody);
  CHECK(unsafe_keeper_path(sticky + "/theirs.sock", self) ==
        "it belongs to " + describe_uid(kNobody) + " in the shared directory " + sticky + " (mode 1777)");
  const std::string theirs = directory("theirs", 0755, kNobody);
  CHECK(unsafe_keeper_path(theirs + "/keeper.sock", self) ==
        "its directory " + theirs + " belongs to " + describe_uid(kNobody) + ", who could put another socket there");
  // A user other than root trusts root's directory too.
  CHECK(unsafe_keeper_path(directory("roots", 0755) + "/keeper.sock", kNobody).empty());
}

TEST_CASE("the keeper refuses a path it can't own safely, naming what is in the way") {
  const auto refusal = [](const std::string& socket) {
    KeeperOptions options;
    options.socket = socket;
    try {
      Keeper keeper(options);
    } catch (const Error& e) {
      CHECK(e.code() == Errc::unreachable);  // exit 4
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string open = directory("open", 0777);
  CHECK(refusal(open + "/keeper.sock").find("may be written by others and is not sticky") != std::string::npos);
  CHECK(refusal(directory("fine", 0700) + "/keeper.sock").empty());
  if (::geteuid() != 0) return;
  const std::string sticky = directory("sticky", 01777);
  file_of(sticky + "/keeper.sock.lock", kNobody);  // another user's lock: the keeper would be locked out
  const std::string why = refusal(sticky + "/keeper.sock");
  CHECK_MESSAGE(why.find(sticky + "/keeper.sock.lock belongs to " + describe_uid(kNobody)) != std::string::npos, why);
}

TEST_CASE("default_keeper_socket: root's in /run/cupool, another user's in $XDG_RUNTIME_DIR") {
  const char* before = std::getenv("XDG_RUNTIME_DIR");
  const std::string kept = before ? before : "";
  ::setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
  CHECK(default_keeper_socket() ==
        (::geteuid() == 0 ? std::string(kDefaultKeeperSocket) : std::string("/run/user/1000/cupool/keeper.sock")));
  ::unsetenv("XDG_RUNTIME_DIR");
  CHECK(default_keeper_socket() == kDefaultKeeperSocket);
  if (before) ::setenv("XDG_RUNTIME_DIR", kept.c_str(), 1);
  CHECK(directory_of("/run/cupool/keeper.sock") == "/run/cupool");
  CHECK(directory_of("keeper.sock") == ".");
  CHECK(directory_of("/keeper.sock") == "/");
}
