// The model of the command line that the writers (cli/completion/writers.h) turn into completion
// scripts and the man page: every visible command, nested ones too, with its options, positionals
// and what each takes, and the texts its --help prints, read from the root CLI::App; and the small
// text helpers the writers share.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace cupool::cli::completion {

// What an option or a positional argument takes.
enum class Kind {
  none,     // nothing: a flag
  any,      // free text: nothing to offer
  choices,  // one of a fixed set (CLI::IsMember and friends)
  file,     // a file name
  yaml,     // a file name, *.yaml / *.yml preferred (configs, node profiles)
  dir,      // a directory name
};

// What an option or a positional takes: its kind and, for a fixed set, the choices.
struct Value {
  Kind kind = Kind::none;
  std::vector<std::string> choices;  // for Kind::choices
};

// An option of a command: its names, a one-line help and what its value takes.
struct Opt {
  std::vector<std::string> names;  // dashes included, long ones first: "--format", "-o"
  std::string help;
  Value value;
  bool repeats = false;       // may be given more than once
  std::string description;    // the whole help text (`help` is its summary)
  std::string type;           // CLI11's type name, validators included: "TEXT", "FLOAT:FLOAT in [0 - 86400]"
  std::string default_value;  // shown as the default ("" for none)
  std::string env;            // the environment variable that sets it ("" for none)
  bool required = false;
  bool optional_value = false;  // its value may be left out (--report or --report=FILE)
  bool inherited = false;       // its parent's, taken too because the command falls through
};

// The count of a positional that takes every word left.
constexpr int kUnbounded = -1;

// A positional argument of a command: its name, a one-line help, what it takes and how many words.
struct Positional {
  std::string name;
  std::string help;
  Value value;
  int count = 1;            // how many words it takes
  std::string description;  // the whole help text
  std::string type;         // CLI11's type name, as for Opt
  bool required = false;
};

// A command (the program itself or a verb), with its options, positionals and subcommands.
struct Command {
  std::vector<std::string> path;   // {} for the program itself; {"buffer", "create"}
  std::vector<std::string> names;  // the name, then its aliases (empty for the program)
  std::string help;                // a one-line summary of the description
  std::string description;         // the whole description (the root's: what the program is)
  std::string footer;              // the text --help prints after the options (examples, exit codes)
  std::vector<Opt> opts;
  std::vector<Positional> positionals;
  std::vector<Command> subs;
};

// The model of the whole command line: the program (root, the topmost CLI::App) and every visible
// verb under it.
Command read_cli(CLI::App& root);

// Every command, the program first, parents before children.
void flatten(const Command& cmd, std::vector<const Command*>& out);

// The names of the subcommands of `cmd`, aliases included.
std::vector<std::string> sub_names(const Command& cmd);

// The words with `sep` between them.
std::string join(const std::vector<std::string>& words, const std::string& sep);

// `s` without its leading and trailing blanks (spaces, tabs, newlines).
std::string trim(const std::string& s);

// `text` with every `from` replaced by `to`.
std::string replace_all(std::string text, const std::string& from, const std::string& to);

// Letters, digits and '_' only, for function names.
std::string ident(const std::string& s);

}  // namespace cupool::cli::completion
