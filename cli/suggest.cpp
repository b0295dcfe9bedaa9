#include "cli/suggest.h"

#include <CLI/CLI.hpp>
#include <algorithm>

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

std::string did_you_mean(const CLI::App& root, const std::vector<std::string>& args) {
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
        const std::string near = nearest(name, option_names(app));
        return near.empty() ? "" : "did you mean '" + near + "'?";
      }
      // Skip the value of an option that takes one and did not get it with '=' or glued on.
      const bool glued = word.find('=') != std::string::npos || (!is_long && word.size() > 2);
      if (opt->get_type_size() > 0 && !glued) ++i;
      continue;
    }
    if (!verbs_done) {
      if (const CLI::App* sub = find_verb(*app, word)) {
        app = sub;
        continue;
      }
      if (app->get_subcommands([](const CLI::App*) { return true; }).size() > 0 &&
          app->get_require_subcommand_min() > 0) {
        const std::string near = nearest(word, verb_names(*app));
        return near.empty() ? "" : "did you mean '" + near + "'?";
      }
    }
    verbs_done = true;
  }
  return "";
}

}  // namespace cupool::cli
