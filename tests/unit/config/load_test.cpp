// The one loader of config files (core/config/load.cpp): a file that fits comes back parsed and
// resolved with its warnings; one with errors is rejected with every finding, as a compiler would.
#include "config/load.h"

#include <doctest/doctest.h>

#include <string>

#include "base/error.h"
#include "device/node.h"
#include "tests/unit/fixtures.h"

namespace cupool::load_test {

NodeReport h100() { return load_profile(std::string(CUPOOL_SOURCE_DIR) + "/configs/profiles/h100.yaml"); }

// The ConfigRejected that loading `text` as t.yaml on `node` throws; fails the test when it loads.
ConfigRejected rejected(const std::string& text, const NodeReport& node, Scope scope = Scope::all,
                        const CheckOptions& options = {}) {
  try {
    load_config(SourceFile("t.yaml", text), node, scope, options);
  } catch (const ConfigRejected& e) {
    return e;
  }
  FAIL("t.yaml was loaded, not rejected:\n" << text);
  return ConfigRejected("", {}, "", false);
}

TEST_CASE("load_config: a file that fits the node comes back parsed, resolved and without warnings") {
  const NodeReport node = h100();
  REQUIRE(node.devices.size() == 1);
  const std::string text =
      "version: 1\npools:\n  - {name: kv, devices: all, handle_types: [posix_fd], release_threshold: 4GiB, "
      "reserve: 1GiB}\n";
  const Loaded loaded = load_config(SourceFile("t.yaml", text), node, Scope::all);
  CHECK(loaded.warnings.empty());
  CHECK(loaded.warning_findings.empty());
  REQUIRE(loaded.config.pools.size() == 1);
  CHECK(loaded.node.devices.size() == 1);
  CHECK(loaded.node.devices[0].info.uuid == node.devices[0].info.uuid);
  REQUIRE(loaded.desired.pools.size() == 1);
  const PoolWant& kv = loaded.desired.pools[0];
  CHECK(kv.name == "kv");
  CHECK(kv.device == 0);
  CHECK(kv.settings.release_threshold.bytes() == 4ULL << 30);
  CHECK(kv.settings.release_threshold.text() == "4GiB");
  CHECK(kv.reserve == 1ULL << 30);
}

TEST_CASE("load_config: warnings do not stop a file; they come back rendered and typed") {
  // Each pool's own device in its access list: a warning per device.
  const std::string text =
      "version: 1\npools:\n  - {name: kv, devices: all, handle_types: [posix_fd], access: [0, 1]}\n";
  const Loaded loaded = load_config(SourceFile("t.yaml", text), test::two_gpu_node(), Scope::all);
  REQUIRE(loaded.warning_findings.size() == 2);
  CHECK(loaded.warning_findings[0].code == "self-access");
  CHECK(loaded.warning_findings[1].code == "self-access");
  CHECK(loaded.warnings.rfind("t.yaml:3:", 0) == 0);
  CHECK(loaded.warnings.find(": warning: ") != std::string::npos);
  CHECK(loaded.warnings.find("[self-access]") != std::string::npos);
  CHECK(loaded.desired.pools.size() == 2);
}

TEST_CASE("load_config: a file that is not a valid config is rejected with file:line:col, as invalid input") {
  const std::string text = "version: 1\npools:\n  - {name: kv, devices: all, reserve: 1024}\n";
  const ConfigRejected e = rejected(text, test::two_gpu_node());
  CHECK(e.invalid_input());
  CHECK(e.code() == Errc::invalid_config);
  CHECK(std::string(e.what()) == "t.yaml: 1 error, 0 warnings, 0 notes");
  CHECK(e.rendered().rfind("t.yaml:3:", 0) == 0);
  CHECK(e.rendered().find(": error: ") != std::string::npos);
  CHECK(e.rendered().find("needs a unit") != std::string::npos);
  REQUIRE(e.findings().size() == 1);
  CHECK(e.findings()[0].dump().find("t.yaml") != std::string::npos);
}

TEST_CASE("load_config: every finding of one file comes in one rejection") {
  const std::string text =
      "version: 1\npools:\n  - {name: a, devices: [0], reserve: 1024}\n  - {name: b, devices: [0], colour: red}\n";
  const ConfigRejected e = rejected(text, test::two_gpu_node());
  CHECK(e.findings().size() == 2);
  CHECK(e.rendered().find("t.yaml:3:") != std::string::npos);
  CHECK(e.rendered().find("t.yaml:4:") != std::string::npos);
}

TEST_CASE("load_config: a valid file that does not fit the node is rejected, not as invalid input") {
  NodeReport node = test::two_gpu_node();
  node.devices[0].memory->free = 1ULL << 30;
  const std::string text =
      "version: 1\npools:\n  - {name: kv, devices: [0], handle_types: [posix_fd], reserve: 8GiB}\n";
  const ConfigRejected e = rejected(text, node);
  CHECK_FALSE(e.invalid_input());
  CHECK(e.code() == Errc::does_not_fit);
  CHECK(e.rendered().find("[reserve-above-free]") != std::string::npos);
  CHECK(e.rendered().rfind("t.yaml:3:", 0) == 0);
}

TEST_CASE(
    "load_config: the node is asked only for a version 1 file, and a node that can't be had leaves the "
    "file's own errors") {
  int asked = 0;
  const auto node = [&asked] {
    ++asked;
    return test::two_gpu_node();
  };
  SUBCASE("another version: not asked") {
    CHECK_THROWS_AS(load_config(SourceFile("t.yaml", "version: 2\n"), node, Scope::all), ConfigRejected);
    CHECK(asked == 0);
  }
  SUBCASE("a valid file: asked once") {
    load_config(SourceFile("t.yaml", "version: 1\npools: [{name: a, devices: [0]}]\n"), node, Scope::all);
    CHECK(asked == 1);
  }
  SUBCASE("no driver: the schema error is what is reported") {
    const auto none = [&asked]() -> NodeReport {
      ++asked;
      throw NoDriverError("no CUDA driver");
    };
    try {
      load_config(SourceFile("t.yaml", "version: 1\npools: [{name: a, devices: [0], reserve: 1024}]\n"), none,
                  Scope::all);
      FAIL("expected ConfigRejected");
    } catch (const ConfigRejected& e) {
      CHECK(e.invalid_input());
      CHECK(e.rendered().find("needs a unit") != std::string::npos);
    }
    CHECK(asked == 1);
  }
  SUBCASE("no driver, valid file: the node's error stands") {
    const auto none = []() -> NodeReport { throw NoDriverError("no CUDA driver"); };
    CHECK_THROWS_AS(
        load_config(SourceFile("t.yaml", "version: 1\npools: [{name: a, devices: [0]}]\n"), none, Scope::all),
        NoDriverError);
  }
}

TEST_CASE("load_config: inside an application only the process: section is judged") {
  // Device 5 is on no node here: an error for the holder's pools, nothing to the process.
  const std::string text =
      "version: 1\nprocess:\n  devices: [0]\n  default_pool: {release_threshold: 2GiB}\npools: [{name: a, "
      "devices: [5]}]\n";
  CHECK(rejected(text, test::two_gpu_node()).rendered().find("[unknown-device]") != std::string::npos);
  const Loaded loaded = load_config(SourceFile("t.yaml", text), test::two_gpu_node(), Scope::process);
  CHECK(loaded.desired.pools.empty());
  REQUIRE(loaded.desired.process.size() == 1);
  CHECK(loaded.desired.process[0].device == 0);
  CHECK(loaded.config.pools.size() == 1);  // the file as written, all of it
}

TEST_CASE("load_config with CheckOptions: account lookups are the caller's, and where they are made decides") {
  const std::string text = "version: 1\nholder: {socket: /tmp/x.sock, group: gpu}\npools: [{name: a, devices: [0]}]\n";
  CheckOptions options;
  int lookups = 0;
  options.group_exists = [&lookups](const std::string& name) {
    ++lookups;
    return name == "video";
  };
  options.user_exists = [](const std::string&) { return true; };

  SUBCASE("this machine's accounts: a missing group is an error") {
    const ConfigRejected e = rejected(text, test::two_gpu_node(), Scope::all, options);
    CHECK_FALSE(e.invalid_input());
    CHECK(e.rendered().find("t.yaml:2:") == 0);
    CHECK(e.rendered().find("[unknown-group]") != std::string::npos);
    CHECK(lookups == 1);
  }
  SUBCASE("a recorded node's: a warning, and the file loads") {
    options.accounts_here = false;
    const Loaded loaded = load_config(SourceFile("t.yaml", text), test::two_gpu_node(), Scope::all, options);
    REQUIRE(loaded.warning_findings.size() == 1);
    CHECK(loaded.warning_findings[0].code == "unknown-group");
    CHECK(lookups == 1);
  }
  SUBCASE("a group that exists: nothing to say") {
    options.group_exists = [&lookups](const std::string&) {
      ++lookups;
      return true;
    };
    const Loaded loaded = load_config(SourceFile("t.yaml", text), test::two_gpu_node(), Scope::all, options);
    CHECK(loaded.warnings.empty());
    CHECK(lookups == 1);
  }
}

TEST_CASE("rejection: the summary names the file and counts; findings are the sorted diagnostics") {
  Diagnostics d;
  const SourceFile file("r.yaml", "version: 1\npools: []\n");
  d.warning("w", Loc{2, 8}, "a warning");
  d.error("e", Loc{1, 1}, "an error");
  const ConfigRejected e = rejection(d, file);
  CHECK(std::string(e.what()) == "r.yaml: 1 error, 1 warning, 0 notes");
  CHECK_FALSE(e.invalid_input());
  REQUIRE(e.findings().size() == 2);
  CHECK(e.rendered() == render_text(d, file));
  CHECK(e.rendered().rfind("r.yaml:1:1: error: an error [e]", 0) == 0);
}

}  // namespace cupool::load_test
