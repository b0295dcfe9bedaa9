#include "base/error.h"

#include <doctest/doctest.h>

#include <set>
#include <string>

#include "cupool/client.h"

using namespace cupool;

TEST_CASE("every error code has one row: its wire name, C status and exit codes") {
  std::set<std::string> wires;
  for (int i = 0; i <= static_cast<int>(Errc::internal); ++i) {
    const auto errc = static_cast<Errc>(i);
    const ErrcInfo& row = errc_info(errc);
    CHECK(row.errc == errc);
    CHECK(std::string(row.wire).size() > 0);
    CHECK(std::string(cupool_status_name(row.c_status)) != "CUPOOL_E_UNKNOWN");
    CHECK(row.c_status != CUPOOL_OK);
    // A wire name reads back as a code with the same C status and the same exit code from a holder.
    const auto back = errc_from_wire(row.wire);
    REQUIRE(back);
    CHECK(errc_info(*back).c_status == row.c_status);
    CHECK(errc_info(*back).exit_holder == row.exit_holder);
    wires.insert(row.wire);
  }
  // The codes of docs/protocol.md.
  for (const char* w : {"bad_frame", "bad_request", "unknown_op", "unsupported_protocol", "hello_required",
                        "not_permitted", "not_found", "exists", "quota_exceeded", "out_of_memory", "limit_exceeded",
                        "busy", "draining", "invalid_config", "does_not_fit", "cuda_error", "internal"})
    CHECK(wires.count(w) == 1);
}

TEST_CASE("the exit codes of the interface") {
  CHECK(InputError("x").exit_code() == ExitCode::invalid_input);
  CHECK(NoDriverError("x").exit_code() == ExitCode::no_driver);
  CHECK(Error(Errc::cuda, "x").exit_code() == ExitCode::no_driver);
  CHECK(Error(Errc::does_not_fit, "x").exit_code() == ExitCode::does_not_fit);
  CHECK(Error(Errc::unreachable, "x").exit_code() == ExitCode::holder_unreachable);
  // What a holder reports: its driver failing is the holder's state (1), not a missing driver here (3).
  CHECK(Error::reported("cuda_error", "x").exit_code() == ExitCode::does_not_fit);
  CHECK(Error::reported("not_permitted", "x").exit_code() == ExitCode::holder_unreachable);
  CHECK(Error::reported("draining", "x").exit_code() == ExitCode::holder_unreachable);
  CHECK(Error::reported("bad_request", "x").exit_code() == ExitCode::invalid_input);
  CHECK(Error::reported("invalid_config", "x").exit_code() == ExitCode::invalid_input);
  // A valid file that does not fit exits 1 whether check or the holder judged it.
  CHECK(Error::reported("does_not_fit", "x").exit_code() == ExitCode::does_not_fit);
  CHECK(Error(Errc::does_not_fit, "x").exit_code() == ExitCode::does_not_fit);
  CHECK(Error::reported("not_found", "x").exit_code() == ExitCode::does_not_fit);
  // A code this version does not know.
  CHECK(Error::reported("something_new", "x").exit_code() == ExitCode::does_not_fit);
  CHECK(exit_code_of_wire("something_new") == ExitCode::does_not_fit);
}

TEST_CASE("C statuses") {
  CHECK(c_status_of_wire("not_permitted") == CUPOOL_E_REFUSED);
  CHECK(c_status_of_wire("limit_exceeded") == CUPOOL_E_BUSY);
  CHECK(c_status_of_wire("unreachable") == CUPOOL_E_UNREACHABLE);
  CHECK(c_status_of_wire("something_new") == CUPOOL_E_PROTOCOL);
  CHECK(Error(Errc::cuda, "x").c_status() == CUPOOL_E_CUDA);
  CHECK(NoDriverError("x").c_status() == CUPOOL_E_CUDA);
  CHECK(InputError("x").c_status() == CUPOOL_E_INVALID);
  CHECK(errc_from_c_status(CUPOOL_E_UNREACHABLE) == Errc::unreachable);
  CHECK(errc_from_c_status(CUPOOL_E_CUDA) == Errc::cuda);
  CHECK(errc_from_c_status(12345) == Errc::internal);
}
