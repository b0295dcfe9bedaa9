// cupool keeper: keep the holder's descriptors (its buffers' memory) across holder restarts where
// there is no systemd file-descriptor store; --list and --release ask a running keeper.
#include "custody/keeper.h"

#include <iostream>
#include <string>

#include "base/error.h"
#include "base/output.h"
#include "cli/options.h"
#include "cli/verbs.h"
#include "model/model.h"

namespace cupool::cli {

namespace {

struct KeeperArgs {
  std::string socket = custody::default_keeper_socket();
  std::string format = "table";
  bool list = false;
  bool release = false;
  double reply_delay = 0;  // seconds (tests)
};

}  // namespace

Verb add_keeper(CLI::App& app) {
  auto args = std::make_shared<KeeperArgs>();
  CLI::App* sub = app.add_subcommand("keeper", "Keep the holder's buffers alive while it stops, restarts or crashes");
  sub->footer(
      "\n"
      "The holder's buffers are GPU memory that other processes map. Each part is a file descriptor, and\n"
      "the memory lives as long as any process holds that descriptor open. The holder gives every one\n"
      "to custody, with a manifest that says what they are, and a holder that starts after a restart or\n"
      "a crash takes them back and adopts the buffers. The shipped systemd units run a keeper\n"
      "(cupool-keeper.service, which 'systemctl stop cupool' leaves running), and so does the Kubernetes\n"
      "manifest, in a DaemonSet of its own beside the holder's, sharing /run/cupool\n"
      "(configs/kubernetes/cupool.yaml). The other custody is systemd's own file-descriptor store (a\n"
      "holder under a unit, without --keeper): it outlives 'systemctl stop' only on systemd 254 and later.\n"
      "\n"
      "The keeper runs in the foreground and never loads CUDA. It listens on --socket (mode 0600, a lock\n"
      "file beside it: one keeper per socket) and only its own user and root may use it. The socket's\n"
      "directory must be one only this user or root can write (by default /run/cupool for root,\n"
      "$XDG_RUNTIME_DIR/cupool for another user), or a sticky one such as /tmp where nothing at the\n"
      "path belongs to another user: the keeper refuses any other place (exit 4, naming what is in\n"
      "the way), and the holder gives descriptors only to a keeper of its own user or root at such a\n"
      "place. It keeps every descriptor open until the holder removes it or someone asks it to\n"
      "release everything. SIGTERM (exit 0) and SIGINT (exit 130) stop it, and stopping closes every\n"
      "descriptor kept: the memory of buffers that no running holder maps is then gone (a warning says\n"
      "how many). SIGHUP is ignored. It logs at info unless --log-level or CUPOOL_LOG_LEVEL says otherwise\n"
      "(--list and --release: at warn, as the other verbs).\n"
      "\n"
      "--list prints the names kept; --release makes a running keeper close everything it keeps (the\n"
      "memory goes unless a holder still maps it) and prints how many it released.\n"
      "\nExamples:\n"
      "  cupool keeper\n"
      "  cupool keeper --socket \"$XDG_RUNTIME_DIR/cupool/keeper.sock\" --log-level debug\n"
      "  cupool keeper --list\n"
      "  cupool keeper --list --format json | jq -r '.names[]'\n"
      "  cupool keeper --list --format yaml\n"
      "  sudo cupool keeper --release\n"
      "\nExit codes: 0 stopped by SIGTERM (or --list/--release done), 130 by SIGINT, 2 a bad option, 4 the\n"
      "socket is taken by another keeper or can't be made (--list/--release: no keeper listens, or it\n"
      "refused this user).");
  sub->add_option("--socket,-s", args->socket,
                  "The keeper's socket (a user other than root: $XDG_RUNTIME_DIR/cupool/keeper.sock, where set)")
      ->envname("CUPOOL_KEEPER")
      ->default_str(custody::kDefaultKeeperSocket);
  CLI::Option* list = sub->add_flag("--list", args->list, "Print the names a running keeper keeps, and exit");
  sub->add_flag("--release", args->release, "Ask a running keeper to close everything it keeps (the memory goes)")
      ->excludes(list);
  add_format_option(sub, args->format)->description("Output format of --list: table, json or yaml")->needs(list);

  // For the tests of the holder's bound on custody (tests/holder/hostile_test.py): a keeper that
  // answers each request this many seconds late. Not shown in --help.
  sub->add_option("--reply-delay", args->reply_delay)->check(CLI::Range(0.0, 60.0))->group("");

  return {sub, [args](Context&) {
            if (!args->list && !args->release) {
              custody::KeeperOptions options;
              options.socket = args->socket;
              options.reply_delay_ms = static_cast<int>(args->reply_delay * 1000);
              return custody::run_keeper(options);
            }
            custody::KeeperClient keeper(args->socket);
            if (args->release) {
              const std::size_t n = keeper.release();
              std::cout << "released " << n << " descriptor" << (n == 1 ? "" : "s") << " kept at " << args->socket
                        << "\n";
              return static_cast<int>(ExitCode::ok);
            }
            const std::vector<std::string> names = keeper.names();
            const auto listed = [&] { return versioned(model::to_json(model::KeeperList{args->socket, names})); };
            switch (parse_format(args->format)) {
              case Format::json: std::cout << dump_json(listed()) << "\n"; break;
              case Format::yaml: std::cout << to_yaml(listed()); break;
              case Format::table: {
                Table table({"NAME"});
                for (const std::string& name : names) table.add({name});
                std::cout << table.str() << names.size() << " kept at " << args->socket << "\n";
                break;
              }
            }
            return static_cast<int>(ExitCode::ok);
          }};
}

}  // namespace cupool::cli
