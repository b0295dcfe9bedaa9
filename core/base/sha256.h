// SHA-256 (FIPS 180-4), for digests of what cupool writes and reads back (the custody manifest).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cupool {

class Sha256 {
 public:
  Sha256();
  // Adds bytes to the message.
  void update(std::string_view bytes);
  // The digest of everything added; the object is spent (call nothing more on it).
  std::array<std::uint8_t, 32> finish();

 private:
  void block(const std::uint8_t* p);

  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> buffer_{};
  std::size_t buffered_ = 0;
  std::uint64_t length_ = 0;  // bytes added
};

// The digest of `bytes` as 64 lower-case hex digits.
std::string sha256_hex(std::string_view bytes);

}  // namespace cupool
