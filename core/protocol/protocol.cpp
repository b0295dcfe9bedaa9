#include "protocol/protocol.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <system_error>

#include "base/json_reader.h"
#include "base/text.h"

namespace cupool::proto {

namespace {

void put16(std::string& out, std::uint16_t v) {
  out.push_back(static_cast<char>(v & 0xff));
  out.push_back(static_cast<char>(v >> 8));
}
void put32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint16_t get16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }
std::uint32_t get32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

[[noreturn]] void bad_frame(const std::string& why) { throw Error(Errc::bad_frame, why); }
[[noreturn]] void bad_request(const std::string& why) { throw Error(Errc::bad_request, why); }

}  // namespace

namespace {
void put_header(std::string& out, Kind kind, std::size_t length, std::uint32_t fds) {
  out.append(reinterpret_cast<const char*>(kMagic), 4);
  put16(out, kVersion);
  put16(out, static_cast<std::uint16_t>(kind));
  put32(out, static_cast<std::uint32_t>(length));
  put32(out, fds);
}
}  // namespace

std::string encode(Kind kind, const Json& body, std::uint32_t fds) {
  const std::string payload = body.dump(-1, ' ', false, Json::error_handler_t::replace);
  const bool may_split = (kind == Kind::reply || kind == Kind::request) && fds == 0;
  const std::size_t limit = !may_split ? kMaxPayload : kind == Kind::reply ? kMaxReply : kMaxRequest;
  if (payload.size() > limit)
    throw Error(kind == Kind::request ? Errc::bad_request : Errc::internal,
                std::string("a ") + (kind == Kind::request ? "request" : "reply") + " of " +
                    std::to_string(payload.size()) + " bytes exceeds the protocol's limit of " + std::to_string(limit));
  // Frames of equal length (give or take a byte): none is shorter than kMinPayload.
  const std::size_t frames = (payload.size() + kMaxPayload - 1) / kMaxPayload;
  std::string out;
  out.reserve(frames * kHeaderSize + payload.size());
  std::size_t at = 0;
  for (std::size_t i = 0; i < frames; ++i) {
    const std::size_t end = payload.size() * (i + 1) / frames;
    const bool last = i + 1 == frames;
    put_header(out, last ? kind : Kind::part, end - at, last ? fds : 0);
    out.append(payload, at, end - at);
    at = end;
  }
  return out;
}

Header decode_header(const std::uint8_t* bytes, Kind expect, bool request_fds) {
  if (std::memcmp(bytes, kMagic, 4) != 0) bad_frame("the frame does not start with the magic bytes \"CUPL\"");
  Header h;
  h.version = get16(bytes + 4);
  if (h.version != kVersion)
    bad_frame("frame version " + std::to_string(h.version) + " is not supported (this holder speaks version 1)");
  const std::uint16_t kind = get16(bytes + 6);
  const bool ok = kind == 4 || (expect == Kind::request ? kind == 1 : (kind == 2 || kind == 3));
  if (!ok) bad_frame("unexpected frame kind " + std::to_string(kind));
  h.kind = static_cast<Kind>(kind);
  h.length = get32(bytes + 8);
  if (h.length < kMinPayload || h.length > kMaxPayload)
    bad_frame("payload length " + std::to_string(h.length) + " is outside 2..65536");
  h.fds = get32(bytes + 12);
  if ((expect == Kind::request && !request_fds) || h.kind == Kind::part ? h.fds != 0 : h.fds > 1)
    bad_frame("a frame may not carry " + std::to_string(h.fds) + " file descriptors");
  return h;
}

Json parse_payload(std::string_view payload) {
  if (valid_utf8(payload) != payload) bad_frame("the payload is not valid UTF-8");
  // JSON text never holds a raw NUL (strings escape it as \u0000), and a parser may take one for
  // the end of its input: "{...}\0junk" would pass as "{...}".
  if (payload.find('\0') != std::string_view::npos) bad_frame("the payload holds a NUL byte");
  // Requests are flat; deep nesting only costs stack (in parsing and in destruction). Keys are
  // read in linear time and a key twice in one object is refused (base/json_reader.h).
  Json j;
  try {
    JsonLimits limits;
    limits.max_depth = kMaxDepth;
    j = read_json(payload, limits);
  } catch (const JsonReadError& e) {
    bad_frame(std::string("the payload ") + e.what());
  }
  if (!j.is_object()) bad_frame("the payload is not a JSON object");
  return j;
}

