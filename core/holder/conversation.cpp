#include "holder/conversation.h"

#include <spdlog/spdlog.h>

#include "base/text.h"
#include "config/diagnostics.h"
#include "holder/holder.h"
#include "protocol/messages.h"

namespace cupool {

using Json = nlohmann::ordered_json;

Json error_body(const Json& id, const std::string& code, const std::string& message) {
  return proto::error_reply(id, {code, message, {}, {}});
}

Json rejected_body(const Json& id, const ConfigRejected& e, std::size_t limit) {
  proto::ConfigRefusal r{{e.wire_code(), e.what(), {}, {}}, e.findings().size(), e.findings(), e.rendered()};
  // Diagnostics are bounded (kMaxFindings; kMaxFindingText, kMaxQuotedLine per finding; the path
  // kMaxConfigName, without control characters), so this is about 10 MiB at the very most, under
  // kMaxReply. Should it not be, the reply still goes: the text is cut, then the last findings.
  auto size = [&] { return proto::refusal_reply(id, r).dump(-1, ' ', false, Json::error_handler_t::replace).size(); };
  const std::string note = "\n... (cut: a reply is at most " + std::to_string(limit) + " bytes)\n";
  std::size_t total = size();
  if (total <= limit) return proto::refusal_reply(id, r);
  const std::size_t without = total - Json(r.rendered).dump().size() + 2;
  r.rendered = without + note.size() + 64 < limit
                   ? utf8_prefix(e.rendered(), (limit - without - note.size() - 64) / 6) + note
                   : note;
  while (size() > limit && !r.findings.empty()) {
    Json first = Json::array();
    for (std::size_t i = 0; i < r.findings.size() / 2; ++i) first.push_back(r.findings[i]);
    r.findings = std::move(first);
  }
  return proto::refusal_reply(id, r);
}

std::size_t Conversation::receive(const char* data, std::size_t size) {
  if (closing_) return 0;
  try {
    const std::size_t used = decoder_.feed(data, size);
    if (decoder_.ready()) {
      auto [header, payload] = decoder_.take();
      take(header, std::move(payload));
    }
    return used;
  } catch (const Error& e) {
    // Only the frame decoder, the payload parser and the parts' bounds throw here: a malformed frame.
    refuse(e.what());
    return size;
  }
}

void Conversation::deliver(const char* data, std::size_t size) {
  if (closing_) return;
  inbox_.append(data, size);
  pull();
}

void Conversation::pull() {
  try {
    std::size_t used = 0;
    while (!decoder_.ready() && used < inbox_.size()) used += decoder_.feed(inbox_.data() + used, inbox_.size() - used);
    inbox_.erase(0, used);
  } catch (const Error& e) {
    inbox_.clear();
    refuse(e.what());
  }
}

bool Conversation::holding() const { return waiting_ || (parked_ && holder_.starting()); }

void Conversation::work() {
  if (!has_work()) return;
  if (!holding() && !held_.empty()) {
    const std::string payload = std::move(held_.front());
    held_.pop_front();
    held_bytes_ -= payload.size();
    handle(payload);
    return;
  }
  try {
    auto [header, payload] = decoder_.take();
    take(header, std::move(payload));
  } catch (const Error& e) {
    // Only the payload parser and the parts' bounds throw here: a malformed frame.
    inbox_.clear();
    refuse(e.what());
    return;
  }
  pull();
}

void Conversation::take(const proto::Header& header, std::string payload) {
  if (header.kind == proto::Kind::part) {
    // Parts cost the holder memory until the request is whole: only admins may send them, and
    // only up to kMaxRequest (others send requests of one frame, as every request but a large
    // plan or apply is).
    if (!parts_started_ && !holder_.admin(client_))
      throw Error(Errc::bad_frame, "a request longer than one frame (" + std::to_string(proto::kMaxPayload) +
                                       " bytes) is taken from admins only (root or the holder's user)");
    parts_started_ = true;
  }
  if (parts_started_) {
    if (parts_.size() + payload.size() > proto::kMaxRequest)
      throw Error(Errc::bad_frame, "a request in parts exceeds " + std::to_string(proto::kMaxRequest) + " bytes");
    parts_ += payload;
    if (header.kind == proto::Kind::part) return;
    payload = std::move(parts_);
    parts_.clear();
    parts_started_ = false;
  }
  handle(payload);
}

void Conversation::handle(const std::string& payload) {
  const Json request = proto::parse_payload(payload);  // bad_frame goes up
  const auto [id, op, quiet] = proto::request_head(request);
  if (waiting_) {
    if (!quiet || (op != "dropped" && op != "free" && op != "reuse")) {
      held_.push_back(payload);
      held_bytes_ += payload.size();
      return;
    }
  } else if (holder_.starting() && (parked_ || !Holder::serves_while_starting(op))) {
    // It needs the driver (or one before it did): served in order once the start is over.
    parked_ = true;
    held_.push_back(payload);
    held_bytes_ += payload.size();
    return;
  } else if (held_.empty()) {
    parked_ = false;
  }
  Fd fd;
  Json reply;
  try {
    Reply answer = holder_.handle(client_, request);
    if (answer.waits) {
      waiting_ = true;  // Holder::on_deferred brings the reply (answer())
      return;
    }
    fd = std::move(answer.fd);
    reply = proto::ok_reply(id, answer.body);
  } catch (const ConfigRejected& e) {
    reply = rejected_body(id, e);
  } catch (const Error& e) {
    reply = error_body(id, e.wire_code(), e.what());
  } catch (const std::exception& e) {
    spdlog::error("internal error serving client {}: {}", client_, e.what());
    reply = error_body(id, errc_info(Errc::internal).wire, e.what());
  }
  const bool ok = proto::reply_ok(reply);
  if (!ok) fd.reset();
  if (on_reply) on_reply(request, reply);
  if (quiet && ok) return;  // a quiet request is answered only when it fails
  queue(reply, proto::Kind::reply, std::move(fd));
}

void Conversation::answer(const Json& reply) {
  waiting_ = false;
  if (on_reply) on_reply(Json{{"deferred", true}}, reply);
  queue(reply);
}

void Conversation::refuse(const std::string& why) {
  spdlog::warn("client {} sent a malformed frame: {}", client_, why);
  queue(error_body(Json(), errc_info(Errc::bad_frame).wire, why));
  closing_ = true;
  parts_.clear();
  parts_.shrink_to_fit();
  parts_started_ = false;
}

void Conversation::queue(const Json& body, proto::Kind kind, Fd fd) {
  OutFrame f;
  f.fd = std::move(fd);
  try {
    f.bytes = proto::encode(kind, body, f.fd ? 1 : 0);
  } catch (const Error& e) {
    f.fd.reset();
    f.bytes = proto::encode(kind, error_body(proto::id_of(body), errc_info(Errc::internal).wire, e.what()));
  }
  queued_ += f.bytes.size();
  if (f.fd) ++fds_queued_;
  out_.push_back(std::move(f));
}

void Conversation::sent(std::size_t n) {
  OutFrame& f = out_.front();
  if (f.fd) {
    f.fd.reset();  // it went with the first byte
    --fds_queued_;
  }
  f.sent += n;
  queued_ -= n;
  if (f.sent == f.bytes.size()) out_.pop_front();
}

}  // namespace cupool
