#include "config/diagnostics.h"

#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cstdio>

#include "base/error.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

TEST_CASE("a finding renders like a compiler's") {
  const SourceFile f("pools.yaml", "version: 1\npools:\n  - name: kv\n\tdevices: [7]\n");
  Diagnostic d;
  d.code = "unknown-device";
  d.loc = {4, 12};
  d.message = "no device '7' on this node";
  d.fact = "this node has 1 device";
  d.help = "device indexes here are 0 to 0";
  CHECK(render_text(d, f) ==
        "pools.yaml:4:12: error: no device '7' on this node [unknown-device]\n"
        " 4 |  devices: [7]\n"
        "   |            ^\n"
        "   = note: this node has 1 device\n"
        "   = help: device indexes here are 0 to 0\n");
}

TEST_CASE("a column past the line's end puts the caret just after it, on a short line or a long one") {
  Diagnostic d;
  d.code = "x";
  d.message = "m";
  const SourceFile short_line("s.yaml", "version: 1\nab\n");
  d.loc = {2, 1000000};
  CHECK(render_text(d, short_line) == "s.yaml:2:1000000: error: m [x]\n 2 | ab\n   |   ^\n");
  // A long line: the window is its end (before: read past the line, found by the config fuzzer).
  const SourceFile long_line("l.yaml", "version: 1\n" + std::string(400, 'k') + "\n");
  d.loc = {2, 700};
  const std::string text = render_text(d, long_line);
  CHECK(text.find(" 2 | ..." + std::string(kMaxQuotedLine, 'k') + "\n") != std::string::npos);
  CHECK(text.find("   | " + std::string(kMaxQuotedLine + 3, ' ') + "^\n") != std::string::npos);
}

TEST_CASE("a whole-file finding has no location or caret") {
  const SourceFile f("-", "");
  Diagnostic d;
  d.code = "empty-file";
  d.message = "the file is empty";
  CHECK(render_text(d, f) == "-: error: the file is empty [empty-file]\n");
}

TEST_CASE("counts, order and JSON") {
  Diagnostics ds;
  ds.warning("b", {5, 1}, "second");
  ds.invalid("a", {2, 3}, "first");
  ds.note("c", {5, 1}, "third");
  const auto s = ds.sorted();
  CHECK(s[0].code == "a");
  CHECK(s[1].code == "b");
  CHECK(s[2].code == "c");
  CHECK(ds.has_invalid_input());
  CHECK(summary_line(ds) == "1 error, 1 warning, 1 note");
  const auto j = to_json(s[0], "x.yaml");
  CHECK(j["line"] == 2);
  CHECK(j["severity"] == "error");
  CHECK(j["fact"].is_null());
}

TEST_CASE("SourceFile reads a file, refuses a huge one") {
  CHECK_THROWS(SourceFile::read("/nonexistent/x.yaml"));
  CHECK_THROWS(SourceFile::read("/dev/zero", 1024));
}

TEST_CASE("read_regular: what a daemon reads unattended is a regular file, and nothing makes it wait") {
  const std::string dir = test::temp_path("dir");
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  const std::string file = dir + "/c.yaml", fifo = dir + "/fifo";
  std::FILE* f = std::fopen(file.c_str(), "w");
  REQUIRE(f);
  std::fputs("version: 1\n", f);
  std::fclose(f);
  CHECK(SourceFile::read_regular(file).text() == "version: 1\n");
  // A FIFO with no writer: refused at once (SourceFile::read would wait for a writer).
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(SourceFile::read_regular(fifo), doctest::Contains("not a regular file"), InputError);
  CHECK_THROWS_WITH_AS(SourceFile::read_regular(dir), doctest::Contains("not a regular file"), InputError);
  CHECK_THROWS_WITH_AS(SourceFile::read_regular("/dev/zero"), doctest::Contains("not a regular file"), InputError);
  CHECK_THROWS_WITH_AS(SourceFile::read_regular(file, 4), doctest::Contains("larger than"), InputError);
}
