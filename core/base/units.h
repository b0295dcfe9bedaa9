// Byte sizes as written in config files and printed in reports.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cupool {

// Parses "32GiB", "1.5 MiB", "500MB", "4096B". Binary units (KiB..TiB) are powers of 1024,
// decimal units (KB..TB) powers of 1000. A bare number, an unknown unit, a negative value, a
// fraction of a byte or a value above 2^64-1 gives nullopt and `why` says what was wrong.
std::optional<std::uint64_t> parse_size(std::string_view text, std::string* why = nullptr);

// Parses "75%" (0 < p <= 100, decimals allowed) into a fraction of 1; nullopt if not a percentage.
std::optional<double> parse_percent(std::string_view text);

// "32 GiB", "1.5 MiB", "512 B": the largest binary unit that keeps the number >= 1.
std::string format_bytes(std::uint64_t bytes);

// A release threshold as a config writes it: "max" for 2^64-1 (the config's `max`), else
// exact_size ("0B", "512MiB"). The one spelling of a threshold in bytes, in every report.
std::string format_threshold(std::uint64_t bytes);

// "32GiB" when exact in a binary unit, else "<n>B": what a config file accepts and means exactly.
std::string exact_size(std::uint64_t bytes);

// Memory of a pool or of a device's graph memory, in bytes: now and the high-water marks (the
// driver's {RESERVED,USED}_MEM_{CURRENT,HIGH}). The device seam returns it and the model prints it
// (model::Usage), so neither needs the other.
struct MemoryUsage {
  std::uint64_t reserved_bytes = 0;
  std::uint64_t reserved_peak_bytes = 0;
  std::uint64_t used_bytes = 0;
  std::uint64_t used_peak_bytes = 0;
};

// The valid units, for messages.
extern const char* const kSizeUnitsHelp;

}  // namespace cupool
