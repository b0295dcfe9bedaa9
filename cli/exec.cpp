// cupool exec: run a command with the config's process: section applied inside it.
#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/fd.h"
#include "base/text.h"
#include "cli/exec_budget.h"
#include "cli/holder_client.h"
#include "cli/options.h"
#include "cli/suggest.h"
#include "cli/verbs.h"
#include "config/config.h"
#include "config/diagnostics.h"
#include "config/load.h"
#include "device/query.h"
#include "device/sim_backend.h"
#include "process/process.h"

namespace cupool::cli {

namespace {

struct ExecArgs {
  std::string config;
  std::string profile;
  std::string report;
  bool strict = false;
  std::string at = "cuinit";
  bool quiet = false;
  // Options that take values are single strings: CLI11 ends a list option's values at "--" and then
  // reads CMD's own options as exec's.
  std::string budget;  // every --budget, joined by newlines
  std::string socket;
  std::string wait;  // --wait's seconds ("0": no limit)
  std::vector<std::string> command;
};

#ifndef CUPOOL_PRELOAD_FROM_BIN
#define CUPOOL_PRELOAD_FROM_BIN "../lib/cupool"
#endif

// The preload library: $CUPOOL_PRELOAD, else beside this binary (a build tree), else where the
// install put it, at a path relative to this binary fixed at build time (LIBDIR/cupool).
std::string find_preload() {
  if (const char* env = std::getenv("CUPOOL_PRELOAD"); env && *env) return env;
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    buf[n] = '\0';
    std::string dir(buf);
    dir = dir.substr(0, dir.rfind('/'));
    for (const std::string& candidate :
         {dir + "/libcupool-preload.so", dir + "/" CUPOOL_PRELOAD_FROM_BIN "/libcupool-preload.so"})
      if (::access(candidate.c_str(), R_OK) == 0) return candidate;
  }
  throw Error(Errc::does_not_fit,
              "can't find libcupool-preload.so beside the cupool binary or in " CUPOOL_PRELOAD_FROM_BIN
              " from it; set CUPOOL_PRELOAD");
}

// The dynamic loader splits LD_PRELOAD at spaces and colons and opens a relative entry from the
// working directory: a preload path with either, or a relative one, would load something else
// (issue 22: the part after a space was another user's library, run inside root's command).
std::string checked_preload(const std::string& path) {
  const char* why = nullptr;
  if (path.empty() || path[0] != '/')
    why = "is not an absolute path (the loader would look for it in the command's working directory)";
  else if (path.find_first_of(" :\t\n") != std::string::npos)
    why = "holds a space or a colon (the loader splits LD_PRELOAD there and would load other files)";
  if (why)
    throw Error(Errc::does_not_fit, "the preload library's path \"" + path + "\" " + why +
                                        "; install cupool under a path without them, or set CUPOOL_PRELOAD to the "
                                        "absolute path of a copy of libcupool-preload.so that has none");
  if (::access(path.c_str(), R_OK) != 0)
    throw Error(Errc::does_not_fit, "can't read the preload library " + path + ": " + std::strerror(errno));
  return path;
}

// Why the dynamic loader would load no library into the program `file` ("" when it would, as far
// as can be told): a set-user-ID or set-group-ID program (secure execution ignores LD_PRELOAD
// paths with a slash) or a statically linked one (no loader runs in it). A script is judged by its
// interpreter. Then the process: section is not applied, and nothing inside could say so.
std::string why_no_preload(const std::string& file, int depth = 0) {
  struct stat st {};
  if (file.empty() || ::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";  // execvp says why
  if (st.st_mode & (S_ISUID | S_ISGID))
    return file + " is set-user-ID or set-group-ID: the dynamic loader ignores LD_PRELOAD for it";
  const Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd) return "";
  unsigned char head[256] = {};
  const ssize_t n = ::pread(fd.get(), head, sizeof head, 0);
  if (n >= 2 && head[0] == '#' && head[1] == '!') {
    std::size_t i = 2;
    while (i < static_cast<std::size_t>(n) && (head[i] == ' ' || head[i] == '\t')) ++i;
    std::string interpreter;
    while (i < static_cast<std::size_t>(n) && head[i] != ' ' && head[i] != '\t' && head[i] != '\n')
      interpreter += static_cast<char>(head[i++]);
    const std::string why = depth < 2 ? why_no_preload(interpreter, depth + 1) : "";
    return why.empty() ? "" : file + " runs " + why;
  }
  Elf64_Ehdr eh{};
  if (n < static_cast<ssize_t>(sizeof eh) || std::memcmp(head, ELFMAG, SELFMAG) != 0 || head[EI_CLASS] != ELFCLASS64)
    return "";
  std::memcpy(&eh, head, sizeof eh);
  if ((eh.e_type != ET_EXEC && eh.e_type != ET_DYN) || eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > 256)
    return "";
  for (unsigned k = 0; k < eh.e_phnum; ++k) {
    Elf64_Phdr ph{};
    if (::pread(fd.get(), &ph, sizeof ph, static_cast<off_t>(eh.e_phoff + k * sizeof ph)) !=
        static_cast<ssize_t>(sizeof ph))
      return "";
    if (ph.p_type == PT_INTERP) return "";
  }
  return file + " is statically linked: no dynamic loader runs in it to load the library";
}

// --budget's values, one a line (CLI11 joins repeated values with newlines).
std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

// --wait's SECONDS: a number >= 0 (0: no limit).
double wait_seconds(const std::string& text) {
  char* end = nullptr;
  const double seconds = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(seconds >= 0) || seconds > 1e9)
    throw Error(Errc::invalid_input,
                "--wait=" + text + ": give a number of seconds (0 or --wait alone: as long as it takes)");
  return seconds;
}

