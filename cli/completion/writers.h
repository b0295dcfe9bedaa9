// The writers, one file each (bash.cpp, zsh.cpp, fish.cpp, man.cpp): each turns the model of the
// command line (cli/completion/model.h) into the completion script of its shell, or the manual
// page, for the program named `prog`.
#pragma once

#include <string>

#include "cli/completion/model.h"

namespace cupool::cli::completion {

// The bash script: a fixed walker, fed by generated lookup functions keyed by the command path.
std::string bash_script(const Command& root, const std::string& prog);

// The zsh script: one _arguments function per command; commands with subcommands dispatch on the
// next word.
std::string zsh_script(const Command& root, const std::string& prog);

// The fish script: a walker finds the command path; one `complete` line per subcommand, option and
// positional.
std::string fish_script(const Command& root, const std::string& prog);

// The manual page PROG(1) in roff (man macros): the program, a section per command with its
// examples, global options, exit status, environment and files. `version` goes into the .TH line
// in place of a date, so the page depends on the definition alone.
std::string man_page(const Command& root, const std::string& prog, const std::string& version);

}  // namespace cupool::cli::completion
