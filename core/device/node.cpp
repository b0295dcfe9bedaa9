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
#include "model/fields.h"
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

// A failed export probe's error, as query shows it.
model::ErrorInfo probe_error(const std::string& result, const std::string& api, const std::string& reason) {
  model::ErrorInfo e;
  e.code = "cuda_error";
  e.message = reason.empty() ? result : reason;
  if (!api.empty()) e.api = api;
  e.result = result;
  return e;
}

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
      if (!p.ok) probe.error = probe_error(p.error, p.api, p.reason);
      f.probes->push_back(std::move(probe));
    }
  }
  return f;
}

// A declared object read strictly from a file the user gave: an error names where it is, the
// key's path after `separator` and what is wrong (`p.yaml: node.devices[0].name: missing`).
// The reader's "is not an object" in a profile's (YAML's) words: "must be a mapping".
std::string in_profile_words(const std::string& problem) {
  static const char* const kIsNot = "is not ";
  if (problem.rfind(kIsNot, 0) != 0) return problem;
  const std::string want = problem.substr(std::strlen(kIsNot));
  if (want == "an object") return "must be a mapping";
  if (want == "an array") return "must be a list";
  if (want == "a boolean") return "must be true or false";
  return "must be " + want;
}

template <class T>
T read_strict(const json& j, const std::string& origin, const char* separator) {
  if (!j.is_object()) throw InputError(origin + ": must be a mapping");
  try {
    return model::read_json_strict<T>(j);
  } catch (const model::FieldError& e) {
    throw InputError(origin + separator + e.path() + ": " + in_profile_words(e.problem()));
  }
}

// A check of a node section's value that its declaration cannot say, naming the key's path.
[[noreturn]] void fail(const std::string& origin, const std::string& path, const std::string& what) {
  throw InputError(origin + "." + path + ": " + what);
}

HandleType handle_type_from(const std::string& name, const std::string& origin, const std::string& path) {
  for (const HandleType t : {HandleType::none, HandleType::posix_fd, HandleType::fabric})
    if (name == handle_type_name(t)) return t;
  fail(origin, path, "unknown handle type '" + name + "'");
}

// The mask of handle_type_names (posix_fd 0x1, win32 0x2, win32_kmt 0x4, fabric 0x8).
std::uint32_t handle_mask_from(const std::vector<std::string>& names, const std::string& origin,
                               const std::string& path) {
  std::uint32_t mask = 0;
  for (const auto& name : names) {
    std::uint32_t bit = 0x1;
    while (bit <= 0x8 && handle_type_names(bit) != std::vector<std::string>{name}) bit <<= 1;
    if (bit > 0x8) fail(origin, path, "unknown handle type '" + name + "'");
    mask |= bit;
  }
  return mask;
}

// A profile written before the names of v1 were amended (docs/naming.md) says `index`,
// `memory.total` and `memory.free`, `deep` for a device's probes, and a failed probe's error as
// three strings (error, api, reason): rewritten here into today's names, for one version, with the
// first such key's path in `old` (the warning names it). These are the only key names the reader
// spells out; the rest come from the declarations (model/fields.h).
void upgrade_old_names(json& node, const std::string& origin, std::string& old) {
  static const char* const kDevice[][2] = {{"index", "device"}, {"deep", "probes"}};
  static const char* const kMemory[][2] = {{"total", "total_bytes"}, {"free", "free_bytes"}};
  const auto rename = [&](json& j, const char* const(&names)[2], const std::string& where) {
    if (!j.is_object() || j.contains(names[1]) || !j.contains(names[0])) return;
    if (old.empty()) old = origin + "." + where + names[0];
    j[names[1]] = std::move(j[names[0]]);
    j.erase(names[0]);
  };
  const auto devices = node.is_object() ? node.find("devices") : node.end();
  if (devices == node.end() || !devices->is_array()) return;
  for (std::size_t k = 0; k < devices->size(); ++k) {
    json& d = (*devices)[k];
    const std::string where = "devices[" + std::to_string(k) + "].";
    for (const auto& names : kDevice) rename(d, names, where);
    if (!d.is_object()) continue;
    if (const auto memory = d.find("memory"); memory != d.end())
      for (const auto& names : kMemory) rename(*memory, names, where + "memory.");
    const auto probes = d.find("probes");
    if (probes == d.end() || !probes->is_array()) continue;
    for (std::size_t p = 0; p < probes->size(); ++p) {
      json& probe = (*probes)[p];
      const auto error = probe.is_object() ? probe.find("error") : probe.end();
      if (error == probe.end() || !error->is_string()) continue;
      if (old.empty()) old = origin + "." + where + "probes[" + std::to_string(p) + "].error";
      // Its api and reason beside it, strings; the old reader took nothing else.
      const auto text = [&](const char* key) {
        const auto it = probe.find(key);
        return it != probe.end() && it->is_string() ? it->get<std::string>() : std::string();
      };
      *error = model::write_json(probe_error(error->get<std::string>(), text("api"), text("reason")));
    }
  }
}

