// Every verb, registered in one place (main.cpp). Each verb file adds its subcommand and options
// to the app and returns the function that runs it; main() owns the exit codes.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "device/backend.h"

namespace cupool::cli {

// What main() builds at the edge and hands to verbs.
struct Context {
  // Makes the backend a verb asks for: the simulated node of `profile` when set, else the driver.
  std::function<std::unique_ptr<Backend>(const std::string& profile)> make_backend;
};

// Runs the verb; returns the exit code (an ExitCode value). Throws cupool::Error for failures.
using Runner = std::function<int(Context&)>;

Runner add_query(CLI::App& app);
Runner add_check(CLI::App& app);
Runner add_hold(CLI::App& app);
Runner add_exec(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_completion(CLI::App& app);
// The verbs that talk to a running holder (through include/cupool/client.h).
Runner add_status(CLI::App& app);
Runner add_stats(CLI::App& app);
Runner add_trim(CLI::App& app);
Runner add_plan(CLI::App& app);
Runner add_apply(CLI::App& app);
Runner add_export(CLI::App& app);
Runner add_buffer(CLI::App& app);

}  // namespace cupool::cli
