// The names of descriptors in custody, and the manifest: what the holder's buffers are, as a sealed
// memfd whose JSON carries a digest of itself.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <set>

#include "base/error.h"
#include "base/json_reader.h"
#include "base/sha256.h"
#include "base/text.h"
#include "custody/custody.h"
#include "custody/fields.h"
#include "protocol/protocol.h"

namespace cupool::custody {

namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kPartPrefix = "cupool-buffer.";
constexpr std::string_view kManifestPrefix = "cupool-manifest.";
constexpr std::size_t kMaxObjectName = 64;  // a buffer's or a pool's name
constexpr std::size_t kMaxUuid = 96;
constexpr std::uint32_t kRequiredSeals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW;

// Buffer and pool names, as the holder takes them: [a-z0-9][a-z0-9._-]*, at most 64 bytes.
bool valid_object_name(std::string_view s) {
  const auto alnum = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z'); };
  if (s.empty() || s.size() > kMaxObjectName || !alnum(s.front())) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return alnum(c) || c == '.' || c == '_' || c == '-'; });
}

// Decimal digits without a leading zero (but "0"), at most `max`: the number, else nullopt.
std::optional<std::uint64_t> parse_decimal(std::string_view s, std::uint64_t max) {
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (max - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

// "YYYY-MM-DDTHH:MM:SS[.fraction]Z", each field in its range.
bool iso_utc(std::string_view s) {
  if (s.size() < 20 || s.size() > 30 || s.back() != 'Z') return false;
  const char* shape = "dddd-dd-ddTdd:dd:dd";
  for (std::size_t i = 0; i < 19; ++i)
    if (shape[i] == 'd' ? (s[i] < '0' || s[i] > '9') : s[i] != shape[i]) return false;
  const auto num = [&](std::size_t at) { return (s[at] - '0') * 10 + (s[at + 1] - '0'); };
  if (num(5) < 1 || num(5) > 12 || num(8) < 1 || num(8) > 31 || num(11) > 23 || num(14) > 59 || num(17) > 60)
    return false;
  const std::string_view rest = s.substr(19, s.size() - 20);
  if (rest.empty()) return true;
  return rest.size() >= 2 && rest[0] == '.' &&
         std::all_of(rest.begin() + 1, rest.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The strict reader of one JSON object of a manifest, a visitor of its declaration (fields.h):
// every key it holds must be read, each value by its rule. Messages are "manifest NAME: PATH.KEY:
// what is wrong".
class ManifestReader {
 public:
  ManifestReader(const Json& object, std::string path, const std::string& subject)
      : object_(object), path_(std::move(path)), subject_(subject) {
    if (!object_.is_object()) fail(path_.empty() ? "the manifest is not a JSON object" : path_ + ": is not an object");
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(Errc::invalid_input, "manifest " + subject_ + ": " + what);
  }
  std::string where(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

  template <class T>
  void operator()(const char* key, T& v, Within range) {
    v = static_cast<T>(number(get(key), where(key), range.min, range.max));
  }
  void operator()(const char* key, std::string& v, ObjectName) {
    v = text(key);
    if (!valid_object_name(v))
      fail(where(key) + ": \"" + safe_for_display(utf8_prefix(v, 80)) +
           "\" is not a name ([a-z0-9][a-z0-9._-]*, at most 64 bytes)");
  }
  void operator()(const char* key, std::string& v, DeviceUuid) {
    v = text(key);
    const bool uuid_chars = std::all_of(v.begin(), v.end(), [](char c) {
      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '/';
    });
    if (!(starts_with(v, "GPU-") || starts_with(v, "MIG-")) || v.size() <= 4 || v.size() > kMaxUuid || !uuid_chars)
      fail(where(key) + ": \"" + safe_for_display(utf8_prefix(v, 100)) +
           "\" is not a device's UUID (GPU-... or MIG-..., at most 96 characters)");
  }
  void operator()(const char* key, std::string& v, const OneOf& rule) {
    v = text(key);
    if (std::find(rule.words.begin(), rule.words.end(), v) == rule.words.end())
      fail(where(key) + ": \"" + safe_for_display(utf8_prefix(v, 64)) + "\" is not " + list_or(rule.words));
  }
  void operator()(const char* key, std::string& v, UtcTime) {
    v = text(key);
    if (!iso_utc(v))
      fail(where(key) + ": \"" + safe_for_display(utf8_prefix(v, 40)) +
           "\" is not a UTC time in ISO 8601 (2025-01-31T12:00:00Z)");
  }
  void operator()(const char* key, std::vector<std::uint64_t>& v, Sizes rule) {
    const Json& j = get(key);
    if (!j.is_array() || j.empty() || j.size() > rule.max_count)
      fail(where(key) + ": must be an array of 1 to " + std::to_string(rule.max_count) + " sizes");
    v.clear();
    for (std::size_t i = 0; i < j.size(); ++i)
      v.push_back(number(j[i], where(key) + "[" + std::to_string(i) + "]", 1, UINT64_MAX));
  }
  void operator()(const char* key, Json& v, TensorIndex) {
    v = get(key);
    if (!v.is_null() && !v.is_object()) fail(where(key) + ": must be an object (a tensor index) or null");
  }
  void operator()(const char* key, std::vector<ManifestBuffer>& v, Buffers rule);
  // The one computed field, the manifest's version (version 2 arrives here renamed as 1).
  void computed(const char* key, int version) {
    const Json& j = get(key);
    if (!j.is_number_integer() || j.get<std::int64_t>() != version)
      fail("manifest version " + safe_for_display(utf8_prefix(j.dump(), 32)) +
           " is not supported (this holder reads versions 1 and 2)");
  }
  template <class Body>
  void object(const char* key, Body&& body) {
    ManifestReader sub(get(key), where(key), subject_);
    body(sub);
    sub.finish();
  }
  // Every key was read.
  void finish() const {
    for (const auto& item : object_.items())
      if (!read_.count(item.key()))
        fail((path_.empty() ? "" : path_ + ": ") + "unknown key \"" + safe_for_display(utf8_prefix(item.key(), 64)) +
             "\"");
  }

 private:
  const Json& get(const char* key) {
    read_.insert(key);
    const auto it = object_.find(key);
    if (it == object_.end()) fail(where(key) + ": missing");
    return *it;
  }
  std::uint64_t number(const Json& v, const std::string& at, std::uint64_t min, std::uint64_t max) const {
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
      fail(at + ": must be a non-negative integer");
    const auto n = v.get<std::uint64_t>();
    if (n < min || n > max)
      fail(at + ": " + std::to_string(n) + " is outside " + std::to_string(min) + ".." + std::to_string(max));
    return n;
  }
  std::string text(const char* key) {
    const Json& v = get(key);
    if (!v.is_string()) fail(where(key) + ": must be a string");
    return v.get<std::string>();
  }

  const Json& object_;
  std::string path_;
  const std::string& subject_;
  std::set<std::string> read_;
};

// One buffer of a manifest: its fields, then what they say together.
ManifestBuffer read_buffer(const Json& j, const std::string& path, const std::string& subject) {
  ManifestReader r(j, path, subject);
  ManifestBuffer b;
  fields(r, b);
  r.finish();
  std::uint64_t sum = 0;
  for (std::uint64_t p : b.parts) {
    if (p > UINT64_MAX - sum) r.fail(r.where("parts") + ": the sizes add up to more than 2^64-1 bytes");
    sum += p;
  }
  if (sum != b.size)
    r.fail(r.where("parts") + ": the parts add up to " + std::to_string(sum) + " bytes, not the size " +
           std::to_string(b.size));
  if (b.mapped.size() != b.parts.size())
    r.fail(r.where("mapped") + ": " + std::to_string(b.mapped.size()) + " sizes for " + std::to_string(b.parts.size()) +
           " parts");
  for (std::size_t i = 0; i < b.parts.size(); ++i)
    if (b.mapped[i] < b.parts[i])
      r.fail(r.where("mapped") + "[" + std::to_string(i) + "]: " + std::to_string(b.mapped[i]) +
             " bytes mapped for a part of " + std::to_string(b.parts[i]));
  return b;
}

void ManifestReader::operator()(const char* key, std::vector<ManifestBuffer>& v, Buffers rule) {
  const Json& buffers = get(key);
  if (!buffers.is_array() || buffers.size() > rule.max_count)
    fail(where(key) + ": must be an array of at most " + std::to_string(rule.max_count) + " buffers");
  std::set<std::string> names;
  std::size_t parts = 0;
  v.clear();
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const std::string path = where(key) + "[" + std::to_string(i) + "]";
    ManifestBuffer b = read_buffer(buffers[i], path, subject_);
    if (!names.insert(b.name).second) fail(path + ".name: the buffer " + b.name + " is listed twice");
    parts += b.parts.size();
    if (parts > rule.max_count)
      fail(where(key) + ": more than " + std::to_string(rule.max_count) +
           " parts in all (custody keeps at most that many)");
    v.push_back(std::move(b));
  }
}

[[noreturn]] void refuse(const std::string& fd_name, const std::string& what) {
  // A manifest says so; the node report's name says what it is.
  throw Error(Errc::invalid_input, (fd_name == kNodeFdName ? "" : "manifest ") + fd_name + ": " + what);
}

// The bytes of a sealed memfd of at most kMaxManifestBytes.
std::string read_sealed(int fd, const std::string& fd_name) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) refuse(fd_name, "can't be read: " + errno_text());
  if (!S_ISREG(st.st_mode)) refuse(fd_name, "is not a memfd (a sealed memfd is expected; this is not a file)");
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) refuse(fd_name, "is not a memfd (a sealed memfd is expected; this file can't be sealed)");
  if ((static_cast<std::uint32_t>(seals) & kRequiredSeals) != kRequiredSeals)
    refuse(fd_name,
           "is not sealed against writing (F_SEAL_WRITE, F_SEAL_SHRINK and F_SEAL_GROW): "
           "what it says could have changed after it was written");
  if (st.st_size <= 0) refuse(fd_name, "is empty");
  if (static_cast<std::uint64_t>(st.st_size) > kMaxManifestBytes)
    refuse(fd_name, "is " + std::to_string(st.st_size) + " bytes, more than the 64 MiB a manifest may be");
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::pread(fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) refuse(fd_name, "can't be read: " + (n < 0 ? errno_text() : std::string("it ended early")));
    got += static_cast<std::size_t>(n);
  }
  return text;
}

