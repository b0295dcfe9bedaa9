#include "cli/suggest.h"

#include <doctest/doctest.h>

#include <CLI/CLI.hpp>

using cupool::cli::did_you_mean;
using cupool::cli::nearest;

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
