// cupool: declare CUDA stream-ordered memory pools in YAML, check them against the node, make
// them real. main() builds the real things (backend, logger) and owns every exit code.
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "base/build_info.h"
#include "base/error.h"
#include "cli/suggest.h"
#include "cli/verbs.h"
#include "device/backend.h"
#include "device/node.h"
#include "device/sim_backend.h"

namespace {

const char* const kExitCodes =
    "Exit codes:\n"
    "  0    success (warnings allowed)\n"
    "  1    the config does not fit the node / drift found\n"
    "  2    the input is invalid (usage, YAML, schema)\n"
    "  3    no usable NVIDIA driver or device\n"
    "  4    the holder is unreachable or refused\n"
    "  130  interrupted";

// Whether stderr is the systemd journal: JOURNAL_STREAM ("device:inode") names it.
bool stderr_is_journal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  struct stat st {};
  if (!stream || ::fstat(STDERR_FILENO, &st) != 0) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(stream, "%llu:%llu", &dev, &ino) != 2) return false;
  return dev == static_cast<unsigned long long>(st.st_dev) && ino == static_cast<unsigned long long>(st.st_ino);
}

// The sd-daemon priority prefix of a line ("<3>" error ... "<7>" debug), which journald reads and
// strips (SyslogLevelPrefix=, on by default).
class JournalPriority : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    static constexpr const char* kPrefix[] = {"<7>", "<7>", "<6>", "<4>", "<3>", "<2>", ""};
    const auto level = static_cast<std::size_t>(msg.level);
    const std::string_view p = level < std::size(kPrefix) ? kPrefix[level] : "";
    dest.append(p.data(), p.data() + p.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JournalPriority>(); }
};

// The logger: "cupool VERB: LEVEL: message" on stderr (`prefix` is "cupool VERB: ", as every error
// line starts), coloured on a terminal unless NO_COLOR is set (https://no-color.org); under
// systemd, each line starts with its journald priority instead.
void make_logger(const std::string& prefix) {
  const char* no_color = std::getenv("NO_COLOR");
  const bool plain = no_color && *no_color;
  auto logger = spdlog::stderr_color_mt("cupool", plain ? spdlog::color_mode::never : spdlog::color_mode::automatic);
  if (stderr_is_journal()) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<JournalPriority>('*').set_pattern("%*%l: %v");
    logger->set_formatter(std::move(formatter));
  } else {
    logger->set_pattern(prefix + "%^%l%$: %v");
  }
}

std::unique_ptr<cupool::Backend> make_backend(const std::string& profile) {
  if (!profile.empty()) {
    cupool::NodeReport node = cupool::load_profile(profile);
    for (const std::string& w : node.source.warnings) spdlog::warn("{}", w);
    return std::make_unique<cupool::SimBackend>(std::move(node));
  }
  return cupool::make_cuda_backend([](const std::string& line) { spdlog::debug("{}", line); });
}

