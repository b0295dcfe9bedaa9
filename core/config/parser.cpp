#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "base/text.h"
#include "base/units.h"
#include "config/config.h"
#include "config/keys.h"

namespace cupool {

const char* const kDefaultSocket = "/run/cupool/cupool.sock";

std::uint64_t Threshold::resolve(std::uint64_t device_memory) const {
  switch (kind) {
    case Kind::bytes: return bytes;
    case Kind::max: return std::numeric_limits<std::uint64_t>::max();
    case Kind::percent: return static_cast<std::uint64_t>(static_cast<long double>(device_memory) * fraction);
  }
  return bytes;
}

std::uint32_t PoolSpec::handle_mask() const {
  std::uint32_t mask = 0;
  for (const auto& h : handle_types) mask |= static_cast<std::uint32_t>(h.value);
  return mask;
}

namespace {

Loc loc_of(const YAML::Node& n, Loc fallback = {}) {
  const YAML::Mark m = n.Mark();
  if (m.line < 0 || m.column < 0) return fallback;
  return Loc{m.line + 1, m.column + 1};
}

std::string hex_byte(unsigned char c) {
  static const char digits[] = "0123456789abcdef";
  return {digits[c >> 4], digits[c & 15]};
}

// A scalar written without quotes (YAML resolves its type) vs a quoted one (always a string).
bool is_plain(const YAML::Node& n) { return n.Tag() != "!"; }

const char* kind_name(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Null: return "nothing";
    default: return "a scalar";
  }
}

bool plain_digits(const YAML::Node& n) {
  if (!n.IsScalar() || !is_plain(n)) return false;
  const std::string& s = n.Scalar();
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
}

// Booleans are written true or false (yes/no/on/True are refused, as by the JSON schema).
std::optional<bool> plain_bool(const YAML::Node& n) {
  if (!n.IsScalar() || !is_plain(n)) return std::nullopt;
  const std::string& s = n.Scalar();
  if (s == "true") return true;
  if (s == "false") return false;
  return std::nullopt;
}

bool matches_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  auto lower_digit = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!lower_digit(s[0])) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return lower_digit(c) || c == '.' || c == '_' || c == '-'; });
}

// A pool's or buffer's name, looked at before its other keys so that messages can name it; "" when
// it has no valid one (its own finding comes with the rest).
std::string name_in(const YAML::Node& node) {
  const YAML::Node n = node[config::keys::kName];
  return n && n.IsScalar() && matches_name(n.Scalar()) ? n.Scalar() : std::string();
}

bool matches_account(const std::string& s) {
  if (s.empty() || s.size() > 32) return false;
  if (!((s[0] >= 'a' && s[0] <= 'z') || s[0] == '_')) return false;
  for (std::size_t i = 1; i < s.size(); ++i) {
    const char c = s[i];
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || (c == '$' && i + 1 == s.size());
    if (!ok) return false;
  }
  return true;
}

struct Field {
  YAML::Node value;
  Loc key_loc;
  Loc value_loc;
};

// Thrown by Parser::visit when a file expands to more values than a config can hold.
struct TooLarge {};

class Parser {
 public:
  explicit Parser(Diagnostics& d) : d_(d) {}

  Config parse(const YAML::Node& root) {
    Config c;
    if (!root.IsMap()) {
      d_.invalid("wrong-type", loc_of(root, {1, 1}),
                 std::string("a cupool config is a mapping with 'version: 1' at the top, found ") + kind_name(root),
                 "start the file with 'version: 1'");
      return c;
    }
    auto f = fields(root, "the config", config::keys::kTop.known, config::keys::kTop.required, {1, 1});
    if (auto* v = get(f, "version")) parse_version(*v, c);
    if (auto* v = get(f, "holder")) parse_holder(*v, c.holder);
    if (auto* v = get(f, "process")) parse_process(*v, c);
    if (auto* v = get(f, "pools")) {
      c.pools_loc = v->key_loc;
      if (auto items = list(*v, "pools", "a list of pools")) {
        if (items->size() > kMaxPools)
          d_.invalid("too-many", v->value_loc, "more than " + std::to_string(kMaxPools) + " pools");
        for (std::size_t i = 0; i < items->size() && i < kMaxPools; ++i) c.pools.push_back(parse_pool((*items)[i], i));
      }
    }
    if (auto* v = get(f, "buffers")) {
      c.buffers_loc = v->key_loc;
      if (auto items = list(*v, "buffers", "a list of buffers")) {
        if (items->size() > kMaxBuffers)
          d_.invalid("too-many", v->value_loc, "more than " + std::to_string(kMaxBuffers) + " buffers");
        for (std::size_t i = 0; i < items->size() && i < kMaxBuffers; ++i)
          c.buffers.push_back(parse_buffer((*items)[i], i));
      }
    }
    return c;
  }

