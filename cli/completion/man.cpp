// man: the manual page in roff (the man macros): NAME, SYNOPSIS and DESCRIPTION from the program,
// a subsection per command (nested ones too) with its synopsis, description, options, arguments and
// the text its --help ends with; global options; exit status from the program's footer; the
// environment variables the options read; files; see also.
#include <algorithm>
#include <cctype>
#include <cstddef>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/completion/model.h"
#include "cli/completion/writers.h"
#include "config/config.h"

namespace cupool::cli::completion {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n'; }
bool is_alpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// `s` as roff text. Backslashes and grave accents print as themselves. A hyphen that joins words
// (two letters or more on each side: "long-lived") stays a hyphen; every other one (options, "-" for
// stdin, "[a-z]", all of `code`) is \- so that what a reader copies is what the shell takes. With
// `code`, quotes are straight quotes (\(aq), not typographic ones.
std::string escape(const std::string& s, bool code) {
  std::string out;
  bool option = false;  // the current word is an option ("--socket", "(--profile)")
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (!is_space(c) && (i == 0 || is_space(s[i - 1]))) {
      std::size_t j = i;
      while (j < s.size() && (s[j] == '(' || s[j] == '[' || s[j] == '\'' || s[j] == '"' || s[j] == '`')) ++j;
      option = j < s.size() && s[j] == '-';
    }
    switch (c) {
      case '\\': out += "\\e"; break;
      case '`': out += "\\(ga"; break;
      case '\'': out += code ? "\\(aq" : "'"; break;
      case '-': {
        const bool hyphen = !code && !option && i > 1 && i + 2 < s.size() && is_alpha(s[i - 2]) && is_alpha(s[i - 1]) &&
                            is_alpha(s[i + 1]) && is_alpha(s[i + 2]);
        out += hyphen ? "-" : "\\-";
        break;
      }
      default: out += c;
    }
  }
  return out;
}

// A line of roff text: one that would start with a control character ('.' or '\'') is kept text.
std::string text_line(const std::string& escaped) {
  if (!escaped.empty() && (escaped[0] == '.' || escaped[0] == '\'')) return "\\&" + escaped;
  return escaped;
}

// A macro argument: quoted, its double quotes as \(dq.
std::string arg(const std::string& escaped) { return "\"" + replace_all(escaped, "\"", "\\(dq") + "\""; }

std::string bold(const std::string& s) { return "\\fB" + escape(s, true) + "\\fR"; }
std::string italic(const std::string& s) { return "\\fI" + escape(s, true) + "\\fR"; }

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The paragraphs of a help text (blocks between blank lines), each as its lines.
std::vector<std::vector<std::string>> paragraphs_of(const std::string& text) {
  std::vector<std::vector<std::string>> out(1);
  for (const auto& line : lines_of(text)) {
    if (trim(line).empty()) {
      if (!out.back().empty()) out.emplace_back();
    } else {
      out.back().push_back(line);
    }
  }
  if (out.back().empty()) out.pop_back();
  return out;
}

// One paragraph of a help text: lines that start at the margin are prose, filled by the formatter;
// indented ones (examples, lists) are kept as they are, indented.
void write_paragraph(std::ostream& out, const std::vector<std::string>& lines) {
  for (std::size_t i = 0; i < lines.size();) {
    const bool literal = is_space(lines[i][0]);
    std::size_t end = i;
    while (end < lines.size() && is_space(lines[end][0]) == literal) ++end;
    if (literal) {
      std::size_t indent = std::string::npos;
      for (std::size_t k = i; k < end; ++k) indent = std::min(indent, lines[k].find_first_not_of(" \t"));
      out << ".RS 4\n.nf\n";
      for (std::size_t k = i; k < end; ++k) out << text_line(escape(lines[k].substr(indent), true)) << "\n";
      out << ".fi\n.RE\n";
    } else {
      out << ".PP\n";
      for (std::size_t k = i; k < end; ++k) out << text_line(escape(trim(lines[k]), false)) << "\n";
    }
    i = end;
  }
}

