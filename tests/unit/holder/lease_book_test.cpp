#include "holder/lease_book.h"

#include <doctest/doctest.h>

using namespace cupool;

namespace lease_book_test {

bool same(const model::LeaseTotals& a, const model::LeaseTotals& b) {
  return a.lease_count == b.lease_count && a.leased_bytes == b.leased_bytes && a.cached_count == b.cached_count &&
         a.cached_bytes == b.cached_bytes;
}

}  // namespace lease_book_test

using namespace lease_book_test;

TEST_CASE("lease book: ids from 1, totals per pool and in all, release") {
  LeaseBook book;
  const LeaseBook::PoolKey a{"a", 0}, b{"b", 1};
  CHECK(book.grant(/*client=*/7, a, 100, 0x1000) == 1);
  CHECK(book.grant(/*client=*/8, a, 50, 0x2000) == 2);
  CHECK(book.grant(/*client=*/7, b, 10, 0x3000) == 3);
  CHECK(same(book.of(a), {2, 150, 0, 0}));
  CHECK(same(book.of(b), {1, 10, 0, 0}));
  CHECK(same(book.of({"c", 0}), {}));
  CHECK(book.clients_of(a) == 2);
  CHECK(book.count() == 3);
  CHECK(book.bytes() == 160);
  CHECK(book.ids() == std::vector<std::uint64_t>{1, 2, 3});
  REQUIRE(book.find(2));
  CHECK(book.find(2)->client == 8);
  CHECK(book.find(2)->address == 0x2000);

  const std::optional<Lease> gone = book.release(1);
  REQUIRE(gone);
  CHECK(gone->size == 100);
  CHECK_FALSE(book.release(1));  // released once
  CHECK(book.find(1) == nullptr);
  CHECK(same(book.of(a), {1, 50, 0, 0}));
  CHECK(book.clients_of(a) == 1);
  CHECK(book.grant(7, a, 1, 0x4000) == 4);  // ids are not reused
}

TEST_CASE("lease book: cached leases, their totals and the asks that want them back") {
  LeaseBook book;
  const LeaseBook::PoolKey a{"a", 0};
  book.grant(7, a, 100, 0x1000);
  book.grant(7, a, 30, 0x2000);
  book.cache(1);
  book.cache(1);  // cached once
  book.cache(2);
  CHECK(same(book.of(a), {2, 130, 2, 130}));
  CHECK(book.cached_count() == 2);
  CHECK(book.cached_bytes() == 130);

  book.ask(1, /*ask=*/5);
  book.ask(2, /*ask=*/5);
  book.forget_ask(2, /*ask=*/6);  // another ask's: kept
  CHECK(book.at(2).ask == 5);
  book.forget_ask(2, 5);
  CHECK(book.at(2).ask == 0);

  CHECK(book.uncache(1) == 5);  // the ask that wanted it, no longer named
  CHECK(book.at(1).ask == 0);
  CHECK_FALSE(book.at(1).cached);
  CHECK(book.uncache(1) == 0);  // not cached
  CHECK(book.uncache(99) == 0);
  CHECK(same(book.of(a), {2, 130, 1, 30}));

  book.uncache(2);
  book.release(2);
  book.release(1);
  CHECK(same(book.of(a), {}));
  CHECK(book.count() == 0);
  CHECK(book.cached_bytes() == 0);
}
