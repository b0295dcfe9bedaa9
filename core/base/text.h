// Small string helpers shared by the parser, the checks and the renderers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cupool {

// Levenshtein distance (insert, delete, substitute each cost 1).
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` if it is close enough to be a likely typo, else "".
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

// The UTF-8 character at byte `at` of `s`: its length in bytes (its code point in `code_point`),
// or 0 when the bytes there are not valid UTF-8 (overlong forms and surrogates included).
std::size_t decode_utf8(std::string_view s, std::size_t at, std::uint32_t* code_point);

// `s` with every byte that is not part of valid UTF-8 replaced by U+FFFD, so that text taken
// from a file can go into JSON and YAML output.
std::string valid_utf8(std::string_view s);

// Whether a character shows as itself on a terminal: not a control character (C0, DEL, C1), a
// bidirectional formatting character (U+202E and friends), a line or paragraph separator or a BOM.
bool display_safe(std::uint32_t code_point);
// `s` is valid UTF-8 of display-safe characters only.
bool displays_as_is(std::string_view s);
// `s` with invalid bytes and characters that are not display-safe replaced by U+FFFD.
std::string safe_for_display(std::string_view s);

// The longest prefix of `s` of at most `max_bytes` bytes that ends at a character boundary.
std::string utf8_prefix(std::string_view s, std::size_t max_bytes);

std::string to_lower(std::string_view s);
bool starts_with(std::string_view s, std::string_view prefix);
bool iequals(std::string_view a, std::string_view b);
std::string join(const std::vector<std::string>& parts, std::string_view sep);

// strerror(errno) as a string: what the last failed system call said.
std::string errno_text();
// "a, b or c" for messages that list valid choices.
std::string list_or(const std::vector<std::string>& parts);

}  // namespace cupool