void write_text(std::ostream& out, const std::string& text) {
  for (const auto& paragraph : paragraphs_of(text)) write_paragraph(out, paragraph);
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

bool is_help(const Opt& o) {
  for (const auto& n : o.names)
    if (n == "--help") return true;
  return false;
}

// CLI11's type name of a value without what its validators add ("FLOAT:FLOAT in [0 - 86400]" ->
// "FLOAT") and without the brackets of one that may be left out ("[SECONDS]" -> "SECONDS").
std::string base_type(const std::string& type) {
  std::string base = trim(type.substr(0, type.find(':')));
  if (base.size() > 2 && base.front() == '[' && base.back() == ']') base = trim(base.substr(1, base.size() - 2));
  return base.empty() ? "VALUE" : base;
}

// What a value takes, as a placeholder: its choices (literal), FILE, DIR or CLI11's type (TEXT, INT).
std::string placeholder(const Value& v, const std::string& type) {
  switch (v.kind) {
    case Kind::none: return "";
    case Kind::choices: {
      std::vector<std::string> words;
      for (const auto& c : v.choices) words.push_back(bold(c));
      return join(words, "|");
    }
    case Kind::file:
    case Kind::yaml: return italic(base_type(type) == "DIR" ? "DIR" : "FILE");
    case Kind::dir: return italic("DIR");
    case Kind::any: return italic(base_type(type));
  }
  return "";
}

// An option with its value as typed: \fB\-\-report\fR[=\fIFILE\fR], \fB\-\-pool\fR \fITEXT\fR.
std::string option_usage(const Opt& o, const std::string& name) {
  const std::string value = placeholder(o.value, o.type);
  if (value.empty()) return bold(name);
  if (o.optional_value) return bold(name) + "[=" + value + "]";
  return bold(name) + " " + value;
}

// A positional as typed: NAME, [NAME], [\-\-] CMD... (words that follow '--' are never options).
std::string positional_usage(const Positional& p) {
  std::string word = italic(upper(p.name));
  if (p.count == kUnbounded) word = "[" + bold("--") + "] " + word + "...";
  return p.required ? word : "[" + word + "]";
}

// The words after a command's name in its synopsis: required options, [OPTIONS] for the others, its
// subcommands, its positionals.
std::string synopsis_args(const Command& c) {
  std::vector<std::string> words;
  bool optional = false;
  for (const auto& o : c.opts) {
    if (is_help(o) || o.inherited) continue;
    if (o.required)
      words.push_back(option_usage(o, o.names.front()));
    else
      optional = true;
  }
  if (optional) words.push_back("[" + italic("OPTIONS") + "]");
  if (!c.subs.empty()) {
    std::vector<std::string> subs;
    for (const auto& s : c.subs) subs.push_back(bold(s.names.front()));
    words.push_back(join(subs, "|") + " ...");
  }
  for (const auto& p : c.positionals) words.push_back(positional_usage(p));
  return join(words, " ");
}

std::string command_name(const std::string& prog, const Command& c) { return trim(prog + " " + join(c.path, " ")); }

// A synopsis line (.SY); consecutive ones stand without space between them until .YS ends the run.
void write_synopsis(std::ostream& out, const std::string& prog, const Command& c) {
  out << ".SY " << arg(escape(command_name(prog, c), true)) << "\n";
  const std::string args = synopsis_args(c);
  if (!args.empty()) out << text_line(args) << "\n";
}

// A sentence: ends with a full stop.
std::string sentence(std::string s) {
  s = trim(s);
  if (!s.empty() && s.back() != '.' && s.back() != '!' && s.back() != '?') s += '.';
  return s;
}

// What a validator adds to the type, as a sentence: "FLOAT:FLOAT in [0 - 86400]" -> "From 0 to
// 86400.", "INT:NONNEGATIVE" -> "0 or more."; "" when it adds nothing (choices, files).
std::string validator_note(const Opt& o) {
  const auto colon = o.type.find(':');
  if (colon == std::string::npos || o.value.kind == Kind::choices) return "";
  const std::string note = trim(o.type.substr(colon + 1));
  if (note.empty() || note == "FILE" || note == "DIR" || note == "PATH(existing)") return "";
  if (note == "NONNEGATIVE") return "0 or more.";
  if (note == "POSITIVE") return "More than 0.";
  const auto open = note.find(" in [");
  const auto dash = note.find(" - ", open);
  if (open != std::string::npos && dash != std::string::npos && note.back() == ']')
    return "From " + note.substr(open + 5, dash - open - 5) + " to " + note.substr(dash + 3, note.size() - dash - 4) +
           ".";
  return "Takes " + note + ".";
}

void write_option(std::ostream& out, const Opt& o) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < o.names.size(); ++i)
    names.push_back(i + 1 == o.names.size() ? option_usage(o, o.names[i]) : bold(o.names[i]));
  out << ".TP\n" << text_line(join(names, ", ")) << "\n";
  std::vector<std::string> notes;
  if (o.required) notes.push_back("Required.");
  if (const std::string v = validator_note(o); !v.empty()) notes.push_back(v);
  if (!o.default_value.empty()) notes.push_back("Default: " + o.default_value + ".");
  if (!o.env.empty()) notes.push_back("Environment: " + o.env + ".");
  if (o.repeats) notes.push_back("May be given more than once.");
  std::string text = sentence(o.description);
  for (const auto& n : notes) text += (text.empty() ? "" : " ") + n;
  for (const auto& line : lines_of(text)) {
    const std::string t = trim(line);
    if (!t.empty()) out << text_line(escape(t, false)) << "\n";
  }
}

