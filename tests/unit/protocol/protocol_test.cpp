#include "protocol/protocol.h"

#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

using namespace cupool;
using namespace cupool::proto;

namespace {
std::string header(std::uint16_t version, std::uint16_t kind, std::uint32_t length, std::uint32_t fds) {
  std::string h = "CUPL";
  h.push_back(static_cast<char>(version & 0xff));
  h.push_back(static_cast<char>(version >> 8));
  h.push_back(static_cast<char>(kind & 0xff));
  h.push_back(static_cast<char>(kind >> 8));
  for (int i = 0; i < 4; ++i) h.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  for (int i = 0; i < 4; ++i) h.push_back(static_cast<char>((fds >> (8 * i)) & 0xff));
  return h;
}

std::string bad_frame_message(const std::string& bytes) {
  FrameDecoder d(Kind::request);
  try {
    std::size_t used = 0;
    while (used < bytes.size()) {
      used += d.feed(bytes.data() + used, bytes.size() - used);
      if (d.ready()) parse_payload(d.take().second);
    }
  } catch (const Error& e) {
    CHECK(e.code() == Errc::bad_frame);
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a frame is the documented 16-byte header and a JSON payload") {
  const std::string f = encode(Kind::request, Json{{"id", 1}, {"op", "hello"}});
  const std::string payload = R"({"id":1,"op":"hello"})";
  CHECK(f == header(1, 1, static_cast<std::uint32_t>(payload.size()), 0) + payload);
}

TEST_CASE("the decoder reassembles frames fed a byte at a time, and stops after each") {
  const std::string a = encode(Kind::request, Json{{"id", 1}, {"op", "list"}});
  const std::string b = encode(Kind::request, Json{{"id", 2}, {"op", "status"}});
  const std::string stream = a + b;
  FrameDecoder d(Kind::request);
  std::vector<Json> got;
  for (char c : stream) {
    CHECK(d.feed(&c, 1) == 1);
    if (d.ready()) got.push_back(parse_payload(d.take().second));
  }
  REQUIRE(got.size() == 2);
  CHECK(got[1]["op"] == "status");
  // Fed all at once, it consumes exactly the first frame.
  FrameDecoder d2(Kind::request);
  CHECK(d2.feed(stream.data(), stream.size()) == a.size());
  CHECK(d2.ready());
  CHECK_FALSE(d2.mid_frame());
}

TEST_CASE("malformed frames are refused with bad_frame and a reason") {
  CHECK(bad_frame_message("XUPL" + std::string(12, '\0')).find("magic") != std::string::npos);
  CHECK(bad_frame_message(header(2, 1, 2, 0) + "{}").find("version 2") != std::string::npos);
  CHECK(bad_frame_message(header(1, 2, 2, 0) + "{}").find("kind") != std::string::npos);
  CHECK(bad_frame_message(header(1, 1, 1, 0) + "{").find("length") != std::string::npos);
  CHECK(bad_frame_message(header(1, 1, 65537, 0)).find("length") != std::string::npos);
  CHECK(bad_frame_message(header(1, 1, 2, 1) + "{}").find("descriptor") != std::string::npos);
  CHECK(bad_frame_message(header(1, 1, 2, 0) + "[]").find("object") != std::string::npos);
  CHECK(bad_frame_message(header(1, 1, 3, 0) + "{x}").find("JSON") != std::string::npos);
  CHECK(bad_frame_message(header(1, 1, 4, 0) + "\"\xff\"}").find("UTF-8") != std::string::npos);
  // A NUL after the object: a parser could stop there and take "{}" (hostile review, 2026-11).
  CHECK(bad_frame_message(header(1, 1, 7, 0) + std::string("{}\0junk", 7)).find("NUL") != std::string::npos);
  std::string deep(40, '[');
  deep = "{\"a\":" + deep + std::string(40, ']') + "}";
  CHECK(bad_frame_message(header(1, 1, static_cast<std::uint32_t>(deep.size()), 0) + deep).find("nests") !=
        std::string::npos);
  // A key twice in one object: refused, not the last one winning (issue 22).
  const std::string twice = R"({"id":1,"op":"list","op":"status"})";
  CHECK(bad_frame_message(header(1, 1, static_cast<std::uint32_t>(twice.size()), 0) + twice)
            .find("has the key \"op\" twice") != std::string::npos);
}

TEST_CASE("hex round trip of 64-byte handles") {
  Bytes64 b{};
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(i * 7);
  const std::string h = to_hex(b);
  CHECK(h.size() == 128);
  CHECK(from_hex(h) == b);
  CHECK_FALSE(from_hex(h.substr(1)));
  CHECK_FALSE(from_hex(std::string(127, '0') + "g"));
}

TEST_CASE("Args: typed, bounded, and unknown arguments are refused with a hint") {
  const Json req = {{"id", 1}, {"op", "alloc"}, {"pool", "kv"}, {"size", 4096}, {"devcie", 0}};
  Args a(req);
  CHECK(a.string("pool", 64) == "kv");
  CHECK(a.u64("size", 1, 1 << 20) == 4096);
  CHECK(a.device("device", -1) == -1);
  try {
    a.finish();
    FAIL("finish accepted an unknown argument");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::bad_request);
    CHECK(std::string(e.what()).find("did you mean \"device\"") != std::string::npos);
  }
  const Json bad = {{"size", -1}, {"pool", 3}, {"big", 1ULL << 50}, {"flag", "yes"}};
  Args b(bad);
  CHECK_THROWS_WITH_AS(b.u64("size", 1, 10), doctest::Contains("non-negative"), Error);
  CHECK_THROWS_WITH_AS(b.string("pool", 64), doctest::Contains("string"), Error);
  CHECK_THROWS_WITH_AS(b.u64("big", 1, 1ULL << 48), doctest::Contains("between"), Error);
  CHECK_THROWS_WITH_AS(b.boolean("flag", false), doctest::Contains("true or false"), Error);
  CHECK_THROWS_WITH_AS(b.string("missing", 64), doctest::Contains("missing argument"), Error);
  // 2^64-1 is not -1 (the pool's first device), nor is any other huge or negative value a device.
  const Json devices = {{"max", UINT64_MAX}, {"big", 4097}, {"neg", -2}, {"ok", 7}, {"any", -1}};
  Args d(devices);
  CHECK_THROWS_WITH_AS(d.device("max", 0), doctest::Contains("device ordinal"), Error);
  CHECK_THROWS_WITH_AS(d.device("big", 0), doctest::Contains("device ordinal"), Error);
  CHECK_THROWS_WITH_AS(d.device("neg", 0), doctest::Contains("device ordinal"), Error);
  CHECK(d.device("ok", 0) == 7);
  CHECK(d.device("any", 0) == -1);
  // Lease ids: each once (a `dropped` naming one twice answered internal, "map::at": issue 22).
  const Json ids = {{"twice", {3U, 5U, 3U}}, {"once", {3U, 5U}}};
  Args i(ids);
  CHECK_THROWS_WITH_AS(i.ids("twice", 8), doctest::Contains("names lease 3 twice"), Error);
  CHECK(i.ids("once", 8) == std::vector<std::uint64_t>{3, 5});
}

TEST_CASE("a descriptor rides with a frame over a socket pair, and only one is kept") {
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  int pipefd[2];
  REQUIRE(pipe(pipefd) == 0);
  send_all(sv[0], encode(Kind::reply, Json{{"id", 3}, {"ok", true}}, 1), pipefd[1]);
  int fd = -1;
  auto [h, body] = receive_frame(sv[1], fd);
  CHECK(h.kind == Kind::reply);
  CHECK(body["id"] == 3);
  REQUIRE(fd >= 0);
  CHECK(write(fd, "x", 1) == 1);
  char c = 0;
  CHECK(read(pipefd[0], &c, 1) == 1);
  CHECK(c == 'x');
  close(fd);
  close(pipefd[0]);
  close(pipefd[1]);
  close(sv[0]);
  int none = -1;
  CHECK_THROWS_AS(receive_frame(sv[1], none), Error);  // EOF: unreachable
  CHECK(none == -1);
  close(sv[1]);
}

namespace {
// The frames of an encoded message: (kind, payload) each.
std::vector<std::pair<int, std::string>> split_frames(const std::string& bytes, Kind expect = Kind::reply) {
  std::vector<std::pair<int, std::string>> out;
  std::size_t at = 0;
  while (at < bytes.size()) {
    const Header h = decode_header(reinterpret_cast<const std::uint8_t*>(bytes.data() + at), expect);
    out.emplace_back(static_cast<int>(h.kind), bytes.substr(at + kHeaderSize, h.length));
    at += kHeaderSize + h.length;
  }
  return out;
}
}  // namespace

TEST_CASE("a reply longer than a frame goes in parts that join to its text, and none is short") {
  for (std::size_t text : {std::size_t{65536 - 40}, std::size_t{65536 - 9}, std::size_t{65536 + 1},
                           std::size_t{3 * 65536 + 7}, std::size_t{200000}}) {
    CAPTURE(text);
    const Json body = {{"id", 1}, {"ok", true}, {"x", std::string(text, 'a')}};
    const std::string dumped = body.dump();
    const auto frames = split_frames(encode(Kind::reply, body));
    REQUIRE(frames.size() == (dumped.size() + kMaxPayload - 1) / kMaxPayload);
    std::string joined;
    for (std::size_t i = 0; i < frames.size(); ++i) {
      CHECK(frames[i].first == (i + 1 == frames.size() ? 2 : 4));
      CHECK(frames[i].second.size() <= kMaxPayload);
      if (frames.size() > 1) CHECK(frames[i].second.size() >= kMaxPayload / 2);
      joined += frames[i].second;
    }
    CHECK(joined == dumped);
  }
  // A request of an admin may be long too; a notice never is, nor a reply with a descriptor.
  const Json big = {{"op", "apply"}, {"config", std::string(100000, 'c')}};
  CHECK(split_frames(encode(Kind::request, big), Kind::request).size() == 2);
  CHECK_THROWS_WITH_AS(encode(Kind::notice, big), doctest::Contains("exceeds"), Error);
  CHECK_THROWS_WITH_AS(encode(Kind::reply, big, 1), doctest::Contains("exceeds"), Error);
  try {
    encode(Kind::request, Json{{"config", std::string(kMaxRequest, 'c')}});
    FAIL("a request over kMaxRequest was encoded");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::bad_request);
  }
  CHECK_THROWS_AS(encode(Kind::reply, Json{{"x", std::string(kMaxReply, 'x')}}), Error);
}

