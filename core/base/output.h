// Output helpers: JSON <-> YAML, aligned tables, and the --format choice.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

// yaml-cpp is only named here (yaml_to_json): the files that use it include it, not every verb.
namespace YAML {
class Node;
}  // namespace YAML

namespace cupool {

enum class Format { table, json, yaml };

// Parses "table", "json", "yaml"; throws InputError otherwise.
Format parse_format(const std::string& text);

// The version of every verb's machine output (JSON and YAML), its first key "schema_version";
// schemas/cupool-VERB-v1.schema.json describes each verb's. Within a version fields are only added;
// removing, renaming or changing the meaning of one makes a new version.
inline constexpr int kOutputSchemaVersion = 1;

// `body` with "schema_version" first: what a verb prints with --format json or yaml.
nlohmann::ordered_json versioned(const nlohmann::ordered_json& body);

// Indented JSON; bytes that are not UTF-8 become U+FFFD instead of throwing.
std::string dump_json(const nlohmann::ordered_json& value);

// Block-style YAML for a JSON value (keys in the JSON object's order).
std::string to_yaml(const nlohmann::ordered_json& value);
// Converts a YAML tree to JSON: plain true/false/null and numbers become typed values,
// quoted scalars stay strings.
nlohmann::ordered_json yaml_to_json(const YAML::Node& node);

// Writes `text` to `path` so that a reader sees the old file or the new one, never a part: a
// temporary file beside it, flushed to disk, then renamed over it. Throws InputError naming the
// path and the reason; the temporary file is removed on failure.
void write_file_atomically(const std::string& path, const std::string& text);

// A table with a header row; columns padded to their widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header);
  void add(std::vector<std::string> row);
  std::string str(const std::string& indent = "") const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace cupool
