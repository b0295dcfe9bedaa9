#include "base/text.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace cupool {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + cost});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string lowered = to_lower(word);
  std::string best;
  std::size_t best_distance = std::string::npos;
  for (const auto& candidate : candidates) {
    const std::size_t d = edit_distance(lowered, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  // Allow about one typo per three characters, at least one.
  const std::size_t limit = std::max<std::size_t>(1, word.size() / 3);
  return best_distance <= limit ? best : std::string();
}

std::size_t decode_utf8(std::string_view s, std::size_t at, std::uint32_t* code_point) {
  if (at >= s.size()) return 0;
  const auto c = static_cast<unsigned char>(s[at]);
  std::size_t len = 0;
  std::uint32_t min = 0;
  if (c < 0x80)
    len = 1;
  else if ((c & 0xe0) == 0xc0)
    len = 2, min = 0x80;
  else if ((c & 0xf0) == 0xe0)
    len = 3, min = 0x800;
  else if ((c & 0xf8) == 0xf0)
    len = 4, min = 0x10000;
  if (len == 0 || at + len > s.size()) return 0;
  std::uint32_t cp = len == 1 ? c : (c & (0x7fu >> len));
  for (std::size_t k = 1; k < len; ++k) {
    const auto cc = static_cast<unsigned char>(s[at + k]);
    if ((cc & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3f);
  }
  if ((len > 1 && cp < min) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  if (code_point) *code_point = cp;
  return len;
}

std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t len = decode_utf8(s, i, nullptr);
    if (len) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

bool display_safe(std::uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)) return false;       // C0, DEL, C1
  if (cp == 0x061c || cp == 0x200e || cp == 0x200f) return false;  // bidirectional marks
  if (cp >= 0x202a && cp <= 0x202e) return false;                  // embeddings and overrides
  if (cp >= 0x2066 && cp <= 0x2069) return false;                  // isolates
  if (cp == 0x2028 || cp == 0x2029 || cp == 0xfeff) return false;  // line, paragraph separators; BOM
  return true;
}

bool displays_as_is(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    std::uint32_t cp = 0;
    const std::size_t len = decode_utf8(s, i, &cp);
    if (!len || !display_safe(cp)) return false;
    i += len;
  }
  return true;
}

std::string safe_for_display(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    std::uint32_t cp = 0;
    const std::size_t len = decode_utf8(s, i, &cp);
    if (len && display_safe(cp)) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xef\xbf\xbd";
      i += len ? len : 1;
    }
  }
  return out;
}

std::string utf8_prefix(std::string_view s, std::size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  std::size_t end = max_bytes;
  // Back up over continuation bytes to the start of the character that does not fit.
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xc0) == 0x80) --end;
  return std::string(s.substr(0, end));
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

bool iequals(std::string_view a, std::string_view b) { return to_lower(a) == to_lower(b); }

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::string list_or(const std::vector<std::string>& parts) {
  if (parts.empty()) return "";
  if (parts.size() == 1) return parts[0];
  std::vector<std::string> head(parts.begin(), parts.end() - 1);
  return join(head, ", ") + " or " + parts.back();
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace cupool
