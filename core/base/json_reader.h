// Untrusted JSON read in one pass, its bounds checked as it is read: the holder's requests and
// the headers of tensor files. nlohmann's own parser builds an ordered_json by looking each key
// up in the object so far (a linear search: the cost grows with the square of the key count; a
// 1 MiB request of 111,845 keys took 13 s) and lets a later duplicate key replace an earlier one.
// This reader appends each key, refuses a duplicate by an ordered set (no chosen keys make it slow), and stops at the
// first value past a bound, before building anything more.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>

namespace cupool {

struct JsonLimits {
  std::size_t max_depth = 8;            // nested arrays and objects (the outermost is depth 1)
  std::size_t max_keys = SIZE_MAX;      // keys of any one object
  const char* too_many_keys = nullptr;  // the message past max_keys (default: "has an object of more than N keys")
};

// What is wrong with the text, as a predicate for the caller's subject ("the payload " + what()):
// "is not valid JSON (at byte N: ...)", "nests deeper than N levels", "has an object of more than
// N keys", "has the key "k" twice in one object".
class JsonReadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The JSON value of `text` (keys in the order they came); throws JsonReadError.
nlohmann::ordered_json read_json(std::string_view text, const JsonLimits& limits);

}  // namespace cupool
