// The config file's keys, declared once: each mapping's keys as the parser knows them (in the
// order of docs/config.md) and those it requires. The parser takes its lists from here (a finding's
// "did you mean" too), and tests/unit/config/keys_test.cpp holds each against the properties of
// schemas/cupool-config-v1.schema.json. They are YAML keys, read with their line and column, so not
// the model's JSON declarations (core/model/fields.h).
#pragma once

#include <string>
#include <vector>

namespace cupool::config::keys {

struct Mapping {
  const char* schema;  // the schema's $defs object with these properties; "" for the top level
  std::vector<std::string> known;
  std::vector<std::string> required;
};

inline const Mapping kTop{"", {"version", "holder", "process", "pools", "buffers"}, {"version"}};
inline const Mapping kHolder{"holder", {"socket", "mode", "group"}, {}};
inline const Mapping kProcess{"process", {"devices", "default_pool", "current_pool", "budget"}, {}};
inline const Mapping kDefaultPool{"defaultPool", {"release_threshold", "reuse", "access"}, {}};
inline const Mapping kCurrentPool{"currentPool", {"max_size", "release_threshold", "reserve", "reuse", "access"}, {}};
inline const Mapping kPool{"pool",
                           {"name", "devices", "location", "alloc_type", "handle_types", "max_size",
                            "release_threshold", "reserve", "reuse", "access", "share"},
                           {"name", "devices"}};
inline const Mapping kBuffer{"buffer", {"name", "pool", "device", "size"}, {"name", "pool", "device", "size"}};
inline const Mapping kReuse{
    "reuse", {"follow_event_dependencies", "allow_opportunistic", "allow_internal_dependencies"}, {}};
inline const Mapping kShare{"share", {"users", "groups", "quota_per_client"}, {}};

// The key that names a pool or a buffer (a finding names it by its name as soon as it has one).
inline constexpr const char* kName = "name";

// Every mapping above, for the test against the schema.
inline const std::vector<const Mapping*> kAll = {&kTop,  &kHolder, &kProcess, &kDefaultPool, &kCurrentPool,
                                                 &kPool, &kBuffer, &kReuse,   &kShare};

}  // namespace cupool::config::keys
