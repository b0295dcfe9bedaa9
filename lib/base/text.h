// Small string helpers shared by the parser, the checks and the renderers.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace cupool {

// Levenshtein distance (insert, delete, substitute each cost 1).
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` if it is close enough to be a likely typo, else "".
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

// `s` with every byte that is not part of valid UTF-8 replaced by U+FFFD, so that text taken
// from a file can go into JSON and YAML output.
std::string valid_utf8(std::string_view s);

std::string to_lower(std::string_view s);
bool starts_with(std::string_view s, std::string_view prefix);
bool iequals(std::string_view a, std::string_view b);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
// "a, b or c" for messages that list valid choices.
std::string list_or(const std::vector<std::string>& parts);

}  // namespace cupool
