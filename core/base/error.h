// Errors: one hierarchy, each error carrying a typed code (Errc). One table (error.cpp) maps every
// code to its name on the wire (docs/protocol.md), its status in the C API (include/cupool/client.h)
// and its exit code (README, --help); nothing else in cupool maps one to another.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

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

// What went wrong. The comment is the meaning; the table in error.cpp gives the rest.
enum class Errc {
  invalid_input,         // a bad command line, an unreadable or oversized file, a bad value
  invalid_config,        // the config file is not a valid config (it comes with findings)
  does_not_fit,          // the config does not fit the node (it comes with findings), or drift
  cuda,                  // a CUDA driver call failed
  no_driver,             // no usable NVIDIA driver or device in this process
  unreachable,           // no holder listens, or the connection to it was lost or can't be made
  bad_frame,             // a frame that breaks the protocol (docs/protocol.md)
  bad_request,           // a request with a missing, ill-typed or out-of-range argument
  unknown_op,            // a request for an operation the holder does not have
  unsupported_protocol,  // a protocol version the holder does not speak
  hello_required,        // a request before "hello"
  not_permitted,         // the peer may not do this (share lists, admin-only operations)
  not_found,             // no such pool, device, buffer or lease
  exists,                // a buffer of that name exists
  quota_exceeded,        // a pool's quota_per_client would be exceeded
  out_of_memory,         // the pool or the device has no room
  limit_exceeded,        // a connection, lease or descriptor limit of the holder
  busy,                  // the object is in use
  draining,              // the holder is stopping
  internal,              // a bug, or the host ran out of something
};

// One row of the table.
struct ErrcInfo {
  Errc errc;
  const char* wire;      // the error code on the wire ("not_found")
  int c_status;          // the cupool_status of the C API (CUPOOL_E_NOT_FOUND)
  ExitCode exit;         // the exit code when the error happens in the cupool process itself
  ExitCode exit_holder;  // the exit code when a holder reports it (a verb that asked the holder)
};

const ErrcInfo& errc_info(Errc errc);
// The code a wire name stands for (the first row that has it); nullopt for a name this version
// does not know.
std::optional<Errc> errc_from_wire(std::string_view wire);
// The C status of an error a holder reported; CUPOOL_E_PROTOCOL for a name this version does not know.
int c_status_of_wire(std::string_view wire);
// The exit code of an error a holder reported; does_not_fit for a name this version does not know.
ExitCode exit_code_of_wire(std::string_view wire);
// The code of a C status (the first row that has it); internal for an unknown status.
Errc errc_from_c_status(int status);

// Where an error happened: in this process, or in the holder that reported it.
enum class Origin { here, holder };

// An error with a plain-language message and its code.
class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message, Origin origin = Origin::here)
      : std::runtime_error(message), code_(code), origin_(origin) {}
  // An error a holder reported with `wire` as its code (an unknown code counts as internal).
  static Error reported(std::string_view wire, const std::string& message);
  Errc code() const noexcept { return code_; }
  Origin origin() const noexcept { return origin_; }
  const char* wire_code() const noexcept { return errc_info(code_).wire; }
  int c_status() const noexcept { return errc_info(code_).c_status; }
  ExitCode exit_code() const noexcept {
    return origin_ == Origin::here ? errc_info(code_).exit : errc_info(code_).exit_holder;
  }

 private:
  Errc code_;
  Origin origin_;
};

// Bad command line or unreadable input file (exit 2).
class InputError : public Error {
 public:
  explicit InputError(const std::string& message) : Error(Errc::invalid_input, message) {}
};

// No driver could be loaded, or it reports no usable device (exit 3).
class NoDriverError : public Error {
 public:
  explicit NoDriverError(const std::string& message) : Error(Errc::no_driver, message) {}
};

}  // namespace cupool
