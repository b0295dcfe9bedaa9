#include "cli/holder_render.h"

#include <doctest/doctest.h>

#include "base/build_info.h"
#include "base/units.h"
#include "config/diagnostics.h"

using namespace cupool;
using json = nlohmann::ordered_json;

namespace {

const char* const kUuid0 = "GPU-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b";

// Replies shaped exactly like the examples in docs/protocol.md.
json status_reply() {
  return json::parse(R"({"id": 8, "ok": true,
    "source": {"simulated": false, "backend": "CUDA driver, libcuda.so.1"},
    "holder": {"pid": 4242, "version": "cupool 0.1.0", "config": "/etc/cupool/cupool.yaml",
               "socket": "/run/cupool/cupool.sock", "started": "2026-11-21T10:00:00Z", "reload_count": 0,
               "draining": false, "uptime_seconds": 3600},
    "pools": [{"name": "kv-cache", "device": 0, "uuid": "GPU-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b",
               "pci_bus_id": "0000:1b:00.0", "location": "device", "handle_types": ["posix_fd"],
               "max_size_bytes": 34359738368, "release_threshold": "max", "release_threshold_bytes": null,
               "lease_count": 3, "leased_bytes": 201326592, "cached_count": 1, "cached_bytes": 67108864,
               "buffer_count": 1, "buffer_bytes": 10737418240},
              {"name": "scratch", "device": 1, "uuid": "GPU-11111111-2222-3333-4444-555555555555",
               "pci_bus_id": "0000:1c:00.0", "location": "device", "handle_types": [], "max_size_bytes": null,
               "release_threshold": "0B", "release_threshold_bytes": 0, "lease_count": 0, "leased_bytes": 0,
               "cached_count": 0, "cached_bytes": 0, "buffer_count": 0, "buffer_bytes": 0},
              {"name": "scratch", "device": 0, "uuid": "GPU-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b",
               "pci_bus_id": "0000:1b:00.0", "location": "device", "handle_types": ["posix_fd", "fabric"],
               "max_size_bytes": 1073741824, "release_threshold": "512MiB", "release_threshold_bytes": 536870912,
               "lease_count": 0, "leased_bytes": 0, "cached_count": 0, "cached_bytes": 0, "buffer_count": 0,
               "buffer_bytes": 0}],
    "buffers": [{"name": "weights", "pool": "kv-cache", "device": 0, "uuid": "GPU-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b",
                 "pci_bus_id": "0000:1b:00.0", "size_bytes": 10737418240, "part_count": 1, "open_count": 2,
                 "state": "ready", "tensor_count": null, "allocation": "exported", "kept": true, "adopted": true}],
    "custody": {"kind": "keeper", "where": "keeper at /run/cupool/keeper.sock", "manifest_sequence": 7,
                "kept_buffer_count": 1, "error": null, "survives_restart": "held buffers", "made_again": "pools",
                "adoption": {"manifest_sequence": 6, "buffers": [], "released_count": 0, "fresh": false,
                            "elapsed_seconds": 0.01,
                            "refused": [{"name": "old", "error": {"code": "refused",
                                                                  "message": "its device GPU-9 is not on this node"}}]}},
    "clients": [{"id": 12, "pid": 5151, "uid": 1000, "user": "svc-infer", "name": "my-server",
                 "lease_count": 3, "leased_bytes": 201326592, "cached_count": 1, "cached_bytes": 67108864,
                 "asked_to_drop_count": 0, "protocol": 2, "open_buffer_count": 1, "connected_seconds": 120}],
    "client_count": 1})");
}

json stats_reply() {
  return json::parse(R"({"id": 9, "ok": true,
    "pools": [{"name": "kv-cache", "device": 0, "uuid": "GPU-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b", "pci_bus_id": "0000:1b:00.0",
               "reserved_bytes": 10804527104, "reserved_peak_bytes": 10804527104, "used_bytes": 10737418240,
               "used_peak_bytes": 10804527104, "release_threshold": "max", "release_threshold_bytes": null,
               "lease_count": 2, "leased_bytes": 134217728, "cached_count": 1, "cached_bytes": 67108864,
               "buffer_count": 2, "buffer_bytes": 17179869184}],
    "dropped_bytes": 0,
    "devices": [{"device": 0, "uuid": "GPU-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b", "pci_bus_id": "0000:1b:00.0",
                 "graph": {"reserved_bytes": 0, "reserved_peak_bytes": 0, "used_bytes": 0, "used_peak_bytes": 0},
                 "buffer_count": 2, "buffer_bytes": 17179869184}]})");
}

