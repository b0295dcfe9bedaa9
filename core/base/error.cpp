#include "base/error.h"

#include <iterator>

#include "cupool/client.h"

namespace cupool {

namespace {

using E = ExitCode;

// The table. Where two rows share a wire name or a C status, the first one stands for it when
// one is read back (errc_from_wire, errc_from_c_status).
// clang-format off
constexpr ErrcInfo kTable[] = {
    // errc                    wire                    C status                exit here            exit, from a holder
    {Errc::invalid_input,        "bad_request",          CUPOOL_E_INVALID,       E::invalid_input,      E::invalid_input},
    {Errc::invalid_config,       "invalid_config",       CUPOOL_E_INVALID,       E::invalid_input,      E::invalid_input},
    {Errc::does_not_fit,         "does_not_fit",         CUPOOL_E_INVALID,       E::does_not_fit,       E::does_not_fit},
    {Errc::cuda,                 "cuda_error",           CUPOOL_E_CUDA,          E::no_driver,          E::does_not_fit},
    {Errc::no_driver,            "cuda_error",           CUPOOL_E_CUDA,          E::no_driver,          E::does_not_fit},
    {Errc::unreachable,          "unreachable",          CUPOOL_E_UNREACHABLE,   E::holder_unreachable, E::holder_unreachable},
    {Errc::bad_frame,            "bad_frame",            CUPOOL_E_PROTOCOL,      E::holder_unreachable, E::holder_unreachable},
    {Errc::bad_request,          "bad_request",          CUPOOL_E_INVALID,       E::invalid_input,      E::invalid_input},
    {Errc::unknown_op,           "unknown_op",           CUPOOL_E_PROTOCOL,      E::holder_unreachable, E::holder_unreachable},
    {Errc::unsupported_protocol, "unsupported_protocol", CUPOOL_E_PROTOCOL,      E::holder_unreachable, E::holder_unreachable},
    {Errc::hello_required,       "hello_required",       CUPOOL_E_PROTOCOL,      E::holder_unreachable, E::holder_unreachable},
    {Errc::not_permitted,        "not_permitted",        CUPOOL_E_REFUSED,       E::holder_unreachable, E::holder_unreachable},
    {Errc::not_found,            "not_found",            CUPOOL_E_NOT_FOUND,     E::does_not_fit,       E::does_not_fit},
    {Errc::exists,               "exists",               CUPOOL_E_EXISTS,        E::does_not_fit,       E::does_not_fit},
    {Errc::quota_exceeded,       "quota_exceeded",       CUPOOL_E_QUOTA,         E::does_not_fit,       E::does_not_fit},
    {Errc::out_of_memory,        "out_of_memory",        CUPOOL_E_OUT_OF_MEMORY, E::does_not_fit,       E::does_not_fit},
    {Errc::limit_exceeded,       "limit_exceeded",       CUPOOL_E_BUSY,          E::holder_unreachable, E::holder_unreachable},
    {Errc::busy,                 "busy",                 CUPOOL_E_BUSY,          E::does_not_fit,       E::does_not_fit},
    {Errc::draining,             "draining",             CUPOOL_E_BUSY,          E::holder_unreachable, E::holder_unreachable},
    {Errc::internal,             "internal",             CUPOOL_E_INTERNAL,      E::does_not_fit,       E::does_not_fit},
};
// clang-format on

// Every code has its row, at its own index.
constexpr bool table_complete() {
  for (std::size_t i = 0; i < std::size(kTable); ++i)
    if (static_cast<std::size_t>(kTable[i].errc) != i) return false;
  return static_cast<std::size_t>(Errc::internal) + 1 == std::size(kTable);
}
static_assert(table_complete(), "kTable must list every Errc once, in the enum's order");

}  // namespace

const ErrcInfo& errc_info(Errc errc) { return kTable[static_cast<std::size_t>(errc)]; }

std::optional<Errc> errc_from_wire(std::string_view wire) {
  for (const ErrcInfo& row : kTable)
    if (wire == row.wire) return row.errc;
  return std::nullopt;
}

int c_status_of_wire(std::string_view wire) {
  const auto errc = errc_from_wire(wire);
  return errc ? errc_info(*errc).c_status : CUPOOL_E_PROTOCOL;
}

ExitCode exit_code_of_wire(std::string_view wire) {
  const auto errc = errc_from_wire(wire);
  return errc ? errc_info(*errc).exit_holder : ExitCode::does_not_fit;
}

Error Error::reported(std::string_view wire, const std::string& message) {
  return Error(errc_from_wire(wire).value_or(Errc::internal), message, Origin::holder);
}

Errc errc_from_c_status(int status) {
  for (const ErrcInfo& row : kTable)
    if (row.c_status == status) return row.errc;
  return Errc::internal;
}

}  // namespace cupool
