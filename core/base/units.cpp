#include "base/units.h"

#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

namespace cupool {

const char* const kSizeUnitsHelp = "B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)";

namespace {

struct Unit {
  const char* name;
  std::uint64_t factor;
};

constexpr std::array<Unit, 9> kUnits{{
    {"B", 1ULL},
    {"KiB", 1ULL << 10},
    {"MiB", 1ULL << 20},
    {"GiB", 1ULL << 30},
    {"TiB", 1ULL << 40},
    {"KB", 1000ULL},
    {"MB", 1000ULL * 1000},
    {"GB", 1000ULL * 1000 * 1000},
    {"TB", 1000ULL * 1000 * 1000 * 1000},
}};

void set(std::string* why, std::string text) {
  if (why) *why = std::move(text);
}

}  // namespace

std::optional<std::uint64_t> parse_size(std::string_view text, std::string* why) {
  std::size_t i = 0;
  std::string integer_part;
  std::string fraction_part;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) integer_part += text[i++];
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) fraction_part += text[i++];
    if (fraction_part.empty()) {
      set(why, "a decimal point must be followed by digits");
      return std::nullopt;
    }
  }
  if (integer_part.empty()) {
    set(why, "a size starts with a number");
    return std::nullopt;
  }
  if (i < text.size() && text[i] == ' ') ++i;  // one optional space: "1.5 GiB"
  const std::string_view unit_text = text.substr(i);
  if (unit_text.empty()) {
    set(why, "a size needs a unit (" + std::string(kSizeUnitsHelp) + ")");
    return std::nullopt;
  }
  const Unit* unit = nullptr;
  for (const auto& u : kUnits)
    if (unit_text == u.name) unit = &u;
  if (!unit) {
    set(why, "unknown unit '" + std::string(unit_text) + "'; use " + kSizeUnitsHelp);
    return std::nullopt;
  }
  if (integer_part.size() > 20) {
    set(why, "the size is too large");
    return std::nullopt;
  }
  // Exact integer arithmetic: integer * factor + fraction * factor / 10^digits.
  unsigned __int128 whole = 0;
  for (char c : integer_part) whole = whole * 10 + static_cast<unsigned>(c - '0');
  unsigned __int128 bytes = whole * unit->factor;
  if (!fraction_part.empty()) {
    if (fraction_part.size() > 18) {
      set(why, "too many decimal places");
      return std::nullopt;
    }
    unsigned __int128 numerator = 0;
    unsigned __int128 denominator = 1;
    for (char c : fraction_part) {
      numerator = numerator * 10 + static_cast<unsigned>(c - '0');
      denominator *= 10;
    }
    const unsigned __int128 scaled = numerator * unit->factor;
    if (scaled % denominator != 0) {
      set(why, "the size is not a whole number of bytes");
      return std::nullopt;
    }
    bytes += scaled / denominator;
  }
  if (bytes > static_cast<unsigned __int128>(UINT64_MAX)) {
    set(why, "the size is too large (above 16 EiB)");
    return std::nullopt;
  }
  return static_cast<std::uint64_t>(bytes);
}

std::optional<double> parse_percent(std::string_view text) {
  if (text.size() < 2 || text.back() != '%') return std::nullopt;
  const std::string number(text.substr(0, text.size() - 1));
  std::size_t digits = 0;
  bool dot = false;
  for (char c : number) {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      ++digits;
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      return std::nullopt;
    }
  }
  if (digits == 0 || number.front() == '.' || number.back() == '.') return std::nullopt;
  const double value = std::strtod(number.c_str(), nullptr);
  if (!(value > 0.0) || value > 100.0) return std::nullopt;
  return value / 100.0;
}

std::string format_bytes(std::uint64_t bytes) {
  static const char* const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  std::uint64_t scale = 1;
  while (unit < 6 && bytes / scale >= 1024) {
    scale *= 1024;
    ++unit;
  }
  char buf[64];
  if (unit == 0 || bytes % scale == 0) {
    std::snprintf(buf, sizeof buf, "%llu %s", static_cast<unsigned long long>(bytes / scale), names[unit]);
  } else {
    const double value = static_cast<double>(bytes) / static_cast<double>(scale);
    std::snprintf(buf, sizeof buf, "%.1f %s", value, names[unit]);
  }
  return buf;
}

std::string exact_size(std::uint64_t bytes) {
  static const char* units[] = {"TiB", "GiB", "MiB", "KiB"};
  static const int shifts[] = {40, 30, 20, 10};
  for (int i = 0; i < 4; ++i) {
    const std::uint64_t unit = 1ULL << shifts[i];
    if (bytes >= unit && bytes % unit == 0) return std::to_string(bytes / unit) + units[i];
  }
  return std::to_string(bytes) + "B";
}

std::string format_threshold(std::uint64_t bytes) {
  return bytes == std::numeric_limits<std::uint64_t>::max() ? "max" : exact_size(bytes);
}

ReleaseThreshold::ReleaseThreshold(std::uint64_t bytes, std::string written)
    : bytes_(bytes), written_(std::move(written)) {}

ReleaseThreshold ReleaseThreshold::max() { return ReleaseThreshold(std::numeric_limits<std::uint64_t>::max()); }

bool ReleaseThreshold::is_max() const { return bytes_ == std::numeric_limits<std::uint64_t>::max(); }

std::string ReleaseThreshold::text() const { return is_max() || written_.empty() ? bytes_text() : written_; }

std::string ReleaseThreshold::bytes_text() const { return format_threshold(bytes_); }

}  // namespace cupool
