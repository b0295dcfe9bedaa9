// "Did you mean": the nearest verb or option to a word the command line did not know, for the
// message of a usage error (`cupool quer`, `cupool query --formt json`).
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace cupool::cli {

// The candidate nearest to `word` by edit distance (insertions, deletions, substitutions and
// swaps of two neighbours), if it is near enough to be a slip: at most 1 edit for words of up to
// 4 characters, 2 up to 8, 3 beyond. Ties go to the first candidate. Empty when none is near.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

// Walks `args` (argv without the program) through `root` as CLI11 would and returns a hint for
// the first word it does not know: "did you mean 'query'?" for a verb, "did you mean '--format'?"
// for an option (the verb's own and, since they fall through, its parents'). Empty when every
// word is known or nothing is near.
std::string did_you_mean(const CLI::App& root, const std::vector<std::string>& args);

}  // namespace cupool::cli
