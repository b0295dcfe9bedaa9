// cupool trim: give reserved pool (and graph) memory in the running holder back to the device,
// and report what was really released.
#include "base/units.h"
#include "cli/holder_client.h"
#include "cli/holder_render.h"
#include "cli/options.h"
#include "cli/verbs.h"
#include "protocol/messages.h"

namespace cupool::cli {

namespace {

struct TrimArgs {
  std::string socket = kDefaultSocket;
  std::string format = "table";
  std::string keep;
  std::string pool;
  bool no_graph = false;
  bool keep_cached = false;
};

}  // namespace

Verb add_trim(CLI::App& app) {
  auto args = std::make_shared<TrimArgs>();
  CLI::App* sub = app.add_subcommand("trim", "Release reserved pool and graph memory in the running holder");
  sub->footer(
      "\n"
      "Trim the running holder's pools (cuMemPoolTrimTo) so that each keeps at most --keep bytes reserved\n"
      "(default 0: everything not in use goes back to the device), and each device's graph memory\n"
      "(cuDeviceGraphMemTrim) unless --no-graph. The holder measures the reserved bytes before and after,\n"
      "so the answer is what was really released: memory that is in use (leases, buffers) stays, and a\n"
      "pool gives memory back in whole chunks. Needs an admin (root or the holder's own user).\n"
      "\n"
      "Blocks that clients released into their cache (CACHED in `cupool status`) are asked back first, as\n"
      "far as --keep needs: each client unmaps them and answers, and the trim runs then (a client that\n"
      "does not answer within the holder's drop timeout, 5 s, is disconnected and its leases freed).\n"
      "--keep-cached leaves them alone.\n"
      "\nExamples:\n"
      "  sudo cupool trim\n"
      "  sudo cupool trim --pool kv-cache --keep 4GiB\n"
      "  sudo cupool trim --no-graph --format json | jq .released\n"
      "  sudo cupool trim --keep-cached\n"
      "\nExit codes: 0 trimmed, 1 no such pool, 2 bad --keep, 4 no holder is listening or it refused.");
  add_socket_option(sub, args->socket);
  add_format_option(sub, args->format);
  sub->add_option("--keep", args->keep, "What each pool may keep reserved, with a unit (e.g. 4GiB; default 0 B)");
  sub->add_option("--pool", args->pool, "Trim only the pools of this name (default: every pool)");
  sub->add_flag("--no-graph", args->no_graph, "Leave the devices' graph memory alone");
  sub->add_flag("--keep-cached", args->keep_cached, "Do not ask clients to drop the blocks they keep cached");

  return {sub, [args](Context&) {
            const Format format = parse_format(args->format);
            std::uint64_t keep = 0;
            if (!args->keep.empty()) {
              std::string why;
              auto parsed = parse_size(args->keep, &why);
              if (!parsed) throw InputError("--keep: '" + args->keep + "' is not a size: " + why);
              keep = *parsed;
            }
            proto::Trim request;
            request.keep_bytes = keep;
            if (!args->pool.empty()) request.pool = args->pool;
            request.graph = !args->no_graph;
            request.cached = !args->keep_cached;
            HolderClient holder = HolderClient::connect(args->socket, "cupool trim");
            print_reply(format, holder.request(proto::to_json(request)), render_trim);
            return static_cast<int>(ExitCode::ok);
          }};
}

}  // namespace cupool::cli