std::string absolute(const std::string& path) {
  if (path.empty() || path[0] == '/' || path == "-") return path;
  char cwd[4096];
  if (!::getcwd(cwd, sizeof cwd)) return path;
  return std::string(cwd) + "/" + path;
}

}  // namespace

// Where execvp would find `command`: a name with a slash as it is, else the first executable
// regular file of that name in $PATH; "" when there is none (execvp then says so).
std::string resolve_command(const std::string& command) {
  if (command.find('/') != std::string::npos) return command;
  const char* env = std::getenv("PATH");
  const std::string path = env && *env ? env : "/usr/local/bin:/usr/bin:/bin";
  std::size_t at = 0;
  while (at <= path.size()) {
    const std::size_t end = std::min(path.find(':', at), path.size());
    const std::string dir = end > at ? path.substr(at, end - at) : ".";
    std::string candidate = dir + "/" + command;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    at = end + 1;
  }
  return "";
}

Verb add_exec(CLI::App& app) {
  auto args = std::make_shared<ExecArgs>();
  CLI::App* sub = app.add_subcommand("exec", "Run a command with the config's process: section applied inside it");
  sub->footer(
      "\n"
      "Pools and their settings are per process, so an operator can't change another program's default\n"
      "pool from outside. 'cupool exec' runs CMD with a small library preloaded (LD_PRELOAD) that applies\n"
      "the file's process: section (per selected device: the default pool's release threshold, reuse\n"
      "policies and peer access; current_pool: a pool made current) inside CMD before its first\n"
      "allocation: with --at cuinit (the default) right after CMD's own first successful cuInit, so a\n"
      "program that forks workers before it touches the GPU keeps working (a driver initialised before a\n"
      "fork is unusable in the children); with --at start before CMD's main, for a program that reaches\n"
      "the driver in a way the library does not see (then nothing is applied: use start). CMD is not\n"
      "modified; processes it starts get the same treatment, each when it initialises CUDA. The file is\n"
      "checked first (an invalid file stops here, exit 2; one that does not fit, exit 1). A failure to\n"
      "apply inside CMD is reported on stderr and CMD runs anyway, unless --strict (then that process\n"
      "ends with exit 3). A CMD that no library can be loaded into (statically linked, set-user-ID or\n"
      "set-group-ID, or a script run by such a program) gets nothing applied: a warning, or with --strict\n"
      "exit 1 before it starts. A file without a process: section applies nothing: a note says so and CMD\n"
      "runs as it is.\n"
      "\n"
      "Budgets (docs/budgets.md): with --budget (or the file's process.budget) the running holder grants\n"
      "CMD that much memory on each device it uses before CMD starts; inside CMD every way of asking how\n"
      "much memory there is (cuMemGetInfo, cudaMemGetInfo, total memory, NVML) answers from the budget,\n"
      "and an allocation past it fails with out-of-memory in CMD alone. A budget that does not fit next\n"
      "to what the holder has granted and holds is refused (exit 1, with the ledger's figures), or waits\n"
      "with --wait. The grant ends with CMD. See it with 'cupool ledger'.\n"
      "\nExamples:\n"
      "  cupool exec configs/single-gpu-inference.yaml -- python serve.py --port 8000\n"
      "  cupool exec pools.yaml --budget 20GiB -- ./train        # 20 GiB on each device it uses\n"
      "  cupool exec pools.yaml --budget 0=40% --wait=60 -- ./batch-job\n"
      "  cupool exec pools.yaml --report=usage.jsonl -- ./train   # per-process pool figures at exit\n"
      "  cupool exec pools.yaml --strict -- ./batch-job\n"
      "\nExit codes: CMD's own; 1, 2 or 3 from cupool exec itself before CMD starts; with --strict, 3 from a\n"
      "process of CMD that the section could not be applied to.");
  sub->add_option("config", args->config, "The config file whose process: section is applied")->required();
  add_profile_option(sub, args->profile, "Apply to (a simulated node: for trying it without a GPU)");
  sub->add_flag("--strict", args->strict, "A failure to apply inside CMD ends that process (exit 3)");
  sub->add_option("--at", args->at, "When to apply: cuinit (after CMD's first cuInit) or start (before main)")
      ->check(CLI::IsMember({"cuinit", "start"}))
      ->capture_default_str();
  sub->add_option("--report", args->report,
                  "When a process that initialised CUDA exits, write its pool figures (JSON, one line per process) to "
                  "FILE, or stderr with '-'")
      ->expected(0, 1)
      ->default_str("-");
  sub->add_flag("--quiet,-q", args->quiet, "No line on stderr when the section was applied");
  sub->add_option("--budget,-b", args->budget,
                  "Memory the holder grants CMD: SIZE or PCT% on each device it uses, or DEVICE=SIZE (repeat, or "
                  "join with commas)")
      ->type_name("BUDGET")
      ->multi_option_policy(CLI::MultiOptionPolicy::Join);
  sub->add_flag("--wait{0}", args->wait,
                "With a budget: wait for room instead of refusing at once; --wait=SECONDS waits at most that long")
      ->disable_flag_override(false);
  add_socket_option(sub, args->socket);
  sub->add_option("command", args->command, "CMD and its arguments, after --")->required();

  return {
      sub, [args, sub](Context& ctx) -> int {
        // Judge the file here first, so a broken file is a clear error and not a line in CMD's stderr.
        require_config(args->config, "exec");
        const SourceFile file = SourceFile::read_regular(args->config, kMaxConfigBytes);
        {
          auto backend = ctx.make_backend(args->profile);
          try {
            configure_process_check(*backend, file.text(), file.path());
          } catch (const ConfigRejected& e) {
            std::cerr << e.rendered();
            throw Error(e.code(), file.path() + ": the process: section can't be applied (" + e.what() + ")");
          }
        }
        // A file without a process: section applies nothing: say so, rather than run CMD in silence.
        Diagnostics parsed;
        const Config config = parse_config(file, parsed);
        if (!config.process)
          std::cerr << "cupool exec: note: " << file.path()
                    << " has no process: section, so nothing is applied inside CMD: it runs as it would without "
                       "cupool exec (its pools are for 'cupool hold')\n";
        BudgetRequest budget;
        budget.specs = parse_budget_specs(split_lines(args->budget));
        if (budget.specs.empty() && config.process && config.process->budget.set) {
          auto backend = ctx.make_backend(args->profile);
          const Loaded loaded = load_config(
              file, [&backend] { return build_report(*backend); }, Scope::process);
          for (const ProcessDeviceWant& w : loaded.desired.process)
            if (w.budget_bytes)
              budget.from_config.emplace_back(loaded.node.devices.at(static_cast<std::size_t>(w.device)).info.uuid,
                                              *w.budget_bytes);
        }
        const bool budgeted = !budget.specs.empty() || !budget.from_config.empty();
        if (!budgeted && sub->get_option("--wait")->count() > 0)
          throw Error(Errc::invalid_input, "--wait is for a budget: give --budget, or process.budget in the file");
        const std::string preload = checked_preload(find_preload());
        // A program the loader puts no library into gets nothing applied, and nothing inside it
        // could say so: --strict refuses it here (issue 22: it ran with nothing applied, exit 0).
        if (const std::string why = why_no_preload(resolve_command(args->command[0])); !why.empty()) {
          if (args->strict)
            throw Error(Errc::does_not_fit,
                        "the process: section can't be applied: " + why + " (--strict; without it, CMD runs as it is)");
          if (budgeted) throw Error(Errc::does_not_fit, "a budget can't be kept: " + why);
          std::cerr << "cupool exec: warning: nothing will be applied: " << why << "\n";
        }
        if (budgeted) {
          budget.socket = args->socket;
          if (sub->get_option("--wait")->count() > 0) budget.wait = wait_seconds(args->wait);
          budget.command = join(args->command, " ");
          budget.quiet = args->quiet;
          ask_for_budget(budget);  // the connection closes here: the grant waits for CMD's preload
        }
        const char* old = std::getenv("LD_PRELOAD");
        const std::string ld = old && *old ? preload + ":" + old : preload;
        ::setenv("LD_PRELOAD", ld.c_str(), 1);
        ::setenv("CUPOOL_EXEC_CONFIG", absolute(args->config).c_str(), 1);
        if (args->strict) ::setenv("CUPOOL_EXEC_STRICT", "1", 1);
        ::setenv("CUPOOL_EXEC_AT", args->at.c_str(), 1);
        if (args->quiet) ::setenv("CUPOOL_EXEC_QUIET", "1", 1);
        if (sub->get_option("--report")->count() > 0)
          ::setenv("CUPOOL_EXEC_REPORT", (args->report.empty() ? std::string("-") : absolute(args->report)).c_str(), 1);
        if (!args->profile.empty()) ::setenv("CUPOOL_PROFILE", absolute(args->profile).c_str(), 1);
        std::vector<char*> argv;
        for (auto& a : args->command) argv.push_back(a.data());
        argv.push_back(nullptr);
        ::execvp(argv[0], argv.data());
        throw Error(Errc::does_not_fit, "can't run " + args->command[0] + ": " + std::strerror(errno));
      }};
}

}  // namespace cupool::cli
