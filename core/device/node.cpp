#include "device/node.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>

#include "base/error.h"
#include "base/output.h"
#include "base/text.h"
#include "model/model.h"

namespace cupool {

using json = nlohmann::ordered_json;

const DeviceReport* NodeReport::device(int ordinal) const {
  if (ordinal < 0 || static_cast<std::size_t>(ordinal) >= devices.size()) return nullptr;
  return &devices[static_cast<std::size_t>(ordinal)];
}

bool NodeReport::managed_pools_supported(int ordinal) const {
  const DeviceReport* d = device(ordinal);
  return d && driver_version >= 13000 && d->info.managed_memory;
}

std::string cuda_version_string(int version) {
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

// ---- selectors ----

namespace {

bool is_hex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

bool hex_run(std::string_view s, std::size_t from, std::size_t count) {
  if (from + count > s.size()) return false;
  for (std::size_t i = from; i < from + count; ++i)
    if (!is_hex(s[i])) return false;
  return true;
}

bool is_uuid_body(std::string_view s) {
  // 8-4-4-4-12 hex digits
  static const std::size_t groups[] = {8, 4, 4, 4, 12};
  std::size_t pos = 0;
  for (std::size_t g = 0; g < 5; ++g) {
    if (!hex_run(s, pos, groups[g])) return false;
    pos += groups[g];
    if (g < 4) {
      if (pos >= s.size() || s[pos] != '-') return false;
      ++pos;
    }
  }
  return pos == s.size();
}

}  // namespace

std::optional<std::string> normalize_pci_bus_id(std::string_view text) {
  // [domain:]bus:device.function, all hex; domain up to 8 digits.
  std::string s = to_lower(text);
  std::size_t dot = s.rfind('.');
  if (dot == std::string::npos || dot + 2 != s.size() || !is_hex(s[dot + 1])) return std::nullopt;
  std::vector<std::string> parts;
  std::string cur;
  for (std::size_t i = 0; i < dot; ++i) {
    if (s[i] == ':') {
      parts.push_back(cur);
      cur.clear();
    } else if (is_hex(s[i])) {
      cur += s[i];
    } else {
      return std::nullopt;
    }
  }
  parts.push_back(cur);
  if (parts.size() == 2) parts.insert(parts.begin(), "0000");
  if (parts.size() != 3) return std::nullopt;
  if (parts[0].empty() || parts[0].size() > 8 || parts[1].size() != 2 || parts[2].size() != 2) return std::nullopt;
  const unsigned long domain = std::stoul(parts[0], nullptr, 16);
  if (domain > 0xffff) return std::nullopt;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04lx:%s:%s.%c", domain, parts[1].c_str(), parts[2].c_str(), s[dot + 1]);
  return std::string(buf);
}

std::optional<DeviceSelector> parse_device_selector(std::string_view text, std::string* why) {
  DeviceSelector sel;
  sel.text = std::string(text);
  if (!text.empty() && text.size() <= 4 &&
      std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; })) {
    sel.kind = DeviceSelector::Kind::index;
    sel.index = std::stoi(std::string(text));
    sel.normalized = std::to_string(sel.index);
    return sel;
  }
  if (text.size() > 4 && iequals(text.substr(0, 4), "GPU-")) {
    if (!is_uuid_body(text.substr(4))) {
      if (why) *why = "a GPU UUID looks like GPU-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b (8-4-4-4-12 hex digits)";
      return std::nullopt;
    }
    sel.kind = DeviceSelector::Kind::uuid;
    sel.normalized = "GPU-" + to_lower(text.substr(4));
    return sel;
  }
  if (auto pci = normalize_pci_bus_id(text)) {
    sel.kind = DeviceSelector::Kind::pci_bus_id;
    sel.normalized = *pci;
    return sel;
  }
  if (why)
    *why = "a device is an index (0), a UUID (GPU-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b) or a PCI bus id (0000:1b:00.0)";
  return std::nullopt;
}

