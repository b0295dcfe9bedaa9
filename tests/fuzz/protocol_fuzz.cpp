// Fuzz target: bytes from a client -> the holder's Conversation (core/holder/conversation.h: the
// frame decoder, the payload parser, Holder::handle and the reply frames, exactly what the server
// runs for a connection), on a simulated two-GPU node holding a small config. The holder may refuse
// anything, but only in the documented ways (an error reply with a code from docs/protocol.md);
// a crash, a leak, a reply frame that does not decode (its parts joined), a reply under the reply
// limit that could not be encoded, an "internal" or "bad_frame" answer to a whole frame, leases and opens left
// behind after the client is gone, or (after a change) an export that doesn't apply as a no-op
// is a finding. Built like config_fuzz.cpp: with libFuzzer when CUPOOL_FUZZ=ON, and always as a
// deterministic driver (mutate_main.cpp --frames) under CTest. Seeds: protocol-corpus/
// (make_protocol_corpus.py) and regressions/protocol/.
//
// Input: byte 0 picks the peer (bits 0-1: root, alice in share.users, bob in share.groups, eve a
// stranger; bit 2: another client, alice (protocol 2), already holds a lease, keeps a block
// cached and has the buffer open, and answers the holder's drop notices as the C library does).
// The rest is fed to a Conversation as core/holder/server.cpp read_from does; a reply that waited
// for cached blocks (Holder::on_deferred) goes back to it as the server does.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "base/error.h"
#include "config/load.h"
#include "device/backend.h"
#include "device/sim_backend.h"
#include "holder/conversation.h"
#include "holder/holder.h"
#include "protocol/protocol.h"
#include "tests/unit/fixtures.h"

namespace {

using cupool::Json;
namespace proto = cupool::proto;

const char* const kConfig = R"(version: 1
holder: {socket: /tmp/cupool-fuzz.sock, mode: "0660"}
pools:
  - name: kv
    devices: [0, 1]
    handle_types: [posix_fd]
    max_size: 1GiB
    release_threshold: max
    reserve: 64MiB
    access: [all]
    share: {users: [alice], groups: [gpu], quota_per_client: 256MiB}
  - name: private
    devices: [0]
    handle_types: [posix_fd]
    max_size: 512MiB
  - name: local
    devices: [1]
    max_size: 256MiB
buffers:
  - {name: weights, pool: kv, device: 0, size: 128MiB}
)";

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "protocol fuzz finding: %s\n", what.c_str());
  std::abort();
}

cupool::Peer peer(std::uint32_t uid, const char* user, std::vector<std::string> groups) {
  cupool::Peer p;
  p.pid = 4242;
  p.uid = uid;
  p.gid = uid;
  p.user = user;
  p.group_names = std::move(groups);
  return p;
}

// CUPOOL_FUZZ_VERBOSE=1: print every reply (to see what a seed or a finding does).
const bool verbose = std::getenv("CUPOOL_FUZZ_VERBOSE") != nullptr;

// Walks the frames of one encoded message (a reply in parts is frames of kind 4, then the last):
// each must decode, only the last may carry a descriptor or say what the message is, and the
// payloads joined must be `text` when given. Returns the joined payload.
std::string walk_frames(const std::string& bytes, bool carries_fd, const std::string* text) {
  std::string joined;
  std::size_t at = 0;
  while (true) {
    if (bytes.size() - at < proto::kHeaderSize) finding("a reply frame shorter than a header");
    const proto::Header h =
        proto::decode_header(reinterpret_cast<const std::uint8_t*>(bytes.data() + at), proto::Kind::reply);
    if (h.length > bytes.size() - at - proto::kHeaderSize) finding("a reply frame's length exceeds the bytes queued");
    joined.append(bytes, at + proto::kHeaderSize, h.length);
    at += proto::kHeaderSize + h.length;
    if (h.kind != proto::Kind::part) {
      if (at != bytes.size()) finding("bytes queued after the last frame of a reply");
      if ((h.fds != 0) != carries_fd) finding("a reply frame's fds field differs from the descriptor it carries");
      break;
    }
    if (h.length < proto::kMaxPayload / 2) finding("a part of a reply shorter than half a frame");
  }
  if (text && joined != *text) finding("the parts of a reply don't join to its text");
  return joined;
}

