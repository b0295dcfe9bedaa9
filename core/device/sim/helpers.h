// Helpers the simulated node's files share (device/sim/). Not for use outside them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>

#include "device/sim_backend.h"

namespace cupool::sim {

// Rounds up to a multiple of `granule`, saturating instead of wrapping near 2^64.
inline std::uint64_t round_up(std::uint64_t bytes, std::uint64_t granule) {
  const std::uint64_t rest = bytes % granule;
  if (rest == 0) return bytes;
  return bytes > UINT64_MAX - (granule - rest) ? UINT64_MAX : bytes + (granule - rest);
}

constexpr std::uint8_t kExportMagic[10] = {'C', 'U', 'P', 'O', 'O', 'L', 'S', 'I', 'M', '1'};
constexpr std::uint8_t kEventMagic[10] = {'C', 'U', 'P', 'O', 'O', 'L', 'E', 'V', 'T', '1'};
constexpr std::uint8_t kExportedMagic[10] = {'C', 'U', 'P', 'O', 'O', 'L', 'V', 'M', 'M', '1'};
constexpr std::uint64_t kExportedPage = 4096;  // what follows an exported allocation's bytes

inline void put_u64(Blob64& blob, std::size_t at, std::uint64_t value) {
  for (std::size_t i = 0; i < 8; ++i) blob[at + i] = static_cast<std::uint8_t>(value >> (8 * i));
}
inline std::uint64_t get_u64(const Blob64& blob, std::size_t at) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < 8; ++i) value |= static_cast<std::uint64_t>(blob[at + i]) << (8 * i);
  return value;
}
inline bool has_magic(const Blob64& blob, const std::uint8_t (&magic)[10]) {
  return std::equal(std::begin(magic), std::end(magic), blob.begin());
}

inline CudaError invalid_value(const char* api, const std::string& why) {
  return CudaError(api, 1, "CUDA_ERROR_INVALID_VALUE", why);
}
inline CudaError system_error(const char* api, const char* call, int code, const char* error_name) {
  return CudaError(api, cuda_error_code(error_name), error_name, std::string(call) + ": " + std::strerror(code));
}

}  // namespace cupool::sim
