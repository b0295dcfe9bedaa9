#include "base/output.h"

#include <fcntl.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "base/error.h"
#include "base/text.h"

namespace cupool {

using json = nlohmann::ordered_json;

Format parse_format(const std::string& text) {
  if (text == "table") return Format::table;
  if (text == "json") return Format::json;
  if (text == "yaml") return Format::yaml;
  throw InputError("unknown format '" + text + "': use table, json or yaml");
}

namespace {

// Whether a YAML reader could take the plain scalar `s` for something other than a string: a
// boolean or null of YAML 1.1 or 1.2 in any case (yes, On, TRUE, ~), a number of either (1_000,
// 0x1f, 1:20, .inf, -.NaN, 1e3), a YAML 1.1 timestamp (2026-11-21T20:50:06Z), or the merge and
// value keys. Such strings are written quoted; quoting one more than needed costs nothing.
bool looks_typed(const std::string& s) {
  if (s.empty()) return true;
  static const char* const kWords[] = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~", "<<", "="};
  std::string lower(s);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* w : kWords)
    if (lower == w) return true;
  // Numbers and timestamps start with a digit, a sign or a dot (.5, .inf, .nan).
  const char first = s[0];
  return std::isdigit(static_cast<unsigned char>(first)) || first == '+' || first == '-' || first == '.';
}

void emit(YAML::Emitter& out, const json& v) {
  switch (v.type()) {
    case json::value_t::object:
      out << YAML::BeginMap;
      for (auto it = v.begin(); it != v.end(); ++it) {
        out << YAML::Key << it.key() << YAML::Value;
        emit(out, it.value());
      }
      out << YAML::EndMap;
      break;
    case json::value_t::array: {
      // Short lists of scalars read best on one line.
      const bool flat =
          std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_primitive(); }) && v.size() <= 16;
      if (flat) out << YAML::Flow;
      out << YAML::BeginSeq;
      for (const auto& e : v) emit(out, e);
      out << YAML::EndSeq;
      break;
    }
    case json::value_t::string: {
      const std::string s = v.get<std::string>();
      if (looks_typed(s)) out << YAML::DoubleQuoted;
      out << s;
      break;
    }
    case json::value_t::boolean: out << (v.get<bool>() ? "true" : "false"); break;
    case json::value_t::null: out << YAML::Null; break;
    case json::value_t::number_unsigned: out << v.get<std::uint64_t>(); break;
    case json::value_t::number_integer: out << v.get<std::int64_t>(); break;
    case json::value_t::number_float: out << v.get<double>(); break;
    default: out << YAML::Null;
  }
}

bool plain_integer(const std::string& s) {
  std::size_t i = (!s.empty() && s[0] == '-') ? 1 : 0;
  if (i >= s.size() || s.size() > 20) return false;
  for (; i < s.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

}  // namespace

json versioned(const json& body) {
  json out = json::object();
  out["schema_version"] = kOutputSchemaVersion;
  if (body.is_object())
    for (auto it = body.begin(); it != body.end(); ++it)
      if (it.key() != "schema_version") out[it.key()] = it.value();
  return out;
}

std::string dump_json(const json& value) { return value.dump(2, ' ', false, json::error_handler_t::replace); }

std::string to_yaml(const json& value) {
  YAML::Emitter out;
  out.SetIndent(2);
  emit(out, value);
  return std::string(out.c_str()) + "\n";
}

json yaml_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      json j = json::object();
      for (const auto& kv : node) j[kv.first.as<std::string>()] = yaml_to_json(kv.second);
      return j;
    }
    case YAML::NodeType::Sequence: {
      json j = json::array();
      for (const auto& e : node) j.push_back(yaml_to_json(e));
      return j;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = node.Scalar();
      if (node.Tag() == "!") return s;  // quoted
      if (s == "true") return true;
      if (s == "false") return false;
      if (s == "null" || s == "~") return nullptr;
      if (plain_integer(s)) {
        try {
          if (s[0] == '-') return std::stoll(s);
          return std::stoull(s);
        } catch (const std::out_of_range&) {
          return s;
        }
      }
      return s;
    }
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return nullptr;
  }
  return nullptr;
}

Table::Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }

void Table::add(std::vector<std::string> row) {
  // Cells can carry text from elsewhere (a client's name, a file's path): a terminal shows it as
  // text, never as a control sequence or a reordering of the line.
  for (auto& cell : row)
    if (!displays_as_is(cell)) cell = safe_for_display(cell);
  rows_.push_back(std::move(row));
}

std::string Table::str(const std::string& indent) const {
  std::vector<std::size_t> width;
  for (const auto& row : rows_) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::ostringstream out;
  for (const auto& row : rows_) {
    std::string line = indent;
    for (std::size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  }
  return out.str();
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const auto fail = [&](const char* what) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return InputError("cannot write '" + path + "': " + what + ": " + std::strerror(err));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError("cannot write '" + path + "': " + std::strerror(errno));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      throw fail("write");
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    throw fail("fsync");
  }
  if (::close(fd) != 0) throw fail("close");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw fail("rename");
}

}  // namespace cupool