// A reply under the reply limit must encode (the conversation replaces one that doesn't with an
// "internal" error, so the encoding is tried here first to tell the two apart): in parts when it
// is longer than a frame.
void check_encodes(const Json& reply) {
  const std::string text = reply.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (verbose) std::fprintf(stderr, "reply (%zu bytes): %.300s\n", text.size(), text.c_str());
  try {
    (void)walk_frames(proto::encode(proto::Kind::reply, reply), false, &text);
  } catch (const cupool::Error& e) {
    if (text.size() <= proto::kMaxReply) finding(std::string("encode refused a reply under the limit: ") + e.what());
  }
}

// Takes every message the conversation queued, as the peer would: each must decode (its parts
// joined) to a reply or a notice.
void take_frames(cupool::Conversation& talk) {
  while (!talk.out().empty()) {
    const cupool::OutFrame& f = talk.out().front();
    (void)proto::parse_payload(walk_frames(f.bytes, static_cast<bool>(f.fd), nullptr));
    talk.sent(f.bytes.size() - f.sent);
  }
}

// What the requests of one input did to the holder.
struct Effects {
  bool changed = false;  // an apply, buffer_create or buffer_remove succeeded
  // An apply was made in part: a pool change was blocked on some device (the pool's devices
  // can then differ, which one config entry can't say), or it failed after it began.
  bool partial = false;
};

// What one request did, judged from the request and its reply.
void judge(const Json& request, const Json& reply, Effects& effects) {
  check_encodes(reply);
  const std::string op = request.value("op", Json()).is_string() ? request["op"].get<std::string>() : "";
  if (reply.value("ok", false)) {
    effects.changed = effects.changed || op == "apply" || op == "buffer_create" || op == "buffer_remove";
    if (op == "apply")
      for (const auto& change : reply["changes"])
        if (change["object"] == "pool" && change.contains("blocked")) effects.partial = true;
    return;
  }
  const std::string code = reply["error"]["code"].get<std::string>();
  if (code == "bad_frame" || code == "internal") finding("a whole frame was answered " + code + ": " + reply.dump());
  // Refusals come before anything was changed; anything else from apply may come half-way.
  if (op == "apply" && code != "not_permitted" && code != "bad_request" && code != "draining" &&
      code != "hello_required" && code != "invalid_config" && code != "does_not_fit")
    effects.partial = true;
}

// "The live state as a version 1 config, which cupool check and apply accept (applying it to the
// same holder changes nothing)" (docs/protocol.md, export). After a partial apply only the first
// half holds: a pool whose devices differ is exported as its first device's (see
// regressions/protocol/export-divergent-pool.bin), and applying that export would change it.
void check_export(const cupool::Holder& holder, const cupool::NodeReport& node, bool partial) {
  const std::string text = holder.export_config();
  cupool::Desired again;
  try {
    again = cupool::load_config(cupool::SourceFile("export.yaml", text), node, cupool::Scope::all).desired;
  } catch (const cupool::ConfigRejected& e) {
    finding("export is not a config that apply accepts:\n" + e.rendered() + "\n" + text);
  }
  if (partial) return;
  const auto changes = holder.plan(again);
  if (!changes.empty())
    finding("applying the export would change " + cupool::model::to_json(holder.view(changes.front())).dump() + ":\n" +
            text);
}

