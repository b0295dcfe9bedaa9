#include <doctest/doctest.h>

#include "base/text.h"
#include "config/config.h"

using namespace cupool;

namespace {

Config parse(const std::string& text, Diagnostics& d) { return parse_config(SourceFile("t.yaml", text), d); }

std::string first(const Diagnostics& d) {
  auto all = d.sorted();
  if (all.empty()) return "";
  return std::to_string(all[0].loc.line) + ":" + std::to_string(all[0].loc.column) + " " + all[0].code + ": " +
         all[0].message;
}

}  // namespace

TEST_CASE("a full config parses with every value and its place") {
  Diagnostics d;
  const Config c = parse(R"(version: 1
holder: {socket: /run/x.sock, mode: "0640", group: gpu}
process:
  devices: [0, GPU-ddeacb68-6ba3-ca8f-b8e0-48c19fc3c0da]
  default_pool: {release_threshold: 75%, access: [all]}
pools:
  - name: kv-cache
    devices: [0, "0000:1b:00.0"]
    location: host_numa:1
    alloc_type: managed
    handle_types: [posix_fd, fabric]
    max_size: 32GiB
    release_threshold: max
    reserve: 1.5GiB
    reuse: {follow_event_dependencies: true, allow_opportunistic: false}
    access: [1]
    share: {users: [svc-infer], groups: [gpu], quota_per_client: 16GiB}
buffers:
  - {name: weights, pool: kv-cache, device: 0, size: 10GiB}
)",
                         d);
  CHECK(d.all().empty());
  CHECK(c.version.value == 1);
  CHECK(c.holder.socket.value == "/run/x.sock");
  CHECK(c.holder.mode.value == 0640u);
  CHECK(c.holder.group.value == "gpu");
  REQUIRE(c.process);
  CHECK(c.process->devices.items.size() == 2);
  CHECK(c.process->default_pool->release_threshold.value.kind == Threshold::Kind::percent);
  CHECK(c.process->default_pool->access->all);
  REQUIRE(c.pools.size() == 1);
  const PoolSpec& p = c.pools[0];
  CHECK(p.name.value == "kv-cache");
  CHECK(p.name.loc.line == 7);
  CHECK(p.name.loc.column == 11);
  CHECK(p.devices.items[1].value.kind == DeviceSelector::Kind::pci_bus_id);
  CHECK(p.location.value.kind == PoolLocation::Kind::host_numa);
  CHECK(p.location.value.numa_id == 1);
  CHECK(p.alloc_type.value == AllocType::managed);
  CHECK(p.handle_mask() == 0x9u);
  CHECK(p.max_size.value == 32ULL << 30);
  CHECK(p.release_threshold.value.kind == Threshold::Kind::max);
  CHECK(p.reserve.value == 3ULL << 29);
  CHECK(p.reuse->follow_event_dependencies.value);
  CHECK_FALSE(p.reuse->allow_opportunistic.value);
  CHECK_FALSE(p.reuse->allow_internal_dependencies.set);
  CHECK(p.share->quota_per_client.value == 16ULL << 30);
  REQUIRE(c.buffers.size() == 1);
  CHECK(c.buffers[0].device.value.index == 0);
}

TEST_CASE("every problem is reported in one run, in file order") {
  Diagnostics d;
  parse(R"(version: 1
pools:
  - name: kv
    devices: [0]
    max_sise: 4GiB
    release_threshold: 1024
  - name: KV
    devices: []
)",
        d);
  const auto all = d.sorted();
  REQUIRE(all.size() == 4);
  CHECK(all[0].code == "unknown-key");
  CHECK(all[0].help.find("did you mean 'max_size'?") == 0);
  CHECK(all[1].code == "bare-number");
  CHECK(all[2].code == "invalid-value");
  CHECK(all[3].code == "empty-list");
  CHECK(d.has_invalid_input());
}

TEST_CASE("strict scalars: quoting, booleans, versions") {
  Diagnostics d;
  parse("version: 1\nholder: {mode: 0660}\n", d);
  CHECK(first(d) == "2:16 wrong-type: mode must be a quoted string of octal digits");
  Diagnostics d2;
  parse("version: 1\npools: [{name: a, devices: [\"0\"]}]\n", d2);
  CHECK(first(d2) == "2:29 wrong-type: device \"0\" is quoted; a device index is a number");
  Diagnostics d3;
  parse("version: 1\npools: [{name: a, devices: [0], reuse: {allow_opportunistic: yes}}]\n", d3);
  CHECK(first(d3) == "2:62 wrong-type: allow_opportunistic must be true or false, not 'yes'");
  Diagnostics d4;
  parse("version: 2\n", d4);
  CHECK(first(d4) == "1:10 unsupported-version: config version 2 is not supported; this cupool reads version 1");
  Diagnostics d5;
  parse("pools: [{name: a, devices: [0]}]\n", d5);
  CHECK(first(d5) == "1:1 missing-key: the config needs 'version'");
}

TEST_CASE("duplicate keys are refused") {
  Diagnostics d;
  parse("version: 1\nversion: 1\n", d);
  CHECK(first(d) == "2:1 duplicate-key: key 'version' appears twice in the config");
}

TEST_CASE("YAML syntax errors carry line and column") {
  Diagnostics d;
  parse("version: 1\npools:\n  - name: [a\n", d);
  REQUIRE(d.all().size() == 1);
  CHECK(d.all()[0].code == "yaml-syntax");
  CHECK(d.all()[0].loc.line >= 3);
}