TEST_CASE("a part carries no descriptor, and kinds other than 1 to 4 are refused") {
  CHECK_THROWS_WITH_AS(decode_header(reinterpret_cast<const std::uint8_t*>(header(1, 4, 2, 1).data()), Kind::reply),
                       doctest::Contains("descriptor"), Error);
  CHECK_THROWS_WITH_AS(decode_header(reinterpret_cast<const std::uint8_t*>(header(1, 5, 2, 0).data()), Kind::reply),
                       doctest::Contains("kind 5"), Error);
  CHECK(decode_header(reinterpret_cast<const std::uint8_t*>(header(1, 4, 2, 0).data()), Kind::request).kind ==
        Kind::part);
  CHECK_THROWS_WITH_AS(decode_header(reinterpret_cast<const std::uint8_t*>(header(1, 3, 2, 0).data()), Kind::request),
                       doctest::Contains("kind 3"), Error);
}

TEST_CASE("receive_frame joins a reply's parts, and refuses a notice among them and parts past the bound") {
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  const Json body = {{"id", 9}, {"ok", true}, {"x", std::string(300000, 'z')}};
  std::thread sender([&] { send_all(sv[0], encode(Kind::reply, body)); });
  int fd = -1;
  auto [h, got] = receive_frame(sv[1], fd);
  sender.join();
  CHECK(h.kind == Kind::reply);
  CHECK(got == body);
  CHECK(fd == -1);

  // A notice between the parts.
  const std::string part = header(1, 4, 2, 0) + "{\"";
  send_all(sv[0], part + encode(Kind::notice, Json{{"notice", "draining"}}));
  CHECK_THROWS_WITH_AS(receive_frame(sv[1], fd), doctest::Contains("between the parts"), Error);
  close(sv[0]);
  close(sv[1]);

  // Parts past kMaxReply: refused when the frame that crosses it is announced.
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  std::thread flood([&] {
    const std::string frame = header(1, 4, kMaxPayload, 0) + std::string(kMaxPayload, ' ');
    try {
      for (std::size_t sent = 0; sent <= kMaxReply; sent += kMaxPayload) send_all(sv[0], frame);
    } catch (const std::exception&) {
      // The receiver stopped reading and closed: expected.
    }
  });
  CHECK_THROWS_WITH_AS(receive_frame(sv[1], fd), doctest::Contains("exceeds"), Error);
  close(sv[1]);
  flood.join();
  close(sv[0]);
}