void write_positional(std::ostream& out, const Positional& p) {
  out << ".TP\n" << text_line(positional_usage(p)) << "\n";
  std::string text = sentence(p.description.empty() ? p.help : p.description);
  bool named = true;  // the help names every choice already
  for (const auto& choice : p.value.choices) named = named && text.find(choice) != std::string::npos;
  if (!named) text += " One of: " + join(p.value.choices, ", ") + ".";
  for (const auto& line : lines_of(text)) {
    const std::string t = trim(line);
    if (!t.empty()) out << text_line(escape(t, false)) << "\n";
  }
}

// A subsection for a command: synopsis, description, options, arguments, its --help's footer.
void write_command(std::ostream& out, const std::string& prog, const Command& c) {
  std::string title = join(c.path, " ");
  if (c.names.size() > 1) {
    std::vector<std::string> aliases(c.names.begin() + 1, c.names.end());
    title += " (alias: " + join(aliases, ", ") + ")";
  }
  out << ".SS " << arg(escape(title, true)) << "\n";
  write_synopsis(out, prog, c);
  out << ".YS\n";
  // The footer's prose up to its first example or list (indented lines) or its exit codes goes with
  // the description; the rest follows the options.
  const auto footer = paragraphs_of(c.footer);
  std::size_t prose = 0;
  while (prose < footer.size() && !starts_with(trim(footer[prose].front()), "Exit codes:")) {
    bool literal = false;
    for (const auto& line : footer[prose]) literal = literal || is_space(line[0]);
    if (literal) break;
    ++prose;
  }
  // A one-line description is a sentence, left out when the footer starts with it; a longer one is
  // text with paragraphs.
  std::string summary = c.description;
  if (!summary.empty() && summary.back() == '.') summary.pop_back();
  if (c.description.find('\n') != std::string::npos)
    write_text(out, c.description);
  else if (prose == 0 || summary.empty() || !starts_with(trim(footer[0].front()), summary))
    write_text(out, sentence(c.description));
  for (std::size_t i = 0; i < prose; ++i) write_paragraph(out, footer[i]);
  // The options it takes from the program (falling through) are under GLOBAL OPTIONS.
  std::vector<const Opt*> opts;
  for (const auto& o : c.opts)
    if (!is_help(o) && !o.inherited) opts.push_back(&o);
  if (!c.subs.empty()) {
    out << ".PP\nCommands:\n";
    for (const auto& s : c.subs)
      out << ".TP\n" << bold(s.names.front()) << "\n" << text_line(escape(sentence(s.help), false)) << "\n";
  }
  if (!c.positionals.empty()) {
    out << ".PP\nArguments:\n";
    for (const auto& p : c.positionals) write_positional(out, p);
  }
  if (!opts.empty()) {
    out << ".PP\nOptions:\n";
    for (const auto* o : opts) write_option(out, *o);
  }
  for (std::size_t i = prose; i < footer.size(); ++i) write_paragraph(out, footer[i]);
}