json plan_reply() {
  return json::parse(R"({"id": 11, "ok": true, "applied": false,
    "changes": [
      {"action": "create", "object": "pool", "name": "scratch", "device": 1, "uuid": "GPU-1", "pci_bus_id": "0000:1c:00.0"},
      {"action": "update", "object": "pool", "name": "kv-cache", "device": 0, "uuid": "GPU-0",
       "pci_bus_id": "0000:1b:00.0", "field": "release_threshold", "from": "0B", "from_value": 0, "to": "max",
       "to_value": null},
      {"action": "remove", "object": "pool", "name": "old", "device": 0, "uuid": "GPU-0", "pci_bus_id": "0000:1b:00.0",
       "blocked": "2 leases held by 1 client"},
      {"action": "create", "object": "buffer", "name": "weights", "device": 0, "uuid": "GPU-0",
       "pci_bus_id": "0000:1b:00.0"}],
    "warnings": [], "warnings_rendered": ""})");
}

}  // namespace

TEST_CASE("reply_body drops the envelope, puts schema_version first and keeps the order") {
  const json body = reply_body(json::parse(R"({"id": 12, "ok": true, "config": "version: 1\n", "a": 1})"));
  CHECK(body.dump() == R"({"schema_version":1,"config":"version: 1\n","a":1})");
  // A holder's own "schema_version" can't move or replace the CLI's.
  CHECK(reply_body(json::parse(R"({"ok": true, "a": 1, "schema_version": 7})")).dump() ==
        R"({"schema_version":1,"a":1})");
}

TEST_CASE("thresholds and durations") {
  CHECK(format_threshold(18446744073709551615ULL) == "max");
  CHECK(format_threshold(0) == "0B");
  CHECK(format_threshold(512ULL << 20) == "512MiB");
  CHECK(format_threshold((512ULL << 20) + 1) == "536870913B");
  CHECK(format_duration(0) == "0s");
  CHECK(format_duration(59) == "59s");
  CHECK(format_duration(125) == "2m 5s");
  CHECK(format_duration(3600) == "1h 0m");
  CHECK(format_duration(86400 * 3 + 3600 * 4 + 59) == "3d 4h");
}

TEST_CASE("status: holder, devices, pools, buffers, clients") {
  CHECK(
      render_status(status_reply()) ==
      "holder  cupool 0.1.0 (pid 4242, cuda backend)\n"
      "uptime  1h 0m (since 2026-11-21T10:00:00Z)\n"
      "config  /etc/cupool/cupool.yaml (0 reloads)\n"
      "socket  /run/cupool/cupool.sock\n"
      "state   serving\n"
      "\n"
      "Devices:\n"
      "  DEVICE  UUID\n"
      "  0       GPU-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b\n"
      "  1       GPU-11111111-2222-3333-4444-555555555555\n"
      "\n"
      "Pools:\n"
      "  POOL      DEVICE  LOCATION  HANDLE TYPES      MAX SIZE  RELEASE THRESHOLD  LEASES       CACHED      BUFFERS\n"
      "  kv-cache  0       device    posix_fd          32 GiB    max                3 (192 MiB)  1 (64 MiB)  1 (10 "
      "GiB)\n"
      "  scratch   1       device    none              default   0B                 0 (0 B)      0 (0 B)     0 (0 B)\n"
      "  scratch   0       device    posix_fd, fabric  1 GiB     512MiB             0 (0 B)      0 (0 B)     0 (0 B)\n"
      "\n"
      "Buffers:\n"
      "  BUFFER   POOL      DEVICE  SIZE    OPENS  KEPT\n"
      "  weights  kv-cache  0       10 GiB  2      yes, adopted\n"
      "\n"
      "Custody: keeper at /run/cupool/keeper.sock (manifest 7). A restart keeps held buffers; made again: pools.\n"
      "Not adopted at start: old: its device GPU-9 is not on this node\n"
      "\n"
      "Clients:\n"
      "  CLIENT  PID   UID   USER       NAME       LEASES       CACHED      OPEN BUFFERS  CONNECTED\n"
      "  12      5151  1000  svc-infer  my-server  3 (192 MiB)  1 (64 MiB)  1             2m 0s\n");
}