 private:
  using Fields = std::map<std::string, Field>;

  // Reads a mapping's keys: reports unknown keys (with "did you mean"), duplicate keys and
  // missing required keys. `where` names the mapping in messages ("pool 'kv-cache'").
  Fields fields(const YAML::Node& map, const std::string& where, const std::vector<std::string>& known,
                const std::vector<std::string>& required, Loc map_loc) {
    Fields out;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node key = it->first;
      const Loc key_loc = loc_of(key, map_loc);
      visit(key_loc);
      if (!key.IsScalar()) {
        d_.invalid("wrong-type", key_loc, "keys in " + where + " must be plain words");
        continue;
      }
      const std::string& name = key.Scalar();
      if (std::find(known.begin(), known.end(), name) == known.end()) {
        const std::string guess = did_you_mean(name, known);
        d_.invalid(
            "unknown-key", key_loc, "unknown key '" + name + "' in " + where,
            (guess.empty() ? std::string() : "did you mean '" + guess + "'? ") + "valid keys: " + join(known, ", "));
        continue;
      }
      if (out.count(name)) {
        d_.invalid("duplicate-key", key_loc, "key '" + name + "' appears twice in " + where,
                   "the first is at line " + std::to_string(out[name].key_loc.line) + "; keep one");
        continue;
      }
      out[name] = Field{it->second, key_loc, loc_of(it->second, key_loc)};
    }
    for (const auto& r : required)
      if (!out.count(r)) d_.invalid("missing-key", map_loc, where + " needs '" + r + "'");
    return out;
  }

  // Counts one value read. YAML aliases repeat what they name, so a few KiB of nested aliases can
  // stand for billions of values: past kMaxValues the file is refused, and reading stops.
  void visit(Loc loc) {
    if (++visited_ <= kMaxValues) return;
    d_.invalid("too-large", loc,
               "the file expands to more than " + std::to_string(kMaxValues) +
                   " values (YAML aliases repeat what they name); a config this big is not a config",
               "write the values out, or use fewer and smaller aliases");
    throw TooLarge{};
  }

  static const Field* get(const Fields& f, const std::string& key) {
    auto it = f.find(key);
    return it == f.end() ? nullptr : &it->second;
  }

  bool expect_map(const Field& f, const std::string& what, const std::string& example) {
    if (f.value.IsMap()) return true;
    d_.invalid("wrong-type", f.value_loc, what + " must be a mapping, found " + kind_name(f.value), example);
    return false;
  }

  std::optional<YAML::Node> list(const Field& f, const std::string& what, const std::string& expected) {
    if (!f.value.IsSequence()) {
      d_.invalid("wrong-type", f.value_loc, "'" + what + "' must be " + expected + ", found " + kind_name(f.value));
      return std::nullopt;
    }
    if (f.value.size() == 0) {
      d_.invalid("empty-list", f.value_loc, "'" + what + "' is an empty list",
                 "remove the key, or list at least one item");
      return std::nullopt;
    }
    return f.value;
  }

  std::optional<std::string> scalar(const Field& f, const std::string& what) {
    if (!f.value.IsScalar()) {
      d_.invalid("wrong-type", f.value_loc, "'" + what + "' must be a single value, found " + kind_name(f.value));
      return std::nullopt;
    }
    return f.value.Scalar();
  }

  void parse_version(const Field& f, Config& c) {
    c.version.loc = f.value_loc;
    if (!plain_digits(f.value)) {
      d_.invalid("wrong-type", f.value_loc, "'version' must be the number 1", "write 'version: 1'");
      return;
    }
    if (f.value.Scalar() != "1") {
      d_.invalid("unsupported-version", f.value_loc,
                 "config version " + f.value.Scalar() + " is not supported; this cupool reads version 1",
                 "write 'version: 1'");
      return;
    }
    c.version.value = 1;
    c.version.set = true;
  }

  void parse_holder(const Field& f, HolderSpec& h) {
    h.loc = f.key_loc;
    if (!expect_map(f, "'holder'", "e.g. holder: {socket: /run/cupool/cupool.sock, mode: \"0660\", group: gpu}"))
      return;
    auto fs = fields(f.value, "'holder'", config::keys::kHolder.known, config::keys::kHolder.required, f.value_loc);
    if (auto* v = get(fs, "socket")) {
      if (auto s = scalar(*v, "socket")) {
        if (s->empty() || (*s)[0] != '/') {
          d_.invalid("invalid-value", v->value_loc, "socket '" + *s + "' is not an absolute path",
                     std::string("e.g. socket: ") + kDefaultSocket);
        } else if (s->size() > 107) {
          d_.invalid("invalid-value", v->value_loc,
                     "socket path is " + std::to_string(s->size()) + " bytes; a Unix socket path holds at most 107");
        } else if (const auto bad = std::find_if(
                       s->begin(), s->end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
                   bad != s->end()) {
          // A NUL would end the path the kernel sees early; other control bytes are never wanted.
          d_.invalid("invalid-value", v->value_loc,
                     "socket path holds a control character (byte " + std::to_string(bad - s->begin()) + " is 0x" +
                         hex_byte(static_cast<unsigned char>(*bad)) + ")",
                     std::string("write a plain path, e.g. socket: ") + kDefaultSocket);
        } else {
          h.socket = {*s, v->value_loc, true};
        }
      }
    }
    if (auto* v = get(fs, "mode")) {
      if (auto s = scalar(*v, "mode")) {
        const bool octal = (s->size() == 3 || (s->size() == 4 && (*s)[0] == '0')) &&
                           std::all_of(s->begin(), s->end(), [](char c) { return c >= '0' && c <= '7'; });
        if (is_plain(v->value)) {
          d_.invalid("wrong-type", v->value_loc, "mode must be a quoted string of octal digits",
                     "write mode: \"" + *s + "\" (unquoted, YAML may read " + *s + " as a number)");
        } else if (!octal) {
          d_.invalid("invalid-value", v->value_loc, "mode \"" + *s + "\" is not an octal file mode",
                     "e.g. mode: \"0660\" (owner and group read-write)");
        } else {
          h.mode = {static_cast<unsigned>(std::stoul(*s, nullptr, 8)), v->value_loc, true};
        }
      }
    }
    if (auto* v = get(fs, "group")) {
      if (auto s = scalar(*v, "group")) {
        if (!matches_account(*s) || plain_digits(v->value))
          d_.invalid("invalid-value", v->value_loc, "'" + *s + "' is not a group name",
                     "a group name is lower-case letters, digits, '_' and '-', starting with a letter or '_'");
        else
          h.group = {*s, v->value_loc, true};
      }
    }
  }

  void parse_process(const Field& f, Config& c) {
    ProcessSpec p;
    p.loc = f.key_loc;
    p.devices.all = true;
    if (!expect_map(f, "'process'", "e.g. process: {devices: all, default_pool: {release_threshold: max}}")) {
      c.process = p;
      return;
    }
    auto fs = fields(f.value, "'process'", config::keys::kProcess.known, config::keys::kProcess.required, f.value_loc);
    if (auto* v = get(fs, "devices")) p.devices = device_list(*v, "devices");
    if (auto* v = get(fs, "default_pool")) {
      DefaultPoolSpec dp;
      dp.loc = v->key_loc;
      if (expect_map(*v, "'default_pool'", "e.g. default_pool: {release_threshold: max}")) {
        auto dfs = fields(v->value, "'default_pool'", config::keys::kDefaultPool.known,
                          config::keys::kDefaultPool.required, v->value_loc);
        if (auto* t = get(dfs, "release_threshold")) dp.release_threshold = threshold(*t);
        if (auto* r = get(dfs, "reuse")) dp.reuse = reuse(*r);
        if (auto* a = get(dfs, "access")) dp.access = device_list(*a, "access");
      }
      p.default_pool = dp;
    }
    if (auto* v = get(fs, "current_pool")) {
      CurrentPoolSpec cp;
      cp.loc = v->key_loc;
      if (expect_map(*v, "'current_pool'", "e.g. current_pool: {release_threshold: max, max_size: 16GiB}")) {
        auto cfs = fields(v->value, "'current_pool'", config::keys::kCurrentPool.known,
                          config::keys::kCurrentPool.required, v->value_loc);
        if (auto* t = get(cfs, "max_size")) cp.max_size = size(*t, "max_size");
        if (auto* t = get(cfs, "release_threshold")) cp.release_threshold = threshold(*t);
        if (auto* t = get(cfs, "reserve")) cp.reserve = size(*t, "reserve");
        if (auto* r = get(cfs, "reuse")) cp.reuse = reuse(*r);
        if (auto* a = get(cfs, "access")) cp.access = device_list(*a, "access");
      }
      p.current_pool = cp;
    }
    if (auto* v = get(fs, "budget")) p.budget = threshold(*v, "budget", false);
    c.process = p;
  }

  PoolSpec parse_pool(const YAML::Node& node, std::size_t index) {
    PoolSpec p;
    p.loc = loc_of(node);
    std::string where = "pool #" + std::to_string(index + 1);
    if (!node.IsMap()) {
      d_.invalid("wrong-type", p.loc, where + " must be a mapping, found " + kind_name(node),
                 "e.g. - {name: kv-cache, devices: [0], release_threshold: max}");
      return p;
    }
    // Name the pool in messages as soon as its name is known.
    if (const std::string n = name_in(node); !n.empty()) where = "pool '" + n + "'";
    auto fs = fields(node, where, config::keys::kPool.known, config::keys::kPool.required, p.loc);
    if (auto* v = get(fs, "name")) p.name = name(*v, "pool");
    if (auto* v = get(fs, "devices")) p.devices = device_list(*v, "devices");
    if (auto* v = get(fs, "location")) p.location = location(*v);
    if (auto* v = get(fs, "alloc_type")) {
      if (auto s = scalar(*v, "alloc_type")) {
        if (*s == "pinned")
          p.alloc_type = {AllocType::pinned, v->value_loc, true};
        else if (*s == "managed")
          p.alloc_type = {AllocType::managed, v->value_loc, true};
        else
          bad_choice(*v, "alloc_type", *s, {"pinned", "managed"});
      }
    }
    if (auto* v = get(fs, "handle_types")) {
      p.handle_types_loc = v->value_loc;
      p.handle_types = handle_types(*v);
    }
    if (auto* v = get(fs, "max_size")) p.max_size = size(*v, "max_size");
    if (auto* v = get(fs, "release_threshold")) p.release_threshold = threshold(*v);
    if (auto* v = get(fs, "reserve")) p.reserve = size(*v, "reserve");
    if (auto* v = get(fs, "reuse")) p.reuse = reuse(*v);
    if (auto* v = get(fs, "access")) p.access = device_list(*v, "access");
    if (auto* v = get(fs, "share")) p.share = share(*v);
    return p;
  }

  BufferSpec parse_buffer(const YAML::Node& node, std::size_t index) {
    BufferSpec b;
    b.loc = loc_of(node);
    std::string where = "buffer #" + std::to_string(index + 1);
    if (!node.IsMap()) {
      d_.invalid("wrong-type", b.loc, where + " must be a mapping, found " + kind_name(node),
                 "e.g. - {name: weights, pool: kv-cache, device: 0, size: 10GiB}");
      return b;
    }
    if (const std::string n = name_in(node); !n.empty()) where = "buffer '" + n + "'";
    auto fs = fields(node, where, config::keys::kBuffer.known, config::keys::kBuffer.required, b.loc);
    if (auto* v = get(fs, "name")) b.name = name(*v, "buffer");
    if (auto* v = get(fs, "pool")) b.pool = name(*v, "pool");
    if (auto* v = get(fs, "device")) {
      if (v->value.IsScalar() && is_plain(v->value) && v->value.Scalar() == "all") {
        d_.invalid("invalid-value", v->value_loc, "a buffer lives on one device, not 'all'", "e.g. device: 0");
      } else if (v->value.IsScalar()) {
        if (auto sel = selector(v->value, v->value_loc)) b.device = {*sel, v->value_loc, true};
      } else {
        d_.invalid("wrong-type", v->value_loc, "'device' must be one device, found " + std::string(kind_name(v->value)),
                   "e.g. device: 0");
      }
    }
    if (auto* v = get(fs, "size")) b.size = size(*v, "size");
    return b;
  }

  At<std::string> name(const Field& f, const std::string& what) {
    At<std::string> out;
    auto s = scalar(f, what == "pool" ? "name" : what);
    if (!s) return out;
    if (!matches_name(*s) || plain_digits(f.value)) {
      d_.invalid("invalid-value", f.value_loc, "'" + *s + "' is not a valid " + what + " name",
                 "a name is lower-case letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64 "
                 "characters" +
                     std::string(plain_digits(f.value) ? "; a name of digits only must be quoted" : ""));
      return out;
    }
    return {*s, f.value_loc, true};
  }

  std::optional<DeviceSelector> selector(const YAML::Node& n, Loc loc) {
    if (!n.IsScalar()) {
      d_.invalid("wrong-type", loc,
                 std::string("a device must be an index, a GPU UUID or a PCI bus id, found ") + kind_name(n));
      return std::nullopt;
    }
    const std::string& s = n.Scalar();
    const bool digits = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c)) != 0;
    });
    if (digits && !is_plain(n)) {
      d_.invalid("wrong-type", loc, "device \"" + s + "\" is quoted; a device index is a number",
                 "write " + s + " without quotes");
      return std::nullopt;
    }
    if (digits) {
      const std::size_t first = std::min(s.find_first_not_of('0'), s.size() - 1);
      if (s.size() - first > 4) {
        d_.invalid("invalid-value", loc, "device index " + s + " is out of range", "a device index is 0 to 9999");
        return std::nullopt;
      }
      return parse_device_selector(s.substr(first));
    }
    std::string why;
    auto sel = parse_device_selector(s, &why);
    if (!sel) d_.invalid("invalid-value", loc, "'" + s + "' is not a device", why);
    return sel;
  }

  DeviceList device_list(const Field& f, const std::string& what) {
    DeviceList out;
    out.loc = f.value_loc;
    if (f.value.IsScalar() && is_plain(f.value) && f.value.Scalar() == "all") {
      out.all = true;
      return out;
    }
    if (f.value.IsScalar()) {
      d_.invalid("wrong-type", f.value_loc, "'" + what + "' must be 'all' or a list of devices",
                 "e.g. " + what + ": [0, 1] (a single device is written [" + f.value.Scalar() + "])");
      return out;
    }
    auto items = list(f, what, "'all' or a list of devices");
    if (!items) return out;
    for (const auto& item : *items) {
      const Loc loc = loc_of(item, f.value_loc);
      visit(loc);
      if (item.IsScalar() && is_plain(item) && item.Scalar() == "all") {
        out.all = true;
        continue;
      }
      if (auto sel = selector(item, loc)) out.items.push_back({*sel, loc, true});
    }
    return out;
  }

  At<PoolLocation> location(const Field& f) {
    At<PoolLocation> out;
    auto s = scalar(f, "location");
    if (!s) return out;
    if (*s == "device") return {PoolLocation{PoolLocation::Kind::device, -1}, f.value_loc, true};
    if (*s == "host") return {PoolLocation{PoolLocation::Kind::host, -1}, f.value_loc, true};
    if (starts_with(*s, "host_numa:")) {
      const std::string id = s->substr(10);
      if (!id.empty() && id.size() <= 6 &&
          std::all_of(id.begin(), id.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }))
        return {PoolLocation{PoolLocation::Kind::host_numa, std::stoi(id)}, f.value_loc, true};
      d_.invalid("invalid-value", f.value_loc, "location '" + *s + "' needs a host NUMA node id",
                 "e.g. location: host_numa:0 (see 'cupool query' for the node's NUMA nodes)");
      return out;
    }
    bad_choice(f, "location", *s, {"device", "host", "host_numa:<id>"});
    return out;
  }

  void bad_choice(const Field& f, const std::string& key, const std::string& value,
                  const std::vector<std::string>& choices) {
    const std::string guess = did_you_mean(value, choices);
    d_.invalid("invalid-value", f.value_loc, "'" + value + "' is not a valid " + key,
               (guess.empty() ? std::string() : "did you mean '" + guess + "'? ") + "valid: " + list_or(choices));
  }

  std::vector<At<HandleType>> handle_types(const Field& f) {
    std::vector<At<HandleType>> out;
    auto items = list(f, "handle_types", "a list of handle types, e.g. [posix_fd]");
    if (!items) return out;
    std::set<std::string> seen;
    Loc none_loc;
    for (const auto& item : *items) {
      const Loc loc = loc_of(item, f.value_loc);
      visit(loc);
      if (!item.IsScalar()) {
        d_.invalid("wrong-type", loc, std::string("a handle type must be a word, found ") + kind_name(item));
        continue;
      }
      const std::string s = item.Scalar();
      HandleType t;
      if (s == "none")
        t = HandleType::none;
      else if (s == "posix_fd")
        t = HandleType::posix_fd;
      else if (s == "fabric")
        t = HandleType::fabric;
      else {
        const std::string guess = did_you_mean(s, {"none", "posix_fd", "fabric"});
        d_.invalid(
            "invalid-value", loc, "'" + s + "' is not a handle type",
            (guess.empty() ? std::string() : "did you mean '" + guess + "'? ") + "valid: none, posix_fd or fabric");
        continue;
      }
      if (!seen.insert(s).second) {
        d_.invalid("duplicate-item", loc, "handle type '" + s + "' is listed twice");
        continue;
      }
      if (t == HandleType::none) none_loc = loc;
      out.push_back({t, loc, true});
    }
    if (none_loc.line && out.size() > 1)
      d_.invalid("invalid-value", none_loc, "'none' cannot be combined with other handle types",
                 "list the IPC handle types you need, or [none] for no IPC");
    return out;
  }

  At<std::uint64_t> size(const Field& f, const std::string& key) {
    At<std::uint64_t> out;
    auto s = scalar(f, key);
    if (!s) return out;
    std::string why;
    if (plain_digits(f.value)) {
      d_.invalid("bare-number", f.value_loc, key + ": " + *s + " has no unit",
                 "a size needs a unit: e.g. " + *s + "B, or 16GiB (" + kSizeUnitsHelp + ")");
      return out;
    }
    auto bytes = parse_size(*s, &why);
    if (!bytes) {
      d_.invalid("invalid-size", f.value_loc, key + ": '" + *s + "' is not a size", why);
      return out;
    }
    return {*bytes, f.value_loc, true};
  }

  // A size or a percentage of device memory under `key`, and with `allow_max` the word max.
  At<Threshold> threshold(const Field& f, const std::string& key = "release_threshold", bool allow_max = true) {
    At<Threshold> out;
    auto s = scalar(f, key);
    if (!s) return out;
    Threshold t;
    t.text = *s;
    const std::string forms = allow_max ? "a size, a percentage or max" : "a size or a percentage";
    if (*s == "max" && allow_max) {
      t.kind = Threshold::Kind::max;
      return {t, f.value_loc, true};
    }
    if (!s->empty() && s->back() == '%') {
      auto fraction = parse_percent(*s);
      if (!fraction) {
        d_.invalid("invalid-value", f.value_loc, key + ": '" + *s + "' is not a percentage between 0 and 100",
                   "e.g. 75% (of the device's memory)");
        return out;
      }
      t.kind = Threshold::Kind::percent;
      t.fraction = *fraction;
      return {t, f.value_loc, true};
    }
    if (plain_digits(f.value)) {
      d_.invalid("bare-number", f.value_loc, key + ": " + *s + " has no unit",
                 std::string("write a size (e.g. 16GiB), a percentage of device memory (e.g. 75%)") +
                     (allow_max ? " or max" : ""));
      return out;
    }
    std::string why;
    auto bytes = parse_size(*s, &why);
    if (!bytes) {
      d_.invalid("invalid-size", f.value_loc, key + ": '" + *s + "' is not " + forms,
                 why + "; or a percentage of device memory (75%)" + (allow_max ? ", or max" : ""));
      return out;
    }
    t.kind = Threshold::Kind::bytes;
    t.bytes = *bytes;
    return {t, f.value_loc, true};
  }

  At<bool> flag(const Field& f, const std::string& key) {
    auto b = plain_bool(f.value);
    if (!b) {
      d_.invalid("wrong-type", f.value_loc,
                 key + " must be true or false" + (f.value.IsScalar() ? ", not '" + f.value.Scalar() + "'" : ""),
                 "write true or false");
      return {};
    }
    return {*b, f.value_loc, true};
  }

  std::optional<Reuse> reuse(const Field& f) {
    if (!expect_map(f, "'reuse'", "e.g. reuse: {follow_event_dependencies: true, allow_opportunistic: true}"))
      return std::nullopt;
    Reuse r;
    r.loc = f.value_loc;
    if (f.value.size() == 0) {
      d_.invalid("empty-map", f.value_loc, "'reuse' is empty",
                 "remove it, or set follow_event_dependencies, allow_opportunistic or allow_internal_dependencies");
      return std::nullopt;
    }
    auto fs = fields(f.value, "'reuse'", config::keys::kReuse.known, config::keys::kReuse.required, f.value_loc);
    if (auto* v = get(fs, "follow_event_dependencies"))
      r.follow_event_dependencies = flag(*v, "follow_event_dependencies");
    if (auto* v = get(fs, "allow_opportunistic")) r.allow_opportunistic = flag(*v, "allow_opportunistic");
    if (auto* v = get(fs, "allow_internal_dependencies"))
      r.allow_internal_dependencies = flag(*v, "allow_internal_dependencies");
    return r;
  }

  std::vector<At<std::string>> accounts(const Field& f, const std::string& key) {
    std::vector<At<std::string>> out;
    auto items = list(f, key, "a list of names");
    if (!items) return out;
    for (const auto& item : *items) {
      const Loc loc = loc_of(item, f.value_loc);
      visit(loc);
      if (!item.IsScalar() || !matches_account(item.Scalar())) {
        d_.invalid("invalid-value", loc,
                   (item.IsScalar() ? "'" + item.Scalar() + "'" : std::string(kind_name(item))) + " is not a " +
                       (key == "users" ? "user" : "group") + " name",
                   "lower-case letters, digits, '_' and '-', starting with a letter or '_'");
        continue;
      }
      out.push_back({item.Scalar(), loc, true});
    }
    return out;
  }

  std::optional<Share> share(const Field& f) {
    if (!expect_map(f, "'share'", "e.g. share: {users: [svc-infer], groups: [gpu], quota_per_client: 16GiB}"))
      return std::nullopt;
    Share s;
    s.loc = f.key_loc;
    if (f.value.size() == 0) {
      d_.invalid("empty-map", f.value_loc, "'share' is empty", "name users or groups that may use the pool");
      return std::nullopt;
    }
    auto fs = fields(f.value, "'share'", config::keys::kShare.known, config::keys::kShare.required, f.value_loc);
    if (auto* v = get(fs, "users")) s.users = accounts(*v, "users");
    if (auto* v = get(fs, "groups")) s.groups = accounts(*v, "groups");
    if (auto* v = get(fs, "quota_per_client")) s.quota_per_client = size(*v, "quota_per_client");
    return s;
  }

  Diagnostics& d_;
  std::size_t visited_ = 0;
};

