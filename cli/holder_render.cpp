#include "cli/holder_render.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <optional>
#include <sstream>
#include <vector>

#include "base/build_info.h"
#include "base/output.h"
#include "base/text.h"
#include "base/units.h"
#include "config/diagnostics.h"
#include "device/node.h"
#include "model/model.h"

namespace cupool {

using json = nlohmann::ordered_json;

namespace {

const char* const kNone = "-";

// Field access that never throws: a reply from another version may lack a field or type it
// differently, and the answer should still be shown.
// A dotted key ("graph.reserved_bytes") looks into nested objects.
const json* field(const json& j, const char* key) {
  const json* at = &j;
  std::string_view rest(key);
  while (true) {
    if (!at->is_object()) return nullptr;
    const std::size_t dot = rest.find('.');
    auto it = at->find(std::string(rest.substr(0, dot)));
    if (it == at->end()) return nullptr;
    if (dot == std::string_view::npos) return &*it;
    at = &*it;
    rest = rest.substr(dot + 1);
  }
}

std::optional<std::uint64_t> u64(const json& j, const char* key) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) return v->get<std::uint64_t>();
  if (v->is_number_integer()) {
    const auto n = v->get<std::int64_t>();
    if (n >= 0) return static_cast<std::uint64_t>(n);
  }
  return std::nullopt;
}

std::optional<std::int64_t> i64(const json& j, const char* key) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<std::int64_t>();  // also true for unsigned values
  return std::nullopt;
}

std::optional<bool> boolean(const json& j, const char* key) {
  const json* v = field(j, key);
  if (!v || !v->is_boolean()) return std::nullopt;
  return v->get<bool>();
}

