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

// A release threshold's bytes as a config writes them: "max" for 2^64-1 (the config's `max`), else
// exact_size ("0B", "512MiB"); ReleaseThreshold's bytes_text() and its text() when unwritten.
std::string format_threshold(std::uint64_t bytes);

// "32GiB" when exact in a binary unit, else "<n>B": what a config file accepts and means exactly.
std::string exact_size(std::uint64_t bytes);

// A pool's release threshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD): its bytes, UINT64_MAX being the
// config's max, and how a config wrote it ("75%", "8GiB", "max") when one did. The one value from
// the resolver to every report; a driver keeps only the bytes. Equal when the bytes are: "75%" and
// "48GiB" of a 64 GiB device are one threshold.
class ReleaseThreshold {
 public:
  ReleaseThreshold() = default;  // 0 bytes (the driver's default for a new pool), unwritten
  explicit ReleaseThreshold(std::uint64_t bytes, std::string written = {});
  // No limit (the config's max): UINT64_MAX bytes, unwritten.
  static ReleaseThreshold max();

  std::uint64_t bytes() const { return bytes_; }
  bool is_max() const;
  // As a config wrote it; "" when none did.
  const std::string& written() const { return written_; }
  // Its one spelling in reports: "max" for max, else as written, else bytes_text() ("0B", "8GiB").
  std::string text() const;
  // The bytes as a config would write them exactly, however this one was written: "max", "48GiB",
  // "536870913B" (format_threshold).
  std::string bytes_text() const;

  friend bool operator==(const ReleaseThreshold& a, const ReleaseThreshold& b) { return a.bytes_ == b.bytes_; }
  friend bool operator!=(const ReleaseThreshold& a, const ReleaseThreshold& b) { return a.bytes_ != b.bytes_; }

 private:
  std::uint64_t bytes_ = 0;
  std::string written_;
};

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