TEST_CASE("status: an idle, draining holder") {
  json reply = status_reply();
  reply["holder"]["draining"] = true;
  reply["holder"]["reload_count"] = 1;
  reply["pools"] = json::array();
  reply["buffers"] = json::array();
  reply["clients"] = json::array();
  reply.erase("custody");  // a holder from before custody
  const std::string text = render_status(reply);
  CHECK(text.find("config  /etc/cupool/cupool.yaml (1 reload)\n") != std::string::npos);
  CHECK(text.find("state   draining (stopping; takes no new allocations)\n") != std::string::npos);
  CHECK(text.find("\nDevices: none\n\nPools: none\n\nBuffers: none\n\nClients: none\n") != std::string::npos);
}

TEST_CASE("status: missing fields show as '-' instead of failing") {
  const std::string text = render_status(json::parse(R"({"ok": true, "pools": [{"name": "p"}], "clients": "x"})"));
  CHECK(text ==
        "holder  -\n"
        "config  -\n"
        "socket  -\n"
        "state   -\n"
        "\n"
        "Devices:\n"
        "  DEVICE  UUID\n"
        "  -       -\n"
        "\n"
        "Pools:\n"
        "  POOL  DEVICE  LOCATION  HANDLE TYPES  MAX SIZE  RELEASE THRESHOLD  LEASES  CACHED  BUFFERS\n"
        "  p     -       -         none          -         -                  -       -       -\n"
        "\n"
        "Buffers: none\n"
        "\n"
        "Clients: none\n");
}

TEST_CASE("stats: sizes for people") {
  CHECK(render_stats(stats_reply()) ==
        "Pools:\n"
        "  POOL      DEVICE  RESERVED  RESERVED HIGH  USED    USED HIGH  RELEASE THRESHOLD  LEASES       "
        "CACHED      HELD\n"
        "  kv-cache  0       10.1 GiB  10.1 GiB       10 GiB  10.1 GiB   max                2 (128 MiB)  "
        "1 (64 MiB)  2 (16 GiB)\n"
        "\n"
        "Held buffers:\n"
        "  DEVICE  UUID                                      HELD\n"
        "  0       GPU-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b  2 (16 GiB)\n"
        "\n"
        "Graph memory:\n"
        "  DEVICE  UUID                                      RESERVED  RESERVED HIGH  USED  USED HIGH\n"
        "  0       GPU-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b  0 B       0 B            0 B   0 B\n");
  CHECK(render_stats(json::parse(R"({"id": 1, "ok": true, "pools": [], "devices": []})")) ==
        "Pools: none\n\nHeld buffers: none\n\nGraph memory: none\n");
  // A holder from before stats counted held buffers: "-".
  json older = stats_reply();
  older["pools"][0].erase("buffer_count");
  older["pools"][0].erase("buffer_bytes");
  CHECK(render_stats(older).find("1 (64 MiB)  -\n") != std::string::npos);
}

