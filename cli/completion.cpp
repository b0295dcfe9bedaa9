// cupool completion SHELL: print a completion script for bash, zsh or fish.
//
// The script is generated from the command-line definition itself: the root CLI::App is walked for
// every visible verb (nested ones too), its options and positionals, and the fixed choices of
// CLI::IsMember options, so the scripts cannot drift from the CLI. The copies committed under
// completions/ are compared with this output by the completions-drift test and rewritten by
// scripts/regen-completions.sh. Nothing here knows about any particular verb.
#include <cctype>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/verbs.h"

namespace cupool::cli {

namespace {

// ---------------------------------------------------------------------------------------------
// The model: what the shells need to know, read from CLI11.

// What an option or a positional argument takes.
enum class Kind {
  none,     // nothing: a flag
  any,      // free text: nothing to offer
  choices,  // one of a fixed set (CLI::IsMember and friends)
  file,     // a file name
  yaml,     // a file name, *.yaml / *.yml preferred (configs, node profiles)
  dir,      // a directory name
};

struct Value {
  Kind kind = Kind::none;
  std::vector<std::string> choices;  // for Kind::choices
};

struct Opt {
  std::vector<std::string> names;  // dashes included, long ones first: "--format", "-o"
  std::string help;
  Value value;
  bool repeats = false;  // may be given more than once
};

// The count of a positional that takes every word left.
constexpr int kUnbounded = -1;

struct Positional {
  std::string name;
  std::string help;
  Value value;
  int count = 1;  // how many words it takes
};

struct Command {
  std::vector<std::string> path;   // {} for the program itself; {"buffer", "create"}
  std::vector<std::string> names;  // the name, then its aliases (empty for the program)
  std::string help;
  std::vector<Opt> opts;
  std::vector<Positional> positionals;
  std::vector<Command> subs;
};

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
      Opt opt{{}, summary(o->get_description()), value, o->get_expected_max() > 1};
      for (const auto& l : o->get_lnames()) opt.names.push_back("--" + l);
      for (const auto& s : o->get_snames()) opt.names.push_back("-" + s);
      if (!has_option(cmd, opt.names.front())) cmd.opts.push_back(opt);
    }
    if (o->get_positional()) {
      // CLI11 counts "as many as given" (a vector) as a huge number of items.
      const int count = o->get_items_expected_max() >= (1 << 20) ? kUnbounded : o->get_items_expected_max();
      const std::string help = summary(o->get_description());
      cmd.positionals.push_back({o->get_name(true), help.empty() ? o->get_name(true) : help, value, count});
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
  add_options(app, cmd);
  // A subcommand that falls through also takes its parent's options.
  if (parent != nullptr && app.get_fallthrough()) {
    for (const auto& o : parent->opts)
      if (!has_option(cmd, o.names.front())) cmd.opts.push_back(o);
  }
  for (CLI::App* sub : app.get_subcommands({}))
    if (!sub->get_name().empty() && !hidden(*sub)) cmd.subs.push_back(build(*sub, &cmd));
  return cmd;
}

// Every command, the program first, parents before children.
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

// Letters, digits and '_' only, for function names.
std::string ident(const std::string& s) {
  std::string out;
  for (const char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

// ---------------------------------------------------------------------------------------------
// bash: a fixed walker, fed by generated lookup functions keyed by the command path.

std::string sh_quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// How the bash walker names what a value takes: '' (a flag), any, file, yaml, dir, 'choices A B'.
std::string bash_value(const Value& v) {
  switch (v.kind) {
    case Kind::none: return "";
    case Kind::any: return "any";
    case Kind::choices: return "choices " + join(v.choices, " ");
    case Kind::file: return "file";
    case Kind::yaml: return "yaml";
    case Kind::dir: return "dir";
  }
  return "";
}

const char* const kBashEngine = R"SH(
# What a value takes ($1, as above): adds the matches for the word $2 to COMPREPLY.
__@P_complete_value() {
  local cur=$2
  local -a found=()
  case $1 in
    choices\ *) mapfile -t found < <(compgen -W "${1#choices }" -- "$cur") ;;
    file)
      compopt -o filenames 2>/dev/null
      mapfile -t found < <(compgen -f -- "$cur") ;;
    dir)
      compopt -o filenames 2>/dev/null
      mapfile -t found < <(compgen -d -- "$cur") ;;
    yaml)
      # Directories and YAML files; any file when there are none.
      compopt -o filenames 2>/dev/null
      mapfile -t found < <(compgen -d -- "$cur"; compgen -f -X '!*.yaml' -- "$cur"; compgen -f -X '!*.yml' -- "$cur")
      ((${#found[@]})) || mapfile -t found < <(compgen -f -- "$cur") ;;
  esac
  COMPREPLY+=("${found[@]}")
}

_@P() {
  COMPREPLY=()
  # The words up to the cursor, with '--opt=value' (which bash splits at '=') put back together.
  local -a words=("${COMP_WORDS[0]}")
  local i w last
  for ((i = 1; i <= COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    last=${words[${#words[@]} - 1]}
    if [[ ($w == = && $last == --* && $last != *=*) || $last == --*= ]]; then
      words[${#words[@]} - 1]+=$w
    else
      words+=("$w")
    fi
  done
  local cword=$((${#words[@]} - 1))
  local cur=${words[cword]}

  # Walk the words before the cursor: the command path, how many positionals it has, and whether
  # the word at the cursor is the value of an option.
  local path='' npos=0 dashdash=0 value='' takes
  for ((i = 1; i < cword; i++)); do
    w=${words[i]}
    if ((dashdash)); then
      npos=$((npos + 1))
      continue
    fi
    case $w in
      --) dashdash=1 ;;
      --*=*) ;;
      -?*)
        takes=$(__@P_option_value "$path" "$w")
        if [[ -n $takes ]]; then
          ((i + 1 == cword)) && value=$takes
          i=$((i + 1))
        fi ;;
      *)
        takes=$(__@P_subcommand "$path" "$w")
        if [[ -n $takes ]]; then
          path=${path:+$path }$takes
          npos=0
        else
          npos=$((npos + 1))
        fi ;;
    esac
  done

  if [[ -n $value ]]; then
    __@P_complete_value "$value" "$cur"
  elif ((!dashdash)) && [[ $cur == --*=* ]]; then
    __@P_complete_value "$(__@P_option_value "$path" "${cur%%=*}")" "${cur#*=}"
  elif ((!dashdash)) && [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$(__@P_options "$path")" -- "$cur")
  else
    local commands positional
    commands=$(__@P_commands "$path")
    positional=$(__@P_positional_value "$path" "$npos")
    mapfile -t COMPREPLY < <(compgen -W "$commands" -- "$cur")
    __@P_complete_value "$positional" "$cur"
    # Nothing else can come here: offer the options.
    if [[ -z $commands && -z $positional ]] && ((!dashdash)); then
      mapfile -t COMPREPLY < <(compgen -W "$(__@P_options "$path")" -- "$cur")
    fi
  fi
  return 0
}

complete -F _@P @N
)SH";

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

std::string bash_script(const Command& root, const std::string& prog) {
  const std::string p = ident(prog);
  std::vector<const Command*> all;
  flatten(root, all);
  std::ostringstream out;
  out << "# bash completion for " << prog << ". Generated by '" << prog << " completion bash' from the\n"
      << "# command-line definition: do not edit (in the repository, run scripts/regen-completions.sh).\n"
      << "# Command paths below are '' for " << prog << " itself, 'buffer create' for a nested verb.\n\n";

  out << "# The subcommands of command path $1.\n__" << p << "_commands() {\n  case $1 in\n";
  for (const auto* c : all)
    if (!c->subs.empty()) out << "    " << sh_quote(join(c->path, " ")) << ") echo " << sh_quote(join(sub_names(*c), " ")) << " ;;\n";
  out << "  esac\n}\n\n";

  out << "# The subcommand that word $2 names under command path $1 (aliases resolved), if any.\n__" << p
      << "_subcommand() {\n  case \"$1|$2\" in\n";
  for (const auto* c : all) {
    for (const auto& s : c->subs) {
      std::vector<std::string> keys;
      for (const auto& n : s.names) keys.push_back(sh_quote(join(c->path, " ") + "|" + n));
      out << "    " << join(keys, " | ") << ") echo " << sh_quote(s.names.front()) << " ;;\n";
    }
  }
  out << "  esac\n}\n\n";

  out << "# The options of command path $1.\n__" << p << "_options() {\n  case $1 in\n";
  for (const auto* c : all) {
    std::vector<std::string> names;
    for (const auto& o : c->opts) names.insert(names.end(), o.names.begin(), o.names.end());
    if (!names.empty()) out << "    " << sh_quote(join(c->path, " ")) << ") echo " << sh_quote(join(names, " ")) << " ;;\n";
  }
  out << "  esac\n}\n\n";

  out << "# What option $2 of command path $1 takes: nothing (a flag), any (free text), file, yaml (a file,\n"
      << "# *.yaml/*.yml preferred), dir, or 'choices WORD...'.\n__" << p << "_option_value() {\n  case \"$1|$2\" in\n";
  for (const auto* c : all) {
    for (const auto& o : c->opts) {
      if (o.value.kind == Kind::none) continue;
      std::vector<std::string> keys;
      for (const auto& n : o.names) keys.push_back(sh_quote(join(c->path, " ") + "|" + n));
      out << "    " << join(keys, " | ") << ") echo " << sh_quote(bash_value(o.value)) << " ;;\n";
    }
  }
  out << "  esac\n}\n\n";

  out << "# What positional argument $2 (counted from 0) of command path $1 takes, as above.\n__" << p
      << "_positional_value() {\n  case \"$1|$2\" in\n";
  for (const auto* c : all) {
    int index = 0;
    for (const auto& pos : c->positionals) {
      const std::string key = join(c->path, " ") + "|";
      if (pos.count == kUnbounded) {
        out << "    " << sh_quote(key) << "*) echo " << sh_quote(bash_value(pos.value)) << " ;;  # " << pos.name << "...\n";
        break;  // it takes all the rest
      }
      for (int k = 0; k < pos.count; ++k, ++index)
        out << "    " << sh_quote(key + std::to_string(index)) << ") echo " << sh_quote(bash_value(pos.value)) << " ;;  # " << pos.name << "\n";
    }
  }
  out << "  esac\n}\n";

  out << replace_all(replace_all(kBashEngine, "@P", p), "@N", prog);
  return out.str();
}

// ---------------------------------------------------------------------------------------------
// zsh: one _arguments function per command; commands with subcommands dispatch on the next word.

// Quotes for zsh's _arguments specs and _describe entries (':' and brackets separate fields there).
std::string zsh_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '\\' || c == '[' || c == ']' || c == ':') out += '\\';
    out += c;
  }
  return out;
}

// Single-quoted for the shell.
std::string zq(const std::string& s) { return replace_all(s, "'", "'\\''"); }

std::string zsh_action(const Value& v) {
  switch (v.kind) {
    case Kind::none: return "";
    case Kind::any: return " ";
    case Kind::choices: {
      std::vector<std::string> items;
      for (const auto& c : v.choices) {
        std::string item;
        for (const char ch : c) {
          if (std::string(" ()\\'\"$`:[]").find(ch) != std::string::npos) item += '\\';
          item += ch;
        }
        items.push_back(item);
      }
      return "(" + join(items, " ") + ")";
    }
    case Kind::file: return "_files";
    case Kind::yaml: return "_files -g \"*.(yaml|yml)\"";
    case Kind::dir: return "_files -/";
  }
  return " ";
}

std::string zsh_function(const std::string& p, const Command& c) {
  std::string name = "_" + p;
  for (const auto& part : c.path) name += "__" + ident(part);
  return name;
}

// One _arguments spec per option: '(-o --format)'{-o+,--format=}'[help]:format:(table json yaml)'.
std::string zsh_option_spec(const Opt& o) {
  std::vector<std::string> forms;
  for (const auto& n : o.names) {
    const bool is_long = n.rfind("--", 0) == 0;
    forms.push_back(n + (o.value.kind == Kind::none ? "" : is_long ? "=" : "+"));
  }
  // Aliases exclude each other; an option that may repeat is offered again ('*').
  std::string spec = o.repeats ? "'*" : o.names.size() > 1 ? "'(" + join(o.names, " ") + ")" : "'";
  spec += forms.size() > 1 ? "'{" + join(forms, ",") + "}'" : forms.front();
  spec += "[" + zq(zsh_escape(o.help)) + "]";
  if (o.value.kind != Kind::none) {
    const std::string& first = o.names.front();
    spec += ":" + zq(zsh_escape(first.substr(first.find_first_not_of('-')))) + ":" + zq(zsh_action(o.value));
  }
  return spec + "'";
}

std::string zsh_script(const Command& root, const std::string& prog) {
  const std::string p = ident(prog);
  std::vector<const Command*> all;
  flatten(root, all);
  std::ostringstream out;
  out << "#compdef " << prog << "\n"
      << "# zsh completion for " << prog << ". Generated by '" << prog << " completion zsh' from the\n"
      << "# command-line definition: do not edit (in the repository, run scripts/regen-completions.sh).\n";

  for (const auto* c : all) {
    out << "\n" << zsh_function(p, *c) << "() {\n";
    std::vector<std::string> specs;
    for (const auto& o : c->opts) specs.push_back(zsh_option_spec(o));
    if (c->subs.empty()) {
      int index = 1;
      for (const auto& pos : c->positionals) {
        const std::string tail = ":" + zq(zsh_escape(pos.name)) + ":" + zq(zsh_action(pos.value)) + "'";
        if (pos.count == kUnbounded) {
          specs.push_back("'*" + tail);
          break;
        }
        for (int k = 0; k < pos.count; ++k) specs.push_back("'" + std::to_string(index++) + tail);
      }
      out << "  _arguments -s -S";
      for (const auto& s : specs) out << " \\\n    " << s;
      out << "\n}\n";
      continue;
    }
    // A command with subcommands: complete the subcommand, then hand the rest of the line over.
    specs.push_back("'1: :->command'");
    specs.push_back("'*:: :->args'");
    out << "  local curcontext=\"$curcontext\" state state_descr line ret=1\n"
        << "  typeset -A opt_args\n"
        << "  _arguments -C -s -S";
    for (const auto& s : specs) out << " \\\n    " << s;
    out << " && ret=0\n"
        << "  case $state in\n"
        << "    (command)\n"
        << "      local -a commands=(\n";
    for (const auto& s : c->subs)
      for (const auto& n : s.names) out << "        '" << zq(zsh_escape(n) + ":" + zsh_escape(s.help)) << "'\n";
    std::string context = prog;
    for (const auto& part : c->path) context += "-" + part;
    out << "      )\n"
        << "      _describe -t commands '" << zq(join(std::vector<std::string>{context, "command"}, " ")) << "' commands && ret=0\n"
        << "      ;;\n"
        << "    (args)\n"
        << "      curcontext=\"${curcontext%:*:*}:" << context << "-${words[1]}:\"\n"
        << "      case ${words[1]} in\n";
    for (const auto& s : c->subs)
      out << "        (" << join(s.names, "|") << ") " << zsh_function(p, s) << " && ret=0 ;;\n";
    out << "      esac\n"
        << "      ;;\n"
        << "  esac\n"
        << "  return ret\n"
        << "}\n";
  }

  // Autoloaded from $fpath, the file runs as _<prog>; sourced, it registers itself.
  out << "\nif [ \"$funcstack[1]\" = \"_" << p << "\" ]; then\n"
      << "  _" << p << " \"$@\"\n"
      << "else\n"
      << "  compdef _" << p << " " << prog << "\n"
      << "fi\n";
  return out.str();
}

// ---------------------------------------------------------------------------------------------
// fish: a walker finds the command path; one `complete` line per subcommand, option, positional.

std::string fq(const std::string& s) {
  std::string out = "'";
  for (const char c : s) {
    if (c == '\\' || c == '\'') out += '\\';
    out += c;
  }
  return out + "'";
}

// The `complete` arguments for what a value takes (an option's value when `option`, else a
// positional's). Files are off for the whole command (complete -f), so file values turn them on.
std::string fish_value(const Value& v, bool option) {
  const std::string yaml = "-k -a '(__fish_complete_suffix .yaml; __fish_complete_suffix .yml)'";
  switch (v.kind) {
    case Kind::none: return "";
    case Kind::any: return option ? " -x" : "";
    case Kind::choices: return std::string(option ? " -x" : "") + " -a " + fq(join(v.choices, " "));
    case Kind::file: return option ? " -r -F" : " -F";
    case Kind::yaml: return std::string(option ? " -x " : " ") + yaml;
    case Kind::dir: return std::string(option ? " -x" : "") + " -a '(__fish_complete_directories)'";
  }
  return "";
}

const char* const kFishEngine = R"SH(
# Prints 'PATH|COUNT' for the command line being completed: the command path ('' for @N itself,
# 'buffer create' for a nested verb) and how many positional arguments it has so far.
function __@P_state
    set -l tokens (commandline -opc)
    set -e tokens[1]
    set -l path
    set -l npos 0
    set -l skip 0
    set -l dashdash 0
    set -l sub
    for tok in $tokens
        set -l here (string join ' ' -- $path)
        if test $skip -eq 1
            set skip 0
        else if test $dashdash -eq 1
            set npos (math $npos + 1)
        else if test "$tok" = --
            set dashdash 1
        else if string match -q -- '--*=*' $tok
            continue
        else if string match -q -- '-?*' $tok
            contains -- "$here|$tok" $__@P_valued; and set skip 1
        else if set sub (__@P_subcommand "$here" $tok)
            set path $path $sub
            set npos 0
        else
            set npos (math $npos + 1)
        end
    end
    set -l here (string join ' ' -- $path)
    echo "$here|$npos"
end

# True when completing at command path $argv[1]; with $argv[2], also only when that many positional
# arguments were given before the cursor ('N+': N or more).
function __@P_at
    set -l state (__@P_state)
    string match -q -- "$argv[1]|*" "$state"; or return 1
    test (count $argv) -ge 2; or return 0
    set -l npos (string replace -r '.*\|' '' -- "$state")
    if string match -q -- '*+' "$argv[2]"
        test "$npos" -ge (string trim -r -c + -- "$argv[2]")
    else
        test "$npos" -eq "$argv[2]"
    end
end
)SH";

std::string fish_script(const Command& root, const std::string& prog) {
  const std::string p = ident(prog);
  std::vector<const Command*> all;
  flatten(root, all);
  std::ostringstream out;
  out << "# fish completion for " << prog << ". Generated by '" << prog << " completion fish' from the\n"
      << "# command-line definition: do not edit (in the repository, run scripts/regen-completions.sh).\n\n";

  // What the walker reads: the options that take a value, and the subcommands of each command.
  std::vector<std::string> valued;
  for (const auto* c : all)
    for (const auto& o : c->opts)
      if (o.value.kind != Kind::none)
        for (const auto& n : o.names) valued.push_back(fq(join(c->path, " ") + "|" + n));
  out << "# Every option that takes a value, as 'PATH|OPTION' (PATH: the command path, '' for " << prog << ").\n"
      << "set -g __" << p << "_valued " << join(valued, " ") << "\n\n"
      << "# Prints the subcommand that word $argv[2] names under command path $argv[1] (aliases resolved);\n"
      << "# fails if none.\n"
      << "function __" << p << "_subcommand\n"
      << "    switch \"$argv[1]|$argv[2]\"\n";
  for (const auto* c : all) {
    for (const auto& s : c->subs) {
      std::vector<std::string> keys;
      for (const auto& n : s.names) keys.push_back(fq(join(c->path, " ") + "|" + n));
      out << "        case " << join(keys, " ") << "\n"
          << "            echo " << fq(s.names.front()) << "\n";
    }
  }
  out << "        case '*'\n"
      << "            return 1\n"
      << "    end\n"
      << "end\n";
  out << replace_all(replace_all(kFishEngine, "@P", p), "@N", prog);

  out << "\ncomplete -c " << prog << " -f\n";
  for (const auto* c : all) {
    const std::string at = "__" + p + "_at \"" + join(c->path, " ") + "\"";
    const std::string head = "complete -c " + prog + " -n " + fq(at);
    out << "\n# " << trim(prog + " " + join(c->path, " ")) << "\n";
    for (const auto& s : c->subs)
      for (const auto& n : s.names) out << head << " -a " << fq(n) << " -d " << fq(s.help) << "\n";
    for (const auto& o : c->opts) {
      out << head;
      for (const auto& n : o.names)
        out << (n.rfind("--", 0) == 0 ? " -l " + fq(n.substr(2)) : " -s " + fq(n.substr(1)));
      out << fish_value(o.value, true) << " -d " << fq(o.help) << "\n";
    }
    int index = 0;
    for (const auto& pos : c->positionals) {
      const bool rest = pos.count == kUnbounded;
      for (int k = 0; rest ? k < 1 : k < pos.count; ++k, ++index) {
        if (pos.value.kind == Kind::any) continue;
        const std::string when = at + " " + std::to_string(index) + (rest ? "+" : "");
        out << "complete -c " << prog << " -n " << fq(when) << fish_value(pos.value, false) << " -d " << fq(pos.help)
            << "\n";
      }
      if (rest) break;
    }
  }
  return out.str();
}

}  // namespace

Verb add_completion(CLI::App& app) {
  auto shell = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("completion", "Print a shell completion script (bash, zsh or fish)");
  sub->description(
      "Print a completion script for SHELL on stdout: verbs, options and their fixed choices, file names\n"
      "where a file is expected. It is generated from this binary's own command line, so it always\n"
      "matches the installed version. Packages install these scripts already; this is for installs by\n"
      "hand and for trying one out in the current shell.");
  sub->footer(
      "\nInstall:\n"
      "  bash  cupool completion bash > ~/.local/share/bash-completion/completions/cupool\n"
      "        (needs the bash-completion package; or put 'source <(cupool completion bash)' in ~/.bashrc)\n"
      "  zsh   mkdir -p ~/.zfunc && cupool completion zsh > ~/.zfunc/_cupool\n"
      "        and in ~/.zshrc, before compinit: fpath=(~/.zfunc $fpath); autoload -Uz compinit && compinit\n"
      "  fish  cupool completion fish > ~/.config/fish/completions/cupool.fish\n"
      "\nTry one in the current shell:\n"
      "  source <(cupool completion bash)\n"
      "  source <(cupool completion zsh)      # after compinit\n"
      "  cupool completion fish | source\n"
      "\nOpen a new shell after installing.");
  sub->add_option("shell", *shell, "The shell: bash, zsh or fish")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh", "fish"}));

  return {sub, [shell, sub](Context&) {
    CLI::App* root = sub;
    while (root->get_parent() != nullptr) root = root->get_parent();
    const std::string prog = root->get_name().empty() ? "cupool" : root->get_name();
    const Command model = build(*root, nullptr);
    if (*shell == "bash")
      std::cout << bash_script(model, prog);
    else if (*shell == "zsh")
      std::cout << zsh_script(model, prog);
    else
      std::cout << fish_script(model, prog);
    return 0;
  }};
}

}  // namespace cupool::cli
