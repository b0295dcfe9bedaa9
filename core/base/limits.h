// Bounds that several parts of cupool must agree on, so that what one part makes another accepts.
#pragma once

#include <cstddef>

namespace cupool {

// Allocations (parts) of one held buffer: what a client's buffer_create may ask for, what
// `buffer load` lays a tensor set out in, what the holder makes, and what a custody manifest
// records and a new holder adopts. (A buffer of more parts once switched custody off for every
// buffer: the manifest took fewer than the holder made.)
inline constexpr std::size_t kMaxBufferParts = 1024;

}  // namespace cupool