TEST_CASE("stats in the Prometheus text format") {
  NodeLabels node;
  node.hostname = "gpu-node-7";
  node.model_names["gpu-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b"] = "NVIDIA H100 80GB HBM3";  // by UUID, lower case
  const std::string text = render_stats_prometheus(stats_reply(), node);
  // dcgm-exporter's labels (gpu, UUID, pci_bus_id as NVML writes it, modelName and Hostname) on
  // a device's series and a pool's, so dashboards join the two.
  const std::string ids = std::string("gpu=\"0\",UUID=\"") + kUuid0 + "\",pci_bus_id=\"00000000:1B:00.0\"";
  const std::string node_labels = ",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"gpu-node-7\"";
  const std::string device = "{" + ids + node_labels + "}";
  const std::string labels = "{pool=\"kv-cache\"," + ids + node_labels + "}";
  CHECK(text.find("# HELP cupool_pool_reserved_bytes ") == 0);
  CHECK(text.find("# TYPE cupool_pool_reserved_bytes gauge\ncupool_pool_reserved_bytes" + labels + " 10804527104\n") !=
        std::string::npos);
  CHECK(text.find("\ncupool_pool_reserved_peak_bytes" + labels + " 10804527104\n") != std::string::npos);
  // The old names of the peaks are written beside the new ones until cupool 0.2 (docs/naming.md).
  CHECK(text.find("\ncupool_pool_reserved_high_bytes" + labels + " 10804527104\n") != std::string::npos);
  CHECK(text.find("# HELP cupool_pool_reserved_high_bytes Deprecated: cupool_pool_reserved_peak_bytes under its old "
                  "name") != std::string::npos);
  CHECK(text.find("\ncupool_pool_used_bytes" + labels + " 10737418240\n") != std::string::npos);
  CHECK(text.find("\ncupool_pool_used_peak_bytes" + labels + " 10804527104\n") != std::string::npos);
  CHECK(text.find("\ncupool_pool_used_high_bytes" + labels + " 10804527104\n") != std::string::npos);
  CHECK(text.find("\ncupool_pool_release_threshold_bytes" + labels + " +Inf\n") != std::string::npos);  // max
  CHECK(text.find("\ncupool_pool_leases" + labels + " 2\n") != std::string::npos);
  CHECK(text.find("\ncupool_pool_leased_bytes" + labels + " 134217728\n") != std::string::npos);
  CHECK(text.find("\ncupool_pool_cached_leases" + labels + " 1\n") != std::string::npos);
  CHECK(text.find("\ncupool_pool_cached_bytes" + labels + " 67108864\n") != std::string::npos);
  // Held buffers and tensor sets, per pool and per device.
  CHECK(text.find("\ncupool_pool_held_buffers" + labels + " 2\n") != std::string::npos);
  CHECK(text.find("\ncupool_pool_held_bytes" + labels + " 17179869184\n") != std::string::npos);
  CHECK(text.find("\ncupool_device_held_buffers" + device + " 2\n") != std::string::npos);
  CHECK(text.find("\ncupool_device_held_bytes" + device + " 17179869184\n") != std::string::npos);
  CHECK(text.find("\ncupool_graph_reserved_bytes" + device + " 0\n") != std::string::npos);
  CHECK(text.find("\ncupool_graph_reserved_peak_bytes" + device + " 0\n") != std::string::npos);
  CHECK(text.find("\ncupool_graph_reserved_high_bytes" + device + " 0\n") != std::string::npos);
  CHECK(text.find("\ncupool_graph_used_bytes" + device + " 0\n") != std::string::npos);
  CHECK(text.find("\ncupool_graph_used_peak_bytes" + device + " 0\n") != std::string::npos);
  CHECK(text.find("\ncupool_graph_used_high_bytes" + device + " 0\n") != std::string::npos);

  // Every line is a comment or a sample; every family has exactly one HELP and one TYPE line.
  std::size_t help = 0, type = 0, samples = 0;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    REQUIRE(end != std::string::npos);
    const std::string line = text.substr(start, end - start);
    if (line.rfind("# HELP ", 0) == 0)
      ++help;
    else if (line.rfind("# TYPE ", 0) == 0)
      ++type;
    else
      ++samples;
    CHECK(line.rfind("cupool_", 0) == (line[0] == '#' ? std::string::npos : 0));
    start = end + 1;
  }
  // 17 series, the four peaks twice (their old names until cupool 0.2), and cupool_build_info.
  CHECK(help == 22);
  CHECK(type == 22);
  CHECK(samples == 22);
  const cupool::BuildInfo& b = cupool::build_info();
  CHECK(text.find("\ncupool_build_info{version=\"" + b.version + "\",commit=\"" + b.commit + "\",cuda_headers=\"" +
                  b.cuda_headers + "\"} 1\n") != std::string::npos);
  // A threshold below max is a number.
  json reply = stats_reply();
  reply["pools"][0]["release_threshold"] = "1KiB";
  reply["pools"][0]["release_threshold_bytes"] = 1024;
  CHECK(render_stats_prometheus(reply, node).find("cupool_pool_release_threshold_bytes" + labels + " 1024\n") !=
        std::string::npos);
  // A GPU the node does not name, and no host name: the labels are there, empty.
  CHECK(render_stats_prometheus(stats_reply())
            .find("\ncupool_graph_used_bytes{" + ids + ",modelName=\"\",Hostname=\"\"} 0\n") != std::string::npos);
}

