// cupool stats: per pool reserved and used bytes (current and high), per device graph memory;
// once, or again every N seconds with --watch.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <ctime>
#include <iostream>
#include <sstream>

#include "base/output.h"
#include "cli/holder_client.h"
#include "cli/holder_render.h"
#include "cli/options.h"
#include "cli/verbs.h"
#include "cli/watch.h"
#include "protocol/messages.h"

namespace cupool::cli {

namespace {

struct StatsArgs {
  std::string socket = kDefaultSocket;
  std::string format = "table";
  bool reset_peaks = false;
  double watch = 0;    // seconds between polls; 0: once
  std::string output;  // a file written atomically at every poll; "": standard output
};

std::string render(const std::string& format, const nlohmann::ordered_json& reply, bool watching,
                   const NodeLabels& labels) {
  if (format == "prometheus") return render_stats_prometheus(reply, labels);
  if (format == "table") return render_stats(reply);
  if (format == "json")
    return watching ? reply_body(reply).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n"
                    : dump_json(reply_body(reply)) + "\n";
  return (watching ? "---\n" : "") + to_yaml(reply_body(reply));
}

// --format prometheus --output FILE --watch: the file a textfile collector reads, rewritten at
// every poll whether the holder answers or not. While it is away the file says so
// (cupool_holder_up 0, no pool values that would be stale); when it is back, the values are.
int watch_textfile(const StatsArgs& args, const Context& ctx, const nlohmann::ordered_json& request) {
  HolderMetrics metrics(args.socket, "cupool stats", ctx, request);
  InterruptGuard guard;
  while (!g_interrupted) {
    const std::string text = metrics.scrape();
    if (g_interrupted) break;
    write_file_atomically(args.output, text);  // the whole file, each time
    if (!pause_for(args.watch)) break;
  }
  return static_cast<int>(ExitCode::ok);
}

}  // namespace

Verb add_stats(CLI::App& app) {
  auto args = std::make_shared<StatsArgs>();
  CLI::App* sub = app.add_subcommand("stats", "Show pool, held buffer and graph memory usage in the running holder");
  sub->footer(
      "\n"
      "Ask the running holder for every pool's reserved and used bytes, current and high-water mark, its\n"
      "release threshold, leases and held buffers and tensor sets (HELD: exported allocations, outside the\n"
      "pool's reserved and used), and every device's held buffers and graph memory. USED HIGH is what clients\n"
      "used (the holder's own mapping of a pool's reserve is not counted). The holder synchronises its\n"
      "streams first, so freed memory is accounted. --reset-peaks (admin) resets the high-water marks\n"
      "after reading them: the values shown are those before the reset (with --watch, every poll resets,\n"
      "so the highs are per interval).\n"
      "--watch polls again every SECONDS (default 2) until Ctrl-C, which ends it with exit 0: a table, headed\n"
      "by the time of the poll, is redrawn on a terminal; json prints one document per line, yaml one\n"
      "document per poll.\n"
      "--format prometheus writes the Prometheus text format, e.g. for the node exporter's textfile collector\n"
      "with --output, which replaces the file atomically ('cupool exporter' serves the same over HTTP). A\n"
      "device's series (cupool_graph_reserved_bytes, cupool_device_held_bytes, ...) are labelled gpu, UUID,\n"
      "pci_bus_id, modelName and Hostname, as dcgm-exporter labels its own, and a pool's\n"
      "(cupool_pool_reserved_bytes, cupool_pool_held_bytes, ...) pool and those five; cupool_build_info\n"
      "names the build. With --watch too, the file is written at every poll and ends with cupool_holder_up:\n"
      "while the holder is away it keeps watching, and the file holds cupool_holder_up 0 and no pool values\n"
      "until the holder is back.\n"
      "\nExamples:\n"
      "  cupool stats\n"
      "  cupool stats --watch                  # every 2 s; --watch=0.5 for twice a second\n"
      "  cupool stats --format json --watch=10 | jq -c '.pools[] | {name, used_bytes}'\n"
      "  cupool stats --format prometheus --output /var/lib/node_exporter/cupool.prom --watch=15\n"
      "  sudo cupool stats --reset-peaks\n"
      "\nExit codes: 0 answered (or --watch ended by Ctrl-C), 2 bad arguments or --output can't be written,\n"
      "4 no holder is listening or it refused (--reset-peaks needs an admin).");
  add_socket_option(sub, args->socket);
  sub->add_option("--format,-o", args->format, "Output format: table, json, yaml or prometheus")
      ->check(CLI::IsMember({"table", "json", "yaml", "prometheus"}))
      ->capture_default_str();
  sub->add_option("--output", args->output,
                  "Write to this file, atomically (a textfile collector never reads half of it), at every poll");
  sub->add_flag("--reset-peaks", args->reset_peaks, "Reset the high-water marks after reading them (admin)");
  sub->add_option("--watch,-w", args->watch, "Poll again every SECONDS (default 2) until Ctrl-C")
      ->expected(0, 1)
      ->default_str("2")
      ->type_name("[SECONDS]")
      ->check(CLI::Range(0.1, 86400.0));

  return {sub, [args](Context& ctx) {
            const nlohmann::ordered_json request = proto::to_json(proto::Stats{args->reset_peaks});
            if (args->watch > 0 && args->format == "prometheus" && !args->output.empty())
              return watch_textfile(*args, ctx, request);
            HolderClient holder = HolderClient::connect(args->socket, "cupool stats");
            // dcgm-exporter's modelName and Hostname labels, read once.
            const NodeLabels labels = args->format == "prometheus" ? read_node_labels(holder, ctx) : NodeLabels{};
            if (args->watch <= 0) {
              const std::string text = render(args->format, holder.request(request), false, labels);
              if (!args->output.empty())
                write_file_atomically(args->output, text);
              else
                std::cout << text << std::flush;
              if (args->reset_peaks && args->format == "table")
                std::cerr << "cupool stats: peaks reset (the high values above are from before the reset)\n";
              return static_cast<int>(ExitCode::ok);
            }

            InterruptGuard guard;
            const bool redraw =
                (args->format == "table" || args->format == "prometheus") && ::isatty(STDOUT_FILENO) == 1;
            bool first = true;
            while (!g_interrupted) {
              nlohmann::ordered_json reply;
              try {
                reply = holder.request(request);
              } catch (const Error&) {
                if (g_interrupted) break;  // Ctrl-C during the request: not a failure
                throw;
              }
              if (g_interrupted) break;
              if (!args->output.empty()) {
                write_file_atomically(args->output, render(args->format, reply, false, labels));  // the whole file
                if (!pause_for(args->watch)) break;
                continue;
              }
              std::string text = render(args->format, reply, true, labels);
              // A table says when it was read; so does the Prometheus text, in a comment.
              if (args->format == "table") text = when_line("stats", args->watch) + "\n" + text;
              if (args->format == "prometheus") text = "# " + when_line("stats", args->watch) + text;
              if (redraw)
                text = "\033[H\033[2J" + text;
              else if (!first && (args->format == "table" || args->format == "prometheus"))
                text = "\n" + text;
              std::cout << text << std::flush;
              first = false;
              if (!pause_for(args->watch)) break;
            }
            return static_cast<int>(ExitCode::ok);
          }};
}

}  // namespace cupool::cli