// The report a node section's facts describe (the inverse of facts_of), with the checks of values
// that a declaration cannot say.
NodeReport report_of(const model::NodeFacts& f, const std::string& origin) {
  NodeReport report;
  report.driver_version = f.cuda_version_int;
  report.kernel_driver_version = f.kernel_module.value_or("");
  report.built_with_cuda = built_with_cuda_version();
  report.host_numa_nodes = f.numa_nodes;
  for (std::size_t k = 0; k < f.devices.size(); ++k) {
    const model::DeviceFacts& df = f.devices[k];
    const std::string where = "devices[" + std::to_string(k) + "]";
    DeviceReport d;
    DeviceInfo& i = d.info;
    i.ordinal = df.id.device;
    if (i.ordinal != static_cast<int>(k))
      fail(origin, where + ".device", "must be " + std::to_string(k) + " (devices in order)");
    i.name = df.name;
    i.uuid = df.id.uuid;
    i.pci_bus_id = df.id.pci_bus_id;
    if (std::sscanf(df.compute_capability.c_str(), "%d.%d", &i.cc_major, &i.cc_minor) != 2)
      fail(origin, where + ".compute_capability", "must be like 9.0");
    i.total_memory = df.memory_total_bytes;
    if (df.memory_free_bytes) d.memory = MemoryInfo{*df.memory_free_bytes, i.total_memory};
    i.memory_pools = df.memory_pools;
    i.pool_handle_types = handle_mask_from(df.pool_handle_types, origin, where + ".pool_handle_types");
    i.fabric_handle = df.fabric_handle;
    i.host_memory_pools = df.host_memory_pools;
    i.host_numa_memory_pools = df.host_numa_memory_pools;
    i.host_numa_id = df.host_numa_id.value_or(-1);
    i.managed_memory = df.managed_memory;
    i.concurrent_managed_access = df.concurrent_managed_access;
    i.pageable_memory_access = df.pageable_memory_access;
    i.vmm = df.vmm;
    i.ipc_events = df.ipc_events;
    i.gpu_direct_rdma = df.gpu_direct_rdma;
    for (std::size_t p = 0; df.probes && p < df.probes->size(); ++p) {
      const model::HandleProbe& hp = (*df.probes)[p];
      ExportProbe probe;
      probe.handle_type =
          handle_type_from(hp.handle_type, origin, where + ".probes[" + std::to_string(p) + "].handle_type");
      probe.ok = hp.ok;
      if (!probe.ok && hp.error) {
        probe.error = hp.error->result.value_or(hp.error->code);
        probe.api = hp.error->api.value_or("");
        probe.reason = hp.error->message;
      }
      d.probes.push_back(probe);
    }
    report.devices.push_back(std::move(d));
  }
  const std::size_t n = report.devices.size();
  bool square = f.peer_access.size() == n;
  for (const auto& row : f.peer_access) square = square && row.size() == n;
  if (!square) fail(origin, "peer_access", "must be a " + std::to_string(n) + "x" + std::to_string(n) + " matrix");
  report.peer_access = f.peer_access;
  report.deep = f.deep;
  if (f.gds) {
    GdsReport gds;
    const auto mode = gds_mode_from_string(f.gds->mode);
    if (!mode) fail(origin, "gds.mode", "must be unavailable, compatibility or gpudirect, not '" + f.gds->mode + "'");
    gds.mode = *mode;
    gds.library_version = f.gds->library_version;
    gds.nvidia_fs_version = f.gds->nvidia_fs_version;
    gds.file_systems = f.gds->file_systems;
    gds.reason = f.gds->note.value_or("");
    if (f.gds->error) {
      gds.error_message = f.gds->error->message;
      gds.error_api = f.gds->error->api.value_or("cuFile");
      gds.error_result = f.gds->error->result.value_or("");
    }
    report.gds = gds;
  }
  return report;
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

std::optional<int> dmem_device(const DmemRegion& region, const NodeReport& report) {
  if (report.source.simulated || !region.pci_bus_id) return std::nullopt;
  for (const auto& d : report.devices)
    if (normalize_pci_bus_id(d.info.pci_bus_id) == region.pci_bus_id) return d.info.ordinal;
  return std::nullopt;
}

namespace {

model::DmemFacts dmem_facts(const DmemSupport& s, const NodeReport& report) {
  model::DmemFacts out;
  out.available = s.available();
  out.cgroup_v2 = s.cgroup_v2;
  out.controller = s.controller;
  if (!s.why.empty()) out.note = s.why;
  for (const DmemRegion& r : s.regions) {
    model::DmemRegionFacts region{r.name, r.capacity_bytes, r.pci_bus_id, std::nullopt};
    if (const auto ordinal = dmem_device(r, report)) {
      const DeviceInfo& info = report.device(*ordinal)->info;
      region.gpu = model::DeviceId{*ordinal, info.uuid, info.pci_bus_id};
    }
    out.regions.push_back(std::move(region));
  }
  return out;
}

}  // namespace

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
  if (report.dmem) f.dmem = dmem_facts(*report.dmem, report);
  return f;
}

