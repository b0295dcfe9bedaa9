// What this binary says it is (core/base/build_info.cpp): the fields a bug report quotes, and
// `cupool --version`'s text made from them.
#include "base/build_info.h"

#include <doctest/doctest.h>

#include <regex>
#include <string>

namespace cupool::build_info_test {

TEST_CASE("build_info: every field is filled, in the shape its comment promises") {
  const BuildInfo& b = build_info();
  CHECK(std::regex_match(b.version, std::regex(R"(\d+\.\d+\.\d+)")));
  CHECK_MESSAGE(std::regex_match(b.commit, std::regex(R"(([0-9a-f]{7,40}(-dirty)?)|unknown)")), b.commit);
  CHECK_MESSAGE(std::regex_match(b.cuda_headers, std::regex(R"((\d+\.\d+\.\d+)|unknown)")), b.cuda_headers);
  CHECK_MESSAGE((b.compiler.rfind("gcc ", 0) == 0 || b.compiler.rfind("clang ", 0) == 0), b.compiler);
  CHECK_FALSE(b.build_type.empty());
  CHECK(&build_info() == &b);  // made once
}

TEST_CASE("version_text: the version and commit, then what it was built with, on two lines") {
  const BuildInfo& b = build_info();
  const std::string text = version_text();
  CHECK(text == "cupool " + b.version + " (commit " + b.commit + ")\nbuilt with the CUDA " + b.cuda_headers +
                    " headers (the driver is loaded at run time), " + b.compiler + ", " + b.build_type);
  CHECK(text.back() != '\n');
}

}  // namespace cupool::build_info_test
