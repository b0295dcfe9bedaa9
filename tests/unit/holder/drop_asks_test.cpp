#include "holder/drop_asks.h"

#include <doctest/doctest.h>

using namespace cupool;

TEST_CASE("drop asks: ids, deadlines, overdue clients, closing") {
  DropAsks drops;
  drops.set_timeout_ms(100);
  const std::uint64_t first = drops.open(/*client=*/7, {1, 2}, /*now_ms=*/1000);
  const std::uint64_t second = drops.open(/*client=*/8, {3}, /*now_ms=*/1050);
  CHECK(first == 1);
  CHECK(second == 2);
  CHECK(drops.next_deadline() == 1100);
  CHECK(drops.overdue(1099).empty());
  CHECK(drops.overdue(1100) == std::vector<std::uint64_t>{7});
  CHECK(drops.overdue(2000) == std::vector<std::uint64_t>{7, 8});
  CHECK(drops.of(7) == std::vector<std::uint64_t>{first});
  REQUIRE(drops.find(first));
  CHECK(drops.find(first)->leases == std::set<std::uint64_t>{1, 2});
  CHECK(drops.close(first) == std::set<std::uint64_t>{1, 2});
  CHECK(drops.find(first) == nullptr);
  CHECK(drops.close(first).empty());  // closed once
  CHECK(drops.next_deadline() == 1150);
  drops.close(second);
  CHECK_FALSE(drops.next_deadline());
}

TEST_CASE("drop asks: a waiter is ready once all its asks are closed; a client's waiters go with it") {
  DropAsks drops;
  const std::uint64_t a = drops.open(1, {10}, 0);
  const std::uint64_t b = drops.open(2, {20}, 0);
  drops.wait(DropWaiter{5, 1, {a, b}, [] { return nlohmann::ordered_json{{"done", 1}}; }});
  drops.wait(DropWaiter{6, 2, {a}, [] { return nlohmann::ordered_json{{"done", 2}}; }});
  CHECK_FALSE(drops.take_ready());
  drops.close(a);
  std::optional<DropWaiter> ready = drops.take_ready();
  REQUIRE(ready);
  CHECK(ready->client == 6);
  CHECK(ready->then()["done"] == 2);
  CHECK_FALSE(drops.take_ready());
  drops.forget_waiters_of(5);
  drops.close(b);
  CHECK_FALSE(drops.take_ready());
}