std::size_t FrameDecoder::feed(const char* data, std::size_t size) {
  std::size_t used = 0;
  while (used < size && !ready_) {
    if (have_ < kHeaderSize) {
      const std::size_t n = std::min(kHeaderSize - have_, size - used);
      std::memcpy(header_bytes_ + have_, data + used, n);
      have_ += n;
      used += n;
      if (have_ == kHeaderSize) {
        header_ = decode_header(header_bytes_, expect_, request_fds_);
        payload_.reserve(header_.length);
      }
      continue;
    }
    const std::size_t n = std::min(static_cast<std::size_t>(header_.length) - payload_.size(), size - used);
    payload_.append(data + used, n);
    used += n;
    if (payload_.size() == header_.length) ready_ = true;
  }
  return used;
}

std::pair<Header, std::string> FrameDecoder::take() {
  std::pair<Header, std::string> out{header_, std::move(payload_)};
  payload_.clear();
  have_ = 0;
  ready_ = false;
  return out;
}

// ---- the names of protocol 4 ----

namespace {

struct Rename {
  Message message;
  const char* op;        // the request's or reply's op, or the notice
  const char* parent;    // "" for a top-level field, else the object it is in ("limits")
  const char* old_name;  // protocols 1 to 3
  const char* new_name;  // protocol 4 (docs/naming.md)
  bool milliseconds;     // the old value is milliseconds, the new one seconds
};

// Every field protocol 4 renamed. What `cupool` prints (status, stats, trim, list, plan,
// buffer_tensors, buffer_create's and buffer_remove's replies) has the new names on every version.
constexpr Rename kRenames[] = {
    {Message::request, "alloc", "", "size", "size_bytes", false},
    {Message::request, "buffer_create", "", "size", "size_bytes", false},
    {Message::request, "buffer_create", "", "parts", "part_sizes_bytes", false},
    {Message::request, "trim", "", "keep", "keep_bytes", false},
    {Message::reply, "hello", "", "holder", "version", false},
    {Message::reply, "hello", "limits", "max_payload", "max_payload_bytes", false},
    {Message::reply, "hello", "limits", "max_reply", "max_reply_bytes", false},
    {Message::reply, "hello", "limits", "max_request", "max_request_bytes", false},
    {Message::reply, "hello", "limits", "max_leases", "max_lease_count", false},
    {Message::reply, "hello", "limits", "max_open_buffers", "max_open_buffer_count", false},
    {Message::reply, "hello", "limits", "frame_timeout_ms", "frame_timeout_seconds", true},
    {Message::reply, "hello", "limits", "drop_timeout_ms", "drop_timeout_seconds", true},
    {Message::reply, "alloc", "", "size", "size_bytes", false},
    {Message::reply, "free", "", "size", "size_bytes", false},
    {Message::reply, "reuse", "", "size", "size_bytes", false},
    {Message::reply, "dropped", "", "leases", "freed_count", false},
    {Message::reply, "dropped", "", "bytes", "freed_bytes", false},
    {Message::reply, "buffer_open", "", "size", "size_bytes", false},
    {Message::reply, "buffer_open", "", "parts", "part_count", false},
    {Message::reply, "buffer_open", "", "buffer_size", "buffer_size_bytes", false},
    {Message::reply, "buffer_open", "", "mapped_size", "mapped_size_bytes", false},
    {Message::notice, "drop", "", "bytes", "requested_bytes", false},
    {Message::notice, "drop", "", "timeout_ms", "timeout_seconds", true},
};

void rename(Json& object, const char* from, const char* to, bool to_seconds, bool to_milliseconds) {
  if (!object.is_object()) return;
  const auto it = object.find(from);
  if (it == object.end() || object.contains(to)) return;
  Json value = std::move(*it);
  object.erase(from);
  if (value.is_number() && to_seconds) value = value.get<double>() / 1000.0;
  if (value.is_number() && to_milliseconds) value = std::llround(value.get<double>() * 1000.0);
  object[to] = std::move(value);
}

void translate(Message message, std::string_view op, Json& body, bool to_new) {
  if (!body.is_object()) return;
  for (const Rename& r : kRenames) {
    if (r.message != message || op != r.op) continue;
    Json* where = &body;
    if (*r.parent) {
      const auto parent = body.find(r.parent);
      if (parent == body.end() || !parent->is_object()) continue;
      where = &*parent;
    }
    if (to_new)
      rename(*where, r.old_name, r.new_name, r.milliseconds, false);
    else
      rename(*where, r.new_name, r.old_name, false, r.milliseconds);
  }
  // A tensor index (buffer_create's "tensors") names each tensor's offset and size the same way.
  if (message == Message::request && op == "buffer_create" && body.contains("tensors") && body["tensors"].is_array())
    for (Json& t : body["tensors"]) {
      rename(t, to_new ? "offset" : "offset_bytes", to_new ? "offset_bytes" : "offset", false, false);
      rename(t, to_new ? "size" : "size_bytes", to_new ? "size_bytes" : "size", false, false);
    }
}

}  // namespace

