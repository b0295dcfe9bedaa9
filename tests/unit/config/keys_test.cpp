#include "config/keys.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace cupool::config::keys_test {

// The names of the schema's object `name` ($defs; the top level for ""), its properties and its
// required ones.
struct SchemaObject {
  std::set<std::string> properties, required;
};

SchemaObject schema_object(const std::string& name) {
  std::ifstream in(std::string(CUPOOL_SOURCE_DIR) + "/schemas/cupool-config-v1.schema.json");
  REQUIRE(in);
  const nlohmann::json schema = nlohmann::json::parse(in);
  const nlohmann::json& object = name.empty() ? schema : schema.at("$defs").at(name);
  SchemaObject out;
  for (auto it = object.at("properties").begin(); it != object.at("properties").end(); ++it)
    out.properties.insert(it.key());
  if (object.contains("required"))
    for (const auto& r : object.at("required")) out.required.insert(r.get<std::string>());
  return out;
}

TEST_CASE("the config's keys are the config schema's properties") {
  for (const keys::Mapping* m : keys::kAll) {
    CAPTURE(m->schema);
    const SchemaObject s = schema_object(m->schema);
    CHECK(std::set<std::string>(m->known.begin(), m->known.end()) == s.properties);
    CHECK(std::set<std::string>(m->required.begin(), m->required.end()) == s.required);
    CHECK(m->known.size() == s.properties.size());  // no key twice
  }
}

TEST_CASE("the key that names a pool or a buffer is one each requires") {
  for (const keys::Mapping* m : {&keys::kPool, &keys::kBuffer}) {
    CAPTURE(m->schema);
    CHECK(std::find(m->required.begin(), m->required.end(), keys::kName) != m->required.end());
  }
}

}  // namespace cupool::config::keys_test
