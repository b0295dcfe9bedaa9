// How the holder writes what it holds (core/holder/names.cpp): the names a request may use, the
// locations and lists in the config's words, and the times it stamps.
#include "holder/names.h"

#include <doctest/doctest.h>

#include <regex>
#include <string>
#include <vector>

namespace cupool::names_test {

TEST_CASE("valid_name: lower case letters and digits first, then . _ - too, at most kMaxName bytes") {
  for (const char* ok : {"kv", "kv-cache", "a", "0", "weights.v2", "pool_1", "x-"}) CHECK_MESSAGE(valid_name(ok), ok);
  for (const char* bad : {"", "KV", "-kv", ".kv", "_kv", "kv cache", "kv/cache", "kv\n", "kvé"})
    CHECK_MESSAGE(!valid_name(bad), bad);
  CHECK(valid_name(std::string(kMaxName, 'a')));
  CHECK_FALSE(valid_name(std::string(kMaxName + 1, 'a')));
}

TEST_CASE("location_text: as the config writes a pool's location") {
  PoolProps p;
  CHECK(location_text(p) == "device");
  p.location = PoolProps::Location::host;
  CHECK(location_text(p) == "host");
  p.location = PoolProps::Location::host_numa;
  p.location_id = 3;
  CHECK(location_text(p) == "host_numa:3");
}

TEST_CASE("list_text: a bracketed list, comma and space between") {
  CHECK(list_text({}) == "[]");
  CHECK(list_text({1}) == "[1]");
  CHECK(list_text({0, 2, 7}) == "[0, 2, 7]");
}

TEST_CASE("iso_now: UTC, to the second; now_s: steady, never backwards") {
  const std::string t = iso_now();
  CHECK_MESSAGE(std::regex_match(t, std::regex(R"(20\d\d-[01]\d-[0-3]\dT[0-2]\d:[0-5]\d:[0-6]\dZ)")), t);
  const std::int64_t a = now_s();
  const std::int64_t b = now_s();
  CHECK(b >= a);
}

}  // namespace cupool::names_test
