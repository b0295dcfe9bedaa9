#include "holder/conversation.h"

#include <spdlog/spdlog.h>

#include "base/text.h"
#include "config/diagnostics.h"
#include "holder/holder.h"

namespace cupool {

using Json = nlohmann::ordered_json;

Json error_body(const Json& id, const std::string& code, const std::string& message) {
  Json j;
  j["id"] = id;
  j["ok"] = false;
  j["error"] = {{"code", code}, {"message", message}};
  return j;
}

namespace {

// The invalid_config (or does_not_fit) reply of a rejected config. A reply must fit in one frame: at most 100
// findings and the text cut at 32 KiB; if that is still too long (long findings, long paths), as
// many findings as fit, halving, then no text.
Json rejected_body(const Json& id, const ConfigRejected& e) {
  Json body = error_body(id, e.wire_code(), e.what());
  Json findings = Json::array();
  for (const auto& f : e.findings()) {
    if (findings.size() == 100) break;
    findings.push_back(f);
  }
  body["error"]["findings_total"] = e.findings().size();
  body["error"]["findings"] = findings;
  std::string rendered = e.rendered();
  if (rendered.size() > 32768)
    rendered = valid_utf8(rendered.substr(0, 32768)) + "\n... (cut: the full list is in 'cupool check')\n";
  body["error"]["rendered"] = rendered;
  auto too_long = [&] { return body.dump(-1, ' ', false, Json::error_handler_t::replace).size() > proto::kMaxPayload; };
  while (too_long() && !body["error"]["findings"].empty()) {
    Json& list = body["error"]["findings"];
    list.erase(list.begin() + static_cast<std::ptrdiff_t>(list.size() / 2), list.end());
  }
  if (too_long()) body["error"]["rendered"] = "(too long for one reply: run 'cupool check' on the file)\n";
  return body;
}

}  // namespace

std::size_t Conversation::receive(const char* data, std::size_t size) {
  if (closing_) return 0;
  try {
    const std::size_t used = decoder_.feed(data, size);
    if (decoder_.ready()) handle(decoder_.take().second);
    return used;
  } catch (const Error& e) {
    // Only the frame decoder and the payload parser throw here: a malformed frame.
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

void Conversation::work() {
  if (!has_work()) return;
  try {
    handle(decoder_.take().second);
  } catch (const Error& e) {
    // Only the payload parser throws here: a malformed frame.
    inbox_.clear();
    refuse(e.what());
    return;
  }
  pull();
}

void Conversation::handle(const std::string& payload) {
  const Json request = proto::parse_payload(payload);  // bad_frame goes up
  Json id = Json();
  if (auto it = request.find("id"); it != request.end() && it->is_number_integer() && it->get<std::int64_t>() >= 0)
    id = *it;
  int fd = -1;
  Json reply;
  try {
    Json body = holder_.handle(client_, request, fd);
    reply["id"] = id;
    reply["ok"] = true;
    for (auto& [k, v] : body.items()) reply[k] = v;
  } catch (const ConfigRejected& e) {
    reply = rejected_body(id, e);
  } catch (const Error& e) {
    reply = error_body(id, e.wire_code(), e.what());
  } catch (const std::exception& e) {
    spdlog::error("internal error serving client {}: {}", client_, e.what());
    reply = error_body(id, errc_info(Errc::internal).wire, e.what());
  }
  const bool ok = reply.value("ok", false);
  if (!ok && fd >= 0) {
    ::close(fd);
    fd = -1;
  }
  if (on_reply) on_reply(request, reply);
  queue(reply, proto::Kind::reply, fd);
}

void Conversation::refuse(const std::string& why) {
  spdlog::warn("client {} sent a malformed frame: {}", client_, why);
  queue(error_body(Json(), errc_info(Errc::bad_frame).wire, why));
  closing_ = true;
}

void Conversation::queue(const Json& body, proto::Kind kind, int fd) {
  OutFrame f;
  f.fd.reset(fd);
  try {
    f.bytes = proto::encode(kind, body, fd >= 0 ? 1 : 0);
  } catch (const Error& e) {
    f.fd.reset();
    f.bytes = proto::encode(kind, error_body(body.value("id", Json()), errc_info(Errc::internal).wire, e.what()));
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
