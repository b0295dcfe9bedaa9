// The protocol fuzz target's input format, for the mutators that keep frames well-formed
// (mutate_main.cpp --frames, protocol_mutator.cpp): byte 0 picks the peer, the rest is a byte
// stream of request frames (docs/protocol.md). split() cuts it into requests and join() writes
// them back with correct headers, so a mutated request still arrives whole: a request sent in
// parts (frames of kind 4, then the last) is one request to the mutators, and one longer than a
// frame is written back in parts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cupool::fuzz {

struct Frames {
  char peer = 0;
  std::vector<std::string> payloads;
  std::string tail;  // bytes after the last whole frame (a broken header, a short payload)
};

inline std::uint32_t get32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

inline std::uint16_t get16(const std::string& s, std::size_t at) {
  return static_cast<std::uint16_t>(static_cast<unsigned char>(s[at]) | static_cast<unsigned char>(s[at + 1]) << 8);
}

inline Frames split(const std::string& input) {
  Frames f;
  if (input.empty()) return f;
  f.peer = input[0];
  std::size_t at = 1, message = 1;  // message: where the request being joined began
  std::string joined;
  while (input.size() - at >= 16 && input.compare(at, 4, "CUPL") == 0) {
    const std::uint32_t length = get32(input, at + 8);
    if (length > input.size() - at - 16) break;
    joined.append(input, at + 16, length);
    const bool part = get16(input, at + 6) == 4;
    at += 16 + length;
    if (part) continue;
    f.payloads.push_back(std::move(joined));
    joined.clear();
    message = at;
  }
  f.tail = input.substr(message);  // a request cut short keeps its parts
  return f;
}

// A request frame with a correct header around `payload` (kind 1, or 4: a part).
inline std::string frame(const std::string& payload, char kind = 1) {
  std::string out = "CUPL";
  out += '\x01';
  out += '\x00';
  out += kind;
  out += '\x00';
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((payload.size() >> (8 * i)) & 0xff));
  out.append(4, '\0');
  out += payload;
  return out;
}

// Frames for one request: one, or parts of equal length (as the protocol's encoder makes them)
// when it is longer than a frame (65536 bytes).
inline std::string request_frames(const std::string& payload) {
  constexpr std::size_t kFrame = 65536;
  const std::size_t n = payload.size() <= kFrame ? 1 : (payload.size() + kFrame - 1) / kFrame;
  std::string out;
  std::size_t at = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t end = payload.size() * (i + 1) / n;
    out += frame(payload.substr(at, end - at), i + 1 == n ? 1 : 4);
    at = end;
  }
  return out;
}

inline std::string join(const Frames& f) {
  std::string out(1, f.peer);
  for (const auto& p : f.payloads) out += request_frames(p);
  out += f.tail;
  return out;
}

}  // namespace cupool::fuzz
