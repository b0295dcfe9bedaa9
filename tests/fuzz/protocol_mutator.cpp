// libFuzzer's mutators for the protocol target (only in the CUPOOL_FUZZ build): most mutations
// change one payload with libFuzzer's own mutator and rewrite the frame headers (frames.h), so
// the holder gets whole frames to answer instead of length mismatches; one in eight mutates the
// raw bytes, headers included. Cross-over splices the frames of two inputs.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "protocol/protocol.h"
#include "tests/fuzz/frames.h"

extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);

namespace {

std::size_t store(const std::string& out, std::uint8_t* data, std::size_t max_size) {
  if (out.size() > max_size) return 0;
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

}  // namespace

extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size, std::size_t max_size,
                                               unsigned int seed) {
  std::minstd_rand rng(seed);
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  if (size == 0 || rng() % 8 == 0) return LLVMFuzzerMutate(data, size, max_size);
  cupool::fuzz::Frames f = cupool::fuzz::split(std::string(reinterpret_cast<const char*>(data), size));
  auto& p = f.payloads;
  if (p.empty()) return LLVMFuzzerMutate(data, size, max_size);
  const std::size_t i = pick(p.size());
  switch (rng() % 8) {
    case 0:  // drop a frame
      if (p.size() > 1) {
        p.erase(p.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
      [[fallthrough]];
    case 1: {  // repeat a frame
      const std::string again = p[i];
      p.insert(p.begin() + static_cast<std::ptrdiff_t>(i), again);
      break;
    }
    case 2:  // swap two frames
      std::swap(p[i], p[pick(p.size())]);
      break;
    case 3:  // another peer
      f.peer = static_cast<char>(rng() & 7);
      break;
    default: {  // change one payload
      std::string& one = p[i];
      const std::size_t others = size - one.size();
      if (others >= max_size) return LLVMFuzzerMutate(data, size, max_size);
      const std::size_t room = std::min(max_size - others, cupool::proto::kMaxPayload);
      if (one.empty()) one = "{}";
      const std::size_t old = one.size();
      if (room < old) return LLVMFuzzerMutate(data, size, max_size);
      one.resize(room);
      one.resize(LLVMFuzzerMutate(reinterpret_cast<std::uint8_t*>(one.data()), old, room));
    }
  }
  const std::size_t n = store(cupool::fuzz::join(f), data, max_size);
  return n ? n : LLVMFuzzerMutate(data, size, max_size);
}

extern "C" std::size_t LLVMFuzzerCustomCrossOver(const std::uint8_t* data1, std::size_t size1,
                                                 const std::uint8_t* data2, std::size_t size2, std::uint8_t* out,
                                                 std::size_t max_out_size, unsigned int seed) {
  std::minstd_rand rng(seed);
  cupool::fuzz::Frames a = cupool::fuzz::split(std::string(reinterpret_cast<const char*>(data1), size1));
  const cupool::fuzz::Frames b = cupool::fuzz::split(std::string(reinterpret_cast<const char*>(data2), size2));
  // The first frames of one, then the last frames of the other.
  const std::size_t keep = a.payloads.empty() ? 0 : static_cast<std::size_t>(rng() % (a.payloads.size() + 1));
  const std::size_t from = b.payloads.empty() ? 0 : static_cast<std::size_t>(rng() % (b.payloads.size() + 1));
  a.payloads.resize(keep);
  a.payloads.insert(a.payloads.end(), b.payloads.begin() + static_cast<std::ptrdiff_t>(from), b.payloads.end());
  a.tail = b.tail;
  return store(cupool::fuzz::join(a), out, max_out_size);
}
