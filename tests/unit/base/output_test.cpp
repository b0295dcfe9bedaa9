#include "base/output.h"

#include <doctest/doctest.h>
#include <yaml-cpp/yaml.h>

using namespace cupool;

TEST_CASE("YAML from JSON keeps types a reader would otherwise change") {
  nlohmann::ordered_json j = {{"version", "13.0"}, {"n", 1}, {"ok", true}, {"none", nullptr}, {"list", {1, 2}}};
  const std::string y = to_yaml(j);
  CHECK(y == "version: \"13.0\"\nn: 1\nok: true\nnone: ~\nlist: [1, 2]\n");
  CHECK(yaml_to_json(YAML::Load(y)) == j);
}

TEST_CASE("YAML from JSON quotes every string a YAML 1.1 or 1.2 reader would type") {
  // Tensor names, metadata values, client names and paths are anyone's text.
  for (const char* text :
       {".nan",       ".inf", "-.inf", ".NaN", "TRUE", "True", "On", "off", "Y",   "n",
        "NULL",       "~",    "1_000", "0x1f", "0o17", "1:20", "+1", "-1",  "1e3", "2026-11-21T20:50:06Z",
        "2026-11-21", "<<",   "=",     ""}) {
    CAPTURE(text);
    const nlohmann::ordered_json j = {{"v", text}};
    const std::string y = to_yaml(j);
    CHECK(y == "v: \"" + std::string(text) + "\"\n");
    CHECK(yaml_to_json(YAML::Load(y)) == j);
  }
  // Plain words stay plain.
  CHECK(to_yaml(nlohmann::ordered_json{{"v", "kv-cache"}}) == "v: kv-cache\n");
  CHECK(to_yaml(nlohmann::ordered_json{{"v", "GPU-e886b279"}}) == "v: GPU-e886b279\n");
}

TEST_CASE("yaml_to_json: quoted scalars stay strings") {
  const auto j = yaml_to_json(YAML::Load("a: \"1\"\nb: 1\nc: 0000:1b:00.0\nd: -5\n"));
  CHECK(j["a"] == "1");
  CHECK(j["b"] == 1);
  CHECK(j["c"] == "0000:1b:00.0");
  CHECK(j["d"] == -5);
}

TEST_CASE("tables align columns") {
  Table t({"a", "long header"});
  t.add({"wide cell", "x"});
  CHECK(t.str() == "a          long header\nwide cell  x\n");
}

TEST_CASE("parse_format") {
  CHECK(parse_format("json") == Format::json);
  CHECK_THROWS(parse_format("xml"));
}

TEST_CASE("a table shows text from elsewhere as text: no control sequences, no reordering") {
  Table t({"NAME", "PID"});
  t.add({"evil\x1b]0;owned\x07", "1"});
  t.add(
      {"a\xe2\x80\xae"
       "b",
       "2"});
  const std::string out = t.str();
  CHECK(out.find('\x1b') == std::string::npos);
  CHECK(out.find('\x07') == std::string::npos);
  CHECK(out.find("\xe2\x80\xae") == std::string::npos);
  CHECK(out.find("a\xef\xbf\xbd"
                 "b") != std::string::npos);
}
