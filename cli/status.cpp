// cupool status: what the running holder holds.
#include "cli/holder_client.h"
#include "cli/holder_render.h"
#include "cli/options.h"
#include "cli/verbs.h"
#include "protocol/messages.h"

namespace cupool::cli {

namespace {

struct StatusArgs {
  std::string socket = kDefaultSocket;
  std::string format = "table";
};

}  // namespace

Verb add_status(CLI::App& app) {
  auto args = std::make_shared<StatusArgs>();
  CLI::App* sub = app.add_subcommand("status", "Show what the running holder holds: pools, buffers, clients");
  sub->footer(
      "\n"
      "Ask the running holder ('cupool hold') what it holds: the holder itself (version, pid, backend,\n"
      "config, uptime, draining), the device UUIDs, every pool with its settings, leases and buffers,\n"
      "the named buffers and how often each is open, and the connected clients. Anyone who can open the\n"
      "holder's socket may ask.\n"
      "\nExamples:\n"
      "  cupool status\n"
      "  cupool status --socket /tmp/cupool.sock\n"
      "  cupool status --format json | jq '.clients[] | {user, leased_bytes}'\n"
      "\nExit codes: 0 answered, 4 no holder is listening or it refused.");
  add_socket_option(sub, args->socket);
  add_format_option(sub, args->format);

  return {sub, [args](Context&) {
            const Format format = parse_format(args->format);
            HolderClient holder = HolderClient::connect(args->socket, "cupool status");
            print_reply(format, holder.request(proto::to_json(proto::Status{})), render_status);
            return static_cast<int>(ExitCode::ok);
          }};
}

}  // namespace cupool::cli
