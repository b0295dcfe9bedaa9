// The holder protocol (docs/protocol.md): frames of format version 1 (16-byte headers, JSON
// payloads, file descriptors as SCM_RIGHTS) and protocol versions 1 to 4. Everything here treats its input as hostile:
// sizes are bounded and every malformed input becomes a cupool::Error with a code from the document (bad_frame,
// bad_request).
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace cupool::proto {

using Json = nlohmann::ordered_json;

constexpr std::uint16_t kVersion = 1;  // of the frame format (the header's version field)
// Protocol versions (hello's "protocol"): 2 added cached blocks (free with cache, reuse, drop,
// dropped, quiet requests); 3 opens buffers held as exported allocations (buffer_open replies with
// the allocation's descriptor); 4 names every argument and reply field as docs/naming.md says
// (size_bytes, part_count, ...: kRenames). A holder speaks every version from kOldestProtocol to
// kProtocol.
constexpr int kProtocol = 4;
constexpr int kOldestProtocol = 1;
constexpr int kNamedProtocol = 4;  // the first version with docs/naming.md's names
constexpr std::size_t kHeaderSize = 16;
constexpr std::size_t kMaxPayload = 65536;           // one frame's payload
constexpr std::size_t kMaxReply = 16 * 1024 * 1024;  // a reply's payloads together, parts included
// The longest "path" of a plan or apply request: the name its findings give the file.
constexpr std::size_t kMaxConfigName = 256;
constexpr std::size_t kMaxRequest = 4 * 1024 * 1024;  // a request's, from an admin (others: one frame)
constexpr std::size_t kMinPayload = 2;                // "{}"
constexpr int kMaxDepth = 16;                         // JSON nesting in a payload
constexpr int kMaxDevice = 4096;                      // the largest device ordinal an argument may name
constexpr std::uint8_t kMagic[4] = {'C', 'U', 'P', 'L'};

// A message longer than kMaxPayload goes as parts: frames of kind `part` carrying consecutive
// slices of its JSON text, then one of the message's kind with the last slice (docs/protocol.md,
// "Frames"). Replies and requests may be sent in parts; notices never are.
enum class Kind : std::uint16_t { request = 1, reply = 2, notice = 3, part = 4 };

struct Header {
  std::uint16_t version = 0;
  Kind kind = Kind::request;
  std::uint32_t length = 0;
  std::uint32_t fds = 0;
};

// The 16 header bytes followed by the payload (the JSON text of `body`). A reply or request longer
// than a frame becomes parts and a last frame, back to back, each at least kMaxPayload / 2 long;
// a descriptor rides only with a reply that fits one frame. Throws Error(Errc::internal) for a
// reply, Error(Errc::bad_request) for a request, when the text exceeds kMaxPayload (kMaxReply or
// kMaxRequest when it may be split).
std::string encode(Kind kind, const Json& body, std::uint32_t fds = 0);

// Reads and validates a header. `expect` is the only kind accepted besides parts (requests at the
// holder; replies and notices when `expect` is reply). Only a reply may carry a descriptor, and a
// request when `request_fds` (the keeper's deposit: docs/protocol.md, "The keeper"); a part never.
// Throws Error(Errc::bad_frame).
Header decode_header(const std::uint8_t* bytes, Kind expect, bool request_fds = false);

// Parses a payload: a JSON object in valid UTF-8. Throws Error(Errc::bad_frame).
Json parse_payload(std::string_view payload);

// Splits a byte stream into frames. Bounded: holds at most one header and one payload.
class FrameDecoder {
 public:
  // `request_fds`: requests may carry one descriptor each (decode_header).
  explicit FrameDecoder(Kind expect, bool request_fds = false) : expect_(expect), request_fds_(request_fds) {}
  // Appends received bytes; returns how many were consumed (stops after one complete frame so
  // the caller can handle it before reading on).
  std::size_t feed(const char* data, std::size_t size);
  // True once a whole frame is buffered; take it with take().
  bool ready() const noexcept { return ready_; }
  // The buffered frame's header and payload; resets for the next frame.
  std::pair<Header, std::string> take();
  // True between a frame's first byte and its last (for the frame timeout).
  bool mid_frame() const noexcept { return !ready_ && (have_ > 0 || !payload_.empty()); }

 private:
  Kind expect_;
  bool request_fds_;
  std::uint8_t header_bytes_[kHeaderSize] = {};
  std::size_t have_ = 0;  // header bytes buffered
  Header header_{};
  std::string payload_;
  bool ready_ = false;
};

// 64 opaque bytes on the wire: a pointer's export data or an IPC event handle (device::Blob64).
using Bytes64 = std::array<std::uint8_t, 64>;

// 128 lower-case hex digits for 64 bytes, and back (nullopt unless exactly 128 hex digits).
// ---- the names of protocol 4 and those before it ----
//
// Both ends work in protocol 4's names. A holder renames what a connection of version 1 to 3
// sends to the new names before it reads it, and what it sends such a connection to the old
// names; a client library does the reverse with a holder that speaks 1 to 3. One table
// (protocol.cpp) says every name that changed, for requests (by op), replies (by op) and notices
// (by notice); the timeouts that were milliseconds are seconds in protocol 4.
enum class Message { request, reply, notice };
// The name of `message` (a request or reply of `op`, or a notice of that name) in protocol 4.
void to_new_names(Message message, std::string_view op, Json& body);
// The same in the names of protocols 1 to 3.
void to_old_names(Message message, std::string_view op, Json& body);
// What protocol 4 calls the top-level field `old_name` of `message` of `op`; nullptr when it was
// not renamed (for a message to say what to send instead).
const char* new_name(Message message, std::string_view op, std::string_view old_name);
// `text` (an error message about a request of `op`) with every quoted argument name of protocol 4
// ("size_bytes") written as protocols 1 to 3 call it ("size"): what a connection of 1 to 3 sent.
std::string in_old_names(std::string_view op, std::string text);

std::string to_hex(const Bytes64& blob);
std::optional<Bytes64> from_hex(std::string_view text);

// Typed access to a request's arguments; every accessor throws Error(Errc::bad_request) naming
// the argument, and finish() refuses arguments nobody asked for.
class Args {
 public:
  // Keeps a reference: `request` must outlive the Args.
  explicit Args(const Json& request);
  explicit Args(Json&&) = delete;
  std::string string(const char* key, std::size_t max_length);
  std::optional<std::string> optional_string(const char* key, std::size_t max_length);
  std::uint64_t u64(const char* key, std::uint64_t min, std::uint64_t max);
  std::optional<std::uint64_t> optional_u64(const char* key, std::uint64_t min, std::uint64_t max);
  // A device ordinal; `fallback` when absent.
  int device(const char* key, int fallback);
  bool boolean(const char* key, bool fallback);
  // An array of at most `max_items` integers from 1 to 2^64-1 (lease ids), each once; missing is an
  // error.
  std::vector<std::uint64_t> ids(const char* key, std::size_t max_items);
  // An argument of any JSON type, checked by the caller; nullptr when absent.
  const Json* value(const char* key) { return find(key); }
  // Throws for any key other than "id", "op" and those read so far.
  void finish() const;

 private:
  const Json* find(const char* key);
  const Json& request_;
  std::vector<std::string> seen_;
};

// ---- sockets (blocking helpers for clients and tests; the holder has its own event loop) ----

// Sends all of `bytes`; when `fd` >= 0 it rides as SCM_RIGHTS on the first byte.
// Throws std::system_error.
void send_all(int socket, std::string_view bytes, int fd = -1);
// One sendmsg of `bytes` (MSG_NOSIGNAL | `flags`), `fd` (when >= 0) as SCM_RIGHTS on its first byte:
// the bytes sent, or -1 with errno set.
ssize_t send_some(int socket, std::string_view bytes, int fd, int flags);
// One recvmsg (MSG_CMSG_CLOEXEC | `flags`) into `data`: the bytes read (0 at EOF), or -1 with errno
// set. Every descriptor that came is appended to `fds` (the caller owns them); `truncated` says
// whether the kernel dropped some (MSG_CTRUNC: more than 253, or no descriptor left here).
ssize_t receive_some(int socket, char* data, std::size_t size, int flags, std::vector<int>& fds, bool& truncated);
// Receives one reply (its parts joined, at most kMaxReply bytes) or notice; a received descriptor
// is returned in `fd` (else -1). The header returned is the last frame's.
// Throws Error(Errc::bad_frame), Error(Errc::unreachable) on EOF, or std::system_error.
std::pair<Header, Json> receive_frame(int socket, int& fd);

}  // namespace cupool::proto