void to_new_names(Message message, std::string_view op, Json& body) { translate(message, op, body, true); }

void to_old_names(Message message, std::string_view op, Json& body) { translate(message, op, body, false); }

std::string in_old_names(std::string_view op, std::string text) {
  for (const Rename& r : kRenames) {
    if (r.message != Message::request || op != r.op || *r.parent) continue;
    const std::string now = std::string("\"") + r.new_name + "\"";
    const std::string then = std::string("\"") + r.old_name + "\"";
    for (std::size_t at = text.find(now); at != std::string::npos; at = text.find(now, at + then.size()))
      text.replace(at, now.size(), then);
  }
  return text;
}

const char* new_name(Message message, std::string_view op, std::string_view old_name) {
  for (const Rename& r : kRenames)
    if (r.message == message && op == r.op && !*r.parent && old_name == r.old_name) return r.new_name;
  return nullptr;
}

std::string to_hex(const Bytes64& blob) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(128);
  for (std::uint8_t b : blob) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

std::optional<Bytes64> from_hex(std::string_view text) {
  if (text.size() != 128) return std::nullopt;
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  Bytes64 blob{};
  for (std::size_t i = 0; i < 64; ++i) {
    const int hi = value(text[2 * i]);
    const int lo = value(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    blob[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return blob;
}

// ---- Args ----

Args::Args(const Json& request) : request_(request) {
  if (!request.is_object()) bad_request("a request is a JSON object");
}

const Json* Args::find(const char* key) {
  seen_.emplace_back(key);
  auto it = request_.find(key);
  return it == request_.end() ? nullptr : &*it;
}

std::optional<std::string> Args::optional_string(const char* key, std::size_t max_length) {
  const Json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_request(std::string("\"") + key + "\" must be a string");
  const auto& s = v->get_ref<const std::string&>();
  if (s.size() > max_length)
    bad_request(std::string("\"") + key + "\" is longer than " + std::to_string(max_length) + " bytes");
  return s;
}

std::string Args::string(const char* key, std::size_t max_length) {
  auto s = optional_string(key, max_length);
  if (!s) bad_request(std::string("missing argument \"") + key + "\"");
  return *s;
}

std::optional<std::uint64_t> Args::optional_u64(const char* key, std::uint64_t min, std::uint64_t max) {
  const Json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<std::int64_t>() >= 0))
    bad_request(std::string("\"") + key + "\" must be a non-negative integer");
  const auto n = v->get<std::uint64_t>();
  if (n < min || n > max)
    bad_request(std::string("\"") + key + "\" must be between " + std::to_string(min) + " and " + std::to_string(max));
  return n;
}

std::uint64_t Args::u64(const char* key, std::uint64_t min, std::uint64_t max) {
  auto n = optional_u64(key, min, max);
  if (!n) bad_request(std::string("missing argument \"") + key + "\"");
  return *n;
}

int Args::device(const char* key, int fallback) {
  const Json* v = find(key);
  if (!v) return fallback;
  // An unsigned value is read as unsigned: 2^64-1 must not wrap to -1 ("the pool's first device").
  const bool in_range = v->is_number_unsigned() ? v->get<std::uint64_t>() <= kMaxDevice
                                                : v->is_number_integer() && v->get<std::int64_t>() >= -1 &&
                                                      v->get<std::int64_t>() <= kMaxDevice;
  if (!in_range)
    bad_request(std::string("\"") + key + "\" must be a device ordinal from 0 to " + std::to_string(kMaxDevice) +
                ", or -1 for the pool's first device");
  return static_cast<int>(v->get<std::int64_t>());
}

bool Args::boolean(const char* key, bool fallback) {
  const Json* v = find(key);
  if (!v) return fallback;
  if (!v->is_boolean()) bad_request(std::string("\"") + key + "\" must be true or false");
  return v->get<bool>();
}

std::vector<std::uint64_t> Args::ids(const char* key, std::size_t max_items) {
  const Json* v = find(key);
  if (!v) bad_request(std::string("missing argument \"") + key + "\"");
  if (!v->is_array()) bad_request(std::string("\"") + key + "\" must be an array of lease ids");
  if (v->size() > max_items)
    bad_request(std::string("\"") + key + "\" has more than " + std::to_string(max_items) + " items");
  std::vector<std::uint64_t> out;
  out.reserve(v->size());
  for (const Json& item : *v) {
    if (!item.is_number_unsigned() || item.get<std::uint64_t>() == 0)
      bad_request(std::string("\"") + key + "\" must hold lease ids (integers from 1 to 2^64-1)");
    out.push_back(item.get<std::uint64_t>());
  }
  // Each id once: a list that names one twice would have it acted on twice.
  std::vector<std::uint64_t> sorted = out;
  std::sort(sorted.begin(), sorted.end());
  if (const auto twice = std::adjacent_find(sorted.begin(), sorted.end()); twice != sorted.end())
    bad_request(std::string("\"") + key + "\" names lease " + std::to_string(*twice) + " twice");
  return out;
}

void Args::finish() const {
  for (const auto& [key, value] : request_.items()) {
    (void)value;
    if (key == "id" || key == "op") continue;
    if (std::find(seen_.begin(), seen_.end(), key) == seen_.end()) {
      std::vector<std::string> known(seen_.begin(), seen_.end());
      std::string hint = did_you_mean(key, known);
      bad_request("unknown argument \"" + valid_utf8(key) + "\"" +
                  (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
    }
  }
}

// ---- sockets ----

ssize_t send_some(int socket, std::string_view bytes, int fd, int flags) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  return ::sendmsg(socket, &msg, MSG_NOSIGNAL | flags);
}

void send_all(int socket, std::string_view bytes, int fd) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send_some(socket, bytes.substr(sent), sent == 0 ? fd : -1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "send");
    }
    sent += static_cast<std::size_t>(n);
  }
}

