// Options that several verbs share, defined once so their names, help and environment twins agree.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace cupool::cli {

// --format/-o table|json|yaml.
inline CLI::Option* add_format_option(CLI::App* sub, std::string& format) {
  return sub->add_option("--format,-o", format, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}))
      ->capture_default_str();
}

// --profile/-p FILE, twin CUPOOL_PROFILE: answer from a recorded node instead of the driver.
inline CLI::Option* add_profile_option(CLI::App* sub, std::string& profile, const std::string& what) {
  return sub->add_option("--profile,-p", profile, what + " this recorded node profile instead of the driver")
      ->envname("CUPOOL_PROFILE");
}

}  // namespace cupool::cli