// Flow collections nested deeper than `limit` are refused before yaml-cpp sees them (its
// recursive parser has no depth limit of its own).
bool nesting_within(const std::string& text, int limit, Loc* where) {
  int depth = 0, line = 1, col = 0;
  char quote = 0;
  char prev = '\n';  // the last character that was not a space
  char last = '\n';  // the previous character
  bool comment = false;
  for (char c : text) {
    const char raw_before = last;
    last = c;
    ++col;
    if (c == '\n') {
      ++line;
      col = 0;
      comment = false;
    }
    if (comment) continue;
    if (quote) {
      if (c == quote) quote = 0;
      continue;
    }
    const char before = prev;
    if (c != ' ' && c != '\t') prev = c;
    // A quote opens a quoted scalar only where a value starts; an apostrophe inside a word doesn't.
    const bool value_start =
        before == '\n' || before == ':' || before == '[' || before == '{' || before == ',' || before == '-';
    if (c == '#' && (raw_before == ' ' || raw_before == '\t' || raw_before == '\n'))
      comment = true;
    else if ((c == '"' || c == '\'') && value_start)
      quote = c;
    else if (c == '[' || c == '{') {
      if (++depth > limit) {
        *where = {line, col};
        return false;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return true;
}

// Events of no interest: has_second_document only asks whether the parser finds a document.
class IgnoreEvents : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// Whether the stream holds a second document. It asks for two documents and no more: on some
// malformed streams yaml-cpp's LoadAll makes documents without end (measured: 24 GB before the
// OOM killer, tests/fuzz/regressions/config/loadall-runaway.yaml). A malformed second
// document throws YAML::Exception like any other syntax error.
bool has_second_document(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  IgnoreEvents ignore;
  return parser.HandleNextDocument(ignore) && parser.HandleNextDocument(ignore);
}

// Where the second document of a YAML stream starts: its "---" line (the first one may open the
// first document).
Loc second_document_marker(const std::string& text) {
  int line = 0, markers = 0, content_lines = 0;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view l(text.data() + start, end - start);
    ++line;
    const bool marker = l.substr(0, 3) == "---" && (l.size() == 3 || l[3] == ' ' || l[3] == '\t' || l[3] == '\r');
    if (marker && (++markers > 1 || content_lines > 0)) return Loc{line, 1};
    if (!marker && !l.empty() && l[0] != '#' && l.find_first_not_of(" \t\r") != std::string_view::npos) ++content_lines;
    start = end + 1;
  }
  return {};
}

}  // namespace

Config parse_config(const SourceFile& file, Diagnostics& diags) {
  Loc deep;
  if (!nesting_within(file.text(), kMaxNesting, &deep)) {
    diags.invalid("too-deep", deep, "lists and mappings nested more than " + std::to_string(kMaxNesting) + " deep");
    return {};
  }
  YAML::Node root;
  try {
    root = YAML::Load(file.text());
    if (has_second_document(file.text())) {
      // A second document would be ignored: say so rather than apply half of what was written.
      diags.invalid("multiple-documents", second_document_marker(file.text()),
                    "the file holds more than one YAML document; a config is one document",
                    "remove the '---' line and merge the documents, or keep each config in its own file");
      return {};
    }
  } catch (const YAML::Exception& e) {
    Loc loc{e.mark.line + 1, e.mark.column + 1};
    if (e.mark.line < 0) loc = {};
    diags.invalid("yaml-syntax", loc, "invalid YAML: " + e.msg);
    return {};
  }
  if (!root || root.IsNull()) {
    diags.invalid("empty-file", {}, "the file is empty", "a config starts with 'version: 1'");
    return {};
  }
  try {
    return Parser(diags).parse(root);
  } catch (const TooLarge&) {
    return {};
  } catch (const YAML::Exception& e) {
    diags.invalid("yaml-syntax", {e.mark.line + 1, e.mark.column + 1}, "invalid YAML: " + e.msg);
    return {};
  }
}

}  // namespace cupool
