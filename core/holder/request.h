// One request being served, as the request table hands it to its handler (holder/*_requests.h),
// and the checks every handler may make of who sent it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "holder/client_table.h"
#include "protocol/protocol.h"

namespace cupool {

using Json = nlohmann::ordered_json;

// One request being served: its connection and its arguments.
struct Request {
  std::uint64_t id;        // the connection's
  const Json& request_id;  // the request's "id", for a deferred reply
  HeldClient& client;
  proto::Args& args;
  const std::string& op;
};

// Throws not_permitted unless `c` is an admin (root or the holder's user); `op` names what it asked.
void require_admin(const HeldClient& c, const char* op);
// Throws draining while the holder stops (`draining`): no new `op` requests.
void require_not_draining(bool draining, const char* op);

}  // namespace cupool
