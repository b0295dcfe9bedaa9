#include <doctest/doctest.h>

#include "base/text.h"

using namespace cupool;

TEST_CASE("edit_distance") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("abc", "abc") == 0);
  CHECK(edit_distance("relase_threshold", "release_threshold") == 1);
  CHECK(edit_distance("kitten", "sitting") == 3);
}

TEST_CASE("did_you_mean picks a close candidate or nothing") {
  const std::vector<std::string> keys{"name", "devices", "max_size", "release_threshold", "reserve"};
  CHECK(did_you_mean("max_sise", keys) == "max_size");
  CHECK(did_you_mean("relase_threshold", keys) == "release_threshold");
  CHECK(did_you_mean("Devices", keys) == "devices");
  CHECK(did_you_mean("colour", keys).empty());
}

TEST_CASE("list_or") {
  CHECK(list_or({}) == "");
  CHECK(list_or({"a"}) == "a");
  CHECK(list_or({"a", "b", "c"}) == "a, b or c");
}

TEST_CASE("valid_utf8 keeps UTF-8 and replaces everything else") {
  CHECK(valid_utf8("plain") == "plain");
  CHECK(valid_utf8("caf\xc3\xa9") == "caf\xc3\xa9");
  CHECK(valid_utf8("so\x94" "cket") == "so\xef\xbf\xbd" "cket");
  CHECK(valid_utf8("\xc0\xaf") == "\xef\xbf\xbd\xef\xbf\xbd");      // overlong
  CHECK(valid_utf8("\xed\xa0\x80") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // surrogate
  CHECK(valid_utf8("\xe2\x82") == "\xef\xbf\xbd\xef\xbf\xbd");      // truncated
  CHECK(valid_utf8("\xf0\x9f\x98\x80") == "\xf0\x9f\x98\x80");
}
