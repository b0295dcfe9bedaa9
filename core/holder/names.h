// How the holder writes what it holds: in plans, replies and exported configs. Shared by the files
// of holder/; not for other parts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/units.h"
#include "config/resolve.h"
#include "device/backend.h"
#include "protocol/messages.h"

namespace cupool {

// Pool and buffer names in requests: [a-z0-9][a-z0-9._-]*, at most kMaxName bytes.
constexpr std::size_t kMaxName = proto::kMaxName;
bool valid_name(const std::string& s);

// Seconds on the steady clock (uptimes, connection ages).
std::int64_t now_s();
// The time now, ISO 8601 UTC ("2026-11-27T09:00:00Z").
std::string iso_now();

// "device", "host" or "host_numa:<id>", as the config writes a location.
std::string location_text(const PoolProps& p);
// "[1, 2]".
std::string list_text(const std::vector<int>& v);

}  // namespace cupool
