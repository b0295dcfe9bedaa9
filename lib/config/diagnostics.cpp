#include "config/diagnostics.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "base/error.h"
#include "base/text.h"

namespace cupool {

const char* severity_name(Severity s) {
  switch (s) {
    case Severity::error:
      return "error";
    case Severity::warning:
      return "warning";
    case Severity::note:
      return "note";
  }
  return "error";
}

SourceFile::SourceFile(std::string path, std::string text) : path_(std::move(path)), text_(std::move(text)) {
  std::string cur;
  for (char c : text_) {
    if (c == '\n') {
      if (!cur.empty() && cur.back() == '\r') cur.pop_back();
      lines_.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) lines_.push_back(cur);
}

SourceFile SourceFile::read(const std::string& path, std::size_t limit) {
  std::string text;
  std::istream* in = &std::cin;
  std::ifstream file;
  const std::string shown = path == "-" ? "<stdin>" : path;
  if (path != "-") {
    file.open(path, std::ios::binary);
    if (!file) throw InputError("cannot read '" + path + "': " + std::strerror(errno));
    in = &file;
  }
  char buf[65536];
  while (*in) {
    in->read(buf, sizeof buf);
    text.append(buf, static_cast<std::size_t>(in->gcount()));
    if (text.size() > limit)
      throw InputError(shown + ": file is larger than " + std::to_string(limit >> 10) + " KiB; a config this big is not a config");
  }
  if (in->bad()) throw InputError("cannot read '" + shown + "'");
  return SourceFile(shown, std::move(text));
}

std::string SourceFile::line(int n) const {
  if (n < 1 || static_cast<std::size_t>(n) > lines_.size()) return "";
  return lines_[static_cast<std::size_t>(n - 1)];
}

void Diagnostics::add(Diagnostic d) {
  // Messages quote the file, which may hold anything: keep them printable as JSON and YAML.
  d.message = valid_utf8(d.message);
  d.fact = valid_utf8(d.fact);
  d.help = valid_utf8(d.help);
  items_.push_back(std::move(d));
}

void Diagnostics::invalid(const std::string& code, Loc loc, std::string message, std::string help) {
  Diagnostic d;
  d.severity = Severity::error;
  d.code = code;
  d.loc = loc;
  d.message = std::move(message);
  d.help = std::move(help);
  d.invalid_input = true;
  add(std::move(d));
}

namespace {
Diagnostic make(Severity s, const std::string& code, Loc loc, std::string message, std::string fact, std::string help) {
  Diagnostic d;
  d.severity = s;
  d.code = code;
  d.loc = loc;
  d.message = std::move(message);
  d.fact = std::move(fact);
  d.help = std::move(help);
  return d;
}
}  // namespace

void Diagnostics::error(const std::string& code, Loc loc, std::string message, std::string fact, std::string help) {
  add(make(Severity::error, code, loc, std::move(message), std::move(fact), std::move(help)));
}
void Diagnostics::warning(const std::string& code, Loc loc, std::string message, std::string fact, std::string help) {
  add(make(Severity::warning, code, loc, std::move(message), std::move(fact), std::move(help)));
}
void Diagnostics::note(const std::string& code, Loc loc, std::string message, std::string fact, std::string help) {
  add(make(Severity::note, code, loc, std::move(message), std::move(fact), std::move(help)));
}

std::vector<Diagnostic> Diagnostics::sorted() const {
  std::vector<Diagnostic> out = items_;
  std::stable_sort(out.begin(), out.end(), [](const Diagnostic& a, const Diagnostic& b) {
    return std::tie(a.loc.line, a.loc.column) < std::tie(b.loc.line, b.loc.column);
  });
  return out;
}

int Diagnostics::count(Severity s) const {
  return static_cast<int>(std::count_if(items_.begin(), items_.end(), [s](const Diagnostic& d) { return d.severity == s; }));
}

bool Diagnostics::has_invalid_input() const {
  return std::any_of(items_.begin(), items_.end(), [](const Diagnostic& d) { return d.invalid_input; });
}

std::string render_text(const Diagnostic& d, const SourceFile& file) {
  std::ostringstream out;
  out << file.path();
  if (d.loc.line > 0) out << ':' << d.loc.line << ':' << d.loc.column;
  out << ": " << severity_name(d.severity) << ": " << d.message << " [" << d.code << "]\n";
  std::string gutter(4, ' ');
  if (d.loc.line > 0) {
    const std::string number = std::to_string(d.loc.line);
    gutter = std::string(number.size() + 1, ' ');
    std::string text = file.line(d.loc.line);
    // Tabs would shift the caret; show them as one space each.
    std::replace(text.begin(), text.end(), '\t', ' ');
    out << ' ' << number << " | " << text << '\n';
    out << gutter << " | " << std::string(static_cast<std::size_t>(std::max(0, d.loc.column - 1)), ' ') << "^\n";
  }
  if (!d.fact.empty()) out << gutter << " = note: " << d.fact << '\n';
  if (!d.help.empty()) out << gutter << " = help: " << d.help << '\n';
  return out.str();
}

std::string summary_line(const Diagnostics& ds) {
  auto plural = [](int n, const char* word) {
    return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
  };
  return plural(ds.count(Severity::error), "error") + ", " + plural(ds.count(Severity::warning), "warning") + ", " +
         plural(ds.count(Severity::note), "note");
}

std::string render_text(const Diagnostics& ds, const SourceFile& file) {
  std::string out;
  for (const auto& d : ds.sorted()) out += render_text(d, file) + "\n";
  return out;
}

nlohmann::ordered_json to_json(const Diagnostic& d, const std::string& path) {
  nlohmann::ordered_json j = {{"file", path},
                      {"line", d.loc.line},
                      {"column", d.loc.column},
                      {"severity", severity_name(d.severity)},
                      {"code", d.code},
                      {"message", d.message},
                      {"invalid_input", d.invalid_input}};
  j["fact"] = d.fact.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(d.fact);
  j["help"] = d.help.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(d.help);
  return j;
}

}  // namespace cupool
