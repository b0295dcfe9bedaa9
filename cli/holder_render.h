// Rendering of the holder's replies (docs/protocol.md) for people and for Prometheus: pure
// functions from a reply's JSON to text, so the verbs that talk to a holder (cli/status.cpp,
// stats, trim, plan, apply, buffer) stay thin and the output is unit-tested without a holder.
//
// Every renderer takes a successful reply (with or without "id" and "ok") and tolerates missing
// or ill-typed fields: such a value is shown as "-" rather than failing, so a holder a version
// ahead still gets a readable answer. Output is deterministic (no clock, no terminal queries) and
// ends with a newline.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace cupool {

class SourceFile;

// The reply without its envelope ("id", "ok") and with "schema_version" first: what --format
// json/yaml prints.
nlohmann::ordered_json reply_body(const nlohmann::ordered_json& reply);

// Seconds as "45s", "2m 5s", "1h 0m", "3d 4h".
std::string format_duration(std::uint64_t seconds);

// `status`: the holder line, devices, pools, buffers and clients.
std::string render_status(const nlohmann::ordered_json& reply);

// `stats`: per pool reserved/used current and high (human sizes) and held buffers; per device held
// buffers and graph memory.
std::string render_stats(const nlohmann::ordered_json& reply);
// The labels dcgm-exporter gives a device that no holder reply carries: the host's name and each
// GPU's name (cli/holder_client.h reads them from the node).
struct NodeLabels {
  std::string hostname;                            // Hostname: gethostname()
  std::map<std::string, std::string> model_names;  // modelName by UUID, lower case ("gpu-8f3c...")
};

// `stats` in the Prometheus text exposition format (version 0.0.4): HELP and TYPE lines, every
// metric family's samples together, label values escaped.
// Labels are dcgm-exporter's: a device's series (cupool_graph_*, cupool_device_held_*, the
// ledger's and the budgets') have gpu, UUID, pci_bus_id (written as NVML does,
// "00000000:1B:00.0"), modelName and Hostname (from `node`; "" where it does not know); a pool's
// have pool and those five. A release threshold of max is +Inf, and cupool_build_info ends it.
std::string render_stats_prometheus(const nlohmann::ordered_json& reply, const NodeLabels& node = {});
// `ledger`: per device where its memory went (held, pool reserves, budgets, contexts, processes
// cupool does not know, what is left), NVML's figures beside them, then each budget and process.
std::string render_ledger(const nlohmann::ordered_json& reply);
// The ledger's Prometheus families (cupool_ledger_*_bytes per device, cupool_budget_*_bytes per
// budget): what render_stats_prometheus adds when the stats reply carries a ledger.
std::string render_ledger_prometheus(const nlohmann::ordered_json& ledger, const NodeLabels& node = {});
// The cupool_build_info family alone (HELP, TYPE, one sample of value 1).
std::string prometheus_build_info();
// A Prometheus label value with `\`, `"` and newline escaped (the exposition format's rule).
std::string prometheus_label_value(std::string_view value);

// `trim`: per pool and per device before / after / released, and the total really released.
std::string render_trim(const nlohmann::ordered_json& reply);

// One change of a `plan`/`apply` reply as a diff line, without a newline:
//   "+ pool scratch on device 1"
//   "~ pool kv-cache on device 0: release_threshold 0 B -> max"
//   "-/+ pool kv-cache on device 0: max_size 32 GiB -> 64 GiB (replaced: can't change on a live pool)"
//   "- pool old on device 0 (kept: 2 leases held by 1 client)"
std::string render_change(const nlohmann::ordered_json& change);
// A `plan` or `apply` reply: a line per change, then a count line; "no changes" when empty.
std::string render_plan(const nlohmann::ordered_json& reply);
// How many of the reply's changes carry "blocked".
std::size_t blocked_changes(const nlohmann::ordered_json& reply);
// How many changes the reply lists.
std::size_t change_count(const nlohmann::ordered_json& reply);

// Findings as the holder sends them (the objects of `cupool check --format json`), rendered
// compiler style against the file they came from (which the caller still has), so they quote
// the source line like `cupool check` does.
std::string render_findings(const nlohmann::ordered_json& findings, const SourceFile& file);

// `buffer ls`: the buffers of a `list` reply (model::BufferInfo, with `permitted`).
std::string render_buffers(const nlohmann::ordered_json& buffers);
// One buffer's tensors (the reply of buffer_tensors): a header line and a table.
std::string render_buffer_tensors(const nlohmann::ordered_json& reply);
// `buffer create` / `buffer rm` replies: one line saying what happened.
std::string render_buffer_created(const nlohmann::ordered_json& reply);
std::string render_buffer_removed(const nlohmann::ordered_json& reply);

}  // namespace cupool