// The exit codes the program's footer lists: "Exit codes:" then indented lines "  CODE  meaning".
std::vector<std::pair<std::string, std::string>> exit_codes(const std::string& footer) {
  std::vector<std::pair<std::string, std::string>> out;
  bool in_list = false;
  for (const auto& line : lines_of(footer)) {
    if (trim(line) == "Exit codes:") {
      in_list = true;
      continue;
    }
    if (!in_list) continue;
    const std::string t = trim(line);
    std::size_t digits = 0;
    while (digits < t.size() && is_digit(t[digits])) ++digits;
    if (line.empty() || !is_space(line[0]) || digits == 0 || digits == t.size() || !is_space(t[digits])) break;
    out.emplace_back(t.substr(0, digits), trim(t.substr(digits)));
  }
  return out;
}

// The program's footer paragraph on the environment, "Environment: NAME (what), NAME (what); NAME
// (what). More text.": each variable with what it says, and the text after that first sentence.
struct FooterEnvironment {
  std::vector<std::pair<std::string, std::string>> variables;
  std::string rest;
};

FooterEnvironment footer_environment(const std::vector<std::string>& paragraph) {
  std::vector<std::string> lines;
  for (const auto& l : paragraph) lines.push_back(trim(l));
  const std::string text = trim(join(lines, " ").substr(std::string("Environment:").size()));
  FooterEnvironment out;
  std::string item;
  int depth = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : '.';
    depth += c == '(' ? 1 : c == ')' ? -1 : 0;
    const bool end = depth == 0 && c == '.' && (i + 1 >= text.size() || is_space(text[i + 1]));
    if (depth == 0 && (c == ',' || c == ';' || end)) {
      item = trim(item);
      const auto name_end = item.find_first_of(" (");
      const auto open = item.find('('), close = item.rfind(')');
      if (!item.empty())
        out.variables.emplace_back(item.substr(0, name_end), open != std::string::npos && close > open
                                                                 ? item.substr(open + 1, close - open - 1)
                                                                 : "");
      item.clear();
      if (end) {
        if (i + 1 < text.size()) out.rest = trim(text.substr(i + 1));
        break;
      }
    } else {
      item += c;
    }
  }
  return out;
}

// "a", "a and b", "a, b and c".
std::string listing(const std::vector<std::string>& words) {
  if (words.size() < 2) return join(words, "");
  return join(std::vector<std::string>(words.begin(), words.end() - 1), ", ") + " and " + words.back();
}

// What each environment variable stands for: the options that read it and the commands they are in
// (the program's own options counted once, not again in each command that falls through).
struct EnvUse {
  std::vector<std::string> options;   // "--socket", in first-seen order
  std::vector<std::string> commands;  // "status", "buffer create"; "" for the program itself
  std::map<std::string, int> helps;   // the options' help texts, how often each
};

std::map<std::string, EnvUse> environment(const Command& root) {
  std::vector<const Command*> all;
  flatten(root, all);
  std::map<std::string, EnvUse> out;
  for (const auto* c : all) {
    for (const auto& o : c->opts) {
      if (o.env.empty() || o.inherited) continue;
      EnvUse& use = out[o.env];
      bool seen = false;
      for (const auto& n : use.options) seen = seen || n == o.names.front();
      if (!seen) use.options.push_back(o.names.front());
      use.commands.push_back(join(c->path, " "));
      ++use.helps[o.help];
    }
  }
  return out;
}