std::optional<int> resolve_device(const NodeReport& node, const DeviceSelector& selector) {
  for (const auto& d : node.devices) {
    switch (selector.kind) {
      case DeviceSelector::Kind::index:
        if (d.info.ordinal == selector.index) return d.info.ordinal;
        break;
      case DeviceSelector::Kind::uuid:
        if (iequals(d.info.uuid, selector.normalized)) return d.info.ordinal;
        break;
      case DeviceSelector::Kind::pci_bus_id:
        if (normalize_pci_bus_id(d.info.pci_bus_id).value_or("") == selector.normalized) return d.info.ordinal;
        break;
    }
  }
  return std::nullopt;
}

std::string device_label(const NodeReport& node, int ordinal) {
  const DeviceReport* d = node.device(ordinal);
  std::string label = "GPU " + std::to_string(ordinal);
  if (d && !d->info.name.empty()) label += " (" + d->info.name + ")";
  return label;
}

// ---- JSON ----

namespace {

model::DeviceFacts device_facts(const DeviceReport& d, int driver_version) {
  const DeviceInfo& i = d.info;
  model::DeviceFacts f;
  f.id = {i.ordinal, i.uuid, i.pci_bus_id};
  f.name = i.name;
  f.compute_capability = std::to_string(i.cc_major) + "." + std::to_string(i.cc_minor);
  f.memory_total_bytes = i.total_memory;
  if (d.memory) f.memory_free_bytes = d.memory->free;
  f.memory_pools = i.memory_pools;
  f.pool_handle_types = handle_type_names(i.pool_handle_types);
  f.fabric_handle = i.fabric_handle;
  f.host_memory_pools = i.host_memory_pools;
  f.host_numa_memory_pools = i.host_numa_memory_pools;
  if (i.host_numa_id >= 0) f.host_numa_id = i.host_numa_id;
  f.managed_memory = i.managed_memory;
  f.managed_pools = driver_version >= 13000 && i.managed_memory;
  f.concurrent_managed_access = i.concurrent_managed_access;
  f.pageable_memory_access = i.pageable_memory_access;
  f.vmm = i.vmm;
  f.ipc_events = i.ipc_events;
  f.gpu_direct_rdma = i.gpu_direct_rdma;
  if (!d.probes.empty()) {
    f.probes.emplace();
    for (const auto& p : d.probes) {
      model::HandleProbe probe{handle_type_name(p.handle_type), p.ok, std::nullopt};
      if (!p.ok)
        probe.error = model::ErrorInfo{"cuda_error", p.reason.empty() ? p.error : p.reason,
                                       p.api.empty() ? std::nullopt : std::optional(p.api), p.error};
      f.probes->push_back(std::move(probe));
    }
  }
  return f;
}

// Typed readers that name the key in their error.
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) fail("", "must be a mapping");
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw InputError(where_ + (key.empty() ? "" : "." + key) + ": " + what);
  }
  const json& at(const std::string& key) const {
    auto it = j_.find(key);
    if (it == j_.end()) fail(key, "missing");
    return *it;
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  std::string str(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_string()) fail(key, "must be a string");
    return v.get<std::string>();
  }
  bool flag(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_boolean()) fail(key, "must be true or false");
    return v.get<bool>();
  }
  std::int64_t integer(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_number_integer()) fail(key, "must be an integer");
    return v.get<std::int64_t>();
  }
  std::uint64_t uinteger(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
      fail(key, "must be a non-negative integer");
    return v.get<std::uint64_t>();
  }
  std::string path(const std::string& key) const { return where_ + "." + key; }

 private:
  const json& j_;
  std::string where_;
};

HandleType handle_type_from(const std::string& name, const Reader& r, const std::string& key) {
  if (name == "none") return HandleType::none;
  if (name == "posix_fd") return HandleType::posix_fd;
  if (name == "fabric") return HandleType::fabric;
  r.fail(key, "unknown handle type '" + name + "'");
}

