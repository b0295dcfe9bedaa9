#include "holder/client_table.h"

#include <doctest/doctest.h>

#include <string>

#include "base/error.h"

using namespace cupool;

namespace client_table_test {

Peer person(std::uint32_t uid, std::string user) {
  Peer p;
  p.pid = 4242;
  p.uid = uid;
  p.gid = uid;
  p.user = std::move(user);
  return p;
}

// The message a connection was refused with ("" when it was not).
std::string refused(ClientTable& table, const Peer& p) {
  try {
    table.connect(p);
  } catch (const Error& e) {
    return e.wire_code() + std::string(": ") + e.what();
  }
  return "";
}

}  // namespace client_table_test

using namespace client_table_test;

TEST_CASE("client table: ids from 1, admins by uid, unknown connections") {
  ClientTable table{/*self_uid=*/1000, HolderLimits{}};
  CHECK(table.connect(person(2001, "alice")) == 1);
  CHECK(table.connect(person(0, "root")) == 2);
  CHECK(table.connect(person(1000, "holder")) == 3);
  CHECK_FALSE(table.admin(1));
  CHECK(table.admin(2));
  CHECK(table.admin(3));
  CHECK_FALSE(table.admin(99));
  CHECK(table.at(1).peer.user == "alice");
  CHECK(table.find(99) == nullptr);
  CHECK_THROWS_AS(table.at(99), Error);
  table.erase(1);
  CHECK(table.size() == 2);
  CHECK(table.connect(person(2001, "alice")) == 4);  // ids are never reused
}

TEST_CASE("client table: per-user limit for all but admins, and the admins' reserve") {
  HolderLimits limits;
  limits.max_clients = 4;
  limits.max_clients_per_user = 2;
  limits.admin_reserve = 1;
  ClientTable table{/*self_uid=*/1000, limits};
  table.connect(person(2001, "alice"));
  const std::uint64_t second = table.connect(person(2001, "alice"));
  CHECK(refused(table, person(2001, "alice")) ==
        "limit_exceeded: the holder serves at most 2 connections per user, and user alice (uid 2001) has them all");
  table.erase(second);
  CHECK(refused(table, person(2001, "alice")).empty());
  table.connect(person(0, "root"));
  table.connect(person(0, "root"));  // admins have no per-user limit
  CHECK(refused(table, person(2002, "bob")) == "limit_exceeded: the holder serves at most 4 connections");
  CHECK(refused(table, person(1000, "holder")).empty());
  CHECK(refused(table, person(0, "root")) ==
        "limit_exceeded: the holder serves at most 4 connections (and 1 more for admins)");
}