TEST_CASE("Prometheus: the ledger's and the budgets' series carry every device label") {
  NodeLabels node;
  node.hostname = "gpu-node-7";
  node.model_names["gpu-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b"] = "NVIDIA H100 80GB HBM3";
  const json ledger = json::parse(R"({"context_allowance_bytes": 536870912, "devices": [
      {"device": 0, "uuid": "GPU-8f3c1a2b-0c4d-4e5f-8a9b-0c1d2e3f4a5b", "pci_bus_id": "0000:1b:00.0",
       "total_bytes": 85899345920, "held_bytes": 0, "buffers": [], "pool_reserved_bytes": 0, "pools": [],
       "budget_bytes": 1073741824, "budget_used_bytes": 0,
       "budgets": [{"grant": "g1", "pid": 77, "user": "alice", "command": "python", "claimed": true,
                    "budget_bytes": 1073741824, "used_bytes": 4096, "peak_bytes": 8192, "device_bytes": null}],
       "context_bytes": 0, "unknown_bytes": 0, "processes": [], "committed_bytes": 0, "available_bytes": 0,
       "usage": {"reader": "unavailable", "note": "", "memory": null, "accounted_bytes": null,
                 "unexplained_bytes": null}}]})");
  const std::string text = render_ledger_prometheus(ledger, node);
  const std::string device =
      std::string("gpu=\"0\",UUID=\"") + kUuid0 +
      "\",pci_bus_id=\"00000000:1B:00.0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"gpu-node-7\"";
  CHECK(text.find("\ncupool_ledger_total_bytes{" + device + "} 85899345920\n") != std::string::npos);
  CHECK_MESSAGE(text.find("\ncupool_budget_used_bytes{" + device + ",grant=\"g1\",pid=\"77\",user=\"alice\"} 4096\n") !=
                    std::string::npos,
                text);
}

TEST_CASE("Prometheus label values are escaped") {
  CHECK(prometheus_label_value("plain-name.1") == "plain-name.1");
  CHECK(prometheus_label_value("a\"b") == "a\\\"b");
  CHECK(prometheus_label_value("a\\b") == "a\\\\b");
  CHECK(prometheus_label_value("a\nb") == "a\\nb");
  json reply = stats_reply();
  reply["pools"][0]["name"] = "we\"ird\\na\nme";
  reply["pools"][0]["uuid"] = nullptr;
  const std::string text = render_stats_prometheus(reply);
  CHECK(text.find(
            "cupool_pool_used_bytes{pool=\"we\\\"ird\\\\na\\nme\",gpu=\"0\",UUID=\"\",pci_bus_id=\"00000000:1B:00.0\","
            "modelName=\"\",Hostname=\"\"} 10737418240\n") != std::string::npos);
}

TEST_CASE("Prometheus: no pools, no samples; a sample without its value is left out") {
  const std::string empty = render_stats_prometheus(json::parse(R"({"pools": [], "devices": []})"));
  CHECK(empty.find("# TYPE cupool_pool_used_bytes gauge\n# HELP cupool_pool_used_peak_bytes") != std::string::npos);
  CHECK(empty.find("\ncupool_pool") == std::string::npos);
  CHECK(empty.find("\ncupool_graph") == std::string::npos);
  json reply = stats_reply();
  reply["pools"][0].erase("used_peak_bytes");
  const std::string text = render_stats_prometheus(reply);
  CHECK(text.find("\ncupool_pool_used_peak_bytes{") == std::string::npos);
  CHECK(text.find("\ncupool_pool_used_high_bytes{") == std::string::npos);
  CHECK(text.find("\ncupool_pool_used_bytes{") != std::string::npos);
}

TEST_CASE("trim: before, after, released and the total") {
  const json reply = json::parse(R"({"id": 10, "ok": true, "released_bytes": 67108864, "dropped_bytes": 0,
    "pools": [{"name": "kv-cache", "device": 0, "uuid": "GPU-0", "pci_bus_id": "0000:1b:00.0",
               "reserved_before_bytes": 67108864, "reserved_after_bytes": 0, "released_bytes": 67108864}],
    "devices": [{"device": 0, "uuid": "GPU-0", "pci_bus_id": "0000:1b:00.0",
                 "graph": {"reserved_before_bytes": 0, "reserved_after_bytes": 0, "released_bytes": 0}}]})");
  CHECK(render_trim(reply) ==
        "Pools:\n"
        "  POOL      DEVICE  RESERVED BEFORE  RESERVED AFTER  RELEASED\n"
        "  kv-cache  0       64 MiB           0 B             64 MiB\n"
        "\n"
        "Graph memory:\n"
        "  DEVICE  RESERVED BEFORE  RESERVED AFTER  RELEASED\n"
        "  0       0 B              0 B             0 B\n"
        "\n"
        "Released 64 MiB in total.\n");
  // --no-graph: no devices, no graph section.
  CHECK(render_trim(json::parse(R"({"released_bytes": 0, "pools": [], "devices": []})")) ==
        "Pools: none\n\nReleased 0 B in total.\n");
}

