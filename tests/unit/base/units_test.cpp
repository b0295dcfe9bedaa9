#include "base/units.h"

#include <doctest/doctest.h>

using namespace cupool;

TEST_CASE("parse_size: binary and decimal units") {
  CHECK(parse_size("4096B") == 4096u);
  CHECK(parse_size("1KiB") == 1024u);
  CHECK(parse_size("32GiB") == 32ULL << 30);
  CHECK(parse_size("2TiB") == 2ULL << 40);
  CHECK(parse_size("500MB") == 500000000u);
  CHECK(parse_size("1.5 GiB") == 3ULL << 29);
  CHECK(parse_size("0B") == 0u);
}

TEST_CASE("parse_size: refusals say why") {
  std::string why;
  CHECK_FALSE(parse_size("1024", &why));
  CHECK(why.find("needs a unit") != std::string::npos);
  CHECK_FALSE(parse_size("32G", &why));
  CHECK(why.find("unknown unit 'G'") != std::string::npos);
  CHECK_FALSE(parse_size("32gib", &why));
  CHECK_FALSE(parse_size("-1GiB", &why));
  CHECK_FALSE(parse_size("1.5B", &why));
  CHECK(why.find("whole number of bytes") != std::string::npos);
  CHECK_FALSE(parse_size("32  GiB", &why));  // one space at most
  CHECK_FALSE(parse_size("1.GiB", &why));
  CHECK_FALSE(parse_size("", &why));
  CHECK_FALSE(parse_size("16777216TiB", &why));  // 2^64
  CHECK(why.find("too large") != std::string::npos);
  CHECK(parse_size("16777215TiB") == 16777215ULL << 40);
}

TEST_CASE("parse_percent") {
  CHECK(parse_percent("75%") == doctest::Approx(0.75));
  CHECK(parse_percent("12.5%") == doctest::Approx(0.125));
  CHECK(parse_percent("100%") == doctest::Approx(1.0));
  CHECK_FALSE(parse_percent("0%"));
  CHECK_FALSE(parse_percent("150%"));
  CHECK_FALSE(parse_percent("75"));
  CHECK_FALSE(parse_percent("%"));
  CHECK_FALSE(parse_percent(".5%"));
}

TEST_CASE("format_bytes") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1 KiB");
  CHECK(format_bytes(32ULL << 30) == "32 GiB");
  CHECK(format_bytes(3ULL << 29) == "1.5 GiB");
}

TEST_CASE("a release threshold is its bytes, said as a config wrote it") {
  const ReleaseThreshold unset;  // the driver's default
  CHECK(unset.bytes() == 0);
  CHECK(unset.written().empty());
  CHECK(unset.text() == "0B");
  // Unwritten: the bytes as a config would write them, exactly.
  CHECK(ReleaseThreshold(512ULL << 20).text() == "512MiB");
  CHECK(ReleaseThreshold((512ULL << 20) + 1).text() == "536870913B");
  // Written: as written; bytes_text() still says the bytes.
  const ReleaseThreshold share(48ULL << 30, "75%");
  CHECK(share.text() == "75%");
  CHECK(share.written() == "75%");
  CHECK(share.bytes_text() == "48GiB");
  CHECK_FALSE(share.is_max());
  // Max: UINT64_MAX bytes, said max however it was written.
  const ReleaseThreshold max = ReleaseThreshold::max();
  CHECK(max.is_max());
  CHECK(max.bytes() == UINT64_MAX);
  CHECK(max.text() == "max");
  CHECK(ReleaseThreshold(UINT64_MAX, "max").text() == "max");
  CHECK(ReleaseThreshold(UINT64_MAX, "18446744073709551615B").text() == "max");
  CHECK(ReleaseThreshold(UINT64_MAX, "18446744073709551615B").written() == "18446744073709551615B");
}

TEST_CASE("release thresholds are equal when their bytes are") {
  // 75% and 48GiB of a 64 GiB device are one threshold.
  CHECK(ReleaseThreshold(48ULL << 30, "75%") == ReleaseThreshold(48ULL << 30, "48GiB"));
  CHECK(ReleaseThreshold(48ULL << 30, "75%") == ReleaseThreshold(48ULL << 30));
  CHECK(ReleaseThreshold::max() == ReleaseThreshold(UINT64_MAX, "max"));
  CHECK(ReleaseThreshold() == ReleaseThreshold(0));
  CHECK(ReleaseThreshold(1ULL << 30, "1GiB") != ReleaseThreshold(2ULL << 30, "1GiB"));
  CHECK_FALSE(ReleaseThreshold(0) != ReleaseThreshold(0, "0B"));
}
