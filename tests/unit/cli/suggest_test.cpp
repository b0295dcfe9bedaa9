#include "cli/suggest.h"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

#include "base/error.h"
#include "tests/unit/fixtures.h"

using cupool::cli::did_you_mean;
using cupool::cli::error_prefix;
using cupool::cli::find_slip;
using cupool::cli::nearest;
using cupool::cli::shipped_file;
using cupool::cli::Slip;
using cupool::cli::usage_error;

namespace {

// A command line shaped like cupool's: global --log-level, verbs with options and positionals,
// nested verbs, a hidden option.
struct Cli {
  CLI::App app{"test", "cupool"};
  std::string log_level, format, profile, config, name, pool;
  bool secret = false;
  Cli() {
    app.require_subcommand(1);
    app.fallthrough();
    app.add_option("--log-level", log_level);
    CLI::App* query = app.add_subcommand("query", "");
    query->add_option("--format,-o", format);
    query->add_option("--profile,-p", profile);
    query->add_flag("--deep");
    query->add_flag("--hidden-one", secret)->group("");
    CLI::App* check = app.add_subcommand("check", "");
    check->add_option("config", config);
    check->add_option("--format,-o", format);
    CLI::App* buffer = app.add_subcommand("buffer", "");
    buffer->require_subcommand(1);
    CLI::App* create = buffer->add_subcommand("create", "");
    create->add_option("name", name);
    create->add_option("--pool", pool);
    buffer->add_subcommand("ls", "");
  }
};

}  // namespace

TEST_CASE("nearest: a slip is near, another word is not") {
  const std::vector<std::string> verbs = {"query", "check", "hold", "status", "stats", "trim"};
  CHECK(nearest("quer", verbs) == "query");
  CHECK(nearest("qeury", verbs) == "query");  // two letters swapped: one edit
  CHECK(nearest("chekc", verbs) == "check");
  CHECK(nearest("stauts", verbs) == "status");
  CHECK(nearest("hodl", verbs) == "hold");
  CHECK(nearest("xyz", verbs).empty());
  CHECK(nearest("deploy", verbs).empty());
  CHECK(nearest("", verbs).empty());
  CHECK(nearest("--formt", {"--format", "--profile", "--deep"}) == "--format");
  CHECK(nearest("-x", {"--format", "-o"}) == "-o");  // one letter: one edit is near
}

TEST_CASE("did_you_mean: a mistyped verb, nested verb or option, and nothing for known words") {
  Cli c;
  CHECK(did_you_mean(c.app, {"quer"}) == "did you mean 'query'?");
  CHECK(did_you_mean(c.app, {"--log-level", "debug", "quer"}) == "did you mean 'query'?");  // a value skipped
  CHECK(did_you_mean(c.app, {"buffer", "craete", "x"}) == "did you mean 'create'?");
  CHECK(did_you_mean(c.app, {"query", "--formt", "json"}) == "did you mean '--format'?");
  CHECK(did_you_mean(c.app, {"query", "--formt=json"}) == "did you mean '--format'?");
  CHECK(did_you_mean(c.app, {"query", "--log-levl", "debug"}) == "did you mean '--log-level'?");  // a parent's
  CHECK(did_you_mean(c.app, {"buffer", "create", "w", "--pol", "kv"}) == "did you mean '--pool'?");
  // Hidden options are never offered.
  CHECK(did_you_mean(c.app, {"query", "--hidden-on"}).empty());
  // Known words: nothing to say (the error was something else).
  CHECK(did_you_mean(c.app, {"query", "--format", "json", "--deep"}).empty());
  CHECK(did_you_mean(c.app, {"check", "quer.yaml"}).empty());  // a positional, not a verb
  CHECK(did_you_mean(c.app, {"query", "-o", "json"}).empty());
  CHECK(did_you_mean(c.app, {"query", "-ojson"}).empty());
  CHECK(did_you_mean(c.app, {"frobnicate"}).empty());
  CHECK(did_you_mean(c.app, {"query", "--", "--formt"}).empty());
}

TEST_CASE("global options parse after the verb") {
  Cli c;
  c.app.parse(std::vector<std::string>{"debug", "--log-level", "--deep", "query"});  // CLI11 takes them reversed
  CHECK(c.log_level == "debug");
  CHECK(c.app.got_subcommand("query"));
}

TEST_CASE("find_slip: the verbs taken and the first unknown word, as verb or option") {
  Cli c;
  Slip s = find_slip(c.app, {"stauts"});
  CHECK(s.verbs.empty());
  CHECK(s.kind == Slip::Kind::verb);
  CHECK(s.word == "stauts");
  CHECK(s.near.empty());  // the test app has no status verb
  s = find_slip(c.app, {"buffer", "craete", "x"});
  CHECK(s.verbs == std::vector<std::string>{"buffer"});
  CHECK(s.kind == Slip::Kind::verb);
  CHECK(s.near == "create");
  s = find_slip(c.app, {"query", "--formt=json"});
  CHECK(s.verbs == std::vector<std::string>{"query"});
  CHECK(s.kind == Slip::Kind::option);
  CHECK(s.word == "--formt");
  CHECK(s.near == "--format");
  s = find_slip(c.app, {"buffer", "create", "w", "--pool", "kv"});
  CHECK(s.verbs == std::vector<std::string>{"buffer", "create"});
  CHECK(s.kind == Slip::Kind::none);
}

