// This node's users and groups looked up by name (core/base/accounts.cpp): what check's holder.group
// and share lists are judged by.
#include "base/accounts.h"

#include <doctest/doctest.h>
#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <string>

namespace cupool::accounts_test {

// No node has these: a name service may take names this long, but nobody picks them.
const std::string kUnknown = "cupool-no-such-account-7f3a9c";

TEST_CASE("accounts: root is a user and a group on every node") {
  CHECK(user_exists("root"));
  CHECK(group_exists("root"));
}

TEST_CASE("accounts: the user and the group this test runs as exist by name") {
  const passwd* me = ::getpwuid(::geteuid());
  REQUIRE_MESSAGE(me, "this test's user has no name on this node");
  CHECK(user_exists(me->pw_name));
  const group* mine = ::getgrgid(::getegid());
  REQUIRE_MESSAGE(mine, "this test's group has no name on this node");
  CHECK(group_exists(mine->gr_name));
}

TEST_CASE("accounts: a name nobody has, and no name at all, do not exist") {
  CHECK_FALSE(user_exists(kUnknown));
  CHECK_FALSE(group_exists(kUnknown));
  CHECK_FALSE(user_exists(""));
  CHECK_FALSE(group_exists(""));
  // A uid written as a number is not a name.
  CHECK_FALSE(user_exists("0"));
  CHECK_FALSE(group_exists("0"));
}

TEST_CASE("accounts: users and groups are looked up apart") {
  // A group of a name no user has: the first of this node's groups that is not also a user.
  std::string group_only;
  ::setgrent();
  while (const group* g = ::getgrent()) {
    if (!::getpwnam(g->gr_name)) {
      group_only = g->gr_name;
      break;
    }
  }
  ::endgrent();
  if (group_only.empty()) return;  // every group here is also a user's name
  CHECK(group_exists(group_only));
  CHECK_FALSE(user_exists(group_only));
}

}  // namespace cupool::accounts_test
