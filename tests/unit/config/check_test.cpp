#include <doctest/doctest.h>

#include <algorithm>

#include "config/load.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

namespace {

// Parses `text` (which must be valid) and checks it against `node`; returns the finding codes.
std::vector<std::string> codes(const std::string& text, const NodeReport& node, const CheckOptions& o = {}) {
  const Judged j = judge_config(
      SourceFile("t.yaml", text), [&] { return node; }, Scope::all, o);
  const Diagnostics& d = j.diags;
  REQUIRE_MESSAGE(!d.has_invalid_input(), render_text(d, SourceFile("t.yaml", text)));
  std::vector<std::string> out;
  for (const auto& f : d.sorted()) out.push_back(f.code);
  return out;
}

bool has(const std::vector<std::string>& v, const std::string& code) {
  return std::find(v.begin(), v.end(), code) != v.end();
}

const char* const kGood = R"(version: 1
pools:
  - {name: kv, devices: all, handle_types: [posix_fd], release_threshold: max, reserve: 8GiB, access: [0, 1]}
)";

}  // namespace

TEST_CASE("a config that fits has no errors") {
  const auto c = codes(kGood, test::two_gpu_node());
  CHECK(c == std::vector<std::string>{"self-access", "self-access"});  // each pool's own device in access
}

TEST_CASE("node facts turn into findings") {
  NodeReport n = test::two_gpu_node();
  SUBCASE("pools unsupported") {
    n.devices[1].info.memory_pools = false;
    CHECK(has(codes(kGood, n), "pools-unsupported"));
  }
  SUBCASE("handle type unsupported") {
    n.devices[0].info.pool_handle_types = 0;
    CHECK(has(codes(kGood, n), "handle-type-unsupported"));
  }
  SUBCASE("peer access impossible") {
    n.peer_access[1][0] = false;
    CHECK(has(codes(kGood, n), "peer-access"));
  }
  SUBCASE("reserves above free memory") {
    n.devices[0].memory->free = 4ULL << 30;
    CHECK(has(codes(kGood, n), "reserve-above-free"));
  }
  SUBCASE("free memory unknown: compared with the total") {
    n.devices[0].memory.reset();
    n.devices[0].info.total_memory = 4ULL << 30;
    CHECK(has(codes(kGood, n), "reserve-above-free"));
  }
  SUBCASE("old driver: managed pools") {
    n.driver_version = 12080;
    CHECK(has(codes("version: 1\npools: [{name: m, devices: [0], alloc_type: managed}]\n", n),
              "managed-pools-unsupported"));
  }
  SUBCASE("no managed memory on the device") {
    n.devices[0].info.managed_memory = false;
    CHECK(has(codes("version: 1\npools: [{name: m, devices: [0], alloc_type: managed}]\n", n),
              "managed-pools-unsupported"));
  }
  SUBCASE("host NUMA node missing, host pools unsupported") {
    n.devices[0].info.host_memory_pools = false;
    const auto c = codes(
        "version: 1\npools:\n  - {name: a, devices: [0], location: host_numa:2}\n  - {name: b, devices: [0], location: "
        "host}\n",
        n);
    CHECK(has(c, "unknown-numa-node"));
    CHECK(has(c, "host-pools-unsupported"));
  }
  SUBCASE("unknown devices by index, UUID and PCI bus id") {
    const auto c = codes(
        "version: 1\npools: [{name: a, devices: [2, GPU-11111111-2222-3333-4444-555555555555, \"0000:99:00.0\"]}]\n",
        n);
    CHECK(std::count(c.begin(), c.end(), "unknown-device") == 3);
  }
}

TEST_CASE("a device the node lacks is one finding, however often the file names it") {
  // Two devices missing (2 and 3), named five times in all, by index and again by the same index.
  const std::string text =
      "version: 1\npools:\n"
      "  - {name: a, devices: [2], access: [3]}\n"
      "  - {name: b, devices: [3], access: [2]}\n"
      "  - {name: c, devices: [0], access: [1, 2]}\n";
  const Judged j = judge_config(SourceFile("t.yaml", text), [] { return test::two_gpu_node(); }, Scope::all, {});
  std::vector<Diagnostic> unknown;
  for (const auto& f : j.diags.sorted())
    if (f.code == "unknown-device") unknown.push_back(f);
  REQUIRE(unknown.size() == 2);
  CHECK(unknown[0].loc.line == 3);
  CHECK(unknown[0].loc.column == 25);
  CHECK(unknown[0].message == "no device '2' on this node (named 3 times; also at 4:38, 5:41)");
  CHECK(unknown[1].loc.column == 38);
  CHECK(unknown[1].message == "no device '3' on this node (named 2 times; also at 4:25)");
  CHECK(unknown[1].help == "device indexes here are 0 to 1");
}