json to_json(const NodeReport& report) { return model::to_json(facts_of(report)); }

NodeReport report_from_json(const json& j, const std::string& origin) {
  json node = j;
  std::string old;
  upgrade_old_names(node, origin, old);
  NodeReport report = report_of(read_strict<model::NodeFacts>(node, origin, "."), origin);
  if (!old.empty())
    report.source.warnings.push_back(
        old +
        ": a profile in the names of cupool before v1 was amended (index, "
        "memory.total, memory.free, deep for probes, their error as text); read this once, and write "
        "it again with `cupool query --profile-out` (docs/naming.md)");
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
  // Without its two sections (profile, node) a file is not a profile at all.
  bool sections = j.is_object();
  for (const std::string& name : model::json_names<model::ProfileDocument>()) sections = sections && j.contains(name);
  if (!sections)
    throw InputError(path +
                     ": not a node profile (expected 'profile:' and 'node:' sections, as written by "
                     "`cupool query --profile-out`)");
  const auto doc = read_strict<model::ProfileDocument>(j, path, ": ");
  const model::ProfileHeader& meta = doc.profile;
  if (meta.version != 1)
    throw InputError(path + ": profile.version: unsupported profile version (this cupool reads 1)");
  NodeReport report = report_from_json(doc.node, path + ": node");
  report.source.simulated = true;
  report.source.profile_path = path;
  report.source.synthetic = meta.synthetic;
  report.source.recorded = meta.recorded;
  report.source.recorded_host = meta.host;
  report.source.note = meta.note.value_or("");
  report.source.description = "simulated node (" + path + ")";
  return report;
}

void save_profile(const NodeReport& report, const std::string& path) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  model::NodeFacts node = facts_of(report);
  node.source.reset();  // the header says where the facts come from
  node.built_with_cuda.reset();
  node.dmem.reset();  // the kernel's, not the node's devices'
  const model::ProfileDocument doc{
      {1, when, host, CUPOOL_VERSION, report.source.synthetic, report.source.description, {}}, model::write_json(node)};
  const std::string text =
      "# cupool node profile, written by `cupool query --profile-out`.\n"
      "# Use it with --profile to check configs against this node on any machine.\n" +
      to_yaml(model::write_json(doc));
  if (path == "-") {
    std::cout << text;
    return;
  }
  write_file_atomically(path, text);  // a reader sees the old profile or the new one
}

}  // namespace cupool