// `text` in a new memfd named `name`, sealed against any change.
Fd seal_text(const std::string& name, const std::string& text) {
  Fd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw Error(Errc::internal, name + ": memfd_create: " + errno_text());
  std::size_t put = 0;
  while (put < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + put, text.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(Errc::internal, name + ": writing the memfd: " + errno_text());
    put += static_cast<std::size_t>(n);
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, kRequiredSeals | F_SEAL_SEAL) != 0)
    throw Error(Errc::internal, name + ": sealing the memfd: " + errno_text());
  return fd;
}

// A sealed memfd's JSON object, its digest checked and removed.
Json read_sealed_json(int fd, const std::string& fd_name) {
  const std::string text = read_sealed(fd, fd_name);
  if (valid_utf8(text) != text) refuse(fd_name, "is not JSON (it is not valid UTF-8)");
  if (text.find('\0') != std::string::npos) refuse(fd_name, "is not JSON (it holds a NUL byte)");
  Json j;
  try {
    JsonLimits limits;
    limits.max_depth = 32;  // the manifest, a buffer, its tensor index and a tensor's shape
    j = read_json(text, limits);
  } catch (const JsonReadError& e) {
    refuse(fd_name, std::string("is not JSON: it ") + e.what());
  }
  if (!j.is_object()) refuse(fd_name, "is not a JSON object");
  return j;
}

}  // namespace