TEST_CASE("plan: a diff line per change, blocked ones say why") {
  CHECK(render_plan(plan_reply()) ==
        "+ pool scratch on device 1\n"
        "~ pool kv-cache on device 0: release_threshold 0B -> max\n"
        "- pool old on device 0 (kept: 2 leases held by 1 client)\n"
        "+ buffer weights on device 0\n"
        "\n"
        "Plan: 2 to create, 1 to update, 1 to remove; 1 blocked (will not be made).\n");
  CHECK(change_count(plan_reply()) == 4);
  CHECK(blocked_changes(plan_reply()) == 1);
}

TEST_CASE("apply: counts only what was made") {
  json reply = plan_reply();
  reply["applied"] = true;
  const std::string text = render_plan(reply);
  CHECK(text.find("- pool old on device 0 (kept: 2 leases held by 1 client)\n") != std::string::npos);
  CHECK(text.substr(text.find("\n\n")) == "\n\nApplied: 2 created, 1 updated; 1 blocked (not made).\n");

  const json all_blocked = json::parse(R"({"applied": true, "changes": [
    {"action": "remove", "object": "buffer", "name": "weights", "blocked": "open 2 times"}]})");
  CHECK(render_plan(all_blocked) ==
        "- buffer weights (kept: open 2 times)\n\nApplied: nothing; 1 blocked (not made).\n");
}

TEST_CASE("plan: no changes") {
  const json empty = json::parse(R"({"id": 11, "ok": true, "applied": false, "changes": [], "warnings": []})");
  CHECK(render_plan(empty) == "no changes\n");
  CHECK(change_count(empty) == 0);
  CHECK(blocked_changes(empty) == 0);
  CHECK(render_plan(json::parse(R"({"applied": true})")) == "no changes\n");
}

TEST_CASE("plan: replace and other value types") {
  CHECK(render_change(json::parse(R"({"action": "replace", "object": "pool", "name": "kv-cache", "device": 1,
      "field": "max_size", "from": "32GiB", "from_value": 34359738368, "to": "", "to_value": null})")) ==
        "-/+ pool kv-cache on device 1: max_size 32GiB -> default");
  CHECK(render_change(json::parse(R"({"action": "replace", "object": "pool", "name": "kv-cache", "device": 0,
      "field": "handle_types", "from": "[posix_fd]", "to": "[posix_fd, fabric]", "from_value": ["posix_fd"],
      "to_value": ["posix_fd", "fabric"], "blocked": "3 leases held by 2 clients"})")) ==
        "-/+ pool kv-cache on device 0: handle_types [posix_fd] -> [posix_fd, fabric] (kept: 3 leases held by 2 "
        "clients)");
  CHECK(render_change(json::parse(R"({"action": "update", "object": "pool", "name": "p", "device": 0,
      "field": "group", "from": "", "from_value": null, "to": "gpu", "to_value": "gpu"})")) ==
        "~ pool p on device 0: group none -> gpu");
  CHECK(render_change(json::parse(R"({"action": "create", "object": "buffer", "name": "w", "device": 0,
      "uuid": "GPU-0", "pci_bus_id": "0000:1b:00.0", "blocked": "no room"})")) ==
        "+ buffer w on device 0 (blocked: no room)");
  CHECK(render_change(json::parse(R"({"action": "remove", "object": "pool", "name": "p", "blocked": null})")) ==
        "- pool p");
  CHECK(render_change(json::parse(R"({"action": "rename", "object": "pool", "name": "p"})")) == "? pool p (rename)");
  CHECK(render_change(json::parse(R"({"action": "update", "object": "holder", "name": "holder", "field": "socket",
      "from": "/tmp/a.sock", "to": "/run/cupool/cupool.sock", "blocked": "changes only when the holder restarts"})")) ==
        "~ holder: socket /tmp/a.sock -> /run/cupool/cupool.sock (blocked: changes only when the holder restarts)");
  CHECK(render_change(json::parse(R"({"action": "update", "object": "holder", "field": "mode", "from": "0660",
      "to": "0600"})")) == "~ holder: mode 0660 -> 0600");
  const json odd = json::parse(R"({"changes": [{"action": "rename", "object": "pool", "name": "p"}]})");
  CHECK(render_plan(odd) == "? pool p (rename)\n\nPlan: 1 other.\n");
}

TEST_CASE("findings from the holder are quoted against the local file") {
  const SourceFile file("pools.yaml", "version: 1\npools:\n  - name: kv-cache\n    reserve: 1GiB\n");
  const json findings = json::parse(R"([{"file": "pools.yaml", "line": 4, "column": 5, "severity": "warning",
      "code": "reserve-above-threshold", "message": "reserve is above release_threshold", "invalid_input": false,
      "fact": null, "help": "set release_threshold to max"}])");
  CHECK(render_findings(findings, file) ==
        "pools.yaml:4:5: warning: reserve is above release_threshold [reserve-above-threshold]\n"
        " 4 |     reserve: 1GiB\n"
        "   |     ^\n"
        "   = help: set release_threshold to max\n"
        "\n");
  CHECK(render_findings(json::array(), file).empty());
  CHECK(render_findings(json(nullptr), file).empty());
}

