// The model of the command line, read from CLI11: what the shells need to know.
#include "cli/completion/model.h"

#include <CLI/CLI.hpp>
#include <cctype>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

namespace cupool::cli::completion {

std::string join(const std::vector<std::string>& words, const std::string& sep) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : sep) + w;
  return out;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n") - b + 1);
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

std::string ident(const std::string& s) {
  std::string out;
  for (const char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

namespace {

// A one-line summary of a help text: its first line; when the text goes on past it (a verb's long
// description), only up to the first clause break or parenthesis, so it does not end mid-sentence.
std::string summary(const std::string& text) {
  const std::string all = trim(text);
  const auto eol = all.find('\n');
  std::string line = trim(all.substr(0, eol));
  if (eol != std::string::npos) {
    for (const char* brk : {": ", "; ", ". ", " ("}) {
      const auto at = line.find(brk);
      if (at != std::string::npos) line.resize(at);
    }
  }
  if (!line.empty() && line.back() == '.') line.pop_back();
  return line;
}

// The fixed choices of an option, from its type name. CLI11 (2.1 and later) appends each
// validator's description to the type name, and a set validator describes itself as its members:
// IsMember({"table","json","yaml"}) on a string gives "TEXT:{table,json,yaml}"; a map (Transformer)
// gives "{key->value,...}", of which the keys are what is typed.
std::vector<std::string> choices_of(const std::string& type_name) {
  const auto open = type_name.find('{');
  if (open == std::string::npos) return {};
  const auto close = type_name.find('}', open);
  if (close == std::string::npos) return {};
  std::vector<std::string> out;
  std::stringstream items(type_name.substr(open + 1, close - open - 1));
  for (std::string item; std::getline(items, item, ',');) {
    item = trim(item.substr(0, item.find("->")));
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The words of a name, lowercased: "--profile-out" -> {"profile", "out"}.
std::vector<std::string> words_of(const std::string& name) {
  std::vector<std::string> out;
  std::string word;
  for (const char c : name + "-") {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!word.empty()) {
      out.push_back(word);
      word.clear();
    }
  }
  return out;
}

bool has_any(const std::vector<std::string>& words, std::initializer_list<const char*> wanted) {
  for (const auto& w : words)
    for (const char* x : wanted)
      if (w == x) return true;
  return false;
}

// What an option or positional takes: a fixed set if a validator says so; else a file or directory
// if its name or its type (CLI::ExistingFile is "FILE", CLI::ExistingDirectory "DIR",
// type_name("PATH"), ...) says so; else free text. Configs and node profiles that are read are YAML
// (--profile, a CONFIG positional); outputs (--profile-out) are any file.
Value value_of(const CLI::Option& o) {
  if (o.get_expected_max() == 0) return {Kind::none, {}};
  const std::string type = o.get_type_name();
  if (auto choices = choices_of(type); !choices.empty()) return {Kind::choices, choices};

  std::vector<std::string> words = words_of(o.get_name(true));
  for (const auto& l : o.get_lnames())
    for (auto& w : words_of(l)) words.push_back(w);
  const std::vector<std::string> type_words = words_of(type);

  const bool output = has_any(words, {"out", "output"});
  if (!output && has_any(words, {"config", "profile"})) return {Kind::yaml, {}};
  if (has_any(words, {"dir", "directory"}) || has_any(type_words, {"dir", "directory"})) return {Kind::dir, {}};
  if (output || has_any(words, {"file", "path", "socket"}) || has_any(type_words, {"file", "path"}))
    return {Kind::file, {}};
  return {Kind::any, {}};
}

bool hidden(const CLI::App& app) { return app.get_group().empty() || app.get_disabled(); }

bool has_option(const Command& cmd, const std::string& name) {
  for (const auto& o : cmd.opts)
    for (const auto& n : o.names)
      if (n == name) return true;
  return false;
}

// Adds the visible options and positionals of `app` to `cmd`, with those of its option groups
// (which CLI11 keeps as nameless subcommands, each with a help flag of its own: first one wins).
void add_options(CLI::App& app, Command& cmd) {
  for (CLI::Option* o : app.get_options()) {
    if (o->get_group().empty()) continue;  // hidden
    const Value value = value_of(*o);
    if (o->nonpositional()) {
      Opt opt;
      opt.help = summary(o->get_description());
      opt.value = value;
      // Several values at once (a vector), or one at a time, each kept (--device of buffer load).
      opt.repeats = o->get_expected_max() > 1 || o->get_multi_option_policy() == CLI::MultiOptionPolicy::TakeAll;
      for (const auto& l : o->get_lnames()) opt.names.push_back("--" + l);
      for (const auto& s : o->get_snames()) opt.names.push_back("-" + s);
      opt.description = trim(o->get_description());
      opt.type = o->get_type_name();
      opt.default_value = o->get_default_str();
      opt.env = o->get_envname();
      opt.required = o->get_required();
      opt.optional_value = o->get_expected_min() == 0 && o->get_expected_max() > 0;
      if (!has_option(cmd, opt.names.front())) cmd.opts.push_back(opt);
    }
    if (o->get_positional()) {
      // CLI11 counts "as many as given" (a vector) as a huge number of items.
      const int count = o->get_items_expected_max() >= (1 << 20) ? kUnbounded : o->get_items_expected_max();
      const std::string help = summary(o->get_description());
      Positional pos;
      pos.name = o->get_name(true);
      pos.help = help.empty() ? pos.name : help;
      pos.value = value;
      pos.count = count;
      pos.description = trim(o->get_description());
      pos.type = o->get_type_name();
      pos.required = o->get_required();
      cmd.positionals.push_back(pos);
    }
  }
  for (CLI::App* group : app.get_subcommands({}))
    if (group->get_name().empty() && !hidden(*group)) add_options(*group, cmd);
}

Command build(CLI::App& app, const Command* parent) {
  Command cmd;
  if (parent != nullptr) {
    cmd.path = parent->path;
    cmd.path.push_back(app.get_name());
    cmd.names.push_back(app.get_name());
    for (const auto& a : app.get_aliases()) cmd.names.push_back(a);
    cmd.help = summary(app.get_description());
  }
  cmd.description = trim(app.get_description());
  cmd.footer = app.get_footer();
  add_options(app, cmd);
  // A subcommand that falls through also takes its parent's options.
  if (parent != nullptr && app.get_fallthrough()) {
    for (Opt o : parent->opts) {
      o.inherited = true;
      if (!has_option(cmd, o.names.front())) cmd.opts.push_back(o);
    }
  }
  for (CLI::App* sub : app.get_subcommands({}))
    if (!sub->get_name().empty() && !hidden(*sub)) cmd.subs.push_back(build(*sub, &cmd));
  return cmd;
}

}  // namespace

Command read_cli(CLI::App& root) { return build(root, nullptr); }

void flatten(const Command& cmd, std::vector<const Command*>& out) {
  out.push_back(&cmd);
  for (const auto& sub : cmd.subs) flatten(sub, out);
}

std::vector<std::string> sub_names(const Command& cmd) {
  std::vector<std::string> out;
  for (const auto& s : cmd.subs)
    for (const auto& n : s.names) out.push_back(n);
  return out;
}

}  // namespace cupool::cli::completion
