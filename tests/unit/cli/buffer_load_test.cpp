#include "cli/buffer_load.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/error.h"

using namespace cupool;
using cupool::cli::LoadArgs;

namespace {

LoadArgs base() {
  LoadArgs a;
  a.socket = "/tmp/s.sock";
  a.name = "llama";
  a.pool = "weights";
  a.direct_io = "never";
  return a;
}

}  // namespace

TEST_CASE("several files: NAME-k, file k on the k-th --device or device k, the read threads shared out") {
  const std::vector<std::string> files = {"a.safetensors", "b.safetensors", "a.safetensors"};
  const std::vector<LoadArgs> loads = cli::split_load(base(), files, {}, 64);
  REQUIRE(loads.size() == 3);
  for (std::size_t k = 0; k < 3; ++k) {
    CHECK(loads[k].name == "llama-" + std::to_string(k));
    CHECK(loads[k].file == files[k]);
    CHECK(loads[k].device == static_cast<int>(k));
    CHECK(loads[k].read_threads == 5);  // max(2, 16 / 3)
    CHECK(loads[k].pool == "weights");
    CHECK(loads[k].direct_io == "never");
  }
  const std::vector<LoadArgs> two = cli::split_load(base(), {"a", "b"}, {3, 1}, 64);
  CHECK(two[0].device == 3);
  CHECK(two[1].device == 1);
  CHECK(two[0].read_threads == 8);  // 16 / 2
  CHECK(cli::split_load(base(), {"a", "b"}, {}, 4)[0].read_threads == 2);
  LoadArgs given = base();
  given.read_threads = 6;  // --read-threads: per file
  CHECK(cli::split_load(given, {"a", "b"}, {}, 64)[1].read_threads == 6);
}

TEST_CASE("several files: a count of --device other than none or one per file is refused") {
  for (const std::vector<int>& devices : {std::vector<int>{0}, std::vector<int>{0, 1, 2}}) {
    try {
      cli::split_load(base(), {"a", "b"}, devices, 8);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.exit_code() == ExitCode::invalid_input);
      CHECK(std::string(e.what()) ==
            "--device: 2 files take 2 --device options (file k to the k-th) or none (file k "
            "to device k), not " +
                std::to_string(devices.size()));
    }
  }
}