// CLI11 takes a `--` right after an option whose value is optional, or right after that option's
// value (`exec P --report -- CMD -n`, `exec P --report FILE -- CMD -n`), as the end of that
// option's values, and would then read CMD's own options as cupool's (issue 22: `--report FILE`
// exited 2). A second `--` there keeps everything after it CMD's. Returns the arguments, in
// CLI11's (reversed) order.
std::vector<std::string> arguments(const CLI::App& app, int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const auto optional_value = [&](const std::string& name) {
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      const CLI::Option* opt = sub->get_option_no_throw(name);
      if (opt && opt->get_expected_min() == 0 && opt->get_expected_max() >= 1) return true;
    }
    return false;
  };
  for (std::size_t i = 1; i < args.size(); ++i) {
    if (args[i] != "--") continue;
    const bool after_option = optional_value(args[i - 1]);
    const bool after_value =
        i >= 2 && (args[i - 1] == "-" || args[i - 1].rfind('-', 0) != 0) && optional_value(args[i - 2]);
    if (after_option || after_value) args.insert(args.begin() + static_cast<std::ptrdiff_t>(i), "--");
    break;  // only the first `--` ends cupool's own arguments
  }
  std::reverse(args.begin(), args.end());
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "cupool: declare CUDA stream-ordered memory pools in YAML, check them against what this node\n"
      "supports, and make them real.",
      "cupool"};
  app.footer(std::string("\n") +
             "Environment: CUPOOL_PROFILE (--profile), CUPOOL_SOCKET (--socket), CUPOOL_LOG_LEVEL (--log-level);\n"
             "NO_COLOR (set: no colour in diagnostics).\n"
             "Run 'cupool help VERB' (or 'cupool VERB --help') for a verb's options and examples, 'cupool man'\n"
             "for the manual page.\n\n" +
             kExitCodes);
  app.require_subcommand(1);
  // Global options (--log-level) work after the verb too: `cupool query --log-level debug`.
  app.fallthrough();
  app.set_version_flag("--version", cupool::version_text(),
                       "The version, the commit and the CUDA headers it was built with");
  // The default depends on the verb (below): the help says both, not one "[warn]" for all.
  std::string log_level = "warn";
  app.add_option("--log-level", log_level,
                 "Diagnostics on stderr: trace, debug, info, warn, error, off (default: warn; info for the daemons, "
                 "hold and keeper without --list or --release)")
      ->envname("CUPOOL_LOG_LEVEL")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));

  // All verbs, in one place, in the order --help lists them.
  namespace verb = cupool::cli;
  const std::vector<verb::Verb> verbs = {verb::add_query(app),      verb::add_check(app),  verb::add_hold(app),
                                         verb::add_keeper(app),     verb::add_status(app), verb::add_stats(app),
                                         verb::add_ledger(app),     verb::add_trim(app),   verb::add_plan(app),
                                         verb::add_apply(app),      verb::add_export(app), verb::add_buffer(app),
                                         verb::add_exporter(app),   verb::add_exec(app),   verb::add_bench(app),
                                         verb::add_completion(app), verb::add_help(app),   verb::add_man(app)};

  try {
    std::vector<std::string> args = arguments(app, argc, argv);
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error exits 2 with its message in the one style
    // (`cupool VERB: ...`), naming the verb or option that looks mistyped.
    const std::string name = e.get_name();
    const std::vector<std::string> given(argv + 1, argv + argc);
    // `cupool nosuchverb --help` would print the help of what came before the unknown verb: say
    // that the verb is unknown instead (exit 2), as without --help.
    const bool help = name == "CallForHelp" || name == "CallForAllHelp";
    if (help && verb::find_slip(app, given).kind == verb::Slip::Kind::verb) {
      std::cerr << verb::usage_error(app, given, e.what());
      return static_cast<int>(cupool::ExitCode::invalid_input);
    }
    if (help || name == "CallForVersion" || e.get_exit_code() == 0) return app.exit(e);
    std::cerr << verb::usage_error(app, given, e.what());
    return static_cast<int>(cupool::ExitCode::invalid_input);
  }

  // The verbs given, outermost first ("buffer", "create"): every error line starts with them.
  std::vector<std::string> verb_path;
  for (const CLI::App* a = &app; !a->get_subcommands().empty();) {
    a = a->get_subcommands().front();
    verb_path.push_back(a->get_name());
  }
  const std::string prefix = verb::error_prefix(verb_path);

  // The holder and the keeper are daemons: what they create, reload and free belongs in their log by default.
  const CLI::App* keeper = app.get_subcommand("keeper");
  const bool daemon = app.got_subcommand("hold") || (keeper->parsed() && keeper->get_option("--list")->count() == 0 &&
                                                     keeper->get_option("--release")->count() == 0);
  if (app.get_option("--log-level")->count() == 0 && !std::getenv("CUPOOL_LOG_LEVEL") && daemon) log_level = "info";
  make_logger(prefix);
  auto logger = spdlog::get("cupool");
  logger->set_level(spdlog::level::from_str(log_level));
  spdlog::set_default_logger(logger);

  cupool::cli::Context context{make_backend};
  for (const verb::Verb& v : verbs) {
    CLI::App* sub = v.command;
    if (!sub->parsed()) continue;
    try {
      return v.run(context);
    } catch (const cupool::Error& e) {
      std::cerr << prefix << e.what() << "\n";
      if (e.code() == cupool::Errc::no_driver) {
        // The profile as this binary reaches it: the checkout's, or the installed data folder's.
        const std::string profile = verb::shipped_file("configs/profiles/h100.yaml");
        std::cerr << "  hint: to ask a recorded node instead, pass --profile FILE (or set CUPOOL_PROFILE)";
        if (profile.empty())
          std::cerr << "; 'cupool query --profile-out FILE' on a node with a GPU records one\n";
        else
          std::cerr << ", e.g.\n        cupool " << sub->get_name() << " --profile " << profile << " ...\n";
      }
      return static_cast<int>(e.exit_code());
    } catch (const std::exception& e) {
      std::cerr << prefix << "internal error: " << e.what() << "\n";
      return static_cast<int>(cupool::ExitCode::does_not_fit);
    }
  }
  return static_cast<int>(cupool::ExitCode::invalid_input);
}