TEST_CASE("buffers") {
  const json buffers = json::parse(R"([
    {"name": "weights", "pool": "kv-cache", "device": 0, "size_bytes": 10737418240, "permitted": true,
     "open_count": 2, "state": "ready", "tensor_count": 291},
    {"name": "secret", "pool": "private", "device": 1, "size_bytes": 1536, "permitted": false, "state": "loading",
     "tensor_count": null}])");
  CHECK(render_buffers(buffers) ==
        "BUFFER   POOL      DEVICE  SIZE     STATE    TENSORS  OPENS  PERMITTED\n"
        "weights  kv-cache  0       10 GiB   ready    291      2      yes\n"
        "secret   private   1       1.5 KiB  loading  -        -      no\n");
  CHECK(render_buffers(json::array()) == "no buffers\n");
  const json index = json::parse(R"({"name": "llama", "size_bytes": 4096, "indexed": true, "metadata": {},
    "parts": [{"part": 0, "size_bytes": 4096}], "tensors": [
    {"name": "embed.weight", "dtype": "F16", "shape": [8, 16], "part": 0, "offset_bytes": 0, "size_bytes": 256},
    {"name": "scale", "dtype": "F32", "shape": [], "part": 0, "offset_bytes": 256, "size_bytes": 4}]})");
  CHECK(render_buffer_tensors(index) ==
        "buffer llama: 4 KiB, 2 tensors\n"
        "TENSOR        DTYPE  SHAPE    OFFSET  SIZE\n"
        "embed.weight  F16    [8, 16]  0       256 B\n"
        "scale         F32    []       256     4 B\n");
  const json parted = json::parse(R"({"name": "big", "size_bytes": 6442450944,
    "parts": [{"part": 0, "size_bytes": 4294967296}, {"part": 1, "size_bytes": 2147483648}], "indexed": true, "tensors": [
    {"name": "a", "dtype": "U8", "shape": [4294967296], "part": 0, "offset_bytes": 0, "size_bytes": 4294967296},
    {"name": "b", "dtype": "U8", "shape": [2147483648], "part": 1, "offset_bytes": 0, "size_bytes": 2147483648}]})");
  CHECK(render_buffer_tensors(parted) ==
        "buffer big: 6 GiB in 2 parts, 2 tensors\n"
        "TENSOR  DTYPE  SHAPE         PART  OFFSET  SIZE\n"
        "a       U8     [4294967296]  0     0       4 GiB\n"
        "b       U8     [2147483648]  1     0       2 GiB\n");
  CHECK(render_buffer_tensors(json::parse(R"({"name": "w", "size_bytes": 1024, "indexed": false, "tensors": []})")) ==
        "buffer w: 1 KiB, 0 tensors\n(no tensor index: made with `cupool buffer create`, not `cupool buffer load`)\n");
  const json created = json::parse(
      R"({"id": 13, "ok": true, "name": "weights", "pool": "kv-cache", "device": 0, "size_bytes": 10737418240})");
  CHECK(render_buffer_created(created) == "created buffer weights: 10 GiB in pool kv-cache on device 0\n");
  CHECK(render_buffer_removed(created) == "removed buffer weights (10 GiB in pool kv-cache on device 0)\n");
}
