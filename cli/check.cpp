// cupool check: judge a config against this node (or a recorded one), every finding at once.
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <iostream>

#include "base/error.h"
#include "base/output.h"
#include "cli/options.h"
#include "cli/suggest.h"
#include "cli/verbs.h"
#include "config/config.h"
#include "config/load.h"
#include "device/query.h"

namespace cupool::cli {

namespace {

struct CheckArgs {
  std::string config;
  std::string profile;
  std::string format = "table";
  bool deep = false;
  bool strict = false;
};

std::string node_line(const NodeReport& node) {
  // "8x NVIDIA H100 80GB HBM3" rather than the same name eight times.
  std::vector<std::pair<std::string, int>> names;
  for (const auto& d : node.devices) {
    if (!names.empty() && names.back().first == d.info.name)
      ++names.back().second;
    else
      names.emplace_back(d.info.name, 1);
  }
  std::string devices;
  for (const auto& [name, n] : names)
    devices += (devices.empty() ? "" : ", ") + (n > 1 ? std::to_string(n) + "x " : "") + name;
  std::string where = node.source.simulated
                          ? "simulated node " + node.source.profile_path + (node.source.synthetic ? " (synthetic)" : "")
                          : "this node";
  return where + ": CUDA " + cuda_version_string(node.driver_version) + ", " + std::to_string(node.devices.size()) +
         (node.devices.size() == 1 ? " GPU" : " GPUs") + (devices.empty() ? "" : " (" + devices + ")");
}

// Findings with their severity word coloured (error red, warning yellow, note cyan), as compilers
// do: on a terminal, unless NO_COLOR is set (https://no-color.org). A finding's first line is
// "PATH[:LINE:COL]: SEVERITY: ..."; the lines under it start with a blank.
std::string coloured(const std::string& text, const std::string& path) {
  const char* no_color = std::getenv("NO_COLOR");
  if (::isatty(STDOUT_FILENO) != 1 || (no_color && *no_color)) return text;
  static const std::pair<const char*, const char*> kColours[] = {
      {"error", "\033[1;31m"}, {"warning", "\033[1;33m"}, {"note", "\033[1;36m"}};
  std::string out;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    std::string line = text.substr(start, end - start);
    if (line.compare(0, path.size(), path) == 0) {
      std::size_t at = path.size();  // past ":LINE:COL"
      while (at < line.size() && (line[at] == ':' || std::isdigit(static_cast<unsigned char>(line[at])))) ++at;
      if (at >= 1 && line.compare(at - 1, 2, ": ") == 0)
        for (const auto& [word, colour] : kColours)
          if (line.compare(at + 1, std::char_traits<char>::length(word) + 1, std::string(word) + ":") == 0) {
            line.replace(at + 1, std::char_traits<char>::length(word), colour + std::string(word) + "\033[0m");
            break;
          }
    }
    out += line + (end < text.size() ? "\n" : "");
    start = end + 1;
  }
  return out;
}

}  // namespace

Verb add_check(CLI::App& app) {
  auto args = std::make_shared<CheckArgs>();
  CLI::App* sub = app.add_subcommand("check", "Judge a config file against this node; nothing is created");
  sub->footer(
      "\n"
      "Judge a config file against what this node supports (or a recorded node with --profile) and report\n"
      "every finding at once, compiler style: path:line:col, severity, the fact behind it, and a fix.\n"
      "Nothing is created; only device attributes are read (--deep also creates and exports test pools).\n"
      "On a terminal the severities are coloured (error red, warning yellow, note cyan) unless NO_COLOR is set.\n"
      "\nExamples:\n"
      "  cupool check configs/single-gpu-inference.yaml\n"
      "  cupool check pools.yaml --profile configs/profiles/h200x2.yaml   # against a recorded node\n"
      "  cupool check pools.yaml --format json | jq '.findings[] | select(.severity == \"error\")'\n"
      "  cat pools.yaml | cupool check -\n"
      "\nExit codes: 0 fits (warnings allowed), 1 does not fit, 2 invalid file, 3 no driver or device.");
  sub->add_option("config", args->config, "The config file ('-' reads standard input)")->required();
  add_profile_option(sub, args->profile, "Judge against");
  add_format_option(sub, args->format);
  sub->add_flag("--deep", args->deep,
                "Also create and export test pools to prove fabric export works (creates a context)");
  sub->add_flag("--strict", args->strict, "Warnings make the check fail (exit 1)");

  return {sub, [args](Context& ctx) {
            const Format format = parse_format(args->format);
            require_config(args->config, "check");
            const SourceFile file = SourceFile::read(args->config, kMaxConfigBytes);
            CheckOptions options;
            options.deep = args->deep;
            // Judged against a recorded node: this machine's users and groups are no proof of its.
            options.accounts_here = args->profile.empty();
            const Judged judged = judge_config(
                file,
                [&] {
                  auto backend = ctx.make_backend(args->profile);
                  QueryOptions q;
                  q.deep = args->deep;
                  q.gds = false;  // a config says nothing of GPUDirect Storage
                  return build_report(*backend, q);
                },
                Scope::all, options);
            const Diagnostics& diags = judged.diags;
            const std::optional<NodeReport>& node = judged.node;

            ExitCode code = ExitCode::ok;
            if (diags.has_invalid_input())
              code = ExitCode::invalid_input;
            else if (diags.has_errors() || (args->strict && diags.count(Severity::warning) > 0))
              code = ExitCode::does_not_fit;
            const char* verdict = code == ExitCode::ok             ? "fits"
                                  : code == ExitCode::does_not_fit ? "does_not_fit"
                                                                   : "invalid";

            if (format == Format::table) {
              std::cout << coloured(render_text(diags, file), file.path());
              std::cout << file.path() << ": ";
              if (code == ExitCode::invalid_input)
                std::cout << "not a valid cupool config";
              else
                std::cout << (code == ExitCode::ok ? "fits " : "does not fit ") << node_line(*node);
              std::cout << " (" << summary_line(diags) << ")\n";
            } else {
              model::CheckReport report;
              report.file = file.path();
              report.verdict = verdict;
              report.exit_code = static_cast<int>(code);
              if (node) report.source = source_of(node->source);
              report.error_count = static_cast<std::uint64_t>(diags.count(Severity::error));
              report.warning_count = static_cast<std::uint64_t>(diags.count(Severity::warning));
              report.note_count = static_cast<std::uint64_t>(diags.count(Severity::note));
              report.not_listed_count = diags.dropped();
              for (const auto& d : diags.sorted()) report.findings.push_back(view(d, file.path()));
              const nlohmann::ordered_json j = versioned(model::to_json(report));
              std::cout << (format == Format::json ? dump_json(j) + "\n" : to_yaml(j));
            }
            return static_cast<int>(code);
          }};
}

}  // namespace cupool::cli