TEST_CASE("protocol 4's names: a request of 1 to 3 read in the new names, a reply written in the old") {
  using proto::Message;
  Json request = Json::parse(R"({"op": "buffer_create", "name": "w", "size": 8, "parts": [4, 4],
    "tensors": [{"name": "a", "dtype": "U8", "shape": [4], "part": 1, "offset": 0, "size": 4}]})");
  proto::to_new_names(Message::request, "buffer_create", request);
  CHECK(request.dump() ==
        R"({"op":"buffer_create","name":"w","tensors":[{"name":"a","dtype":"U8","shape":[4],"part":1,)"
        R"("offset_bytes":0,"size_bytes":4}],"size_bytes":8,"part_sizes_bytes":[4,4]})");
  proto::to_old_names(Message::request, "buffer_create", request);  // and back, for an older holder
  CHECK(request["size"] == 8);
  CHECK(request["parts"] == Json::array({4, 4}));
  CHECK(request["tensors"][0].contains("offset"));
  CHECK(!request.contains("size_bytes"));

  Json hello = Json::parse(R"({"protocol": 4, "version": "cupool 0.1.0",
    "limits": {"max_payload_bytes": 65536, "frame_timeout_seconds": 5.0, "drop_timeout_seconds": 0.25}})");
  proto::to_old_names(Message::reply, "hello", hello);
  CHECK(hello["holder"] == "cupool 0.1.0");
  CHECK(hello["limits"]["max_payload"] == 65536);
  CHECK(hello["limits"]["frame_timeout_ms"] == 5000);  // seconds in 4, milliseconds before
  CHECK(hello["limits"]["drop_timeout_ms"] == 250);
  proto::to_new_names(Message::reply, "hello", hello);
  CHECK(hello["limits"]["drop_timeout_seconds"] == 0.25);

  Json dropped = {{"ask", 3}, {"freed_count", 2}, {"freed_bytes", 64}};
  proto::to_old_names(Message::reply, "dropped", dropped);
  CHECK(dropped.dump() == R"({"ask":3,"leases":2,"bytes":64})");
  Json notice = {{"notice", "drop"}, {"leases", {1, 2}}, {"requested_bytes", 64}, {"timeout_seconds", 5.0}};
  proto::to_old_names(Message::notice, "drop", notice);
  CHECK(notice["leases"] == Json::array({1, 2}));  // the ids: an array in both
  CHECK(notice["bytes"] == 64);
  CHECK(notice["timeout_ms"] == 5000);

  // A refusal of a request of 1 to 3 names its arguments as that request did.
  CHECK(proto::in_old_names("alloc", R"("size_bytes" must be from 1 to 2^48 ("size_bytes": 0))") ==
        R"("size" must be from 1 to 2^48 ("size": 0))");
  CHECK(proto::in_old_names("trim", R"("keep_bytes" is not a number)") == R"("keep" is not a number)");
  CHECK(proto::in_old_names("free", R"("size_bytes")") == R"("size_bytes")");  // not free's argument

  // Only the op's own fields: status's names are the same in every version.
  Json status = {{"lease_count", 1}, {"size", 2}};
  proto::to_old_names(Message::reply, "status", status);
  CHECK(status.dump() == R"({"lease_count":1,"size":2})");
  // A field both ways, or no object where one is expected, is left alone.
  Json both = {{"size", 1}, {"size_bytes", 2}};
  proto::to_new_names(Message::request, "alloc", both);
  CHECK(both["size_bytes"] == 2);
  Json odd = {{"limits", 7}};
  proto::to_old_names(Message::reply, "hello", odd);
  CHECK(odd.dump() == R"({"limits":7})");
}
