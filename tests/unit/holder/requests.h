// Requests to a Holder in unit tests, as a connection would make them (the reply's descriptor,
// if any, closed; a reply that waits for drops is a std::logic_error here: test::waits asks).
#pragma once

#include <stdexcept>
#include <string>

#include "base/error.h"
#include "holder/holder.h"

namespace cupool::test {

inline Json call(Holder& holder, std::uint64_t client, Json request, std::int64_t request_id = 1) {
  request["id"] = request_id;
  Reply out = holder.handle(client, request);
  if (out.waits) throw std::logic_error("the reply to " + request.dump() + " waits for drops");
  return std::move(out.body);
}

// Whether the request's reply waits for clients to drop cached blocks (Reply::later()).
inline bool waits(Holder& holder, std::uint64_t client, Json request, std::int64_t request_id = 1) {
  request["id"] = request_id;
  return holder.handle(client, request).waits;
}

// "ok", or the error code the request was refused with.
inline std::string error_code(Holder& holder, std::uint64_t client, Json request) {
  try {
    call(holder, client, std::move(request));
  } catch (const Error& e) {
    return e.wire_code();
  }
  return "ok";
}

}  // namespace cupool::test
