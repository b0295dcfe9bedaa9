// One client's conversation with the holder, without the socket: request bytes in, reply frames
// out (docs/protocol.md). The server moves the bytes between the socket and a Conversation; the
// protocol fuzzer feeds its input to the same class, so what it tests is what the server runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "base/fd.h"
#include "protocol/protocol.h"

namespace cupool {

class ConfigRejected;
class Holder;

// The invalid_config (or does_not_fit) reply of a rejected config: every finding and the rendered
// text, as `cupool check` prints them; over `limit` (never, by the diagnostics' bounds), the text
// is cut and then the last findings (finding_count still counts them all).
nlohmann::ordered_json rejected_body(const nlohmann::ordered_json& id, const ConfigRejected& e,
                                     std::size_t limit = proto::kMaxReply);

// A frame to send; `fd` rides with its first byte (SCM_RIGHTS).
struct OutFrame {
  std::string bytes;
  std::size_t sent = 0;
  Fd fd;
};

// The reply frame for an error: {"id": id, "ok": false, "error": {"code", "message"}}.
nlohmann::ordered_json error_body(const nlohmann::ordered_json& id, const std::string& code,
                                  const std::string& message);

class Conversation {
 public:
  // `client` is the holder's id of the connection (Holder::connect).
  Conversation(Holder& holder, std::uint64_t client) : holder_(holder), client_(client) {}

  // Takes received bytes, at most up to the end of one frame, and returns how many it took. When
  // they complete a frame, the request is handled and its reply queued. A malformed frame queues a
  // bad_frame reply and the conversation is closing: it takes no more bytes. (The fuzzer's way in;
  // the server uses deliver() and work().)
  std::size_t receive(const char* data, std::size_t size);

  // Keeps received bytes until work() takes them. The server delivers only while wants_input().
  void deliver(const char* data, std::size_t size);
  // Whether to read more from the peer: not closing, and less than kMaxInbox bytes waiting.
  bool wants_input() const { return !closing_ && inbox_.size() < kMaxInbox; }
  // A whole request is waiting and may be handled now: not while kMaxQueuedFds replies that carry
  // a descriptor wait for the peer to read them (a peer that asks for descriptors and never reads
  // can't make the holder keep more).
  // While a request waits for cached blocks (Reply::later()), quiet `dropped`, `free` and
  // `reuse` are served at once; other requests are held (up to kMaxInbox bytes) and served in
  // order once the waiting one is answered, so replies keep the order of requests.
  // While the holder starts (Holder::starting), a request that needs the driver is held the same
  // way, with every request after it, until the start is over.
  bool has_work() const {
    if (closing_ || fds_queued_ >= kMaxQueuedFds) return false;
    if (holding()) return decoder_.ready() && held_bytes_ < kMaxInbox;
    return !held_.empty() || decoder_.ready();
  }
  // Handles one waiting request, if has_work(). A malformed frame closes the conversation.
  void work();
  // Refuses the stream: queues a bad_frame reply saying `why`; the conversation is closing.
  void refuse(const std::string& why);
  // Queues a reply or notice. A body that does not fit a frame is replaced by an "internal" error
  // (and `fd` is closed).
  void queue(const nlohmann::ordered_json& body, proto::Kind kind = proto::Kind::reply, Fd fd = {});

  // Frames waiting to be sent, oldest first, and their unsent bytes.
  std::deque<OutFrame>& out() { return out_; }
  std::size_t queued_bytes() const { return queued_; }
  // The reply of the request that waited (Holder::on_deferred): queued, and requests are served again.
  void answer(const nlohmann::ordered_json& reply);
  bool waiting() const { return waiting_; }
  // Requests held until the holder's start is over (none when it is).
  bool parked() const { return parked_; }
  // Records that `n` bytes of the front frame went out; pops it when all did.
  void sent(std::size_t n);

  std::uint64_t client() const { return client_; }
  // After a malformed frame, or when the holder stops and the peer holds nothing that needs it:
  // close once the queue is flushed.
  bool closing() const { return closing_; }
  void close_after_sending() { closing_ = true; }
  // Between a frame's first byte and its last (for a request in parts: the first part's first
  // byte and the last frame's last).
  bool mid_frame() const { return decoder_.mid_frame() || parts_started_; }

  static constexpr std::size_t kMaxInbox = 64 * 1024;  // received bytes kept before reading stops
  static constexpr std::size_t kMaxQueuedFds = 1;      // unread replies that carry a descriptor

  // Called after each request was handled, with the request and its reply (for tests and
  // fuzzers that judge what requests did).
  std::function<void(const nlohmann::ordered_json& request, const nlohmann::ordered_json& reply)> on_reply;

 private:
  // Takes a whole frame: a part is kept (from admins; from others it is refused), a request is
  // handled with the parts before it.
  void take(const proto::Header& header, std::string payload);
  void handle(const std::string& payload);
  // Moves inbox bytes into the decoder, up to the end of the next frame.
  void pull();

  Holder& holder_;
  std::uint64_t client_;
  proto::FrameDecoder decoder_{proto::Kind::request};
  std::string inbox_;
  std::deque<OutFrame> out_;
  std::size_t queued_ = 0;
  std::size_t fds_queued_ = 0;
  bool closing_ = false;
  std::string parts_;  // the payloads of the parts of a request so far
  // Requests are held: one waits for cached blocks, or one waits for the start to end.
  bool holding() const;
  bool waiting_ = false;          // a request's reply waits for cached blocks (Reply::later())
  bool parked_ = false;           // a request came that the holder serves only once started
  std::deque<std::string> held_;  // payloads of requests that came while one waited
  std::size_t held_bytes_ = 0;
  bool parts_started_ = false;
};

}  // namespace cupool