TEST_CASE("fabric: an attribute is not proof; a --deep probe is") {
  NodeReport n = test::two_gpu_node();
  const char* text = "version: 1\npools: [{name: f, devices: [0], handle_types: [fabric]}]\n";
  CHECK(codes(text, n) == std::vector<std::string>{"fabric-unverified"});
  CheckOptions deep;
  deep.deep = true;
  CHECK(codes(text, n, deep).empty());
  n.devices[0].probes.push_back({HandleType::fabric, false, "CUDA_ERROR_NOT_PERMITTED",
                                 "cuMemPoolExportToShareableHandle", "no IMEX channel is reachable", ""});
  CHECK(codes(text, n, deep) == std::vector<std::string>{"fabric-not-exportable"});
  n.devices[0].info.fabric_handle = false;
  CHECK(codes(text, n, deep) == std::vector<std::string>{"handle-type-unsupported"});
}

TEST_CASE("rules that need no node") {
  const NodeReport n = test::two_gpu_node();
  CHECK(has(
      codes("version: 1\npools: [{name: a, devices: [0], max_size: 1GiB, release_threshold: max, reserve: 2GiB}]\n", n),
      "reserve-above-max-size"));
  CHECK(has(codes("version: 1\npools: [{name: a, devices: [0], release_threshold: 50%, reserve: 41GiB}]\n", n),
            "reserve-above-threshold"));
  CHECK(codes("version: 1\npools: [{name: a, devices: [0], release_threshold: 50%, reserve: 40GiB}]\n", n).empty());
  CHECK(has(codes("version: 1\npools: [{name: a, devices: [0], share: {groups: [gpu]}}]\n", n),
            "share-without-handle-type"));
  CHECK(has(codes("version: 1\npools: [{name: a, devices: [0], handle_types: [posix_fd], max_size: 1GiB, share: "
                  "{quota_per_client: 2GiB}}]\n",
                  n),
            "quota-above-size"));
  CHECK(has(codes("version: 1\npools: [{name: a, devices: [0]}, {name: a, devices: [1]}]\n", n), "duplicate-name"));
  CHECK(has(codes("version: 1\npools: [{name: a, devices: [0], location: host, handle_types: [posix_fd]}]\n", n),
            "host-pool-ipc"));
}

TEST_CASE("buffers: pool, device, size and sharing") {
  const NodeReport n = test::two_gpu_node();
  const std::string pools = "version: 1\npools: [{name: w, devices: [0], handle_types: [posix_fd], max_size: 2GiB}]\n";
  CHECK(codes(pools + "buffers: [{name: b, pool: w, device: 0, size: 1GiB}]\n", n).empty());
  CHECK(codes(pools + "buffers: [{name: b, pool: x, device: 0, size: 1GiB}]\n", n) ==
        std::vector<std::string>{"unknown-pool"});
  CHECK(codes(pools + "buffers: [{name: b, pool: w, device: 1, size: 1GiB}]\n", n) ==
        std::vector<std::string>{"buffer-device"});
  CHECK(codes(pools + "buffers: [{name: b, pool: w, device: 0, size: 3GiB}]\n", n) ==
        std::vector<std::string>{"buffers-above-max-size"});
  CHECK(
      codes(pools + "buffers: [{name: b, pool: w, device: 0, size: 1GiB}, {name: b, pool: w, device: 0, size: 1GiB}]\n",
            n) == std::vector<std::string>{"duplicate-name"});
  CHECK(codes("version: 1\npools: [{name: w, devices: [0]}]\nbuffers: [{name: b, pool: w, device: 0, size: 1GiB}]\n",
              n) == std::vector<std::string>{"buffer-not-shareable"});
}

TEST_CASE("findings name the node they were judged against") {
  NodeReport n = test::two_gpu_node();
  n.source.simulated = true;
  n.source.profile_path = "p.yaml";
  n.peer_access[1][0] = false;
  const std::string text = "version: 1\npools: [{name: a, devices: [0], access: [1]}]\n";
  const Diagnostics d = judge_config(
                            SourceFile("t.yaml", text), [&] { return n; }, Scope::all)
                            .diags;
  REQUIRE(d.all().size() == 1);
  CHECK(d.all()[0].fact == "cuDeviceCanAccessPeer(1, 0) = 0 on the node in p.yaml");
  CHECK(d.all()[0].loc.line == 2);
  CHECK(d.all()[0].loc.column == 42);
}