TEST_CASE("bounded input: nesting and counts") {
  Diagnostics d;
  parse("version: 1\nx: " + std::string(200, '[') + std::string(200, ']') + "\n", d);
  CHECK(first(d) ==
        "2:" + std::to_string(3 + kMaxNesting + 1) + " too-deep: lists and mappings nested more than 32 deep");

  std::string many = "version: 1\npools:\n";
  for (std::size_t i = 0; i <= kMaxPools; ++i) many += "  - {name: p" + std::to_string(i) + ", devices: [0]}\n";
  Diagnostics d2;
  const Config c = parse(many, d2);
  CHECK(first(d2).find("too-many: more than 1024 pools") != std::string::npos);
  CHECK(c.pools.size() == kMaxPools);

  // Brackets inside quotes and comments don't count; an apostrophe inside a word opens no quote.
  Diagnostics d3;
  parse("version: 1 # [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\nholder: {group: \"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"}\n",
        d3);
  CHECK(first(d3).find("too-deep") == std::string::npos);
  Diagnostics d4;
  parse("version: 1\nx: it's " + std::string(40, '[') + "\n", d4);
  CHECK(first(d4).find("too-deep") != std::string::npos);
}

TEST_CASE("bounded input: aliases are counted as often as they are used") {
  // 300 uses of a pool entry that lists 1,200 values: 5.8 KiB of YAML standing for 360,000 values.
  std::string devices, users;
  for (int i = 0; i < 400; ++i) {
    devices += (i ? ", " : "") + std::string("0");
    users += (i ? ", u" : "u") + std::to_string(i);
  }
  std::string text = "version: 1\npools:\n  - &p {name: kv, handle_types: [posix_fd], devices: [" + devices +
                     "],\n        share: {users: &u [" + users + "], groups: *u}}\n";
  for (int i = 0; i < 300; ++i) text += "  - *p\n";
  Diagnostics d;
  parse(text, d);
  CHECK(d.all().size() == 1);
  CHECK(first(d).find("too-large: the file expands to more than 100000 values") != std::string::npos);
  // The same pool written once is fine.
  Diagnostics ok;
  parse(text.substr(0, text.find("  - *p")), ok);
  CHECK_MESSAGE(!ok.has_invalid_input(), first(ok));
}

TEST_CASE("a finding's text is bounded as shown: bytes that are not UTF-8 do not triple it") {
  // A size of "1" and 600 bytes that are not UTF-8: each is shown as U+FFFD (3 bytes), and the
  // message and help that quote it are cut after that (the config fuzzer found them 1,536 bytes).
  const std::string text =
      "version: 1\npools: [{name: kv, devices: [0]}]\nbuffers:\n  - {name: w, pool: kv, device: 0, size: 1" +
      std::string(600, '\xff') + "}\n";
  Diagnostics d;
  parse_config(SourceFile("t.yaml", text), d);
  REQUIRE(!d.all().empty());
  for (const auto& f : d.all()) {
    CHECK(f.message.size() <= kMaxFindingText + 3);
    CHECK(f.help.size() <= kMaxFindingText + 3);
    CHECK(valid_utf8(f.message) == f.message);
  }
}

TEST_CASE("findings are bounded: how many are kept, what each carries, what of a line is quoted") {
  // 5,000 unknown keys with 200-byte names on one 1 MiB-ish line.
  std::string text = "version: 1\npools: [{name: kv, devices: [0]";
  for (int i = 0; i < 5000; ++i) text += ", k" + std::to_string(i) + std::string(200, 'x') + ": 1";
  text += "}]\n";
  const SourceFile file("t.yaml", text);
  Diagnostics d;
  parse_config(file, d);
  CHECK(d.count(Severity::error) == 5000);
  CHECK(d.all().size() == kMaxFindings);
  CHECK(d.dropped() == 5000 - kMaxFindings);
  CHECK(d.has_invalid_input());
  for (const auto& f : d.all()) CHECK(f.message.size() <= kMaxFindingText + 3);
  const std::string out = render_text(d, file);
  // 1,000 findings, each quoting at most a 160-byte window of the 1 MiB line.
  CHECK(out.size() < kMaxFindings * 1200);
  CHECK(out.find("and 4000 more findings, not shown (the first 1000 are)") != std::string::npos);
  const std::string one = render_text(d.sorted()[500], file);
  CHECK(one.find("...") != std::string::npos);
  // The caret still points at the key: the character under it in the window is its first.
  const auto quoted = one.substr(one.find(" | ") + 3, one.find('\n', one.find(" | ")) - one.find(" | ") - 3);
  const std::size_t caret = one.find('^') - one.rfind('|', one.find('^')) - 2;
  CHECK(quoted.substr(caret, 1) == "k");
}

TEST_CASE("an empty file and a non-mapping are invalid") {
  Diagnostics d;
  parse("", d);
  CHECK(first(d) == "0:0 empty-file: the file is empty");
  Diagnostics d2;
  parse("- 1\n", d2);
  CHECK(first(d2).find("wrong-type: a cupool config is a mapping") != std::string::npos);
}

TEST_CASE("Threshold::resolve") {
  Threshold t;
  t.kind = Threshold::Kind::percent;
  t.fraction = 0.5;
  CHECK(t.resolve(80ULL << 30) == 40ULL << 30);
  t.kind = Threshold::Kind::max;
  CHECK(t.resolve(1) == UINT64_MAX);
}
