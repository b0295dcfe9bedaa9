#include "cli/nfd.h"

#include <doctest/doctest.h>

#include <map>
#include <regex>
#include <string>

#include "device/query.h"
#include "device/sim_backend.h"
#include "tests/unit/fixtures.h"

using namespace cupool;

namespace {

// Kubernetes' own rules (apimachinery validation: IsQualifiedName, IsValidLabelValue), written
// out here so that the test does not trust the code it checks.
const std::regex kName("([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]");
const std::regex kDnsSubdomain("[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");

bool valid_label_name(const std::string& full) {
  const auto slash = full.find('/');
  if (slash == std::string::npos || full.find('/', slash + 1) != std::string::npos) return false;
  const std::string prefix = full.substr(0, slash);
  const std::string name = full.substr(slash + 1);
  return prefix.size() <= 253 && std::regex_match(prefix, kDnsSubdomain) && name.size() <= 63 &&
         std::regex_match(name, kName);
}

bool valid_label_value(const std::string& value) {
  return value.empty() || (value.size() <= 63 && std::regex_match(value, kName));
}

NodeReport from_profile(const std::string& name, bool deep = false) {
  SimBackend sim(load_profile(std::string(CUPOOL_SOURCE_DIR) + "/configs/profiles/" + name));
  QueryOptions options;
  options.deep = deep;
  return build_report(sim, options);
}

// The labels without the prefix, by name.
std::map<std::string, std::string> by_name(const NodeReport& report) {
  std::map<std::string, std::string> out;
  for (const auto& l : nfd_labels(report)) {
    REQUIRE(l.name.rfind(kNfdLabelPrefix, 0) == 0);
    CHECK_MESSAGE(out.count(l.name) == 0, "label " << l.name << " twice");
    out[l.name.substr(kNfdLabelPrefix.size())] = l.value;
  }
  return out;
}

}  // namespace

TEST_CASE("nfd: every label of every bundled profile is a valid Kubernetes label") {
  for (const char* profile : {"h100.yaml", "h200x2.yaml", "synthetic-8gpu-mixed-peers.yaml"})
    for (bool deep : {false, true}) {
      CAPTURE(profile);
      CAPTURE(deep);
      const auto labels = nfd_labels(from_profile(profile, deep));
      CHECK(labels.size() >= 12);
      for (const auto& l : labels) {
        CAPTURE(l.name);
        CAPTURE(l.value);
        CHECK(valid_label_name(l.name));
        CHECK(valid_label_value(l.value));
      }
    }
}

TEST_CASE("nfd: the recorded H100") {
  const auto labels = by_name(from_profile("h100.yaml"));
  const std::map<std::string, std::string> expected{
      {"driver.cuda", "13.0"},
      {"driver.kernel-module", "580.159.04"},
      {"gpu.count", "1"},
      {"gpu.product", "NVIDIA-H100-80GB-HBM3"},
      {"pools.any", "true"},
      {"pools.all", "true"},
      {"handle-type.posix_fd", "true"},
      {"handle-type.fabric", "true"},
      // The attribute says fabric; only an export (--deep) can say whether IMEX lets it work.
      {"fabric.usable", "unverified"},
      {"peer.all-pairs", "true"},
      {"peer.pairs", "0"},
      {"peer.largest-group", "1"},
  };
  CHECK(labels == expected);
  // Recorded with --deep on a node without an IMEX channel: the fabric export failed there.
  CHECK(by_name(from_profile("h100.yaml", true)).at("fabric.usable") == "false");
}

TEST_CASE("nfd: peer access of the two H200s and of the 8-GPU node in two NVLink groups") {
  const auto h200 = by_name(from_profile("h200x2.yaml"));
  CHECK(h200.at("gpu.count") == "2");
  CHECK(h200.at("gpu.product") == "NVIDIA-H200");
  CHECK(h200.at("peer.all-pairs") == "true");
  CHECK(h200.at("peer.pairs") == "1");
  CHECK(h200.at("peer.largest-group") == "2");

  const auto eight = by_name(from_profile("synthetic-8gpu-mixed-peers.yaml"));
  CHECK(eight.at("gpu.count") == "8");
  CHECK(eight.at("peer.all-pairs") == "false");
  CHECK(eight.at("peer.pairs") == "12");  // two groups of 4: 6 pairs each
  CHECK(eight.at("peer.largest-group") == "4");
}