// Nothing a client did may outlive it.
void check_released(const cupool::Holder& holder) {
  if (holder.lease_count() != 0 || holder.leased_bytes() != 0) finding("leases left after every client disconnected");
  if (holder.cached_count() != 0 || holder.cached_bytes() != 0) finding("cached blocks left after every client left");
  if (holder.next_deadline()) finding("a drop notice still waits for an answer after every client left");
  const cupool::model::Status status = holder.status();
  for (const auto& b : status.buffers)
    if (b.open_count != 0) finding("buffer " + b.name + " still open after every client left");
  for (const auto& p : status.pools)
    if (p.leases.lease_count != 0 || p.leases.leased_bytes != 0)
      finding("pool " + p.pool.name + " still counts leases");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const cupool::NodeReport node = [] {
    spdlog::set_level(spdlog::level::off);
    return cupool::test::two_gpu_node();
  }();
  static const cupool::Desired want =
      cupool::load_config(cupool::SourceFile("fuzz.yaml", kConfig), node, cupool::Scope::all).desired;
  if (size == 0) return 0;

  cupool::SimBackend sim(node);
  cupool::Holder holder(sim, node, /*self_uid=*/1000);
  holder.adopt_holder_settings(want.holder);
  holder.apply(want);

  // A bystander holding a lease and an open buffer: what the fuzzed client does to pools and
  // buffers (apply, buffer_remove) meets them in use.
  std::uint64_t bystander = 0;
  if (data[0] & 4) {
    bystander = holder.connect(peer(1001, "alice", {"alice"}));
    // The buffer's descriptor (protocol 3) is closed with its reply: the mapping is not needed here.
    holder.handle(bystander, {{"id", 1}, {"op", "hello"}, {"protocol", 3}});
    holder.handle(bystander, {{"id", 2}, {"op", "alloc"}, {"pool", "kv"}, {"device", 1}, {"size", 1 << 20}});
    holder.handle(bystander, {{"id", 3}, {"op", "buffer_open"}, {"name", "weights"}});
    holder.handle(bystander, {{"id", 4}, {"op", "alloc"}, {"pool", "kv"}, {"device", 0}, {"size", 2 << 20}});
    holder.handle(bystander, {{"id", 5}, {"op", "free"}, {"lease", 2}, {"cache", true}});
  }
  // Drop notices to the bystander, answered after each step (never from inside the holder).
  std::vector<Json> bystander_drops;
  cupool::Conversation* talking = nullptr;
  holder.on_notice([&](std::uint64_t to, const Json& notice) {
    if (to == bystander && notice.value("notice", "") == "drop") bystander_drops.push_back(notice);
  });
  holder.on_deferred([&](std::uint64_t, const Json& reply) {
    if (talking) talking->answer(reply);
  });
  auto answer_drops = [&] {
    while (!bystander_drops.empty()) {
      const Json notice = bystander_drops.front();
      bystander_drops.erase(bystander_drops.begin());
      holder.handle(
          bystander,
          {{"id", 6}, {"op", "dropped"}, {"ask", notice["ask"]}, {"leases", notice["leases"]}, {"quiet", true}});
    }
  };
  static const cupool::Peer peers[4] = {peer(0, "root", {"root"}), peer(1001, "alice", {"alice"}),
                                        peer(1002, "bob", {"bob", "gpu"}), peer(1003, "eve", {"eve"})};
  const std::uint64_t client = holder.connect(peers[data[0] & 3]);
  Effects effects;

  try {
    cupool::Conversation talk(holder, client);
    talking = &talk;
    talk.on_reply = [&effects](const Json& request, const Json& reply) { judge(request, reply, effects); };
    const char* bytes = reinterpret_cast<const char*>(data + 1);
    const std::size_t n = size - 1;
    std::size_t used = 0;
    while (used < n && !talk.closing()) {
      const std::size_t took = talk.receive(bytes + used, n - used);
      if (took == 0) finding("the conversation took no bytes");
      used += took;
      answer_drops();
      while (talk.has_work()) talk.work();  // requests held while one waited
      take_frames(talk);
    }
    talking = nullptr;
  } catch (const std::exception& e) {
    finding(std::string("uncaught exception: ") + e.what());
  }

  holder.on_deferred(nullptr);
  holder.disconnect(client);
  if (bystander) holder.disconnect(bystander);
  check_released(holder);
  if (effects.changed) check_export(holder, node, effects.partial);
  return 0;
}