TEST_CASE("usage_error: one style, `cupool VERB: ` first, the word in quotes, a did-you-mean") {
  Cli c;
  CHECK(usage_error(c.app, {"qeury"}, "A subcommand is required") ==
        "cupool: unknown verb \"qeury\" (did you mean \"query\"?)\n  'cupool help' lists the verbs\n");
  CHECK(usage_error(c.app, {"buffer", "craete"}, "x") ==
        "cupool buffer: unknown verb \"craete\" (did you mean \"create\"?)\n  'cupool help buffer' lists the verbs\n");
  CHECK(usage_error(c.app, {"frobnicate"}, "A subcommand is required") ==
        "cupool: unknown verb \"frobnicate\"\n  'cupool help' lists the verbs\n");
  CHECK(usage_error(c.app, {"query", "--formt", "json"}, "The following arguments were not expected: json --formt") ==
        "cupool query: unknown option \"--formt\" (did you mean \"--format\"?)\n"
        "  'cupool query --help' lists its options\n");
  CHECK(usage_error(c.app, {}, "A subcommand is required") ==
        "cupool: a verb is required (one of: query, check, buffer)\n  'cupool --help' says more\n");
  CHECK(usage_error(c.app, {"buffer"}, "A subcommand is required") ==
        "cupool buffer: a verb is required (one of: create, ls)\n  'cupool buffer --help' says more\n");
  // Any other error: CLI11's words after the prefix, the first letter lower case.
  CHECK(usage_error(c.app, {"check"}, "Config is required") ==
        "cupool check: config is required\n  'cupool check --help' says more\n");
  CHECK(error_prefix({}) == "cupool: ");
  CHECK(error_prefix({"buffer", "create"}) == "cupool buffer create: ");
}

TEST_CASE("shipped_file: the working directory's, else the installed data folder's, else the checkout's") {
  const std::string root = cupool::test::temp_path("shipped");  // removed at exit, also when a check fails
  const std::string rel = "configs/profiles/h100.yaml";
  // Nowhere: "".
  CHECK(shipped_file(rel + ".none", root + "/usr/bin/cupool").empty());
  // Installed: PREFIX/bin/cupool finds PREFIX/share/cupool/configs/...
  REQUIRE(::system(("mkdir -p " + root + "/usr/bin " + root + "/usr/share/cupool/configs/profiles " + root +
                    "/src/build " + root + "/src/configs/profiles")
                       .c_str()) == 0);
  std::ofstream(root + "/usr/share/cupool/" + rel) << "x";
  std::ofstream(root + "/src/" + rel) << "x";
  CHECK(shipped_file(rel, root + "/usr/bin/cupool") == root + "/usr/share/cupool/" + rel);
  // A build tree in a checkout: SRC/build/cupool finds SRC/configs/...
  CHECK(shipped_file(rel, root + "/src/build/cupool") == root + "/src/" + rel);
  // The working directory first, as written (a checkout's root).
  char cwd[4096];
  REQUIRE(::getcwd(cwd, sizeof cwd) != nullptr);
  REQUIRE(::chdir((root + "/src").c_str()) == 0);
  CHECK(shipped_file(rel, root + "/usr/bin/cupool") == rel);
  REQUIRE(::chdir(cwd) == 0);
}

TEST_CASE("require_config: a CONFIG that is not there, in words, with the sample to copy") {
  using cupool::cli::require_config;
  const std::string path = cupool::test::temp_path("pools.yaml");
  const auto message = [](const std::string& p, const std::string& verb, const std::string& sample) {
    try {
      require_config(p, verb, sample);
    } catch (const cupool::InputError& e) {
      return std::string(e.what());
    }
    return std::string("(nothing thrown)");
  };
  CHECK(message(path, "check", "/usr/share/cupool/configs/systemd/cupool.yaml") ==
        "no config file at '" + path +
            "'\n"
            "  hint: give the path of an existing config, or start from the commented sample:\n"
            "          cp /usr/share/cupool/configs/systemd/cupool.yaml " +
            path +
            "\n"
            "        then edit it and 'cupool check " +
            path + "'");
  // hold: also how to start it again.
  const std::string hold = message(path + "/x.yaml", "hold", "/s.yaml");
  CHECK(hold.rfind("no config file at '" + path + "/x.yaml'\n", 0) == 0);
  CHECK(hold.find(",\n        and start the holder again (under systemd: systemctl restart cupool)") !=
        std::string::npos);
  CHECK(message(path, "check", "/s.yaml").find("systemctl") == std::string::npos);
  // A file there: nothing to say (reading it is the reader's); standard input; a path under a file
  // (ENOTDIR) is missing too.
  std::ofstream(path) << "version: 1\n";
  CHECK(message(path, "check", "/s.yaml") == "(nothing thrown)");
  CHECK(message("-", "check", "/s.yaml") == "(nothing thrown)");
  CHECK(message(path + "/x.yaml", "check", "/s.yaml").rfind("no config file at '" + path + "/x.yaml'\n", 0) == 0);
}
