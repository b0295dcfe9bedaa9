#include "cli/suggest.h"

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>

#include "base/error.h"

namespace cupool::cli {

namespace {

// Optimal string alignment distance: Levenshtein plus the swap of two neighbours ("fromat").
std::size_t distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The visible subcommands of `app`, by every name they answer to.
std::vector<std::string> verb_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App* s) { return !s->get_group().empty(); })) {
    names.push_back(sub->get_name());
    for (const std::string& alias : sub->get_aliases()) names.push_back(alias);
  }
  return names;
}

const CLI::App* find_verb(const CLI::App& app, const std::string& word) {
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (sub->check_name(word)) return sub;
  return nullptr;
}

// The option of `app` or (falling through) of an app above it that answers to `name`
// ("--format", "-o").
const CLI::Option* find_option(const CLI::App* app, const std::string& name) {
  for (; app; app = app->get_parent())
    for (const CLI::Option* opt : app->get_options())
      if (opt->check_name(name)) return opt;
  return nullptr;
}

// Every option name (dashes included) of `app` and the apps above it, hidden ones left out.
std::vector<std::string> option_names(const CLI::App* app) {
  std::vector<std::string> names;
  for (; app; app = app->get_parent())
    for (const CLI::Option* opt : app->get_options()) {
      if (opt->get_group().empty()) continue;
      for (const std::string& n : opt->get_lnames()) names.push_back("--" + n);
      for (const std::string& n : opt->get_snames()) names.push_back("-" + n);
    }
  return names;
}

std::string join_words(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

}  // namespace

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  const std::size_t bare = word.size() - std::min(word.find_first_not_of('-'), word.size());
  const std::size_t limit = bare <= 4 ? 1 : bare <= 8 ? 2 : 3;
  std::string best;
  std::size_t best_distance = limit + 1;
  for (const std::string& c : candidates) {
    const std::size_t d = distance(word, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

Slip find_slip(const CLI::App& root, const std::vector<std::string>& args) {
  Slip slip;
  const CLI::App* app = &root;
  bool verbs_done = false;  // a positional was taken: later words are not verbs
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (word == "--") break;
    if (word.size() > 1 && word[0] == '-') {
      const std::string name = word.substr(0, word.find('='));
      const bool is_long = name.rfind("--", 0) == 0;
      const CLI::Option* opt = find_option(app, is_long ? name : name.substr(0, 2));
      if (!opt) {
        slip.kind = Slip::Kind::option;
        slip.word = is_long ? name : name.substr(0, 2);
        slip.near = nearest(name, option_names(app));
        return slip;
      }
      // Skip the value of an option that takes one and did not get it with '=' or glued on.
      const bool glued = word.find('=') != std::string::npos || (!is_long && word.size() > 2);
      if (opt->get_type_size() > 0 && !glued) ++i;
      continue;
    }
    if (!verbs_done) {
      if (const CLI::App* sub = find_verb(*app, word)) {
        app = sub;
        slip.verbs.push_back(sub->get_name());
        continue;
      }
      if (app->get_subcommands([](const CLI::App*) { return true; }).size() > 0 &&
          app->get_require_subcommand_min() > 0) {
        slip.kind = Slip::Kind::verb;
        slip.word = word;
        slip.near = nearest(word, verb_names(*app));
        return slip;
      }
    }
    verbs_done = true;
  }
  return slip;
}

std::string did_you_mean(const CLI::App& root, const std::vector<std::string>& args) {
  const Slip slip = find_slip(root, args);
  return slip.near.empty() ? "" : "did you mean '" + slip.near + "'?";
}

std::string error_prefix(const std::vector<std::string>& verbs) {
  std::string prefix = "cupool";
  for (const std::string& v : verbs) prefix += " " + v;
  return prefix + ": ";
}

std::string verb_list(const CLI::App& app) {
  std::string out;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App* s) { return !s->get_group().empty(); }))
    out += (out.empty() ? "" : ", ") + sub->get_name();
  return out;
}

std::string usage_error(const CLI::App& root, const std::vector<std::string>& args, const std::string& message) {
  const Slip slip = find_slip(root, args);
  const CLI::App* app = &root;
  for (const std::string& v : slip.verbs) app = app->get_subcommand(v);
  const std::string prefix = error_prefix(slip.verbs);
  std::string path = "cupool";
  for (const std::string& v : slip.verbs) path += " " + v;
  const std::string near = slip.near.empty() ? "" : " (did you mean \"" + slip.near + "\"?)";
  if (slip.kind == Slip::Kind::verb)
    return prefix + "unknown verb \"" + slip.word + "\"" + near + "\n  '" +
           (slip.verbs.empty() ? std::string("cupool help") : "cupool help " + join_words(slip.verbs)) +
           "' lists the verbs\n";
  if (slip.kind == Slip::Kind::option)
    return prefix + "unknown option \"" + slip.word + "\"" + near + "\n  '" + path + " --help' lists its options\n";
  // No verb where one is needed: say which there are.
  if (message.find("subcommand") != std::string::npos &&
      !app->get_subcommands([](const CLI::App*) { return true; }).empty())
    return prefix + "a verb is required (one of: " + verb_list(*app) + ")\n  '" + path + " --help' says more\n";
  std::string text = message;
  // CLI11 writes sentences ("The following argument was not expected"); after the prefix, lower case.
  if (text.size() > 1 && std::isupper(static_cast<unsigned char>(text[0])) &&
      std::islower(static_cast<unsigned char>(text[1])))
    text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
  return prefix + text + "\n  '" + path + " --help' says more\n";
}

std::string shipped_file(const std::string& relative, const std::string& exe_arg) {
  const auto exists = [](const std::string& p) { return ::access(p.c_str(), R_OK) == 0; };
  if (exists(relative)) return relative;
  std::string exe = exe_arg;
  if (exe.empty()) {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return "";
    exe.assign(buf, static_cast<std::size_t>(n));
  }
  const std::size_t slash = exe.rfind('/');
  if (slash == std::string::npos) return "";
  const std::string dir = exe.substr(0, slash);  // /usr/bin, or a build tree
  const std::size_t up = dir.rfind('/');
  const std::string prefix = up == std::string::npos ? "." : dir.substr(0, up);  // /usr
  for (const std::string& candidate : {prefix + "/share/cupool/" + relative, prefix + "/" + relative})
    if (exists(candidate)) return candidate;
  return "";
}

void require_config(const std::string& path, const std::string& verb, const std::string& sample_arg) {
  struct stat st {};
  if (path == "-" || ::stat(path.c_str(), &st) == 0 || (errno != ENOENT && errno != ENOTDIR)) return;
  std::string where;
  if (path.empty() || path[0] != '/') {
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd)) where = std::string(" (looked for in ") + cwd + ")";
  }
  const std::string sample = sample_arg.empty() ? shipped_file(kSampleConfig) : sample_arg;
  std::string hint;
  if (sample.empty()) {
    hint =
        "  hint: give the path of an existing config, or write one there: the examples are in cupool's\n"
        "        configs/ folder, every key is in 'man cupool'";
  } else {
    hint =
        "  hint: give the path of an existing config, or start from the commented sample:\n"
        "          cp " +
        sample + " " + path +
        "\n"
        "        then edit it and 'cupool check " +
        path + "'";
  }
  if (verb == "hold") hint += ",\n        and start the holder again (under systemd: systemctl restart cupool)";
  throw InputError("no config file at '" + path + "'" + where + "\n" + hint);
}

}  // namespace cupool::cli