TEST_CASE("nfd: a handle type or pools on only some devices is not the node's") {
  NodeReport node = test::two_gpu_node();
  node.devices[1].info.pool_handle_types = 0x1;  // no fabric on GPU 1
  auto labels = by_name(node);
  CHECK(labels.at("handle-type.posix_fd") == "true");
  CHECK(labels.at("handle-type.fabric") == "false");
  CHECK(labels.at("fabric.usable") == "false");

  node.devices[1].info.memory_pools = false;
  labels = by_name(node);
  CHECK(labels.at("pools.any") == "true");
  CHECK(labels.at("pools.all") == "false");
  CHECK(labels.at("handle-type.posix_fd") == "false");
}

TEST_CASE("nfd: fabric is usable only where every device's export worked") {
  NodeReport node = test::two_gpu_node();
  node.deep = true;
  for (auto& d : node.devices) d.probes.push_back({HandleType::fabric, true, "", "", "", ""});
  CHECK(by_name(node).at("fabric.usable") == "true");
  node.devices[1].probes[0] = {
      HandleType::fabric, false, "CUDA_ERROR_NOT_PERMITTED", "cuMemPoolExportToShareableHandle", "no IMEX channel", ""};
  CHECK(by_name(node).at("fabric.usable") == "false");
}

TEST_CASE("nfd: peer access one way only is no pair, and mixed products say so") {
  NodeReport node = test::two_gpu_node();
  node.peer_access = {{true, true}, {false, true}};
  node.devices[1].info.name = "Other GPU";
  const auto labels = by_name(node);
  CHECK(labels.at("peer.all-pairs") == "false");
  CHECK(labels.at("peer.pairs") == "0");
  CHECK(labels.at("peer.largest-group") == "1");
  CHECK(labels.at("gpu.product") == "mixed");
}

TEST_CASE("nfd: label values from any text") {
  CHECK(nfd_label_value("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3");
  CHECK(nfd_label_value("  Tesla  V100-SXM2 (32 GB)  ") == "Tesla-V100-SXM2-32-GB");
  CHECK(nfd_label_value("580.159.04") == "580.159.04");
  CHECK(nfd_label_value("") == "unknown");
  CHECK(nfd_label_value("\xe2\x80\xae\n") == "unknown");
  CHECK(nfd_label_value("-._x_.-") == "x");
  const std::string long_name = "GPU " + std::string(80, 'a') + " -x";
  const std::string v = nfd_label_value(long_name);
  CHECK(v.size() <= 63);
  CHECK(valid_label_value(v));
  // Cut at 63 where the 63rd character is not a letter or digit: the end is trimmed.
  CHECK(nfd_label_value(std::string(62, 'a') + "-b") == std::string(62, 'a'));
}

TEST_CASE("nfd: the feature file is comments and name=value lines NFD reads") {
  const std::string text = render_nfd(from_profile("h100.yaml"));
  std::size_t labels = 0;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = text.find('\n', at);
    REQUIRE(end != std::string::npos);  // every line ends with a newline
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.rfind("#", 0) == 0) {
      CHECK(line.rfind("# +", 0) != 0);  // NFD directives (expiry-time, no-label) start so
      continue;
    }
    const auto eq = line.find('=');
    REQUIRE(eq != std::string::npos);
    CHECK(valid_label_name(line.substr(0, eq)));
    CHECK(valid_label_value(line.substr(eq + 1)));
    ++labels;
  }
  CHECK(labels == nfd_labels(from_profile("h100.yaml")).size());
  CHECK(text.size() < 64 * 1024);  // NFD ignores a larger feature file
  CHECK(text.find("configs/profiles/h100.yaml") != std::string::npos);
}