TEST_CASE("holder.group and the share lists name this machine's users and groups: check says which do not exist") {
  const std::string text = R"(version: 1
holder: {socket: /tmp/x.sock, group: gpu}
pools:
  - {name: a, devices: [0], handle_types: [posix_fd], share: {users: [svc-infer, alice], groups: [gpu]}}
  - {name: b, devices: [0], handle_types: [posix_fd], share: {users: [svc-infer]}}
)";
  CheckOptions o;
  o.user_exists = [](const std::string& n) { return n == "alice"; };
  o.group_exists = [](const std::string& n) { return n == "video"; };
  const Judged j = judge_config(
      SourceFile("t.yaml", text), [] { return test::two_gpu_node(); }, Scope::all, o);
  std::vector<std::string> seen;
  for (const auto& f : j.diags.sorted())
    seen.push_back(f.code + " " + severity_name(f.severity) + " " + std::to_string(f.loc.line) + ":" +
                   std::to_string(f.loc.column));
  // holder.group: an error (hold would stop at the socket after creating everything); a share
  // entry: a warning (it grants nothing); each name once, where it is first written.
  CHECK(seen == std::vector<std::string>{"unknown-group error 2:38", "unknown-user warning 4:71",
                                         "unknown-group warning 4:99"});
  CHECK(j.rejected());
  const std::string rendered = render_text(j.diags, SourceFile("t.yaml", text));
  CHECK(rendered.find("groupadd --system gpu") != std::string::npos);
  CHECK(rendered.find("useradd --system svc-infer") != std::string::npos);

  // Judged against a recorded node (check --profile), this machine's accounts are no proof.
  o.accounts_here = false;
  const Judged elsewhere = judge_config(
      SourceFile("t.yaml", text), [] { return test::two_gpu_node(); }, Scope::all, o);
  CHECK_FALSE(elsewhere.rejected());
  CHECK(elsewhere.diags.count(Severity::warning) == 3);
  o.accounts_here = true;

  // Everything exists: nothing to say.
  o.user_exists = o.group_exists = [](const std::string&) { return true; };
  const Judged fine = judge_config(
      SourceFile("t.yaml", text), [] { return test::two_gpu_node(); }, Scope::all, o);
  CHECK(fine.diags.all().empty());
  // Inside an application (exec) only process: is judged: no accounts.
  o.user_exists = o.group_exists = [](const std::string&) { return false; };
  const Judged process = judge_config(
      SourceFile("t.yaml", text), [] { return test::two_gpu_node(); }, Scope::process, o);
  CHECK(process.diags.all().empty());
}

TEST_CASE("a file naming thousands of accounts costs at most kMaxAccountLookups lookups") {
  std::string text = "version: 1\npools:\n  - {name: a, devices: [0], handle_types: [posix_fd], share: {users: [";
  for (int i = 0; i < 500; ++i) text += (i ? ", u" : "u") + std::to_string(i);
  text += "]}}\n";
  std::size_t asked = 0;
  CheckOptions o;
  o.user_exists = [&](const std::string&) {
    ++asked;
    return false;
  };
  const Judged j = judge_config(
      SourceFile("t.yaml", text), [] { return test::two_gpu_node(); }, Scope::all, o);
  CHECK(asked == kMaxAccountLookups);
  CHECK(j.diags.count(Severity::warning) == static_cast<int>(kMaxAccountLookups));
}

TEST_CASE("a file with schema errors is judged on the node too: every finding in one run") {
  const std::string text = R"(version: 1
pools:
  - {name: kv, devices: [0], reserve: 90GiB, colour: blue}
  - {name: kv2, devices: [5]}
)";
  bool asked = false;
  const Judged j = judge_config(
      SourceFile("t.yaml", text),
      [&] {
        asked = true;
        return test::two_gpu_node();
      },
      Scope::all);
  CHECK(asked);
  CHECK(j.diags.has_invalid_input());
  std::vector<std::string> codes;
  for (const auto& f : j.diags.sorted()) codes.push_back(f.code);
  CHECK(has(codes, "unknown-key"));
  CHECK(has(codes, "unknown-device"));
  CHECK(has(codes, "reserve-above-free"));

  // Not a config at all: the node is not asked.
  asked = false;
  const Judged yaml = judge_config(
      SourceFile("t.yaml", "version: 1\npools: [\n"),
      [&] {
        asked = true;
        return test::two_gpu_node();
      },
      Scope::all);
  CHECK_FALSE(asked);
  CHECK(yaml.diags.has_invalid_input());
  // No node to ask (no driver): the file's own errors stand, nothing thrown.
  const Judged no_node = judge_config(
      SourceFile("t.yaml", text), []() -> NodeReport { throw Error(Errc::no_driver, "no driver"); }, Scope::all);
  CHECK(no_node.diags.has_invalid_input());
  CHECK_FALSE(no_node.node);
}

TEST_CASE("a long fact many findings share is shown once; the others point at it") {
  const std::string text = "version: 1\npools:\n  - {name: a, devices: [7]}\n  - {name: b, devices: [8]}\n";
  const Judged j = judge_config(
      SourceFile("t.yaml", text), [] { return test::two_gpu_node(); }, Scope::all);
  const std::string rendered = render_text(j.diags, SourceFile("t.yaml", text));
  CHECK(rendered.find("= note: as at 3:25 above") != std::string::npos);
  const std::string fact = j.diags.sorted().at(0).fact;
  REQUIRE(fact.size() >= 60);
  CHECK(rendered.find(fact) == rendered.rfind(fact));  // once
  // The JSON form keeps each finding whole.
  CHECK(j.diags.sorted().at(1).fact == fact);
}