std::uint32_t handle_mask_from(const json& names, const Reader& r, const std::string& key) {
  if (!names.is_array()) r.fail(key, "must be a list");
  std::uint32_t mask = 0;
  for (const auto& n : names) {
    if (!n.is_string()) r.fail(key, "must list handle type names");
    const std::string s = n.get<std::string>();
    if (s == "posix_fd")
      mask |= 0x1;
    else if (s == "win32")
      mask |= 0x2;
    else if (s == "win32_kmt")
      mask |= 0x4;
    else if (s == "fabric")
      mask |= 0x8;
    else
      r.fail(key, "unknown handle type '" + s + "'");
  }
  return mask;
}

// A profile written before the names of v1 were amended (docs/naming.md) says `index`, `memory.total`
// and `memory.free`, and a failed probe's error as three strings: read for one version, with a
// warning in `old` naming the first such key.
DeviceReport device_from_json(const json& j, const std::string& where, std::string& old) {
  Reader r(j, where);
  DeviceReport d;
  DeviceInfo& i = d.info;
  const bool old_names = !r.has("device") && r.has("index");
  if (old_names && old.empty()) old = r.path("index");
  i.ordinal = static_cast<int>(r.integer(old_names ? "index" : "device"));
  i.name = r.str("name");
  i.uuid = r.str("uuid");
  i.pci_bus_id = r.str("pci_bus_id");
  const std::string cc = r.str("compute_capability");
  if (std::sscanf(cc.c_str(), "%d.%d", &i.cc_major, &i.cc_minor) != 2) r.fail("compute_capability", "must be like 9.0");
  Reader mem(r.at("memory"), r.path("memory"));
  const bool old_memory = !mem.has("total_bytes") && mem.has("total");
  if (old_memory && old.empty()) old = mem.path("total");
  const std::string total = old_memory ? "total" : "total_bytes", free = old_memory ? "free" : "free_bytes";
  i.total_memory = mem.uinteger(total);
  if (mem.has(free) && !mem.at(free).is_null()) d.memory = MemoryInfo{mem.uinteger(free), i.total_memory};
  i.memory_pools = r.flag("memory_pools");
  i.pool_handle_types = handle_mask_from(r.at("pool_handle_types"), r, "pool_handle_types");
  i.fabric_handle = r.flag("fabric_handle");
  i.host_memory_pools = r.flag("host_memory_pools");
  i.host_numa_memory_pools = r.flag("host_numa_memory_pools");
  i.host_numa_id = r.at("host_numa_id").is_null() ? -1 : static_cast<int>(r.integer("host_numa_id"));
  i.managed_memory = r.flag("managed_memory");
  i.concurrent_managed_access = r.flag("concurrent_managed_access");
  i.pageable_memory_access = r.flag("pageable_memory_access");
  i.vmm = r.flag("vmm");
  i.ipc_events = r.flag("ipc_events");
  i.gpu_direct_rdma = r.flag("gpu_direct_rdma");
  const char* probes_key = r.has("probes") ? "probes" : "deep";  // deep: the old name
  if (r.has(probes_key)) {
    if (std::string(probes_key) == "deep" && old.empty()) old = r.path("deep");
    const json& probes = r.at(probes_key);
    if (!probes.is_array()) r.fail(probes_key, "must be a list");
    for (std::size_t k = 0; k < probes.size(); ++k) {
      Reader p(probes[k], r.path(std::string(probes_key) + "[" + std::to_string(k) + "]"));
      ExportProbe probe;
      probe.handle_type = handle_type_from(p.str("handle_type"), p, "handle_type");
      probe.ok = p.flag("ok");
      if (!probe.ok && p.at("error").is_string()) {  // the old form
        if (old.empty()) old = p.path("error");
        probe.error = p.str("error");
        probe.api = p.has("api") ? p.str("api") : "";
        probe.reason = p.has("reason") ? p.str("reason") : "";
      } else if (!probe.ok) {
        Reader e(p.at("error"), p.path("error"));
        probe.error = e.has("result") ? e.str("result") : e.str("code");
        probe.api = e.has("api") ? e.str("api") : "";
        probe.reason = e.str("message");
      }
      d.probes.push_back(probe);
    }
  }
  return d;
}

}  // namespace

