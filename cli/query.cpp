// cupool query: what this machine supports.
#include "device/query.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "base/error.h"
#include "base/output.h"
#include "cli/nfd.h"
#include "cli/options.h"
#include "cli/query_table.h"
#include "cli/verbs.h"
#include "custody/custody.h"

namespace cupool::cli {

namespace {

struct QueryArgs {
  std::string format = "table";
  std::vector<std::string> devices;
  std::string profile;
  std::string profile_out;
  bool deep = false;
};

}  // namespace

Verb add_query(CLI::App& app) {
  auto args = std::make_shared<QueryArgs>();
  CLI::App* sub = app.add_subcommand("query", "Report what this machine supports for CUDA memory pools");
  sub->footer(
      "\n"
      "Report what this machine supports for CUDA memory pools: driver and CUDA versions; per device the\n"
      "name, UUID, PCI bus id, memory, compute capability, pool support, pool handle types, host and\n"
      "host-NUMA pools, managed memory, VMM and IPC events; the peer-access matrix; and whether this host's\n"
      "kernel can limit a cgroup's GPU memory (the dmem cgroup controller, Linux 6.14+, and the regions GPU\n"
      "drivers registered; read where CUPOOL_CGROUP_ROOT says, else /sys/fs/cgroup).\n"
      "It reads device attributes only and creates no CUDA context (no device memory is taken);\n"
      "--deep also creates, uses and exports a small pool per handle type and says why one fails, and\n"
      "says whether the node has GPUDirect Storage for `buffer load --gds` (it loads NVIDIA's libcufile\n"
      "and opens its driver; cuFile's log goes to cufile.log in /run/cupool for root, in\n"
      "$XDG_RUNTIME_DIR/cupool for another user, or where CUFILE_LOGFILE_PATH says).\n"
      "--format nfd writes node labels (cupool.feature.node.kubernetes.io/...: driver, GPU count and\n"
      "product, pool support, handle types, fabric, peer access) as a feature file for Kubernetes'\n"
      "node-feature-discovery (docs/kubernetes.md).\n"
      "\nExamples:\n"
      "  cupool query\n"
      "  cupool query --format json | jq '.devices[].pool_handle_types'\n"
      "  cupool query --deep --devices 0\n"
      "  cupool query --profile-out node.yaml        # record this node for checks elsewhere\n"
      "  cupool query --profile configs/profiles/h100.yaml   # a recorded node, no GPU needed\n"
      "  cd /etc/kubernetes/node-feature-discovery/features.d && cupool query --format nfd > .cupool && mv .cupool "
      "cupool\n"
      "\nExit codes: 0 reported (a --deep probe that fails is reported, not an error), 2 bad arguments, an\n"
      "unreadable profile, no such device or a --profile-out that can't be written, 3 no driver or device\n"
      "(--format json or yaml still writes a document: driver null, no devices, and the error).");
  // Not add_format_option: query alone also writes node-feature-discovery labels.
  sub->add_option("--format,-o", args->format,
                  "Output format: table, json, yaml or nfd (node labels for node-feature-discovery)")
      ->check(CLI::IsMember({"table", "json", "yaml", "nfd"}))
      ->capture_default_str();
  sub->add_option("--devices,-d", args->devices,
                  "Only these devices: indexes, GPU-<uuid> or PCI bus ids (comma-separated)")
      ->delimiter(',');
  add_profile_option(sub, args->profile, "Answer from");
  sub->add_option("--profile-out", args->profile_out,
                  "Also record the answer as a node profile in this file ('-': stdout)");
  sub->add_flag("--deep", args->deep,
                "Also create, use and export a small pool per handle type, and ask cuFile about GPUDirect Storage "
                "(creates a context)");

  return {sub, [args](Context& ctx) {
            QueryOptions options;
            options.deep = args->deep;
            // The kernel's dmem controller, where cgroup v2 is mounted (a container may see the
            // host's elsewhere; the CLI tests point it at a tree of their own).
            const char* cgroup_root = std::getenv("CUPOOL_CGROUP_ROOT");
            options.cgroup_root = cgroup_root && *cgroup_root ? cgroup_root : "/sys/fs/cgroup";
            if (options.deep) (void)place_cufile_log();  // the deep probe opens cuFile
            for (const auto& text : args->devices) {
              std::string why;
              auto sel = parse_device_selector(text, &why);
              if (!sel) throw InputError("--devices: '" + text + "' is not a device: " + why);
              options.devices.push_back(*sel);
            }
            if (!args->profile_out.empty() && !options.devices.empty())
              throw InputError("--profile-out records the whole node; drop --devices");
            auto backend = ctx.make_backend(args->profile);
            NodeReport report;
            try {
              report = build_report(*backend, options);
            } catch (const Error& e) {
              // A program that asked for JSON or YAML gets a document that says why, then the exit
              // code and the message on stderr as always.
              const bool document = args->format == "json" || args->format == "yaml";
              if (e.code() != Errc::no_driver || !document || !args->profile_out.empty()) throw;
              const model::Json failure = versioned(model::to_json(query_failure(*backend, options, e)));
              std::cout << (args->format == "json" ? dump_json(failure) + "\n" : to_yaml(failure));
              throw;
            }
            if (!args->profile_out.empty()) save_profile(report, args->profile_out);
            if (args->profile_out == "-") return 0;
            if (args->format == "nfd") {
              std::cout << render_nfd(report);
              return 0;
            }
            switch (parse_format(args->format)) {
              case Format::table: std::cout << render_report_table(report); break;
              case Format::json: std::cout << dump_json(versioned(to_json(report))) << "\n"; break;
              case Format::yaml: std::cout << to_yaml(versioned(to_json(report))); break;
            }
            return 0;
          }};
}

std::string place_cufile_log(const std::string& place) {
  if (const char* set = std::getenv("CUFILE_LOGFILE_PATH"); set && *set) return set;
  const std::string dir = place.empty() ? custody::directory_of(custody::default_keeper_socket()) : place;
  // The user's own directory (XDG) stays private; root's /run/cupool is the holder's (0755).
  const mode_t mode = ::geteuid() == 0 ? 0755 : 0700;
  struct stat st {};
  const bool usable = (::mkdir(dir.c_str(), mode) == 0 || errno == EEXIST) && ::stat(dir.c_str(), &st) == 0 &&
                      S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() && ::access(dir.c_str(), W_OK) == 0;
  std::string path = usable ? dir + "/cufile.log" : "/dev/null";
  ::setenv("CUFILE_LOGFILE_PATH", path.c_str(), 1);
  return path;
}

}  // namespace cupool::cli
