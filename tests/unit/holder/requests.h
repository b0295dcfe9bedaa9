// Requests to a Holder in unit tests, as a connection would make them (the reply's descriptor,
// if any, closed).
#pragma once

#include <unistd.h>

#include <string>

#include "base/error.h"
#include "holder/holder.h"

namespace cupool::test {

inline Json call(Holder& holder, std::uint64_t client, Json request, std::int64_t request_id = 1) {
  request["id"] = request_id;
  int fd = -1;
  Json out = holder.handle(client, request, fd);
  if (fd >= 0) ::close(fd);
  return out;
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