// A scalar as text: strings as they are, numbers in decimal, booleans as yes/no is left to the
// caller; "-" when missing.
std::string text(const json& j, const char* key) {
  const json* v = field(j, key);
  if (!v || v->is_null()) return kNone;
  if (v->is_string()) return valid_utf8(v->get<std::string>());
  if (v->is_number_unsigned()) return std::to_string(v->get<std::uint64_t>());
  if (v->is_number_integer()) return std::to_string(v->get<std::int64_t>());
  if (v->is_boolean()) return v->get<bool>() ? "true" : "false";
  return v->dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string number(const json& j, const char* key) {
  if (auto n = i64(j, key)) return std::to_string(*n);
  if (auto n = u64(j, key)) return std::to_string(*n);
  return kNone;
}

std::string bytes(const json& j, const char* key) {
  auto n = u64(j, key);
  return n ? format_bytes(*n) : kNone;
}

const json& list(const json& j, const char* key) {
  static const json empty = json::array();
  const json* v = field(j, key);
  return v && v->is_array() ? *v : empty;
}

// "3 (192 MiB)": a count and the bytes behind it.
std::string count_and_bytes(const json& j, const char* count_key, const char* bytes_key) {
  std::string out = number(j, count_key);
  if (auto b = u64(j, bytes_key)) out += " (" + format_bytes(*b) + ")";
  return out;
}

std::string plural(std::uint64_t n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

// A titled table; "Title: none" when there are no rows.
std::string section(const std::string& title, const Table& table, std::size_t rows) {
  if (rows == 0) return title + ": none\n";
  return title + ":\n" + table.str("  ");
}

// Any JSON value as a short phrase, for a change's "from" and "to".
std::string value_text(const json& v) {
  if (v.is_null()) return "none";
  if (v.is_string()) return valid_utf8(v.get<std::string>());
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_unsigned()) return std::to_string(v.get<std::uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<std::int64_t>());
  if (v.is_array()) {
    std::vector<std::string> parts;
    for (const auto& e : v) parts.push_back(value_text(e));
    return "[" + join(parts, ", ") + "]";
  }
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

// HELP text escaping in the exposition format: backslash and newline.
std::string prometheus_help(std::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

struct Metric {
  const char* name;
  const char* key;  // the field of the JSON object it comes from (docs/naming.md); README maps each
  const char* help;
  bool null_is_inf = false;  // a null value means no limit: +Inf
};

const Metric kPoolMetrics[] = {
    {"cupool_pool_reserved_bytes", "reserved_bytes",
     "Bytes the pool has reserved from its device now (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)."},
    {"cupool_pool_reserved_high_bytes", "reserved_peak_bytes",
     "High-water mark of the pool's reserved bytes since the last peak reset (CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)."},
    {"cupool_pool_used_bytes", "used_bytes",
     "Bytes of the pool in use by allocations now (CU_MEMPOOL_ATTR_USED_MEM_CURRENT)."},
    {"cupool_pool_used_high_bytes", "used_peak_bytes",
     "High-water mark of the pool's used bytes since the last peak reset (CU_MEMPOOL_ATTR_USED_MEM_HIGH)."},
    {"cupool_pool_release_threshold_bytes", "release_threshold_bytes",
     "Reserved bytes the pool keeps across a synchronize; +Inf for max, no limit (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD).",
     true},
    {"cupool_pool_leases", "lease_count", "Allocations that clients of the holder hold from the pool."},
    {"cupool_pool_leased_bytes", "leased_bytes",
     "Bytes that clients of the holder hold from the pool (cached ones included)."},
    {"cupool_pool_cached_leases", "cached_count",
     "Leases that clients released into their cache: still mapped by them and charged to them, reused without a round "
     "trip."},
    {"cupool_pool_cached_bytes", "cached_bytes", "Bytes of the pool's cached leases."},
};

const Metric kDeviceMetrics[] = {
    {"cupool_graph_reserved_bytes", "graph.reserved_bytes",
     "Bytes of graph memory the device has reserved now (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)."},
    {"cupool_graph_reserved_high_bytes", "graph.reserved_peak_bytes",
     "High-water mark of the device's reserved graph memory since the last peak reset."},
    {"cupool_graph_used_bytes", "graph.used_bytes",
     "Bytes of graph memory in use on the device now (CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)."},
    {"cupool_graph_used_high_bytes", "graph.used_peak_bytes",
     "High-water mark of the device's used graph memory since the last peak reset."},
};

// A label of a sample and the reply's field it comes from. The device labels are
// dcgm-exporter's (gpu, UUID, pci_bus_id; for a device's own series also modelName and Hostname,
// which come from the node, not the reply), so dashboards join cupool's series with its.
struct Label {
  const char* name;
  const char* key;  // the reply's field; kFromNode: the node's (NodeLabels)
};
constexpr const char* kFromNode = "";
const std::vector<Label> kPoolLabels = {
    {"pool", "name"}, {"gpu", "device"}, {"UUID", "uuid"}, {"pci_bus_id", "pci_bus_id"}};
const std::vector<Label> kDeviceLabels = {{"gpu", "device"},
                                          {"UUID", "uuid"},
                                          {"pci_bus_id", "pci_bus_id"},
                                          {"modelName", kFromNode},
                                          {"Hostname", kFromNode}};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A label's value from the reply (or the node): the PCI bus id as NVML and dcgm-exporter write it
// ("00000000:1B:00.0"), everything else as text; "" for a missing or null field.
std::string label_value(const json& row, const Label& l, const NodeLabels& node) {
  const std::string_view name = l.name;
  if (name == "Hostname") return node.hostname;
  if (name == "modelName") {
    const auto it = node.model_names.find(lower(text(row, "uuid")));
    return it == node.model_names.end() ? "" : it->second;
  }
  const json* v = field(row, l.key);
  if (!v || v->is_null()) return "";
  std::string value = text(row, l.key);
  if (std::string_view(l.key) != "pci_bus_id") return value;
  const auto normal = normalize_pci_bus_id(value);  // "0000:1b:00.0"
  if (!normal) return value;
  std::string upper = "0000" + *normal;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return upper;
}

void metric_family(std::ostringstream& out, const Metric& m, const json& rows, const std::vector<Label>& labels,
                   const NodeLabels& node) {
  out << "# HELP " << m.name << ' ' << prometheus_help(m.help) << "\n";
  out << "# TYPE " << m.name << " gauge\n";
  for (const auto& row : rows) {
    auto value = u64(row, m.key);
    const json* present = field(row, m.key);
    if (m.null_is_inf && present && present->is_null()) value = std::numeric_limits<std::uint64_t>::max();
    if (!value) continue;
    out << m.name << '{';
    for (std::size_t i = 0; i < labels.size(); ++i)
      out << (i ? "," : "") << labels[i].name << "=\"" << prometheus_label_value(label_value(row, labels[i], node))
          << '"';
    // No limit (a release threshold of max, null in JSON) is +Inf.
    out << "} ";
    if (*value == std::numeric_limits<std::uint64_t>::max())
      out << "+Inf";
    else
      out << *value;
    out << "\n";
  }
}

// A change with a "blocked" reason (a string; false or null would mean not blocked) is not made.
bool is_blocked(const json& change) {
  const json* b = field(change, "blocked");
  return b && !b->is_null() && !(b->is_boolean() && !b->get<bool>());
}

std::string device_phrase(const json& change) {
  return field(change, "device") ? " on device " + text(change, "device") : "";
}

}  // namespace

json reply_body(const json& reply) {
  if (!reply.is_object()) return reply;
  json body = json::object();
  for (auto it = reply.begin(); it != reply.end(); ++it)
    if (it.key() != "id" && it.key() != "ok") body[it.key()] = it.value();
  return versioned(body);
}

std::string format_duration(std::uint64_t seconds) {
  const std::uint64_t days = seconds / 86400;
  const std::uint64_t hours = seconds / 3600 % 24;
  const std::uint64_t minutes = seconds / 60 % 60;
  const std::uint64_t secs = seconds % 60;
  if (days > 0) return std::to_string(days) + "d " + std::to_string(hours) + "h";
  if (hours > 0) return std::to_string(hours) + "h " + std::to_string(minutes) + "m";
  if (minutes > 0) return std::to_string(minutes) + "m " + std::to_string(secs) + "s";
  return std::to_string(secs) + "s";
}

std::string render_status(const json& reply) {
  std::ostringstream out;
  const json* holder_ptr = field(reply, "holder");
  const json& holder = holder_ptr ? *holder_ptr : json::object();

  Table head({"", ""});
  std::string line = text(holder, "version");
  std::vector<std::string> about;
  if (field(holder, "pid")) about.push_back("pid " + number(holder, "pid"));
  if (const json* source = field(reply, "source"); source && field(*source, "simulated"))
    about.push_back(boolean(*source, "simulated").value_or(false) ? "simulated backend" : "cuda backend");
  if (!about.empty()) line += " (" + join(about, ", ") + ")";
  head.add({"holder", line});
  if (auto up = u64(holder, "uptime_seconds")) {
    std::string uptime = format_duration(*up);
    if (field(holder, "started")) uptime += " (since " + text(holder, "started") + ")";
    head.add({"uptime", uptime});
  }
  std::string config = text(holder, "config");
  std::vector<std::string> counts;
  if (auto reloads = u64(holder, "reload_count")) counts.push_back(plural(*reloads, "reload"));
  if (auto applies = u64(holder, "apply_count"); applies && *applies > 0) counts.push_back(plural(*applies, "apply"));
  if (!counts.empty()) config += " (" + join(counts, ", ") + ")";
  head.add({"config", config});
  // What `cupool apply` put in place instead, until a reload or a restart reads the file again.
  if (const json* applied = field(holder, "applied_config"); applied && applied->is_object())
    head.add({"applied", text(*applied, "path") + " since " + text(*applied, "since") + " by " +
                             text(*applied, "user") + " (a reload or a restart goes back to the config)"});
  head.add({"socket", text(holder, "socket")});
  const auto draining = boolean(holder, "draining");
  head.add({"state", !draining ? kNone : *draining ? "draining (stopping; takes no new allocations)" : "serving"});
  const std::string head_text = head.str();
  out << head_text.substr(head_text.find('\n') + 1);

  // Devices: the ordinal-to-UUID map, which clients need (ordinals differ per process).
  std::vector<std::pair<std::string, std::string>> devices;
  for (const auto& p : list(reply, "pools")) {
    std::pair<std::string, std::string> d{text(p, "device"), text(p, "uuid")};
    bool seen = false;
    for (const auto& e : devices) seen = seen || e == d;
    if (!seen) devices.push_back(d);
  }
  Table dt({"DEVICE", "UUID"});
  for (const auto& [device, uuid] : devices) dt.add({device, uuid});
  out << "\n" << section("Devices", dt, devices.size());

  const json& pools = list(reply, "pools");
  Table pt(
      {"POOL", "DEVICE", "LOCATION", "HANDLE TYPES", "MAX SIZE", "RELEASE THRESHOLD", "LEASES", "CACHED", "BUFFERS"});
  for (const auto& p : pools) {
    std::vector<std::string> types;
    for (const auto& t : list(p, "handle_types")) types.push_back(value_text(t));
    const json* max_size = field(p, "max_size_bytes");
    pt.add({text(p, "name"), text(p, "device"), text(p, "location"), types.empty() ? "none" : join(types, ", "),
            !max_size             ? kNone
            : max_size->is_null() ? "default"
                                  : bytes(p, "max_size_bytes"),
            text(p, "release_threshold"), count_and_bytes(p, "lease_count", "leased_bytes"),
            count_and_bytes(p, "cached_count", "cached_bytes"), count_and_bytes(p, "buffer_count", "buffer_bytes")});
  }
  out << "\n" << section("Pools", pt, pools.size());

  const json& buffers = list(reply, "buffers");
  Table bt({"BUFFER", "POOL", "DEVICE", "SIZE", "OPENS", "KEPT"});
  for (const auto& b : buffers) {
    // KEPT: whether it outlives the holder (custody has it), and whether this holder adopted it.
    std::string kept = b.value("kept", false) ? "yes" : b.value("allocation", "") == "pool" ? "no (host pool)" : "no";
    if (b.value("adopted", false)) kept += ", adopted";
    bt.add(
        {text(b, "name"), text(b, "pool"), text(b, "device"), bytes(b, "size_bytes"), number(b, "open_count"), kept});
  }
  out << "\n" << section("Buffers", bt, buffers.size());
  if (reply.contains("custody") && reply["custody"].is_object()) {
    const json& c = reply["custody"];
    out << "\nCustody: " << (c.value("kind", "none") == "none" ? "none" : c.value("where", std::string()));
    if (c.contains("manifest_sequence") && c["manifest_sequence"].is_number())
      out << " (manifest " << c["manifest_sequence"].dump() << ")";
    out << ". A restart keeps " << c.value("survives_restart", std::string())
        << "; made again: " << c.value("made_again", std::string()) << ".\n";
    if (const json* error = field(c, "error"); error && error->is_object())
      out << "Custody error: " << text(*error, "message") << "\n";
    if (c.contains("adoption") && c["adoption"].is_object())
      for (const auto& r : list(c["adoption"], "refused"))
        out << "Not adopted at start: " << text(r, "name") << ": " << text(r, "error.message") << "\n";
  }

  const json& clients = list(reply, "clients");
  Table ct({"CLIENT", "PID", "UID", "USER", "NAME", "LEASES", "CACHED", "OPEN BUFFERS", "CONNECTED"});
  for (const auto& c : clients) {
    const auto connected = u64(c, "connected_seconds");
    ct.add({number(c, "id"), number(c, "pid"), number(c, "uid"), text(c, "user"), text(c, "name"),
            count_and_bytes(c, "lease_count", "leased_bytes"), count_and_bytes(c, "cached_count", "cached_bytes"),
            number(c, "open_buffer_count"), connected ? format_duration(*connected) : kNone});
  }
  out << "\n" << section("Clients", ct, clients.size());
  if (const auto total = u64(reply, "client_count"); total && *total > clients.size())
    out << "(" << clients.size() << " of " << *total << " clients shown)\n";
  return out.str();
}

std::string render_stats(const json& reply) {
  std::ostringstream out;
  const json& pools = list(reply, "pools");
  Table pt(
      {"POOL", "DEVICE", "RESERVED", "RESERVED HIGH", "USED", "USED HIGH", "RELEASE THRESHOLD", "LEASES", "CACHED"});
  for (const auto& p : pools) {
    pt.add({text(p, "name"), text(p, "device"), bytes(p, "reserved_bytes"), bytes(p, "reserved_peak_bytes"),
            bytes(p, "used_bytes"), bytes(p, "used_peak_bytes"), text(p, "release_threshold"),
            count_and_bytes(p, "lease_count", "leased_bytes"), count_and_bytes(p, "cached_count", "cached_bytes")});
  }
  out << section("Pools", pt, pools.size());

  const json& devices = list(reply, "devices");
  Table dt({"DEVICE", "UUID", "RESERVED", "RESERVED HIGH", "USED", "USED HIGH"});
  for (const auto& d : devices)
    dt.add({text(d, "device"), text(d, "uuid"), bytes(d, "graph.reserved_bytes"), bytes(d, "graph.reserved_peak_bytes"),
            bytes(d, "graph.used_bytes"), bytes(d, "graph.used_peak_bytes")});
  out << "\n" << section("Graph memory", dt, devices.size());
  return out.str();
}

std::string prometheus_label_value(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return valid_utf8(out);
}

std::string render_stats_prometheus(const json& reply, const NodeLabels& node) {
  std::ostringstream out;
  for (const auto& m : kPoolMetrics) metric_family(out, m, list(reply, "pools"), kPoolLabels, node);
  for (const auto& m : kDeviceMetrics) metric_family(out, m, list(reply, "devices"), kDeviceLabels, node);
  out << prometheus_build_info();
  return out.str();
}

std::string prometheus_build_info() {
  const BuildInfo& b = build_info();
  return "# HELP cupool_build_info The cupool that wrote these metrics: version, commit, CUDA headers; always 1.\n"
         "# TYPE cupool_build_info gauge\n"
         "cupool_build_info{version=\"" +
         prometheus_label_value(b.version) + "\",commit=\"" + prometheus_label_value(b.commit) + "\",cuda_headers=\"" +
         prometheus_label_value(b.cuda_headers) + "\"} 1\n";
}

std::string render_trim(const json& reply) {
  std::ostringstream out;
  const json& pools = list(reply, "pools");
  Table pt({"POOL", "DEVICE", "RESERVED BEFORE", "RESERVED AFTER", "RELEASED"});
  for (const auto& p : pools)
    pt.add({text(p, "name"), text(p, "device"), bytes(p, "reserved_before_bytes"), bytes(p, "reserved_after_bytes"),
            bytes(p, "released_bytes")});
  out << section("Pools", pt, pools.size());

  // No devices: graph memory was not trimmed (--no-graph).
  const json& devices = list(reply, "devices");
  if (!devices.empty()) {
    Table dt({"DEVICE", "RESERVED BEFORE", "RESERVED AFTER", "RELEASED"});
    for (const auto& d : devices)
      dt.add({text(d, "device"), bytes(d, "graph.reserved_before_bytes"), bytes(d, "graph.reserved_after_bytes"),
              bytes(d, "graph.released_bytes")});
    out << "\n" << section("Graph memory", dt, devices.size());
  }
  if (const auto dropped = u64(reply, "dropped_bytes"); dropped && *dropped)
    out << "\nClients dropped " << format_bytes(*dropped) << " of cached blocks first.";
  out << "\nReleased " << bytes(reply, "released_bytes") << " in total.\n";
  return out.str();
}

std::string render_change(const json& change) {
  const std::string action = text(change, "action");

  std::string mark = "?";
  if (action == "create")
    mark = "+";
  else if (action == "update")
    mark = "~";
  else if (action == "replace")
    mark = "-/+";
  else if (action == "remove")
    mark = "-";

  // "holder" changes (e.g. its socket) have no name of their own.
  const std::string object = text(change, "object");
  const json* name = field(change, "name");
  const bool named = name && !name->is_null() && text(change, "name") != object;
  std::string line = mark + " " + object + (named ? " " + text(change, "name") : "") + device_phrase(change);
  if (const json* pool = field(change, "pool"); pool && object != "pool") line += " in pool " + value_text(*pool);
  if (mark == "?") line += " (" + action + ")";
  if (field(change, "field")) {
    line += ": " + text(change, "field");
    // In config syntax; "" is no value: for a max_size, the driver's default.
    const std::string absent = text(change, "field") == "max_size" ? "default" : "none";
    auto shown = [&](const char* key) {
      const json* t = field(change, key);
      const std::string v = t ? value_text(*t) : "";
      return v.empty() ? absent : v;
    };
    if (field(change, "from") || field(change, "to")) line += " " + shown("from") + " -> " + shown("to");
  }
  if (is_blocked(change)) {
    // A blocked remove or replace leaves the object as it is: it is kept.
    const json& reason = *field(change, "blocked");
    const std::string why = reason.is_string() ? valid_utf8(reason.get<std::string>()) : "in use";
    line += (action == "remove" || action == "replace" ? " (kept: " : " (blocked: ") + why + ")";
  }
  return line;
}

std::size_t change_count(const json& reply) { return list(reply, "changes").size(); }

std::size_t blocked_changes(const json& reply) {
  std::size_t n = 0;
  for (const auto& c : list(reply, "changes"))
    if (is_blocked(c)) ++n;
  return n;
}

namespace {

// An apply lasts until the holder reads its own file again: said, so it is not undone silently.
std::string lasts_until_reload(const json& reply) {
  if (!boolean(reply, "applied").value_or(false) || text(reply, "holder_config") == kNone) return "";
  return "The holder's file is still " + text(reply, "holder_config") +
         ": a reload (SIGHUP) or a restart goes back to it; edit that file to keep this.\n";
}

}  // namespace

std::string render_plan(const json& reply) {
  const json& changes = list(reply, "changes");
  if (changes.empty()) return "no changes\n" + lasts_until_reload(reply);
  const bool applied = boolean(reply, "applied").value_or(false);

  std::ostringstream out;
  // Counted per action; for apply only what was made.
  const char* const actions[] = {"create", "update", "replace", "remove"};
  const char* const planned[] = {"to create", "to update", "to replace", "to remove"};
  const char* const made[] = {"created", "updated", "replaced", "removed"};
  std::size_t counts[4] = {0, 0, 0, 0};
  std::size_t other = 0;
  for (const auto& c : changes) {
    out << render_change(c) << "\n";
    if (applied && is_blocked(c)) continue;
    bool known = false;
    for (std::size_t i = 0; i < 4; ++i)
      if (text(c, "action") == actions[i]) {
        ++counts[i];
        known = true;
      }
    if (!known) ++other;
  }
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < 4; ++i)
    if (counts[i] > 0) parts.push_back(std::to_string(counts[i]) + " " + (applied ? made[i] : planned[i]));
  if (other > 0) parts.push_back(std::to_string(other) + " other");
  const std::size_t blocked = blocked_changes(reply);
  out << "\n" << (applied ? "Applied: " : "Plan: ") << (parts.empty() ? "nothing" : join(parts, ", "));
  if (blocked > 0) out << "; " << blocked << " blocked (" << (applied ? "not made" : "will not be made") << ")";
  out << ".\n";
  out << lasts_until_reload(reply);
  return out.str();
}

std::string render_findings(const json& findings, const SourceFile& file) {
  std::string out;
  if (!findings.is_array()) return out;
  for (const auto& f : findings) {
    // Read as the one finding object (model::Finding); one the holder sent malformed is said so.
    model::Finding m;
    try {
      m = model::finding_from_json(f);
    } catch (const std::exception& e) {
      out += file.path() + ": a finding the holder sent could not be read (" + e.what() + ")\n";
      continue;
    }
    Diagnostic d;
    d.severity = m.severity == "warning" ? Severity::warning : m.severity == "note" ? Severity::note : Severity::error;
    d.code = valid_utf8(m.code);
    d.message = valid_utf8(m.message);
    d.loc.line = std::max(0, std::min(m.line, 1 << 30));
    d.loc.column = std::max(0, std::min(m.column, 1 << 30));
    if (m.fact) d.fact = valid_utf8(*m.fact);
    if (m.help) d.help = valid_utf8(*m.help);
    d.invalid_input = m.invalid_input;
    out += render_text(d, file) + "\n";
  }
  return out;
}

std::string render_buffers(const json& buffers) {
  if (!buffers.is_array() || buffers.empty()) return "no buffers\n";
  Table t({"BUFFER", "POOL", "DEVICE", "SIZE", "STATE", "TENSORS", "OPENS", "PERMITTED"});
  for (const auto& b : buffers) {
    const auto permitted = boolean(b, "permitted");
    t.add({text(b, "name"), text(b, "pool"), text(b, "device"), bytes(b, "size_bytes"), text(b, "state"),
           number(b, "tensor_count"), number(b, "open_count"),
           !permitted   ? kNone
           : *permitted ? "yes"
                        : "no"});
  }
  return t.str();
}

std::string render_buffer_tensors(const json& reply) {
  const auto it = reply.find("tensors");
  const std::size_t count = it != reply.end() && it->is_array() ? it->size() : 0;
  const auto parts = reply.find("parts");
  const std::size_t part_count = parts != reply.end() && parts->is_array() ? parts->size() : 1;
  std::string out = "buffer " + text(reply, "name") + ": " + bytes(reply, "size_bytes") +
                    (part_count > 1 ? " in " + std::to_string(part_count) + " parts" : std::string()) + ", " +
                    std::to_string(count) + (count == 1 ? " tensor\n" : " tensors\n");
  if (!count) {
    if (boolean(reply, "indexed") == std::optional<bool>(false))
      out += "(no tensor index: made with `cupool buffer create`, not `cupool buffer load`)\n";
    return out;
  }
  // The part column only where there are parts: offsets then count from each part's start.
  const bool by_part = part_count > 1;
  Table t(by_part ? std::vector<std::string>{"TENSOR", "DTYPE", "SHAPE", "PART", "OFFSET", "SIZE"}
                  : std::vector<std::string>{"TENSOR", "DTYPE", "SHAPE", "OFFSET", "SIZE"});
  for (const auto& tensor : *it) {
    std::string shape = "[";
    if (tensor.contains("shape") && tensor["shape"].is_array())
      for (const auto& d : tensor["shape"]) shape += (shape.size() > 1 ? ", " : "") + d.dump();
    std::vector<std::string> row{text(tensor, "name"), text(tensor, "dtype"), shape + "]"};
    if (by_part) row.push_back(number(tensor, "part"));
    row.push_back(number(tensor, "offset_bytes"));
    row.push_back(bytes(tensor, "size_bytes"));
    t.add(row);
  }
  return out + t.str();
}

std::string render_buffer_created(const json& reply) {
  return "created buffer " + text(reply, "name") + ": " + bytes(reply, "size_bytes") + " in pool " +
         text(reply, "pool") + " on device " + text(reply, "device") + "\n";
}

std::string render_buffer_removed(const json& reply) {
  return "removed buffer " + text(reply, "name") + " (" + bytes(reply, "size_bytes") + " in pool " +
         text(reply, "pool") + " on device " + text(reply, "device") + ")\n";
}

}  // namespace cupool
