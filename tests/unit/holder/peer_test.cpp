// Who is on the other end of a connection (core/holder/peer.cpp): what the kernel says of a socket's
// peer, with the names the holder's share lists are matched against.
#include "holder/peer.h"

#include <doctest/doctest.h>
#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

namespace cupool::peer_test {

TEST_CASE("peer_of: this process, as the kernel sees it across a socket pair") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  const Peer p = peer_of(fds[0]);
  ::close(fds[0]);
  ::close(fds[1]);
  CHECK(p.pid == ::getpid());
  CHECK(p.uid == ::geteuid());
  CHECK(p.gid == ::getegid());
  if (const passwd* me = ::getpwuid(::geteuid())) CHECK(p.user == me->pw_name);
  if (const group* mine = ::getgrgid(::getegid())) {
    REQUIRE_FALSE(p.group_names.empty());
    CHECK(p.group_names[0] == mine->gr_name);  // the primary group first
  }
  // Each group once, though the primary one is among the supplementary ones too.
  CHECK(std::set<std::string>(p.group_names.begin(), p.group_names.end()).size() == p.group_names.size());
}

TEST_CASE("peer_of: a descriptor that is no connected socket is refused, saying which question failed") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  try {
    peer_of(fds[0]);
    FAIL("expected std::runtime_error");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).rfind("SO_PEERCRED: ", 0) == 0);
  }
  ::close(fds[0]);
  ::close(fds[1]);
}

}  // namespace cupool::peer_test