std::string iso_utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  if (!gmtime_r(&now, &utc)) return "1970-01-01T00:00:00Z";
  char text[40];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02dZ", utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday,
                utc.tm_hour, utc.tm_min, utc.tm_sec);
  return text;
}

bool valid_fd_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' || c == '_' ||
           c == '-';
  });
}

std::string part_fd_name(const std::string& buffer, std::size_t part) {
  return std::string(kPartPrefix) + buffer + "." + std::to_string(part);
}

std::string manifest_fd_name(std::uint64_t sequence) { return std::string(kManifestPrefix) + std::to_string(sequence); }

std::optional<std::pair<std::string, std::size_t>> parse_part_fd_name(const std::string& name) {
  if (!starts_with(name, kPartPrefix)) return std::nullopt;
  const std::string rest = name.substr(kPartPrefix.size());
  const std::size_t dot = rest.rfind('.');
  if (dot == std::string::npos) return std::nullopt;
  const auto part = parse_decimal(std::string_view(rest).substr(dot + 1), kMaxParts - 1);
  std::string buffer = rest.substr(0, dot);
  if (!part || !valid_object_name(buffer)) return std::nullopt;
  return std::make_pair(std::move(buffer), static_cast<std::size_t>(*part));
}

std::optional<std::uint64_t> parse_manifest_fd_name(const std::string& name) {
  if (!starts_with(name, kManifestPrefix)) return std::nullopt;
  return parse_decimal(std::string_view(name).substr(kManifestPrefix.size()), UINT64_MAX);
}

