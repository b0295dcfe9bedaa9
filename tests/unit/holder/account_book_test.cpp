#include "holder/account_book.h"

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>

#include "config/load.h"
#include "device/sim_backend.h"
#include "holder/holder.h"
#include "tests/unit/fixtures.h"
#include "tests/unit/holder/requests.h"

using namespace cupool;

namespace account_book_test {

using Clock = std::chrono::steady_clock;

// A name service that takes 20 ms a lookup (a directory service), and counts them.
struct SlowNames {
  int calls = 0;
  AccountBook::Lookup lookup() {
    return [this](const std::string& name) {
      ++calls;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return name.rfind("known", 0) == 0;
    };
  }
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace account_book_test

using namespace account_book_test;

TEST_CASE("account book: a peer's lookups are bounded in time, answers are kept, admins are not bounded") {
  SlowNames names;
  AccountBook book(names.lookup(), names.lookup(), AccountBook::Limits{});
  const auto start = Clock::now();
  int unknown = 0;
  for (int i = 0; i < 64; ++i) unknown += book.user_exists(1001, false, "nobody-" + std::to_string(i)) ? 0 : 1;
  // 100 ms of lookups at 20 ms each, then names count as existing without a lookup.
  CHECK(names.calls <= 6);
  CHECK(unknown == names.calls);
  CHECK(book.skipped() == 64U - static_cast<unsigned>(names.calls));
  CHECK(seconds_since(start) < 0.3);
  // Kept: asking again costs nothing, for anyone.
  const int calls = names.calls;
  CHECK_FALSE(book.user_exists(1002, false, "nobody-0"));
  CHECK(names.calls == calls);
  // Another peer has its own time; an admin is not bounded.
  CHECK(book.group_exists(1002, false, "known-group"));
  CHECK(names.calls == calls + 1);
  for (int i = 0; i < 10; ++i) CHECK_FALSE(book.user_exists(0, true, "admin-asks-" + std::to_string(i)));
  CHECK(names.calls == calls + 11);
}

TEST_CASE("account book: a peer's time comes back as time passes") {
  SlowNames names;
  AccountBook::Limits limits;
  limits.burst = std::chrono::milliseconds(30);
  limits.per_second = std::chrono::milliseconds(100);
  AccountBook book(names.lookup(), names.lookup(), limits);
  for (int i = 0; i < 10; ++i) (void)book.user_exists(1001, false, "a" + std::to_string(i));
  const int spent = names.calls;
  CHECK(spent <= 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // 40 ms back
  for (int i = 0; i < 10; ++i) (void)book.user_exists(1001, false, "b" + std::to_string(i));
  CHECK(names.calls > spent);
  CHECK(names.calls <= spent + 3);
}

TEST_CASE("account book: a plan from any peer naming 64 accounts holds the serving thread briefly") {
  // Issue 34: 64 lookups of 20 ms each held every client 1.3 s per plan.
  SimBackend sim{test::two_gpu_node()};
  Holder holder{sim, test::two_gpu_node(), /*self_uid=*/1000};
  SlowNames names;
  holder.set_account_book(AccountBook(names.lookup(), names.lookup(), AccountBook::Limits{}));
  std::string config =
      "version: 1\npools:\n  - name: kv\n    devices: [0]\n    handle_types: [posix_fd]\n"
      "    share: {users: [";
  for (int i = 0; i < 64; ++i) config += (i ? ", u" : "u") + std::to_string(i);
  config += "]}\n";
  Peer eve;
  eve.pid = 4242;
  eve.uid = 1001;
  eve.user = "eve";
  const std::uint64_t id = holder.connect(eve);
  test::call(holder, id, {{"op", "hello"}, {"protocol", proto::kProtocol}});
  for (int round = 0; round < 3; ++round) {
    const auto start = Clock::now();
    const Json reply = test::call(holder, id, {{"op", "plan"}, {"config", config}});
    CHECK(reply.contains("changes"));
    CHECK(seconds_since(start) < 0.3);
  }
  CHECK(names.calls <= 6);
}
