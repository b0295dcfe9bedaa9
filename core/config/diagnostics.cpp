#include "config/diagnostics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <sstream>

#include "base/error.h"
#include "base/fd.h"
#include "base/text.h"

namespace cupool {

const char* severity_name(Severity s) {
  switch (s) {
    case Severity::error: return "error";
    case Severity::warning: return "warning";
    case Severity::note: return "note";
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

SourceFile SourceFile::read_regular(const std::string& path, std::size_t limit) {
  // O_NONBLOCK: opening a FIFO with no writer must not wait; it is refused below anyway.
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd) throw InputError("cannot read '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw InputError("cannot read '" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw InputError("'" + path + "' is not a regular file");
  if (static_cast<std::uint64_t>(st.st_size) > limit)
    throw InputError(path + ": file is larger than " + std::to_string(limit >> 10) +
                     " KiB; a config this big is not a config");
  std::string text;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError("cannot read '" + path + "': " + std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > limit)
      throw InputError(path + ": file is larger than " + std::to_string(limit >> 10) +
                       " KiB; a config this big is not a config");
  }
  return SourceFile(path, std::move(text));
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
      throw InputError(shown + ": file is larger than " + std::to_string(limit >> 10) +
                       " KiB; a config this big is not a config");
  }
  if (in->bad()) throw InputError("cannot read '" + shown + "'");
  return SourceFile(shown, std::move(text));
}

std::string SourceFile::line(int n) const {
  if (n < 1 || static_cast<std::size_t>(n) > lines_.size()) return "";
  return lines_[static_cast<std::size_t>(n - 1)];
}

namespace {

// Text a finding carries is bounded: messages quote the file, and a file can hold a 60 KiB key,
// or control characters (escaped "\x1b" in YAML): shown as U+FFFD, they can neither move a
// terminal's cursor nor grow sixfold as JSON escapes ("\u001b").
// Shown first, then cut: a byte that is not UTF-8 shows as U+FFFD, three bytes, so 512 bytes of a
// file could become 1,536 (the config fuzzer's bound found it). Showing never shortens a
// character, so what lies past the first kMaxFindingText + 1 bytes is past the cut too.
std::string bounded(const std::string& text) {
  std::string shown = safe_for_display(std::string_view(text).substr(0, kMaxFindingText + 1));
  if (shown.size() <= kMaxFindingText && text.size() <= kMaxFindingText) return shown;
  return utf8_prefix(shown, kMaxFindingText) + "...";
}

}  // namespace

void Diagnostics::add(Diagnostic d) {
  ++counts_[static_cast<std::size_t>(d.severity)];
  invalid_input_ = invalid_input_ || d.invalid_input;
  if (items_.size() >= kMaxFindings) {
    ++dropped_;
    return;
  }
  // Messages quote the file, which may hold anything: keep them printable as JSON and YAML.
  d.message = bounded(d.message);
  d.fact = bounded(d.fact);
  d.help = bounded(d.help);
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

int Diagnostics::count(Severity s) const { return static_cast<int>(counts_[static_cast<std::size_t>(s)]); }

bool Diagnostics::has_invalid_input() const { return invalid_input_; }

namespace {

// One finding; `fact_shown_at`: where an earlier finding showed the same fact (line 0: none),
// which this one names instead of repeating it.
std::string render_one(const Diagnostic& d, const SourceFile& file, Loc fact_shown_at) {
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
    // A long line is shown as a window around the column, so that a 60 KiB line is not printed
    // once per finding on it.
    std::size_t caret = static_cast<std::size_t>(std::max(0, d.loc.column - 1));
    if (text.size() > kMaxQuotedLine) {
      std::size_t from = caret > kMaxQuotedLine / 2 ? caret - kMaxQuotedLine / 2 : 0;
      // A column past the line's end (the parser counts characters, or points after the line):
      // the window is the line's end, and the caret follows it.
      from = std::min(from, text.size() - kMaxQuotedLine);
      while (from > 0 && (static_cast<unsigned char>(text[from]) & 0xc0) == 0x80) --from;  // a character's start
      std::string window = utf8_prefix(std::string_view(text).substr(std::min(from, text.size())), kMaxQuotedLine);
      const bool cut_after = from + window.size() < text.size();
      caret = caret >= from ? caret - from : 0;
      if (from > 0) {
        window = "..." + window;
        caret += 3;
      }
      if (cut_after) window += "...";
      text = std::move(window);
    }
    caret = std::min(caret, text.size());  // at most just after the text shown
    out << ' ' << number << " | " << safe_for_display(text) << '\n';
    out << gutter << " | " << std::string(caret, ' ') << "^\n";
  }
  if (!d.fact.empty()) {
    if (fact_shown_at.line > 0)
      out << gutter << " = note: as at " << fact_shown_at.line << ':' << fact_shown_at.column << " above\n";
    else
      out << gutter << " = note: " << d.fact << '\n';
  }
  if (!d.help.empty()) out << gutter << " = help: " << d.help << '\n';
  return out.str();
}

}  // namespace

std::string render_text(const Diagnostic& d, const SourceFile& file) { return render_one(d, file, Loc{}); }

std::string summary_line(const Diagnostics& ds) {
  auto plural = [](int n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); };
  return plural(ds.count(Severity::error), "error") + ", " + plural(ds.count(Severity::warning), "warning") + ", " +
         plural(ds.count(Severity::note), "note");
}

std::string render_text(const Diagnostics& ds, const SourceFile& file) {
  std::string out;
  // A long fact many findings share (the node's device list after each unknown device) is shown
  // once, in full, where it first comes; the others point there.
  std::map<std::string, Loc> facts_shown;
  for (const auto& d : ds.sorted()) {
    Loc shown_at{};
    if (d.fact.size() >= 60 && d.loc.line > 0) {
      const auto [it, fresh] = facts_shown.emplace(d.fact, d.loc);
      if (!fresh) shown_at = it->second;
    }
    out += render_one(d, file, shown_at) + "\n";
  }
  if (ds.dropped() > 0)
    out += file.path() + ": ... and " + std::to_string(ds.dropped()) + " more findings, not shown (the first " +
           std::to_string(kMaxFindings) + " are)\n\n";
  return out;
}

model::Finding view(const Diagnostic& d, const std::string& path) {
  model::Finding f;
  f.file = path;
  f.line = d.loc.line;
  f.column = d.loc.column;
  f.severity = severity_name(d.severity);
  f.code = d.code;
  f.message = d.message;
  f.invalid_input = d.invalid_input;
  if (!d.fact.empty()) f.fact = d.fact;
  if (!d.help.empty()) f.help = d.help;
  return f;
}

nlohmann::ordered_json to_json(const Diagnostic& d, const std::string& path) { return model::to_json(view(d, path)); }

}  // namespace cupool