model::Source source_of(const ReportSource& s) {
  model::Source out;
  out.simulated = s.simulated;
  out.backend = s.description;
  if (s.simulated) {
    out.profile = s.profile_path;
    out.synthetic = s.synthetic;
    if (!s.recorded.empty()) out.recorded = s.recorded;
    if (!s.recorded_host.empty()) out.recorded_host = s.recorded_host;
  }
  return out;
}

model::NodeFacts facts_of(const NodeReport& report) {
  model::NodeFacts f;
  f.source = source_of(report.source);
  f.cuda_version = cuda_version_string(report.driver_version);
  f.cuda_version_int = report.driver_version;
  if (!report.kernel_driver_version.empty()) f.kernel_module = report.kernel_driver_version;
  f.built_with_cuda = cuda_version_string(report.built_with_cuda);
  f.numa_nodes = report.host_numa_nodes;
  for (const auto& d : report.devices) f.devices.push_back(device_facts(d, report.driver_version));
  f.peer_access = report.peer_access;
  f.deep = report.deep;
  if (report.gds) {
    const GdsReport& g = *report.gds;
    model::GdsFacts out;
    out.mode = to_string(g.mode);
    out.library_version = g.library_version;
    out.nvidia_fs_version = g.nvidia_fs_version;
    out.file_systems = g.file_systems;
    if (!g.reason.empty()) out.note = g.reason;
    if (!g.error_api.empty()) {
      model::ErrorInfo e;
      e.code = "cufile_error";
      e.message = g.error_message;
      e.api = g.error_api;
      if (!g.error_result.empty()) e.result = g.error_result;
      out.error = e;
    }
    f.gds = out;
  }
  return f;
}

json to_json(const NodeReport& report) { return model::to_json(facts_of(report)); }

NodeReport report_from_json(const json& j, const std::string& origin) {
  Reader r(j, origin);
  NodeReport report;
  Reader driver(r.at("driver"), r.path("driver"));
  report.driver_version = static_cast<int>(driver.integer("cuda_version_int"));
  if (driver.has("kernel_module") && !driver.at("kernel_module").is_null())
    report.kernel_driver_version = driver.str("kernel_module");
  report.built_with_cuda = built_with_cuda_version();
  Reader host(r.at("host"), r.path("host"));
  const json& numa = host.at("numa_nodes");
  if (!numa.is_array()) host.fail("numa_nodes", "must be a list");
  for (const auto& n : numa) {
    if (!n.is_number_integer()) host.fail("numa_nodes", "must list integers");
    report.host_numa_nodes.push_back(n.get<int>());
  }
  const json& devices = r.at("devices");
  if (!devices.is_array()) r.fail("devices", "must be a list");
  std::string old;
  for (std::size_t k = 0; k < devices.size(); ++k) {
    report.devices.push_back(device_from_json(devices[k], r.path("devices[" + std::to_string(k) + "]"), old));
    if (report.devices.back().info.ordinal != static_cast<int>(k))
      r.fail("devices[" + std::to_string(k) + "].device", "must be " + std::to_string(k) + " (devices in order)");
  }
  if (!old.empty())
    report.source.warnings.push_back(
        old +
        ": a profile in the names of cupool before v1 was amended (index, "
        "memory.total, memory.free, deep for probes, their error as text); read this once, and write "
        "it again with `cupool query --profile-out` (docs/naming.md)");
  const json& peers = r.at("peer_access");
  const std::size_t n = report.devices.size();
  if (!peers.is_array() || peers.size() != n)
    r.fail("peer_access", "must be a " + std::to_string(n) + "x" + std::to_string(n) + " matrix");
  for (const auto& row : peers) {
    if (!row.is_array() || row.size() != n)
      r.fail("peer_access", "must be a " + std::to_string(n) + "x" + std::to_string(n) + " matrix");
    std::vector<bool> out;
    for (const auto& v : row) {
      if (!v.is_boolean()) r.fail("peer_access", "must hold true or false");
      out.push_back(v.get<bool>());
    }
    report.peer_access.push_back(out);
  }
  report.deep = r.has("deep") && r.flag("deep");
  if (r.has("gds") && !r.at("gds").is_null()) {
    Reader g(r.at("gds"), r.path("gds"));
    GdsReport gds;
    const std::string mode = g.str("mode");
    const auto m = gds_mode_from_string(mode);
    if (!m) g.fail("mode", "must be unavailable, compatibility or gpudirect, not '" + mode + "'");
    gds.mode = *m;
    if (g.has("library_version") && !g.at("library_version").is_null()) gds.library_version = g.str("library_version");
    if (g.has("nvidia_fs_version") && !g.at("nvidia_fs_version").is_null())
      gds.nvidia_fs_version = g.str("nvidia_fs_version");
    if (g.has("file_systems")) {
      const json& fs = g.at("file_systems");
      if (!fs.is_array()) g.fail("file_systems", "must be a list");
      for (const auto& f : fs) {
        if (!f.is_string()) g.fail("file_systems", "must list names");
        gds.file_systems.push_back(f.get<std::string>());
      }
    }
    if (g.has("note") && !g.at("note").is_null()) gds.reason = g.str("note");
    if (g.has("error") && !g.at("error").is_null()) {
      Reader e(g.at("error"), g.path("error"));
      gds.error_message = e.str("message");
      gds.error_api = e.has("api") ? e.str("api") : "cuFile";
      if (e.has("result")) gds.error_result = e.str("result");
    }
    report.gds = gds;
  }
  return report;
}