// ENVIRONMENT: the variables options read (what the option is for, which options and commands), and
// those the program's footer names besides.
void write_environment(std::ostream& out, const Command& root, const FooterEnvironment& footer) {
  std::map<std::string, std::string> entries;  // name -> roff text
  for (const auto& [name, use] : environment(root)) {
    // The help most of its options share says what it is.
    std::string help;
    int most = 0;
    for (const auto& [h, n] : use.helps)
      if (n > most) help = h, most = n;
    std::vector<std::string> options;
    for (const auto& o : use.options) options.push_back(bold(o));
    std::vector<std::string> commands;
    for (const auto& c : use.commands)
      if (!c.empty()) commands.push_back(bold(c));
    std::string text = escape(sentence(help), false) + " The value of " + join(options, ", ") +
                       " when it is not given on the command line";
    entries[name] = text + (commands.empty() ? "." : ", in " + listing(commands) + ".");
  }
  for (const auto& [name, what] : footer.variables) {
    if (entries.count(name) != 0) continue;
    std::string text = sentence(what);
    if (!text.empty()) text[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
    entries[name] = escape(text, false);
  }
  if (entries.empty()) return;
  out << ".SH ENVIRONMENT\n";
  for (const auto& [name, text] : entries) out << ".TP\n" << bold(name) << "\n" << text_line(text) << "\n";
}

}  // namespace

