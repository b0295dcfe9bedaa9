#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "cli/verbs.h"
#include "tests/unit/fixtures.h"

using cupool::cli::place_cufile_log;

TEST_CASE("place_cufile_log: cuFile's log goes where cupool says, not into the working directory") {
  // Issue 34: cuFile wrote cufile.log into the working directory of `query --deep` and `buffer load`.
  const char* before = std::getenv("CUFILE_LOGFILE_PATH");
  const std::string kept = before ? before : "";
  const std::string dir = cupool::test::temp_path("logs");
  ::unsetenv("CUFILE_LOGFILE_PATH");
  CHECK(place_cufile_log(dir) == dir + "/cufile.log");
  CHECK(std::string(std::getenv("CUFILE_LOGFILE_PATH")) == dir + "/cufile.log");
  CHECK(::access(dir.c_str(), W_OK) == 0);  // made
  // The user's own choice stands.
  CHECK(place_cufile_log(dir + "/elsewhere") == dir + "/cufile.log");
  // A place that can't be a directory: nowhere rather than the working directory.
  const std::string file = dir + "/a-file";
  std::ofstream(file) << "x";
  ::unsetenv("CUFILE_LOGFILE_PATH");
  CHECK(place_cufile_log(file) == "/dev/null");
  if (before)
    ::setenv("CUFILE_LOGFILE_PATH", kept.c_str(), 1);
  else
    ::unsetenv("CUFILE_LOGFILE_PATH");
}