NodeReport load_profile(const std::string& path) {
  YAML::Node root;
  try {
    if (path == "-") {
      root = YAML::Load(std::cin);
    } else {
      std::ifstream in(path);
      if (!in) throw InputError("cannot read node profile '" + path + "': " + std::strerror(errno));
      root = YAML::Load(in);
    }
  } catch (const YAML::Exception& e) {
    throw InputError(path + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                     ": not a valid node profile: " + e.msg);
  }
  const json j = yaml_to_json(root);
  if (!j.is_object() || !j.contains("profile") || !j.contains("node"))
    throw InputError(path +
                     ": not a node profile (expected 'profile:' and 'node:' sections, as written by "
                     "`cupool query --profile-out`)");
  Reader meta(j["profile"], path + ": profile");
  if (meta.integer("version") != 1) meta.fail("version", "unsupported profile version (this cupool reads 1)");
  NodeReport report = report_from_json(j["node"], path + ": node");
  report.source.simulated = true;
  report.source.profile_path = path;
  report.source.synthetic = meta.has("synthetic") && meta.flag("synthetic");
  if (meta.has("recorded")) report.source.recorded = meta.str("recorded");
  if (meta.has("host")) report.source.recorded_host = meta.str("host");
  if (meta.has("note")) report.source.note = meta.str("note");
  report.source.description = "simulated node (" + path + ")";
  return report;
}

void save_profile(const NodeReport& report, const std::string& path) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  json node = to_json(report);
  node.erase("source");
  node.erase("built_with_cuda");
  json doc;
  doc["profile"] = {{"version", 1},
                    {"recorded", when},
                    {"host", host},
                    {"cupool", CUPOOL_VERSION},
                    {"synthetic", report.source.synthetic},
                    {"recorded_from", report.source.description}};
  doc["node"] = node;
  const std::string text =
      "# cupool node profile, written by `cupool query --profile-out`.\n"
      "# Use it with --profile to check configs against this node on any machine.\n" +
      to_yaml(doc);
  if (path == "-") {
    std::cout << text;
    return;
  }
  write_file_atomically(path, text);  // a reader sees the old profile or the new one
}

}  // namespace cupool