std::string man_page(const Command& root, const std::string& prog, const std::string& version) {
  std::ostringstream out;
  out << ".\\\" Manual page for " << prog << ". Generated by '" << prog << " completion man' from the command-line\n"
      << ".\\\" definition: do not edit (in the repository, run scripts/regen-completions.sh).\n"
      << ".TH " << upper(prog) << " 1 " << arg("version " + escape(version, true)) << " " << arg(escape(prog, true))
      << " " << arg("User Commands") << "\n";

  // What the program is: its description, without a leading "PROG: ".
  std::string what = replace_all(trim(root.description), "\n", " ");
  if (starts_with(what, prog + ": ")) what = what.substr(prog.size() + 2);
  if (!what.empty() && what.back() == '.') what.pop_back();
  out << ".SH NAME\n" << escape(prog, true) << " \\- " << escape(what, false) << "\n";

  std::vector<const Command*> all;
  flatten(root, all);
  bool falls_through = false;  // the program's options are taken after a command too
  for (const auto* c : all)
    for (const auto& o : c->opts) falls_through = falls_through || o.inherited;

  out << ".SH SYNOPSIS\n";
  {
    std::vector<std::string> global;
    std::vector<std::string> flags;
    for (const auto& o : root.opts) {
      if (o.value.kind == Kind::none)
        flags.push_back(bold(o.names.front()));
      else
        global.push_back("[" + option_usage(o, o.names.front()) + "]");
    }
    global.push_back(italic("COMMAND") + " [" + italic("OPTIONS") + "] [" + italic("ARGUMENTS") + "]");
    out << ".SY " << escape(prog, true) << "\n" << join(global, " ") << "\n";
    if (!flags.empty()) out << ".SY " << escape(prog, true) << "\n" << join(flags, " | ") << "\n";
    out << ".YS\n.PP\nwhere " << italic("COMMAND") << " is one of:\n";
    for (const auto* c : all)
      if (!c->path.empty() && c->subs.empty()) write_synopsis(out, prog, *c);
    out << ".YS\n";
  }

  // The program's footer: its exit codes and environment have sections of their own.
  FooterEnvironment footer_env;
  out << ".SH DESCRIPTION\n";
  if (!what.empty()) {
    what[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(what[0])));
    out << escape(sentence(what), false) << "\n";
  }
  for (const auto& paragraph : paragraphs_of(root.footer)) {
    const std::string first = trim(paragraph.front());
    if (starts_with(first, "Exit codes:")) continue;
    if (starts_with(first, "Environment:")) {
      footer_env = footer_environment(paragraph);
      if (!footer_env.rest.empty()) write_paragraph(out, {footer_env.rest});
      continue;
    }
    write_paragraph(out, paragraph);
  }
  out << ".PP\nEach command is described under " << bold("COMMANDS") << " below, with examples.\n";

  out << ".SH COMMANDS\n";
  for (const auto* c : all)
    if (!c->path.empty()) write_command(out, prog, *c);

  out << ".SH \"GLOBAL OPTIONS\"\n";
  {
    // An example with the first of them that takes a choice: "cupool --log-level debug query".
    std::string example_option;
    for (const auto& o : root.opts)
      if (example_option.empty() && o.value.kind == Kind::choices)
        example_option = o.names.front() + " " + o.value.choices[o.value.choices.size() > 1 ? 1 : 0];
    const Command* first = nullptr;
    for (const auto* c : all)
      if (first == nullptr && !c->path.empty() && c->subs.empty()) first = c;
    if (falls_through) {
      out << "They go before the command or after it";
      if (!example_option.empty() && first != nullptr)
        out << ": " << bold(prog + " " + example_option + " " + join(first->path, " ")) << " is "
            << bold(command_name(prog, *first) + " " + example_option);
      out << ".\n";
    } else {
      out << "They go before the command";
      if (!example_option.empty() && first != nullptr)
        out << ", e.g. " << bold(prog + " " + example_option + " " + join(first->path, " "));
      out << ".\n";
    }
  }
  for (const auto& o : root.opts) write_option(out, o);
  for (const auto& o : root.opts) {
    if (!is_help(o)) continue;
    std::vector<std::string> names;
    for (const auto& n : o.names) names.push_back(bold(n));
    out << ".PP\nEvery command takes " << join(names, ", ") << " too.\n";
  }

  if (const auto codes = exit_codes(root.footer); !codes.empty()) {
    out << ".SH \"EXIT STATUS\"\n";
    for (const auto& [code, meaning] : codes) {
      std::string text = sentence(meaning);
      text[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
      out << ".TP\n" << bold(code) << "\n" << text_line(escape(text, false)) << "\n";
    }
    out << ".PP\nEach command's section says what its codes mean for it.\n";
  }

  write_environment(out, root, footer_env);

  out << ".SH FILES\n"
      << ".TP\n"
      << italic("/etc/cupool/cupool.yaml") << "\n"
      << "The config that the systemd unit " << bold("cupool.service") << " holds; any path works.\n"
      << ".TP\n"
      << italic(kDefaultSocket) << "\n"
      << "The holder's Unix socket, unless the config's " << bold("holder.socket") << ", " << bold("--socket") << " or "
      << bold("CUPOOL_SOCKET") << " names another.\n"
      << ".TP\n"
      << italic("share/cupool/configs/") << "\n"
      << "Example configs and recorded node profiles (for " << bold("--profile") << "), under the install prefix.\n"
      << ".TP\n"
      << italic("share/cupool/schemas/cupool-config-v1.schema.json") << "\n"
      << "The JSON Schema of the config file, under the install prefix.\n";

  out << ".SH \"SEE ALSO\"\n"
      << ".BR nvidia\\-smi (1),\n"
      << ".BR systemctl (1),\n"
      << ".BR journalctl (1)\n"
      << ".PP\n"
      << "In the source tree: " << italic("README.md") << "; " << italic("docs/config.md") << " (the config file), "
      << italic("docs/protocol.md") << " (the holder's protocol), " << italic("docs/security.md")
      << " (who may use a pool), " << italic("docs/python.md") << " (the Python package); "
      << italic("include/cupool/client.h") << " (the C API).\n";
  return out.str();
}

}  // namespace cupool::cli::completion