Json to_json(const Manifest& m) { return model::write_json(m); }

namespace {

// A buffer's names in manifest version 2 (docs/naming.md, "The manifest"), and in version 1.
constexpr std::pair<const char*, const char*> kVersion2Names[] = {{"size_bytes", "size"},
                                                                  {"part_sizes_bytes", "parts"},
                                                                  {"mapped_sizes_bytes", "mapped"},
                                                                  {"owner_uid", "owner"},
                                                                  {"tensor_index", "index"}};

// Renames each buffer's keys of one version to the other's (`to_v2`: 1 to 2), keeping their order;
// the rest is the same in both. Reading version 2, a buffer with a name of version 1 is refused:
// returns what is wrong ("" when nothing is).
std::string rename_buffers(Json& j, bool to_v2) {
  const auto buffers = j.is_object() ? j.find("buffers") : j.end();
  if (buffers == j.end() || !buffers->is_array()) return "";
  for (std::size_t k = 0; k < buffers->size(); ++k) {
    Json& b = (*buffers)[k];
    if (!b.is_object()) continue;
    Json renamed = Json::object();
    for (auto& [key, value] : b.items()) {
      std::string name = key;
      for (const auto& [v2, v1] : kVersion2Names) {
        if (!to_v2 && key == v1)
          return "buffers[" + std::to_string(k) + "]: \"" + v1 + "\" is version 1's name (version 2 says \"" + v2 +
                 "\")";
        if (key == (to_v2 ? v1 : v2)) name = to_v2 ? v2 : v1;
      }
      renamed[name] = std::move(value);
    }
    b = std::move(renamed);
  }
  return "";
}

}  // namespace

Json manifest_version2(const Manifest& m) {
  Json j = to_json(m);
  j["manifest"] = 2;
  rename_buffers(j, /*to_v2=*/true);
  return j;
}

std::string manifest_digest(const Json& body) {
  return "sha256:" + sha256_hex(body.dump(-1, ' ', false, Json::error_handler_t::strict));
}

Manifest manifest_from_json(const Json& written, const std::string& fd_name) {
  // Version 2 has the names of the rules; read as version 1's, whose reader checks every field.
  const auto version = written.is_object() ? written.find("manifest") : written.end();
  Json v1;
  const bool v2 = version != written.end() && *version == 2;
  if (v2) {
    v1 = written;
    v1["manifest"] = kManifestVersion;
    if (const std::string wrong = rename_buffers(v1, /*to_v2=*/false); !wrong.empty())
      ManifestReader(written, "", fd_name).fail(wrong);
  }
  const Json& j = v2 ? v1 : written;
  ManifestReader r(j, "", fd_name);
  Manifest m;
  fields(r, m);
  r.finish();
  if (const auto named = parse_manifest_fd_name(fd_name); named && *named != m.sequence)
    r.fail("it says it is sequence " + std::to_string(m.sequence) + ", its name says " + std::to_string(*named));
  return m;
}

