#include "base/text.h"

#include <doctest/doctest.h>

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
  CHECK(valid_utf8("so\x94"
                   "cket") ==
        "so\xef\xbf\xbd"
        "cket");
  CHECK(valid_utf8("\xc0\xaf") == "\xef\xbf\xbd\xef\xbf\xbd");                  // overlong
  CHECK(valid_utf8("\xed\xa0\x80") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // surrogate
  CHECK(valid_utf8("\xe2\x82") == "\xef\xbf\xbd\xef\xbf\xbd");                  // truncated
  CHECK(valid_utf8("\xf0\x9f\x98\x80") == "\xf0\x9f\x98\x80");
}

TEST_CASE("UTF-8: decoding, what shows as itself, and cutting at a character boundary") {
  std::uint32_t cp = 0;
  CHECK(decode_utf8("\xc3\xa9", 0, &cp) == 2);
  CHECK(cp == 0xe9);
  CHECK(decode_utf8("\xc0\xaf", 0, &cp) == 0);      // overlong
  CHECK(decode_utf8("\xed\xa0\x80", 0, &cp) == 0);  // surrogate
  CHECK(decode_utf8("\xe2\x82", 0, &cp) == 0);      // cut short
  CHECK(displays_as_is("kv-cache caf\xc3\xa9"));
  CHECK_FALSE(displays_as_is("a\tb"));
  CHECK_FALSE(displays_as_is("a\xc2\x85"));  // NEL (C1)
  CHECK_FALSE(
      displays_as_is("a\xe2\x80\xae"
                     "b"));  // RIGHT-TO-LEFT OVERRIDE
  CHECK_FALSE(displays_as_is("a\xff"));
  CHECK(safe_for_display("a\x1b[2Jb") == "a\xef\xbf\xbd[2Jb");
  CHECK(safe_for_display("x\xe2\x80\xaey") == "x\xef\xbf\xbdy");
  // A 64-byte cut of 63 ASCII bytes and an "é" (2 bytes) keeps the 63, not half of the é.
  const std::string name = std::string(63, 'a') + "\xc3\xa9";
  CHECK(utf8_prefix(name, 64) == std::string(63, 'a'));
  CHECK(utf8_prefix(name, 65) == name);
  CHECK(utf8_prefix("\xe6\x8e\xa8\xe7\x90\x86", 4) == "\xe6\x8e\xa8");
}
