// The protocol fuzz target's input format, for the mutators that keep frames well-formed
// (mutate_main.cpp --frames, protocol_mutator.cpp): byte 0 picks the peer, the rest is a byte
// stream of request frames (docs/protocol.md). split() cuts it into payloads and join() writes
// them back with correct headers, so a mutated payload still arrives as a whole frame.
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

inline Frames split(const std::string& input) {
  Frames f;
  if (input.empty()) return f;
  f.peer = input[0];
  std::size_t at = 1;
  while (input.size() - at >= 16 && input.compare(at, 4, "CUPL") == 0) {
    const std::uint32_t length = get32(input, at + 8);
    if (length > input.size() - at - 16) break;
    f.payloads.push_back(input.substr(at + 16, length));
    at += 16 + length;
  }
  f.tail = input.substr(at);
  return f;
}

// A request frame with a correct header around `payload`.
inline std::string frame(const std::string& payload) {
  std::string out = "CUPL";
  out += '\x01';
  out += '\x00';
  out += '\x01';
  out += '\x00';
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((payload.size() >> (8 * i)) & 0xff));
  out.append(4, '\0');
  out += payload;
  return out;
}

inline std::string join(const Frames& f) {
  std::string out(1, f.peer);
  for (const auto& p : f.payloads) out += frame(p);
  out += f.tail;
  return out;
}

}  // namespace cupool::fuzz
