#include "cli/nfd.h"

#include <cctype>
#include <cstdint>
#include <sstream>

#include "base/text.h"

namespace cupool {

namespace {

bool alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

const char* boolean(bool b) { return b ? "true" : "false"; }

bool supports(const DeviceReport& d, HandleType type) {
  return d.info.memory_pools && (d.info.pool_handle_types & static_cast<std::uint32_t>(type)) != 0;
}

// "true" when a fabric export was proven on every device (--deep), "false" when a device lacks
// fabric pools or its export failed, "unverified" otherwise: the attribute reads 1 on nodes
// where the export still fails for want of an IMEX channel (README, `query --deep`).
std::string fabric_usable(const NodeReport& report) {
  bool proven = true;
  for (const auto& d : report.devices) {
    if (!supports(d, HandleType::fabric)) return "false";
    bool ok = false;
    for (const auto& p : d.probes)
      if (p.handle_type == HandleType::fabric) {
        if (!p.ok) return "false";
        ok = true;
      }
    proven = proven && ok;
  }
  return proven ? "true" : "unverified";
}

// Both directions of peer access between the devices at positions r and c of the report.
bool mutual(const NodeReport& report, std::size_t r, std::size_t c) {
  return report.peer_access[r][c] && report.peer_access[c][r];
}

// The size of the largest clique of `adjacent` within `candidates` (Bron-Kerbosch with a pivot).
// Peer access on real nodes comes in a few cliques (NVLink domains, PCIe switches), so this
// returns after a handful of calls.
int largest_clique(const std::vector<std::uint64_t>& adjacent, std::uint64_t candidates, std::uint64_t excluded,
                   int size) {
  if (candidates == 0 && excluded == 0) return size;
  const std::uint64_t both = candidates | excluded;
  int pivot = 0;
  while ((both >> pivot & 1u) == 0) ++pivot;
  int best = size;
  std::uint64_t left = candidates & ~adjacent[static_cast<std::size_t>(pivot)];
  while (left != 0) {
    int v = 0;
    while ((left >> v & 1u) == 0) ++v;
    const std::uint64_t bit = std::uint64_t{1} << v;
    const std::uint64_t next = adjacent[static_cast<std::size_t>(v)];
    const int found = largest_clique(adjacent, candidates & next, excluded & next, size + 1);
    if (found > best) best = found;
    candidates &= ~bit;
    excluded |= bit;
    left &= ~bit;
  }
  return best;
}

}  // namespace

std::string nfd_label_value(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (alnum(c) || c == '.' || c == '_' || c == '-')
      out += c;
    else if (out.empty() || out.back() != '-')
      out += '-';
  }
  // A value starts and ends with a letter or digit, and has at most 63 characters.
  std::size_t first = 0;
  while (first < out.size() && !alnum(out[first])) ++first;
  out.erase(0, first);
  if (out.size() > 63) out.resize(63);
  while (!out.empty() && !alnum(out.back())) out.pop_back();
  return out.empty() ? "unknown" : out;
}

std::vector<NodeLabel> nfd_labels(const NodeReport& report) {
  std::vector<NodeLabel> labels;
  const auto add = [&labels](const std::string& name, const std::string& value) {
    labels.push_back({std::string(kNfdLabelPrefix) + name, value});
  };
  const auto& devices = report.devices;
  const std::size_t n = devices.size();

  add("driver.cuda", nfd_label_value(cuda_version_string(report.driver_version)));
  if (!report.kernel_driver_version.empty()) add("driver.kernel-module", nfd_label_value(report.kernel_driver_version));
  add("gpu.count", std::to_string(n));
  bool same_name = true;
  for (const auto& d : devices) same_name = same_name && d.info.name == devices.front().info.name;
  add("gpu.product", n == 0 ? "none" : same_name ? nfd_label_value(devices.front().info.name) : "mixed");

  bool any_pools = false;
  bool all_pools = n > 0;
  for (const auto& d : devices) {
    any_pools = any_pools || d.info.memory_pools;
    all_pools = all_pools && d.info.memory_pools;
  }
  add("pools.any", boolean(any_pools));
  add("pools.all", boolean(all_pools));
  for (HandleType type : {HandleType::posix_fd, HandleType::fabric}) {
    bool all = n > 0;
    for (const auto& d : devices) all = all && supports(d, type);
    add(std::string("handle-type.") + handle_type_name(type), boolean(all));
  }
  add("fabric.usable", n == 0 ? "false" : fabric_usable(report));

  bool all_pairs = true;
  int pairs = 0;
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t c = 0; c < n; ++c) {
      if (r == c) continue;
      all_pairs = all_pairs && report.peer_access[r][c];
      if (r < c && mutual(report, r, c)) ++pairs;
    }
  add("peer.all-pairs", boolean(all_pairs));
  add("peer.pairs", std::to_string(pairs));
  // The most GPUs one job can get with peer access among all of them. A node with more than 64
  // devices (none is built) goes without this label rather than without a bound on the search.
  if (n > 0 && n <= 64) {
    std::vector<std::uint64_t> adjacent(n, 0);
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t c = 0; c < n; ++c)
        if (r != c && mutual(report, r, c)) adjacent[r] |= std::uint64_t{1} << c;
    const std::uint64_t everyone = n == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1;
    add("peer.largest-group", std::to_string(largest_clique(adjacent, everyone, 0, 0)));
  }
  return labels;
}

std::string render_nfd(const NodeReport& report) {
  std::ostringstream out;
  // Comments only: NFD reads "# +" lines as directives (expiry-time, no-label), so none starts so.
  out << "# Node labels from `cupool query --format nfd` (cupool " << CUPOOL_VERSION << ") for the local source of\n"
      << "# node-feature-discovery: /etc/kubernetes/node-feature-discovery/features.d/cupool\n";
  if (report.source.simulated) out << "# Simulated node: " << safe_for_display(report.source.profile_path) << "\n";
  if (report.deep) out << "# With --deep: fabric.usable is the outcome of a real fabric export\n";
  for (const auto& label : nfd_labels(report)) out << label.name << "=" << label.value << "\n";
  return out.str();
}

}  // namespace cupool
