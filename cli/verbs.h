// Every verb, registered in one place (main.cpp). Each verb file adds its subcommand and options
// to the app and returns the function that runs it; main() owns the exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>

#include "device/backend.h"
#include "model/model.h"

namespace cupool::cli {

// What main() builds at the edge and hands to verbs.
struct Context {
  // Makes the backend a verb asks for: the simulated node of `profile` when set, else the driver.
  std::function<std::unique_ptr<Backend>(const std::string& profile)> make_backend;
};

// Runs the verb; returns the exit code (an ExitCode value). Throws cupool::Error for failures.
using Runner = std::function<int(Context&)>;

// A verb: its subcommand (with its options) and what runs it.
struct Verb {
  CLI::App* command = nullptr;
  Runner run;
};

Verb add_query(CLI::App& app);
Verb add_check(CLI::App& app);
Verb add_hold(CLI::App& app);
Verb add_exec(CLI::App& app);
Verb add_bench(CLI::App& app);
// `cupool bench`'s report for people: the settings, a row per case (microseconds), the ratios.
std::string render_bench_table(const model::BenchReport& report);
Verb add_completion(CLI::App& app);
// The command line's own documentation: 'cupool help [VERB...]' (what --help prints) and 'cupool
// man' (the manual page, through man on a terminal). Both are in cli/completion.cpp.
Verb add_help(CLI::App& app);
Verb add_man(CLI::App& app);
// The verbs that talk to a running holder (through include/cupool/client.h).
Verb add_status(CLI::App& app);
Verb add_stats(CLI::App& app);
Verb add_ledger(CLI::App& app);
Verb add_trim(CLI::App& app);
Verb add_plan(CLI::App& app);
Verb add_apply(CLI::App& app);
Verb add_export(CLI::App& app);
Verb add_buffer(CLI::App& app);
Verb add_exporter(CLI::App& app);
// The keeper of the holder's descriptors (custody/keeper.h); --list and --release ask a running one.
Verb add_keeper(CLI::App& app);

// cuFile writes cufile.log into the working directory unless CUFILE_LOGFILE_PATH says where. Before
// a verb that may load cuFile (query --deep, buffer load), points it at a place cupool owns: the
// directory of the keeper's default socket (/run/cupool for root, $XDG_RUNTIME_DIR/cupool for
// others, made when missing), or /dev/null where that can't be had. A CUFILE_LOGFILE_PATH of the
// user's is left alone. Returns where the log goes (main.cpp). `dir`: the directory to use instead
// (tests).
std::string place_cufile_log(const std::string& dir = "");

// Where execvp would find `command`: a name with a slash as it is, else the first executable
// regular file of that name in $PATH; "" when there is none (exec.cpp).
std::string resolve_command(const std::string& command);

}  // namespace cupool::cli
