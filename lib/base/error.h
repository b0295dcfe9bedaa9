// Errors that reach `main`, each carrying the documented exit code.
#pragma once

#include <stdexcept>
#include <string>

namespace cupool {

// The exit codes are part of the interface (README, --help). Only main() turns them into a status.
enum class ExitCode : int {
  ok = 0,                  // success, warnings allowed
  does_not_fit = 1,        // the config does not fit the node / drift found
  invalid_input = 2,       // usage, YAML or schema error
  no_driver = 3,           // no usable driver or device
  holder_unreachable = 4,  // the holder is unreachable or refused
  interrupted = 130,
};

// An error with a plain-language message and the exit code it maps to.
class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const noexcept { return code_; }

 private:
  ExitCode code_;
};

// Bad command line or unreadable input file (exit 2).
class InputError : public Error {
 public:
  explicit InputError(const std::string& message) : Error(ExitCode::invalid_input, message) {}
};

// No driver could be loaded, or it reports no usable device (exit 3).
class NoDriverError : public Error {
 public:
  explicit NoDriverError(const std::string& message) : Error(ExitCode::no_driver, message) {}
};

}  // namespace cupool
