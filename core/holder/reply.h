// What a request handler returns: the reply's fields and the descriptor that rides with it, or
// word that the reply comes later (the request waits for clients to drop cached blocks).
#pragma once

#include <nlohmann/json.hpp>
#include <utility>

#include "base/fd.h"

namespace cupool {

struct Reply {
  Reply() = default;
  // A reply of these fields (the server adds "id" and "ok") and no descriptor.
  Reply(nlohmann::ordered_json fields) : body(std::move(fields)) {}  // NOLINT(google-explicit-constructor)
  Reply(nlohmann::ordered_json fields, Fd descriptor) : body(std::move(fields)), fd(std::move(descriptor)) {}
  // The reply comes later, through Holder::on_deferred (docs/protocol.md, "Cached blocks").
  static Reply later() {
    Reply r;
    r.waits = true;
    return r;
  }

  nlohmann::ordered_json body;  // the reply's fields (null while it waits)
  Fd fd;                        // sent with the reply, then closed (none: -1)
  bool waits = false;           // the reply comes later, through on_deferred
};

}  // namespace cupool
