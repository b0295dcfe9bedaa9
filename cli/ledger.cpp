// cupool ledger: every byte of each device as the holder accounts for it, once or with --watch.
#include <unistd.h>

#include <iostream>

#include "base/output.h"
#include "cli/holder_client.h"
#include "cli/holder_render.h"
#include "cli/options.h"
#include "cli/verbs.h"
#include "cli/watch.h"
#include "protocol/messages.h"

namespace cupool::cli {

namespace {

struct LedgerArgs {
  std::string socket = kDefaultSocket;
  std::string format = "table";
  double watch = 0;
};

std::string render(const std::string& format, const nlohmann::ordered_json& reply, bool watching) {
  if (format == "table") return render_ledger(reply);
  if (format == "json")
    return watching ? reply_body(reply).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n"
                    : dump_json(reply_body(reply)) + "\n";
  return (watching ? "---\n" : "") + to_yaml(reply_body(reply));
}

}  // namespace

Verb add_ledger(CLI::App& app) {
  auto args = std::make_shared<LedgerArgs>();
  CLI::App* sub =
      app.add_subcommand("ledger", "Show where each GPU's memory went: held sets, pools, budgets, other processes");
  sub->footer(
      "\n"
      "Ask the running holder for its account of every byte of each device: held buffers and tensor sets\n"
      "(each once, however many processes map it, with how many do), the holder's pool reserves, each\n"
      "budget it granted ('cupool exec --budget': pid, user, command, budget, used, peak), the allowance\n"
      "for each process's CUDA context, the processes NVML lists that cupool does not know, and what is\n"
      "left for a new budget (AVAILABLE = total - everything committed). Beside them NVML's used memory and\n"
      "what the ledger can't explain of it. The same figures are in 'cupool stats --format prometheus'\n"
      "(cupool_ledger_*, cupool_budget_*) and the exporter. --watch polls every SECONDS until Ctrl-C.\n"
      "\nExamples:\n"
      "  cupool ledger\n"
      "  cupool ledger --watch=1\n"
      "  cupool ledger --format json | jq '.devices[] | {device, available_bytes}'\n"
      "\nExit codes: 0 answered (or --watch ended by Ctrl-C), 4 no holder is listening or it refused.");
  add_socket_option(sub, args->socket);
  add_format_option(sub, args->format);
  sub->add_option("--watch,-w", args->watch, "Poll again every SECONDS (default 2) until Ctrl-C")
      ->expected(0, 1)
      ->default_str("2")
      ->type_name("[SECONDS]")
      ->check(CLI::Range(0.1, 86400.0));

  return {sub, [args](Context&) {
            HolderClient holder = HolderClient::connect(args->socket, "cupool ledger");
            const nlohmann::ordered_json request = proto::to_json(proto::LedgerAsk{});
            if (args->watch <= 0) {
              std::cout << render(args->format, holder.request(request), false) << std::flush;
              return static_cast<int>(ExitCode::ok);
            }
            InterruptGuard guard;
            const bool redraw = args->format == "table" && ::isatty(STDOUT_FILENO) == 1;
            bool first = true;
            while (!g_interrupted) {
              nlohmann::ordered_json reply;
              try {
                reply = holder.request(request);
              } catch (const Error&) {
                if (g_interrupted) break;
                throw;
              }
              if (g_interrupted) break;
              std::string text = render(args->format, reply, true);
              if (args->format == "table") {
                text = when_line("ledger", args->watch) + "\n" + text;
                text = redraw ? "\033[H\033[2J" + text : (first ? "" : "\n") + text;
              }
              std::cout << text << std::flush;
              first = false;
              if (!pause_for(args->watch)) break;
            }
            return static_cast<int>(ExitCode::ok);
          }};
}

}  // namespace cupool::cli