ssize_t receive_some(int socket, char* data, std::size_t size, int flags, std::vector<int>& fds, bool& truncated) {
  iovec iov{data, size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // Room for as many descriptors as one message can carry (SCM_MAX_FD, 253).
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | flags);
  truncated = n >= 0 && (msg.msg_flags & MSG_CTRUNC) != 0;
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int received = -1;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.push_back(received);
    }
  }
  return n;
}

namespace {
// Reads exactly `size` bytes; collects a descriptor if one arrives.
void receive_exact(int socket, char* data, std::size_t size, int& fd) {
  std::size_t got = 0;
  std::vector<int> fds;
  while (got < size) {
    fds.clear();
    bool truncated = false;
    const ssize_t n = receive_some(socket, data + got, size - got, 0, fds, truncated);
    for (int received : fds) {
      if (fd < 0) {
        fd = received;
      } else {
        ::close(received);  // more than one: never leak the extra
      }
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "receive");
    }
    if (n == 0) throw Error(Errc::unreachable, "the holder closed the connection");
    got += static_cast<std::size_t>(n);
  }
}
}  // namespace

std::pair<Header, Json> receive_frame(int socket, int& fd) {
  fd = -1;
  try {
    std::string payload;
    for (;;) {
      std::uint8_t header[kHeaderSize];
      receive_exact(socket, reinterpret_cast<char*>(header), kHeaderSize, fd);
      const Header h = decode_header(header, Kind::reply);
      if (h.kind == Kind::notice && !payload.empty()) bad_frame("a notice came between the parts of a reply");
      if (payload.size() + h.length > kMaxReply)
        bad_frame("a reply in parts exceeds " + std::to_string(kMaxReply) + " bytes");
      const std::size_t at = payload.size();
      payload.resize(at + h.length);
      receive_exact(socket, payload.data() + at, h.length, fd);
      if (h.kind == Kind::part) continue;
      if (h.fds == 0 && fd >= 0) {
        ::close(fd);
        fd = -1;
      }
      return {h, parse_payload(payload)};
    }
  } catch (...) {
    if (fd >= 0) ::close(fd);
    fd = -1;
    throw;
  }
}

}  // namespace cupool::proto
