// Compiler-style findings: `path:line:col: severity: message [code]`, the source line, a caret,
// and the fact and the fix behind it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "model/model.h"

namespace cupool {

enum class Severity { error, warning, note };
const char* severity_name(Severity s);

// 1-based line and column; 0 means "the whole file".
struct Loc {
  int line = 0;
  int column = 0;
};

struct Diagnostic {
  Severity severity = Severity::error;
  std::string code;  // rule id, e.g. "unknown-key", "peer-access"
  Loc loc;
  std::string message;         // what is wrong
  std::string fact;            // the fact behind it (what the node reports), optional
  std::string help;            // what would be valid / "did you mean", optional
  bool invalid_input = false;  // the file is not a valid config (exit 2), not a misfit (exit 1)
};

// A config file's text, kept to quote lines in findings.
class SourceFile {
 public:
  SourceFile(std::string path, std::string text);
  // Reads `path` ("-" for standard input), at most `limit` bytes. Throws InputError.
  static SourceFile read(const std::string& path, std::size_t limit = 1 << 20);
  // The same for a file that must be a regular file (what a daemon or a library reads unattended):
  // anything else (a FIFO, a device) is refused at once, without waiting on it. Throws InputError.
  static SourceFile read_regular(const std::string& path, std::size_t limit = 1 << 20);
  const std::string& path() const { return path_; }
  const std::string& text() const { return text_; }
  // Line `n` (1-based) without its newline; "" if out of range.
  std::string line(int n) const;

 private:
  std::string path_;
  std::string text_;
  std::vector<std::string> lines_;
};

// Bounds on what findings cost, whatever the file: the findings kept (the rest are counted), the
// text each carries (message, fact and help each), and the part of a long source line quoted.
constexpr std::size_t kMaxFindings = 1000;
constexpr std::size_t kMaxFindingText = 512;
constexpr std::size_t kMaxQuotedLine = 160;

class Diagnostics {
 public:
  void add(Diagnostic d);
  // Shorthands for the common cases.
  void invalid(const std::string& code, Loc loc, std::string message, std::string help = "");
  void error(const std::string& code, Loc loc, std::string message, std::string fact = "", std::string help = "");
  void warning(const std::string& code, Loc loc, std::string message, std::string fact = "", std::string help = "");
  void note(const std::string& code, Loc loc, std::string message, std::string fact = "", std::string help = "");

  // The findings kept (the first kMaxFindings made), in file order (line, column), stable for
  // findings at the same place.
  std::vector<Diagnostic> sorted() const;
  const std::vector<Diagnostic>& all() const { return items_; }
  // Counts of every finding made, kept or not.
  int count(Severity s) const;
  bool has_invalid_input() const;
  bool has_errors() const { return count(Severity::error) > 0; }
  // Findings made beyond kMaxFindings (counted, not kept).
  std::size_t dropped() const { return dropped_; }

 private:
  std::vector<Diagnostic> items_;
  std::size_t counts_[3] = {0, 0, 0};  // by Severity
  std::size_t dropped_ = 0;
  bool invalid_input_ = false;
};

// One finding as text, with the quoted line (a window of it, when long) and a caret under the column.
std::string render_text(const Diagnostic& d, const SourceFile& file);
// All findings in file order and a closing count line ("2 errors, 1 warning").
std::string render_text(const Diagnostics& ds, const SourceFile& file);
std::string summary_line(const Diagnostics& ds);
// A finding as every verb prints it (model::Finding), and its JSON.
model::Finding view(const Diagnostic& d, const std::string& path);
nlohmann::ordered_json to_json(const Diagnostic& d, const std::string& path);

// A config that can't be used (held, applied in a process): Errc::invalid_config when it is not a
// valid config at all (exit 2), Errc::does_not_fit when it does not fit the node (exit 1). It
// carries the findings (as `cupool check --format json` writes them) and the compiler-style text.
class ConfigRejected : public Error {
 public:
  ConfigRejected(const std::string& summary, nlohmann::ordered_json findings, std::string rendered, bool invalid_input)
      : Error(invalid_input ? Errc::invalid_config : Errc::does_not_fit, summary),
        findings_(std::move(findings)),
        rendered_(std::move(rendered)) {}
  const nlohmann::ordered_json& findings() const { return findings_; }
  const std::string& rendered() const { return rendered_; }
  // True when the file is not a valid config at all (exit 2), false when it does not fit (exit 1).
  bool invalid_input() const { return code() == Errc::invalid_config; }

 private:
  nlohmann::ordered_json findings_;
  std::string rendered_;
};

}  // namespace cupool