Fd seal_manifest(const Manifest& m) {
  const std::string name = manifest_fd_name(m.sequence);
  Manifest stamped = m;
  if (stamped.written.empty()) stamped.written = iso_utc_now();
  Json j = to_json(stamped);
  try {
    (void)manifest_from_json(j, name);  // never write what a holder would refuse to read
  } catch (const Error& e) {
    throw Error(Errc::invalid_input, std::string("can't be written: ") + e.what());
  }
  j["digest"] = manifest_digest(j);
  return seal_text(name, j.dump(-1, ' ', false, Json::error_handler_t::strict));
}

Manifest open_manifest(int fd, const std::string& fd_name) {
  Json j = read_sealed_json(fd, fd_name);
  const auto digest = j.find("digest");
  if (digest == j.end() || !digest->is_string()) refuse(fd_name, "has no digest (\"digest\": \"sha256:...\")");
  const std::string claimed = digest->get<std::string>();
  j.erase("digest");
  if (manifest_digest(j) != claimed) {
    // Who wrote it, as it says (not verified: that is the point).
    Manifest said;
    model::Seen seen;
    model::read_json_lenient(j, said, seen);
    std::string by;
    if (seen.has(said.holder_pid)) by += "pid " + std::to_string(said.holder_pid);
    if (seen.has(said.written))
      by += (by.empty() ? "" : " ") + std::string("at ") + safe_for_display(utf8_prefix(said.written, 40));
    refuse(fd_name,
           "the digest does not match its contents" + (by.empty() ? std::string() : " (written by " + by + ")"));
  }
  return manifest_from_json(j, fd_name);
}

Fd seal_node(const KeptNode& node) {
  if (node.fingerprint.empty() || node.fingerprint.size() > 200 || !node.report.is_object())
    throw Error(Errc::invalid_input,
                std::string(kNodeFdName) + " can't be written: it needs a fingerprint and a report");
  Json j = Json::object();
  j["node"] = 1;
  j["fingerprint"] = node.fingerprint;
  j["written"] = node.written.empty() ? iso_utc_now() : node.written;
  j["report"] = node.report;
  j["digest"] = manifest_digest(j);
  return seal_text(kNodeFdName, j.dump(-1, ' ', false, Json::error_handler_t::strict));
}

KeptNode open_node(int fd) {
  Json j = read_sealed_json(fd, kNodeFdName);
  const auto digest = j.find("digest");
  if (digest == j.end() || !digest->is_string()) refuse(kNodeFdName, "has no digest (\"digest\": \"sha256:...\")");
  const std::string claimed = digest->get<std::string>();
  j.erase("digest");
  if (manifest_digest(j) != claimed) refuse(kNodeFdName, "the digest does not match its contents");
  const auto field = [&](const char* key) -> const Json& {
    const auto it = j.find(key);
    if (it == j.end()) refuse(kNodeFdName, std::string("has no \"") + key + "\"");
    return *it;
  };
  if (field("node") != 1) refuse(kNodeFdName, "is not version 1 (\"node\": 1)");
  const Json& fingerprint = field("fingerprint");
  const Json& written = field("written");
  if (!fingerprint.is_string() || fingerprint.get<std::string>().empty() || fingerprint.get<std::string>().size() > 200)
    refuse(kNodeFdName, "\"fingerprint\" must be a string of 1 to 200 characters");
  if (!written.is_string() || written.get<std::string>().size() > 40)
    refuse(kNodeFdName, "\"written\" must be a time (\"2025-01-31T12:00:00Z\")");
  if (!field("report").is_object()) refuse(kNodeFdName, "\"report\" must be an object");
  if (j.size() != 4) refuse(kNodeFdName, "has fields other than node, fingerprint, written and report");
  return KeptNode{fingerprint.get<std::string>(), j["report"], written.get<std::string>()};
}

}  // namespace cupool::custody
