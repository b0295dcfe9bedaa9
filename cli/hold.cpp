// cupool hold: run the holder in the foreground (systemd Type=notify).
#include <string>

#include "cli/options.h"
#include "cli/suggest.h"
#include "cli/verbs.h"
#include "holder/server.h"

namespace cupool::cli {

namespace {
struct HoldArgs {
  std::string config;
  std::string socket;
  std::string profile;
  double drain_timeout = 30;
  double drop_timeout = 5;
  std::size_t max_clients_per_user = 256;
  bool no_kernel_refusal = false;
  std::string keeper;
  double keeper_wait = 30;
  double start_timeout = 120;
  bool fresh = false;
};
}  // namespace

Verb add_hold(CLI::App& app) {
  auto args = std::make_shared<HoldArgs>();
  CLI::App* sub =
      app.add_subcommand("hold", "Run the holder: keep the config's pools and serve them to other processes");
  sub->footer(
      "\n"
      "Runs in the foreground until SIGTERM. Checks the file like 'cupool check' (and refuses to start if it\n"
      "does not fit), creates every pool (settings, peer access, reserve, verified through the pool's\n"
      "reserved-memory attribute) and buffer, and listens on the socket (holder.socket; mode and group from\n"
      "the file). Clients get pools and memory through the C API (include/cupool/client.h) or the protocol\n"
      "(docs/protocol.md); 'cupool status', 'stats', 'trim', 'plan', 'apply', 'export' and 'buffer' talk to it.\n"
      "\n"
      "Signals: SIGHUP reloads the file (a file with errors is reported and the old state kept; a pool with\n"
      "leases is never removed); SIGTERM stops taking new work, tells every client, waits up to\n"
      "--drain-timeout only for clients with leases in use (an exporter, a watcher or an engine that only\n"
      "maps held buffers does not delay it), then frees leases, buffers and pools in that order (SIGINT does\n"
      "the same, exit 130; a second signal stops at once). Only one holder serves a socket (a lock file beside it); a "
      "socket left\n"
      "by a holder that crashed is replaced. Under systemd (Type=notify) it reports READY, RELOADING and\n"
      "STOPPING: see configs/systemd/cupool.service.\n"
      "\n"
      "Connections: at most 1024, and at most --max-clients-per-user from one user (by the kernel's word\n"
      "for who the peer is); root and the holder's own user have no per-user limit and 16 connections\n"
      "beyond the 1024, so 'cupool status' works on a full holder. Past a limit the peer is told\n"
      "limit_exceeded and closed.\n"
      "\n"
      "Held buffers outlive the holder: a buffer or tensor set of a device pool is an exported allocation\n"
      "whose descriptor goes into custody as soon as it exists, with a manifest of names, sizes, device UUIDs\n"
      "and tensor indexes: a keeper ('cupool keeper', --keeper; the shipped units and the Kubernetes manifest\n"
      "run one), or without --keeper under systemd the unit's file-descriptor store (which outlives\n"
      "'systemctl stop' only on systemd 254 and later). A holder that restarts, is upgraded or crashes\n"
      "adopts them: nothing is read again, and clients keep their mappings.\n"
      "\n"
      "The start: the holder listens as soon as it has read custody and its config, before it loads the\n"
      "driver (cuInit takes 0.2 s on an H200), checking the config against the node report the last holder\n"
      "kept in custody while the node is the same (its boot, driver, GPUs and CUDA_VISIBLE_DEVICES). Until\n"
      "the driver is up it serves hello, status and the held buffers (buffer_open, buffer_tensors) from\n"
      "custody; other requests wait in their connection (at most --start-timeout). Then it maps the adopted\n"
      "buffers (the driver checks each against the manifest), asks the node again and makes the pools.\n"
      "'cupool status' says where the start's time went.\n"
      "Pools, leases and cached blocks are this process's and are made again from the config. --fresh starts\n"
      "from nothing. 'cupool status' says what custody holds.\n"
      "\n"
      "Cached blocks: a client (protocol 2) keeps the mappings of blocks it released, to get them again\n"
      "without a round trip; they stay charged to it (CACHED in 'cupool status'). When the holder needs\n"
      "them (trim, apply or SIGHUP, an allocation that does not fit) it asks the client to drop them; a client that\n"
      "does not answer within --drop-timeout is disconnected and its leases freed.\n"
      "\n"
      "It logs at info (what it creates, reloads and frees) unless --log-level or CUPOOL_LOG_LEVEL says\n"
      "otherwise; the other verbs log at warn.\n"
      "\nExamples:\n"
      "  cupool hold /etc/cupool/cupool.yaml\n"
      "  cupool keeper & cupool hold /etc/cupool/cupool.yaml --keeper /run/cupool/keeper.sock\n"
      "  cupool hold configs/ipc-multiprocess-server.yaml --socket /tmp/cupool.sock --profile "
      "configs/profiles/h200x2.yaml\n"
      "\nExit codes: 0 stopped by SIGTERM, 130 by SIGINT, 1 the config does not fit, 2 invalid config,\n"
      "3 no driver or device, 4 the socket is taken by another holder or can't be made.");
  sub->add_option("config", args->config, "The config file to hold")->required();
  sub->add_option("--socket,-s", args->socket, "Listen here instead of the config's holder.socket")
      ->envname("CUPOOL_SOCKET");
  add_profile_option(sub, args->profile, "Hold pools on");
  sub->add_option("--drain-timeout", args->drain_timeout,
                  "Seconds SIGTERM waits for clients with leases in use to free them")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  sub->add_option("--drop-timeout", args->drop_timeout,
                  "Seconds a client has to give back cached blocks when asked, before it is disconnected")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  sub->add_option("--max-clients-per-user", args->max_clients_per_user,
                  "Connections one user (not root, not the holder's user) may hold at once")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("--keeper", args->keeper,
                  "Keep the held buffers' descriptors in the keeper at this socket ('cupool keeper'; the shipped unit "
                  "names /run/cupool/keeper.sock) rather than in systemd's file-descriptor store")
      ->envname("CUPOOL_KEEPER");
  sub->add_option("--keeper-wait", args->keeper_wait, "Seconds the start waits for the keeper to answer")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  sub->add_option("--start-timeout", args->start_timeout,
                  "Seconds the driver may take to come up once the holder listens (requests that need it wait); "
                  "past it the holder exits 3")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  sub->add_flag("--fresh", args->fresh,
                "Start from nothing: drop the buffers custody kept instead of adopting them (their memory is freed)");
  // For the hostile-peer tests: behave as on kernels before 6.16, which can't refuse descriptors
  // that clients send (tests/holder/hostile_test.py). Not shown in --help.
  sub->add_flag("--no-kernel-descriptor-refusal", args->no_kernel_refusal)->group("");

  return {sub, [args](Context& ctx) {
            require_config(args->config, "hold");
            auto backend = ctx.make_backend(args->profile);
            ServerOptions options;
            options.config_path = args->config;
            options.socket = args->socket;
            options.drain_timeout_ms = static_cast<int>(args->drain_timeout * 1000);
            options.max_clients_per_user = args->max_clients_per_user;
            options.drop_timeout_ms = static_cast<int>(args->drop_timeout * 1000);
            options.refuse_descriptors_in_kernel = !args->no_kernel_refusal;
            options.keeper = args->keeper;
            options.keeper_wait_ms = static_cast<int>(args->keeper_wait * 1000);
            options.fresh = args->fresh;
            options.start_timeout_ms = static_cast<int>(args->start_timeout * 1000);
            return run_holder(*backend, options);
          }};
}

}  // namespace cupool::cli
