#include "cli/holder_render.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <vector>

#include "base/build_info.h"
#include "base/output.h"
#include "base/text.h"
#include "base/units.h"
#include "cli/reply_view.h"
#include "config/diagnostics.h"
#include "device/node.h"
#include "model/fields.h"
#include "model/model.h"

namespace cupool {

using json = nlohmann::ordered_json;
using render::kNone;
using render::Read;
using render::Shown;

namespace {

// A count the model writes from a list and does not read back (`client_count`): never throws, none
// when absent or not a count (a reply from another version may type it differently).
std::optional<std::uint64_t> count_in(const json& reply, const char* key) {
  const auto v = reply.is_object() ? reply.find(key) : reply.end();
  if (v == reply.end()) return std::nullopt;
  if (v->is_number_unsigned()) return v->get<std::uint64_t>();
  if (v->is_number_integer() && v->get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v->get<std::int64_t>());
  return std::nullopt;
}

std::string plural(std::uint64_t n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

// A titled table; "Title: none" when there are no rows.
std::string section(const std::string& title, const Table& table, std::size_t rows) {
  if (rows == 0) return title + ": none\n";
  return title + ":\n" + table.str("  ");
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

// A sample's value, typed from its row of the reply; none where the row lacks it (or has it
// ill-typed): that sample is left out.
template <class Row>
struct Metric {
  const char* name;
  std::optional<std::uint64_t> (*value)(const Row& row, const Shown& shown);
  const char* help;
};

std::optional<std::uint64_t> shown_count(const Shown& shown, const std::uint64_t& v) {
  return shown.has(v) ? std::optional<std::uint64_t>(v) : std::nullopt;
}

// The high-water marks, each written under its name (`_peak_`, as the JSON field) and, until
// cupool 0.2, under its old one (`_high_`, after the driver's attribute; docs/naming.md).
std::optional<std::uint64_t> pool_reserved_peak(const model::PoolStats& p, const Shown& s) {
  return shown_count(s, p.usage.reserved_peak_bytes);
}
std::optional<std::uint64_t> pool_used_peak(const model::PoolStats& p, const Shown& s) {
  return shown_count(s, p.usage.used_peak_bytes);
}
std::optional<std::uint64_t> graph_reserved_peak(const model::DeviceGraph& d, const Shown& s) {
  return shown_count(s, d.graph.reserved_peak_bytes);
}
std::optional<std::uint64_t> graph_used_peak(const model::DeviceGraph& d, const Shown& s) {
  return shown_count(s, d.graph.used_peak_bytes);
}
#define CUPOOL_OLD_NAME(now) "Deprecated: " now " under its old name, written until cupool 0.2."

// The names of the metrics and the fields they come from (docs/naming.md; README maps each).
const Metric<model::PoolStats> kPoolMetrics[] = {
    {"cupool_pool_reserved_bytes",
     [](const model::PoolStats& p, const Shown& s) { return shown_count(s, p.usage.reserved_bytes); },
     "Bytes the pool has reserved from its device now (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)."},
    {"cupool_pool_reserved_peak_bytes", pool_reserved_peak,
     "High-water mark of the pool's reserved bytes since the last peak reset (CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)."},
    {"cupool_pool_reserved_high_bytes", pool_reserved_peak, CUPOOL_OLD_NAME("cupool_pool_reserved_peak_bytes")},
    {"cupool_pool_used_bytes",
     [](const model::PoolStats& p, const Shown& s) { return shown_count(s, p.usage.used_bytes); },
     "Bytes of the pool in use by allocations now (CU_MEMPOOL_ATTR_USED_MEM_CURRENT)."},
    {"cupool_pool_used_peak_bytes", pool_used_peak,
     "High-water mark of the pool's used bytes since the last peak reset (CU_MEMPOOL_ATTR_USED_MEM_HIGH)."},
    {"cupool_pool_used_high_bytes", pool_used_peak, CUPOOL_OLD_NAME("cupool_pool_used_peak_bytes")},
    // No limit (a release threshold of max, null in JSON) is +Inf.
    {"cupool_pool_release_threshold_bytes",
     [](const model::PoolStats& p, const Shown& s) -> std::optional<std::uint64_t> {
       if (!s.has_part<model::ThresholdBytes>(p.release_threshold)) return std::nullopt;
       return p.release_threshold.bytes();  // max: UINT64_MAX
     },
     "Reserved bytes the pool keeps across a synchronize; +Inf for max, no limit (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)."},
    {"cupool_pool_leases",
     [](const model::PoolStats& p, const Shown& s) { return shown_count(s, p.leases.lease_count); },
     "Allocations that clients of the holder hold from the pool."},
    {"cupool_pool_leased_bytes",
     [](const model::PoolStats& p, const Shown& s) { return shown_count(s, p.leases.leased_bytes); },
     "Bytes that clients of the holder hold from the pool (cached ones included)."},
    {"cupool_pool_cached_leases",
     [](const model::PoolStats& p, const Shown& s) { return shown_count(s, p.leases.cached_count); },
     "Leases that clients released into their cache: still mapped by them and charged to them, reused without a round "
     "trip."},
    {"cupool_pool_cached_bytes",
     [](const model::PoolStats& p, const Shown& s) { return shown_count(s, p.leases.cached_bytes); },
     "Bytes of the pool's cached leases."},
    {"cupool_pool_held_buffers",
     [](const model::PoolStats& p, const Shown& s) { return shown_count(s, p.buffers.buffer_count); },
     "Buffers and tensor sets the holder holds in the pool (cupool buffer create/load, the config's buffers)."},
    {"cupool_pool_held_bytes",
     [](const model::PoolStats& p, const Shown& s) { return shown_count(s, p.buffers.buffer_bytes); },
     "Bytes of the pool's held buffers and tensor sets: a device pool's are exported allocations, not in its "
     "reserved or used bytes."},
};

const Metric<model::DeviceGraph> kDeviceMetrics[] = {
    {"cupool_graph_reserved_bytes",
     [](const model::DeviceGraph& d, const Shown& s) { return shown_count(s, d.graph.reserved_bytes); },
     "Bytes of graph memory the device has reserved now (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)."},
    {"cupool_graph_reserved_peak_bytes", graph_reserved_peak,
     "High-water mark of the device's reserved graph memory since the last peak reset."},
    {"cupool_graph_reserved_high_bytes", graph_reserved_peak, CUPOOL_OLD_NAME("cupool_graph_reserved_peak_bytes")},
    {"cupool_graph_used_bytes",
     [](const model::DeviceGraph& d, const Shown& s) { return shown_count(s, d.graph.used_bytes); },
     "Bytes of graph memory in use on the device now (CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)."},
    {"cupool_graph_used_peak_bytes", graph_used_peak,
     "High-water mark of the device's used graph memory since the last peak reset."},
    {"cupool_graph_used_high_bytes", graph_used_peak, CUPOOL_OLD_NAME("cupool_graph_used_peak_bytes")},
    {"cupool_device_held_buffers",
     [](const model::DeviceGraph& d, const Shown& s) { return shown_count(s, d.buffers.buffer_count); },
     "Buffers and tensor sets the holder holds in the device's pools."},
    {"cupool_device_held_bytes",
     [](const model::DeviceGraph& d, const Shown& s) { return shown_count(s, d.buffers.buffer_bytes); },
     "Bytes of the buffers and tensor sets held in the device's pools (its pools' cupool_pool_held_bytes)."},
};
#undef CUPOOL_OLD_NAME

// A label of a sample and where its value comes from. The device labels are dcgm-exporter's (gpu,
// UUID, pci_bus_id, modelName and Hostname; the last two come from the node, not the reply), on
// every series of a pool or a device, so dashboards join cupool's series with its.
enum class LabelFrom { pool_name, device, uuid, pci_bus_id, model_name, hostname };
struct Label {
  const char* name;
  LabelFrom from;
};
const std::vector<Label> kDeviceLabels = {{"gpu", LabelFrom::device},
                                          {"UUID", LabelFrom::uuid},
                                          {"pci_bus_id", LabelFrom::pci_bus_id},
                                          {"modelName", LabelFrom::model_name},
                                          {"Hostname", LabelFrom::hostname}};
const std::vector<Label> kPoolLabels = [] {
  std::vector<Label> out = {{"pool", LabelFrom::pool_name}};
  out.insert(out.end(), kDeviceLabels.begin(), kDeviceLabels.end());
  return out;
}();

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const std::string* pool_name(const model::PoolStats& p) { return &p.name; }
const std::string* pool_name(const model::DeviceGraph&) { return nullptr; }
const std::string* pool_name(const model::LedgerDevice&) { return nullptr; }

// A label's value from a row (or the node): the PCI bus id as NVML and dcgm-exporter write it
// ("00000000:1B:00.0"), everything else as text; "" for a missing or null field.
std::string label_value(const model::DeviceId& id, const std::string* name, LabelFrom from, const Shown& shown,
                        const NodeLabels& node) {
  switch (from) {
    case LabelFrom::hostname: return node.hostname;
    case LabelFrom::model_name: {
      const auto it = node.model_names.find(lower(shown.text(id.uuid)));
      return it == node.model_names.end() ? "" : it->second;
    }
    case LabelFrom::pool_name: return name && shown.has(*name) ? valid_utf8(*name) : "";
    case LabelFrom::device: return shown.has(id.device) ? std::to_string(id.device) : "";
    case LabelFrom::uuid: return shown.has(id.uuid) ? valid_utf8(id.uuid) : "";
    case LabelFrom::pci_bus_id: break;
  }
  if (!shown.has(id.pci_bus_id)) return "";
  std::string value = valid_utf8(id.pci_bus_id);
  const auto normal = normalize_pci_bus_id(value);  // "0000:1b:00.0"
  if (!normal) return value;
  std::string upper = "0000" + *normal;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return upper;
}

template <class Row>
void metric_family(std::ostringstream& out, const Metric<Row>& m, const std::vector<Row>& rows,
                   const std::vector<Label>& labels, const Shown& shown, const NodeLabels& node) {
  out << "# HELP " << m.name << ' ' << prometheus_help(m.help) << "\n";
  out << "# TYPE " << m.name << " gauge\n";
  for (const Row& row : rows) {
    const std::optional<std::uint64_t> value = m.value(row, shown);
    if (!value) continue;
    out << m.name << '{';
    for (std::size_t i = 0; i < labels.size(); ++i)
      out << (i ? "," : "") << labels[i].name << "=\""
          << prometheus_label_value(label_value(row.id, pool_name(row), labels[i].from, shown, node)) << '"';
    out << "} ";
    if (*value == std::numeric_limits<std::uint64_t>::max())
      out << "+Inf";
    else
      out << *value;
    out << "\n";
  }
}

// A buffer made or removed: its name, size, pool and device.
std::vector<std::string> buffer_made(const json& reply) {
  const Read<model::BufferMade> r(reply);
  const model::BufferMade& b = r.value;
  return {r.shown.text(b.name), r.shown.bytes(b.size_bytes), r.shown.text(b.pool), r.shown.number(b.id.device)};
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

// "listening at 21 ms, ready at 402 ms (node report from custody; driver 249 ms, mapping 31 ms, ...)".
std::string render_start(const model::HolderStart& s) {
  const auto ms = [](double seconds) { return std::to_string(std::llround(seconds * 1000)) + " ms"; };
  std::string text = "listening at " + ms(s.listening_seconds);
  text += s.ready_seconds ? ", ready at " + ms(*s.ready_seconds) : std::string(", not ready yet");
  text +=
      " (node report from " + s.node_report + ", custody " + ms(s.custody_seconds) + ", config " + ms(s.config_seconds);
  if (s.ready_seconds)
    text += "; then the driver " + ms(s.driver_seconds) + ", its report " + ms(s.driver_report_seconds) +
            ", adopted buffers mapped " + ms(s.mapping_seconds) + ", devices " + ms(s.devices_seconds) + ", pools " +
            ms(s.pools_seconds);
  return text + ")";
}

std::string render_status(const json& reply) {
  const Read<model::Status> read(reply);
  const model::Status& st = read.value;
  const Shown& shown = read.shown;
  const model::HolderInfo& holder = st.holder;
  std::ostringstream out;

  Table head({"", ""});
  std::string line = shown.text(holder.version);
  std::vector<std::string> about;
  if (shown.has(holder.pid)) about.push_back("pid " + shown.number(holder.pid));
  if (shown.has(st.source.simulated)) about.push_back(st.source.simulated ? "simulated backend" : "cuda backend");
  if (!about.empty()) line += " (" + join(about, ", ") + ")";
  head.add({"holder", line});
  if (shown.has(holder.uptime_seconds) && holder.uptime_seconds >= 0) {
    std::string uptime = format_duration(static_cast<std::uint64_t>(holder.uptime_seconds));
    if (shown.has(holder.started)) uptime += " (since " + shown.text(holder.started) + ")";
    head.add({"uptime", uptime});
  }
  std::string config = shown.text(holder.config);
  std::vector<std::string> counts;
  if (shown.has(holder.reload_count)) counts.push_back(plural(holder.reload_count, "reload"));
  if (holder.apply_count > 0) counts.push_back(plural(holder.apply_count, "apply"));
  if (!counts.empty()) config += " (" + join(counts, ", ") + ")";
  head.add({"config", config});
  // What `cupool apply` put in place instead, until a reload or a restart reads the file again.
  if (const auto& applied = holder.applied_config)
    head.add({"applied", shown.text(applied->path) + " since " + shown.text(applied->since) + " by " +
                             shown.text(applied->user) + " (a reload or a restart goes back to the config)"});
  if (const auto& reload = holder.last_reload)
    head.add({"last reload", shown.text(reload->at) +
                                 (reload->applied ? ": applied, " : ": NOT applied, kept the old state: ") +
                                 shown.text(reload->message)});
  head.add({"socket", shown.text(holder.socket)});
  const bool starting = holder.start && holder.start->state == "starting";
  head.add({"state", !shown.has(holder.draining) ? kNone
                     : holder.draining           ? "draining (stopping; takes no new allocations)"
                     : starting ? "starting (the driver is coming up: held buffers are served, other requests wait)"
                                : "serving"});
  if (const auto& st0 = holder.start) head.add({"start", render_start(*st0)});
  const std::string head_text = head.str();
  out << head_text.substr(head_text.find('\n') + 1);

  // Devices: the ordinal-to-UUID map, which clients need (ordinals differ per process).
  std::vector<std::pair<std::string, std::string>> devices;
  for (const model::PoolStatus& p : st.pools) {
    std::pair<std::string, std::string> d{shown.number(p.pool.id.device), shown.text(p.pool.id.uuid)};
    bool seen_before = false;
    for (const auto& e : devices) seen_before = seen_before || e == d;
    if (!seen_before) devices.push_back(d);
  }
  Table dt({"DEVICE", "UUID"});
  for (const auto& [device, uuid] : devices) dt.add({device, uuid});
  out << "\n" << section("Devices", dt, devices.size());

  Table pt(
      {"POOL", "DEVICE", "LOCATION", "HANDLE TYPES", "MAX SIZE", "RELEASE THRESHOLD", "LEASES", "CACHED", "BUFFERS"});
  for (const model::PoolStatus& p : st.pools) {
    std::vector<std::string> types;
    for (const std::string& t : p.pool.handle_types) types.push_back(valid_utf8(t));
    const auto& max_size = p.pool.max_size_bytes;
    pt.add({shown.text(p.pool.name), shown.number(p.pool.id.device), shown.text(p.pool.location),
            types.empty() ? "none" : join(types, ", "),
            !shown.has(max_size) ? kNone
            : !max_size          ? "default"
                                 : format_bytes(*max_size),
            shown.threshold(p.release_threshold), shown.count_and_bytes(p.leases.lease_count, p.leases.leased_bytes),
            shown.count_and_bytes(p.leases.cached_count, p.leases.cached_bytes),
            shown.count_and_bytes(p.buffers.buffer_count, p.buffers.buffer_bytes)});
  }
  out << "\n" << section("Pools", pt, st.pools.size());

  Table bt({"BUFFER", "POOL", "DEVICE", "SIZE", "OPENS", "KEPT"});
  for (const model::BufferInfo& b : st.buffers) {
    // KEPT: whether it outlives the holder (custody has it), and whether this holder adopted it.
    std::string kept = b.kept ? "yes" : b.allocation == "pool" ? "no (host pool)" : "no";
    if (b.adopted) kept += ", adopted";
    bt.add({shown.text(b.name), shown.text(b.pool), shown.number(b.id.device), shown.bytes(b.size_bytes),
            shown.number(b.open_count), kept});
  }
  out << "\n" << section("Buffers", bt, st.buffers.size());
  if (shown.has(st.custody)) {
    const model::Custody& c = st.custody;
    const std::string kind = shown.has(c.kind) ? c.kind : "none";
    out << "\nCustody: " << (kind == "none" ? "none" : c.where.value_or(""));
    if (c.manifest_sequence) out << " (manifest " << *c.manifest_sequence << ")";
    out << ". A restart keeps " << c.survives_restart << "; made again: " << c.made_again << ".\n";
    if (c.error) out << "Custody error: " << shown.text(c.error->message) << "\n";
    if (c.adoption)
      for (const model::RefusedBuffer& r : c.adoption->refused)
        out << "Not adopted at start: " << shown.text(r.name) << ": " << shown.text(r.error.message) << "\n";
  }

  Table ct({"CLIENT", "PID", "UID", "USER", "NAME", "LEASES", "CACHED", "OPEN BUFFERS", "CONNECTED"});
  for (const model::ClientInfo& c : st.clients) {
    const bool connected = shown.has(c.connected_seconds) && c.connected_seconds >= 0;
    ct.add({shown.number(c.id), shown.number(c.pid), shown.number(c.uid), shown.text(c.user), shown.text(c.name),
            shown.count_and_bytes(c.leases.lease_count, c.leases.leased_bytes),
            shown.count_and_bytes(c.leases.cached_count, c.leases.cached_bytes), shown.number(c.open_buffer_count),
            connected ? format_duration(static_cast<std::uint64_t>(c.connected_seconds)) : kNone});
  }
  out << "\n" << section("Clients", ct, st.clients.size());
  // client_count is written from the list (model/fields.h), so it is read here: a holder may list fewer.
  if (const auto total = count_in(reply, "client_count"); total && *total > st.clients.size())
    out << "(" << st.clients.size() << " of " << *total << " clients shown)\n";
  return out.str();
}

std::string render_stats(const json& reply) {
  const Read<model::Stats> read(reply);
  const model::Stats& st = read.value;
  const Shown& shown = read.shown;
  std::ostringstream out;
  // HELD: the pool's buffers and tensor sets, outside its reserved and used (exported allocations).
  Table pt({"POOL", "DEVICE", "RESERVED", "RESERVED HIGH", "USED", "USED HIGH", "RELEASE THRESHOLD", "LEASES", "CACHED",
            "HELD"});
  for (const model::PoolStats& p : st.pools) {
    pt.add({shown.text(p.name), shown.number(p.id.device), shown.bytes(p.usage.reserved_bytes),
            shown.bytes(p.usage.reserved_peak_bytes), shown.bytes(p.usage.used_bytes),
            shown.bytes(p.usage.used_peak_bytes), shown.threshold(p.release_threshold),
            shown.count_and_bytes(p.leases.lease_count, p.leases.leased_bytes),
            shown.count_and_bytes(p.leases.cached_count, p.leases.cached_bytes),
            shown.count_and_bytes(p.buffers.buffer_count, p.buffers.buffer_bytes)});
  }
  out << section("Pools", pt, st.pools.size());

  Table ht({"DEVICE", "UUID", "HELD"});
  for (const model::DeviceGraph& d : st.devices)
    ht.add({shown.number(d.id.device), shown.text(d.id.uuid),
            shown.count_and_bytes(d.buffers.buffer_count, d.buffers.buffer_bytes)});
  out << "\n" << section("Held buffers", ht, st.devices.size());

  Table dt({"DEVICE", "UUID", "RESERVED", "RESERVED HIGH", "USED", "USED HIGH"});
  for (const model::DeviceGraph& d : st.devices)
    dt.add({shown.number(d.id.device), shown.text(d.id.uuid), shown.bytes(d.graph.reserved_bytes),
            shown.bytes(d.graph.reserved_peak_bytes), shown.bytes(d.graph.used_bytes),
            shown.bytes(d.graph.used_peak_bytes)});
  out << "\n" << section("Graph memory", dt, st.devices.size());
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

namespace {
// The ledger's families (below): cupool_ledger_* per device, cupool_budget_* per budget.
void ledger_families(std::ostringstream& out, const model::Ledger& ledger, const Shown& shown, const NodeLabels& node);
}  // namespace

std::string render_stats_prometheus(const json& reply, const NodeLabels& node) {
  std::ostringstream out;
  const Read<model::Stats> read(reply);
  for (const auto& m : kPoolMetrics) metric_family(out, m, read.value.pools, kPoolLabels, read.shown, node);
  for (const auto& m : kDeviceMetrics) metric_family(out, m, read.value.devices, kDeviceLabels, read.shown, node);
  if (read.value.ledger) ledger_families(out, *read.value.ledger, read.shown, node);
  out << prometheus_build_info();
  return out.str();
}

namespace {

#define CUPOOL_LEDGER_METRIC(field, help)                                                                          \
  {                                                                                                                \
    "cupool_ledger_" #field, [](const model::LedgerDevice& d, const Shown& s) { return shown_count(s, d.field); }, \
        help                                                                                                       \
  }
const Metric<model::LedgerDevice> kLedgerMetrics[] = {
    CUPOOL_LEDGER_METRIC(total_bytes, "The device's memory as the driver reports it (cuDeviceTotalMem)."),
    CUPOOL_LEDGER_METRIC(held_bytes, "Bytes of held buffers and tensor sets on the device, each once."),
    CUPOOL_LEDGER_METRIC(pool_reserved_bytes, "Bytes the holder's device pools have reserved."),
    CUPOOL_LEDGER_METRIC(budget_bytes, "Bytes granted as budgets to processes (cupool exec --budget)."),
    CUPOOL_LEDGER_METRIC(budget_used_bytes, "Bytes the budgeted processes hold, as their preloads count them."),
    CUPOOL_LEDGER_METRIC(context_bytes, "The allowance for CUDA contexts: the holder's and one per budget."),
    CUPOOL_LEDGER_METRIC(unknown_bytes, "Bytes used by processes cupool does not know (NVML's process list)."),
    CUPOOL_LEDGER_METRIC(committed_bytes, "Held + pool reserves + budgets + contexts + unknown processes."),
    CUPOOL_LEDGER_METRIC(available_bytes, "What a new budget may take on the device: total - committed."),
    {"cupool_ledger_nvml_used_bytes",
     [](const model::LedgerDevice& d, const Shown& s) {
       return d.memory ? shown_count(s, d.memory->used_bytes) : std::nullopt;
     },
     "The device's used memory as NVML reports it (nvmlDeviceGetMemoryInfo_v2; the driver's own reserve included)."},
    {"cupool_ledger_accounted_bytes",
     [](const model::LedgerDevice& d, const Shown& s) {
       return d.accounted_bytes && s.has(d.accounted_bytes) ? d.accounted_bytes : std::nullopt;
     },
     "What the ledger explains of NVML's used memory (cupool_ledger_nvml_used_bytes minus this is unexplained)."},
};
#undef CUPOOL_LEDGER_METRIC

void ledger_families(std::ostringstream& out, const model::Ledger& ledger, const Shown& shown, const NodeLabels& node) {
  for (const auto& m : kLedgerMetrics) metric_family(out, m, ledger.devices, kDeviceLabels, shown, node);
  // A budget's series: the device's labels, and the grant, pid and user.
  const struct {
    const char* name;
    std::uint64_t model::LedgerBudget::*field;
    const char* help;
  } budget_metrics[] = {
      {"cupool_budget_bytes", &model::LedgerBudget::budget_bytes, "A process's budget on the device."},
      {"cupool_budget_used_bytes", &model::LedgerBudget::used_bytes,
       "What a budgeted process holds on the device (its preload's count)."},
      {"cupool_budget_peak_bytes", &model::LedgerBudget::peak_bytes,
       "The most a budgeted process has held on the device."},
  };
  for (const auto& m : budget_metrics) {
    out << "# HELP " << m.name << ' ' << m.help << "\n# TYPE " << m.name << " gauge\n";
    for (const model::LedgerDevice& d : ledger.devices)
      for (const model::LedgerBudget& b : d.budgets) {
        if (!shown.has(b.*m.field)) continue;
        out << m.name << '{';
        for (const Label& label : kDeviceLabels)
          out << label.name << "=\"" << prometheus_label_value(label_value(d.id, nullptr, label.from, shown, node))
              << "\",";
        out << "grant=\"" << prometheus_label_value(b.grant) << "\",pid=\"" << b.pid << "\",user=\""
            << prometheus_label_value(b.user) << "\"} " << b.*m.field << "\n";
      }
  }
}

}  // namespace

std::string render_ledger_prometheus(const json& ledger, const NodeLabels& node) {
  std::ostringstream out;
  const Read<model::Ledger> read(ledger);
  ledger_families(out, read.value, read.shown, node);
  return out.str();
}

std::string render_ledger(const json& reply) {
  const Read<model::Ledger> read(reply);
  const Shown& shown = read.shown;
  std::ostringstream out;
  Table dt({"DEVICE", "TOTAL", "HELD", "POOLS", "BUDGETS", "USED", "CONTEXTS", "UNKNOWN", "AVAILABLE", "NVML USED",
            "UNEXPLAINED"});
  for (const model::LedgerDevice& d : read.value.devices) {
    const std::string unexplained = !d.unexplained_bytes ? kNone
                                    : *d.unexplained_bytes < 0
                                        ? "-" + format_bytes(static_cast<std::uint64_t>(-*d.unexplained_bytes))
                                        : format_bytes(static_cast<std::uint64_t>(*d.unexplained_bytes));
    dt.add({shown.number(d.id.device), shown.bytes(d.total_bytes), shown.bytes(d.held_bytes),
            shown.bytes(d.pool_reserved_bytes), shown.bytes(d.budget_bytes), shown.bytes(d.budget_used_bytes),
            shown.bytes(d.context_bytes), shown.bytes(d.unknown_bytes), shown.bytes(d.available_bytes),
            d.memory ? shown.bytes(d.memory->used_bytes) : kNone, unexplained});
  }
  out << section("Devices", dt, read.value.devices.size());
  for (const model::LedgerDevice& d : read.value.devices)
    if (d.usage_source == "unavailable" && !d.usage_note.empty())
      out << "device " << d.id.device << ": no NVML figures (" << valid_utf8(d.usage_note) << ")\n";

  Table bt({"GRANT", "DEVICE", "PID", "USER", "BUDGET", "USED", "PEAK", "ON DEVICE", "COMMAND"});
  std::size_t budgets = 0;
  for (const model::LedgerDevice& d : read.value.devices)
    for (const model::LedgerBudget& b : d.budgets) {
      ++budgets;
      bt.add({shown.text(b.grant) + (b.claimed ? "" : " (unclaimed)"), std::to_string(d.id.device), shown.number(b.pid),
              shown.text(b.user), shown.bytes(b.budget_bytes), shown.bytes(b.used_bytes), shown.bytes(b.peak_bytes),
              b.device_bytes ? format_bytes(*b.device_bytes) : kNone, utf8_prefix(valid_utf8(b.command), 60)});
    }
  out << "\n" << section("Budgets", bt, budgets);

  Table ht({"BUFFER", "DEVICE", "SIZE", "MAPPED BY"});
  std::size_t buffers = 0;
  for (const model::LedgerDevice& d : read.value.devices)
    for (const model::LedgerBuffer& b : d.buffers) {
      ++buffers;
      ht.add(
          {shown.text(b.name), std::to_string(d.id.device), shown.bytes(b.size_bytes), shown.number(b.mapper_count)});
    }
  out << "\n" << section("Held", ht, buffers);

  Table pt({"PID", "DEVICE", "ROLE", "ON DEVICE", "COMMAND"});
  std::size_t processes = 0;
  for (const model::LedgerDevice& d : read.value.devices)
    for (const model::LedgerProcess& p : d.processes) {
      ++processes;
      pt.add({shown.number(p.pid), std::to_string(d.id.device), shown.text(p.role),
              p.used_bytes ? format_bytes(*p.used_bytes) : kNone, utf8_prefix(valid_utf8(p.command), 60)});
    }
  out << "\n" << section("Processes on the GPUs (NVML)", pt, processes);
  out << "\nEach budget is charged " << shown.bytes(read.value.context_allowance_bytes)
      << " more for its context; AVAILABLE is what a new budget may take.\n";
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
  const Read<model::Trim> read(reply);
  const model::Trim& tr = read.value;
  const Shown& shown = read.shown;
  std::ostringstream out;
  Table pt({"POOL", "DEVICE", "RESERVED BEFORE", "RESERVED AFTER", "RELEASED"});
  for (const model::PoolTrim& p : tr.pools)
    pt.add({shown.text(p.name), shown.number(p.id.device), shown.bytes(p.reserved_before_bytes),
            shown.bytes(p.reserved_after_bytes), shown.bytes(p.released_bytes)});
  out << section("Pools", pt, tr.pools.size());

  // No devices: graph memory was not trimmed (--no-graph).
  if (!tr.devices.empty()) {
    Table dt({"DEVICE", "RESERVED BEFORE", "RESERVED AFTER", "RELEASED"});
    for (const model::GraphTrim& d : tr.devices)
      dt.add({shown.number(d.id.device), shown.bytes(d.reserved_before_bytes), shown.bytes(d.reserved_after_bytes),
              shown.bytes(d.released_bytes)});
    out << "\n" << section("Graph memory", dt, tr.devices.size());
  }
  if (tr.dropped_bytes) out << "\nClients dropped " << format_bytes(tr.dropped_bytes) << " of cached blocks first.";
  out << "\nReleased " << shown.bytes(tr.released_bytes) << " in total.\n";
  return out.str();
}

std::string render_buffers(const json& buffers) {
  model::BufferListing listing;
  listing.buffers = buffers;
  const Read<model::ListReply> read(model::write_json(listing));  // the buffers of a list reply
  const model::ListReply& listed = read.value;
  const Shown& shown = read.shown;
  if (listed.buffers.empty()) return "no buffers\n";
  Table t({"BUFFER", "POOL", "DEVICE", "SIZE", "STATE", "TENSORS", "OPENS", "PERMITTED"});
  for (const model::BufferInfo& b : listed.buffers) {
    t.add({shown.text(b.name), shown.text(b.pool), shown.number(b.id.device), shown.bytes(b.size_bytes),
           shown.text(b.state), shown.number(b.tensor_count), shown.number(b.open_count),
           !b.permitted   ? kNone
           : *b.permitted ? "yes"
                          : "no"});
  }
  return t.str();
}

std::string render_buffer_tensors(const json& reply) {
  const Read<model::BufferTensors> read(reply);
  const model::BufferTensors& bt = read.value;
  const Shown& shown = read.shown;
  const std::size_t count = bt.tensors.size();
  const std::size_t part_count = shown.has(bt.part_sizes) ? bt.part_sizes.size() : 1;
  std::string out = "buffer " + shown.text(bt.name) + ": " + shown.bytes(bt.size_bytes) +
                    (part_count > 1 ? " in " + std::to_string(part_count) + " parts" : std::string()) + ", " +
                    std::to_string(count) + (count == 1 ? " tensor\n" : " tensors\n");
  if (!count) {
    if (shown.has(bt.indexed) && !bt.indexed)
      out += "(no tensor index: made with `cupool buffer create`, not `cupool buffer load`)\n";
    return out;
  }
  // The part column only where there are parts: offsets then count from each part's start.
  const bool by_part = part_count > 1;
  Table t(by_part ? std::vector<std::string>{"TENSOR", "DTYPE", "SHAPE", "PART", "OFFSET", "SIZE"}
                  : std::vector<std::string>{"TENSOR", "DTYPE", "SHAPE", "OFFSET", "SIZE"});
  for (const model::TensorEntry& tensor : bt.tensors) {
    std::string shape = "[";
    for (const std::uint64_t d : tensor.shape) shape += (shape.size() > 1 ? ", " : "") + std::to_string(d);
    std::vector<std::string> row{shown.text(tensor.name), shown.text(tensor.dtype), shape + "]"};
    if (by_part) row.push_back(shown.number(tensor.part));
    row.push_back(shown.number(tensor.offset_bytes));
    row.push_back(shown.bytes(tensor.size_bytes));
    t.add(row);
  }
  return out + t.str();
}

std::string render_buffer_created(const json& reply) {
  const std::vector<std::string> b = buffer_made(reply);
  return "created buffer " + b[0] + ": " + b[1] + " in pool " + b[2] + " on device " + b[3] + "\n";
}

std::string render_buffer_removed(const json& reply) {
  const std::vector<std::string> b = buffer_made(reply);
  return "removed buffer " + b[0] + " (" + b[1] + " in pool " + b[2] + " on device " + b[3] + ")\n";
}

}  // namespace cupool
