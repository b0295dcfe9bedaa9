// Usage errors in words: the nearest verb or option to a word the command line did not know
// (`cupool stauts`, `cupool query --formt json`), the one message style of every error the CLI
// prints (`cupool VERB: ...`), and where this binary's shipped files (node profiles) are, for hints.
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

// What walking a command line as CLI11 would found: the verbs it took and the first word it did
// not know.
struct Slip {
  enum class Kind { none, verb, option };
  std::vector<std::string> verbs;  // the verbs taken, outermost first: {"buffer", "create"}
  Kind kind = Kind::none;          // what the unknown word was taken for; none: every word is known
  std::string word;                // the unknown word ("stauts", "--formt", without "=value")
  std::string near;                // the nearest known verb or option; "" when none is near
};
Slip find_slip(const CLI::App& root, const std::vector<std::string>& args);

// "cupool buffer create: " for {"buffer", "create"}, "cupool: " for none: how every error line
// the CLI prints starts.
std::string error_prefix(const std::vector<std::string>& verbs);

// The verbs of `app` in --help's order, by name ("query, check, hold, ...").
std::string verb_list(const CLI::App& app);

// The message of a usage error, every line ending in a newline: `cupool: unknown verb "stauts" (did
// you mean "status"?)`, `cupool query: unknown option "--formt" (did you mean "--format"?)`, `cupool
// buffer: a verb is required (one of: ...)`, else CLI11's `message` after the prefix, then where to
// read more.
std::string usage_error(const CLI::App& root, const std::vector<std::string>& args, const std::string& message);

// The shipped file at `relative` (under the data folder, e.g. "configs/profiles/h100.yaml") as
// this binary can reach it: relative to the working directory when it is there (a checkout), else
// SHARE/cupool/relative beside the binary's prefix (`/proc/self/exe`: /usr/bin/cupool ->
// /usr/share/cupool/...), else in the checkout a build tree lies in (build/cupool -> ../relative);
// "" when none exists. `exe` is the binary's path ("" reads /proc/self/exe).
std::string shipped_file(const std::string& relative, const std::string& exe = "");

// The commented sample config that the package installs as /etc/cupool/cupool.yaml (the file the
// unit holds), as shipped: configs/systemd/cupool.yaml under the data folder.
inline constexpr const char* kSampleConfig = "configs/systemd/cupool.yaml";

// A verb's CONFIG that does not exist, in cupool's words: throws InputError naming the path (and,
// for a relative one, the directory it was looked for in) and what to do: copy the commented sample
// `sample` there (when "", the one shipped_file finds; none found: the examples), check it, and for
// `verb` "hold", start the holder again. Does nothing for "-" (standard input) or a path that
// exists; other failures to read are the reader's to say.
void require_config(const std::string& path, const std::string& verb, const std::string& sample = "");

}  // namespace cupool::cli
