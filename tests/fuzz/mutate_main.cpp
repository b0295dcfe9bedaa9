// Deterministic driver for the fuzz targets: runs every seed file, then `--iterations` random
// mutations of them (byte flips, YAML punctuation inserted, ranges deleted or duplicated, lines
// swapped, truncation), through LLVMFuzzerTestOneInput. Same seed, same inputs.
// Usage: cupool_config_fuzz_replay [--iterations N] [--seed S] [--ext .yaml] [--frames] FILE_OR_DIR...
// Directories are searched for files ending in --ext (default .yaml). --frames: the inputs are
// protocol frames (frames.h); most mutations change payloads and keep the headers right, so the
// holder gets to parse and answer them, and one in eight mutates the raw bytes.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fuzz/frames.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Nasty {
  const char* const* items;
  std::size_t count;
};

// A number that is too big, or a deep flow collection (config text).
const char* const kYamlNasty[] = {"99999999999999999999999GiB",
                                  "-1",
                                  "1e400",
                                  "[[[[[[[[",
                                  "{a: {b: {c:",
                                  "\xef\xbb\xbf",
                                  "\x00",
                                  "*anchor",
                                  "&a [*a]",
                                  "!!binary aGk="};
// Values and keys that requests get wrong (protocol payloads).
const char* const kJsonNasty[] = {"18446744073709551615",
                                  "18446744073709551616",
                                  "9007199254740992",
                                  "-9223372036854775808",
                                  "-1",
                                  "1e400",
                                  "0.5",
                                  "null",
                                  "true",
                                  "\"\"",
                                  "\"\\ud800\"",
                                  "\"\\u0000\"",
                                  "[[[[[[[[[[[[[[[[[[",
                                  "{\"a\":{\"b\":{\"c\":",
                                  ",\"x\":1",
                                  "\"kv\"",
                                  "\"weights\"",
                                  "\"private\"",
                                  "\"local\"",
                                  "4096",
                                  "\xc3\x28",
                                  "\xef\xbb\xbf",
                                  "\x00",
                                  "\"alloc\"",
                                  "\"free\"",
                                  "\"apply\"",
                                  "\"buffer_remove\"",
                                  ",\"force\":true",
                                  ",\"device\":1",
                                  ",\"size\":1048576",
                                  "281474976710656"};

// What a request line and headers get wrong (HTTP heads, --listen addresses).
const char* const kHttpNasty[] = {"\r\n",     "\n",
                                  "\r\n\r\n", " ",
                                  "\t",       "GET",
                                  "HEAD",     "OPTIONS",
                                  "/metrics", "/metrics?a=b",
                                  "HTTP/1.1", "HTTP/2",
                                  "\x00",     "\x7f",
                                  "\xff",     ":",
                                  "[",        "]",
                                  "?",        "65536",
                                  "-1",       "99999999999999999999",
                                  "[::1]:",   "Host: x\r\n"};

std::string mutate(std::string s, std::mt19937_64& rng, const std::vector<std::string>& seeds,
                   const Nasty& nasty = {kYamlNasty, sizeof kYamlNasty / sizeof kYamlNasty[0]}) {
  static const std::string punct = "[]{}:,-#'\"&*!|>%@`? \n\t0123456789.~";
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  const int rounds = 1 + static_cast<int>(rng() % 4);
  for (int r = 0; r < rounds; ++r) {
    switch (rng() % 8) {
      case 0:  // flip a byte
        if (!s.empty()) s[pick(s.size())] = static_cast<char>(rng() & 0xff);
        break;
      case 1:  // insert YAML punctuation
        s.insert(pick(s.size() + 1), 1, punct[pick(punct.size())]);
        break;
      case 2: {  // delete a range
        const std::size_t at = pick(s.size() + 1);
        s.erase(at, pick(16) + 1);
        break;
      }
      case 3: {  // duplicate a range
        const std::size_t at = pick(s.size() + 1);
        const std::string part = s.substr(at, pick(64) + 1);
        s.insert(pick(s.size() + 1), part);
        break;
      }
      case 4: {  // splice in a line of another seed
        const std::string& other = seeds[pick(seeds.size())];
        const std::size_t at = pick(other.size() + 1);
        const std::size_t end = other.find('\n', at);
        s.insert(pick(s.size() + 1), other.substr(at, end == std::string::npos ? std::string::npos : end - at + 1));
        break;
      }
      case 5:  // truncate
        s.resize(pick(s.size() + 1));
        break;
      case 6: {  // change indentation of a line
        const std::size_t nl = s.find('\n', pick(s.size() + 1));
        if (nl != std::string::npos) s.insert(nl + 1, std::string(pick(6) + 1, ' '));
        break;
      }
      default: {  // a nasty value
        const char* n = nasty.items[pick(nasty.count)];
        s.insert(pick(s.size() + 1), n, std::strlen(n) ? std::strlen(n) : 1);
      }
    }
  }
  return s;
}

// Frame-aware: mutates payloads, reorders, drops and repeats frames, changes the peer byte.
std::string mutate_frames(const std::string& input, std::mt19937_64& rng, const std::vector<std::string>& payloads) {
  static const Nasty json{kJsonNasty, sizeof kJsonNasty / sizeof kJsonNasty[0]};
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  if (rng() % 8 == 0) return mutate(input, rng, payloads, json);  // headers too
  cupool::fuzz::Frames f = cupool::fuzz::split(input);
  auto& p = f.payloads;
  const int rounds = 1 + static_cast<int>(rng() % 3);
  for (int r = 0; r < rounds; ++r) {
    switch (rng() % 6) {
      case 0:
      case 1:
      case 2:  // change a payload
        if (!p.empty()) {
          std::string& one = p[pick(p.size())];
          one = mutate(one, rng, payloads, json);
          break;
        }
        [[fallthrough]];
      case 3:  // a request of another seed
        if (!payloads.empty())
          p.insert(p.begin() + static_cast<std::ptrdiff_t>(pick(p.size() + 1)), payloads[pick(payloads.size())]);
        break;
      case 4:  // drop or repeat a frame
        if (!p.empty()) {
          const auto at = p.begin() + static_cast<std::ptrdiff_t>(pick(p.size()));
          if (rng() % 2) {
            p.erase(at);
          } else {
            const std::string again = *at;
            p.insert(at, again);
          }
        }
        break;
      default:  // another peer
        f.peer = static_cast<char>(rng() & 7);
    }
  }
  return cupool::fuzz::join(f);
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = 2000;
  unsigned long long seed = 20261121;
  std::string ext = ".yaml";
  bool frames = false;
  std::vector<std::string> seeds;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iterations" && i + 1 < argc) {
      iterations = std::atol(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--ext" && i + 1 < argc) {
      ext = argv[++i];
    } else if (a == "--frames") {
      frames = true;
    } else if (std::filesystem::is_directory(a)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::recursive_directory_iterator(a))
        if (e.is_regular_file() && e.path().extension() == ext) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const auto& f : files) seeds.push_back(read(f));
    } else if (std::filesystem::is_regular_file(a)) {
      seeds.push_back(read(a));
    } else {
      std::fprintf(stderr, "no such file or directory: %s\n", a.c_str());
      return 2;
    }
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "no seed files\n");
    return 2;
  }
  long failures = 0;
  for (const auto& s : seeds)
    failures += LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()) != 0;
  std::vector<std::string> payloads;  // --frames: every seed's requests, for splicing
  if (frames)
    for (const auto& s : seeds)
      for (auto& p : cupool::fuzz::split(s).payloads) payloads.push_back(std::move(p));
  std::mt19937_64 rng(seed);
  for (long i = 0; i < iterations; ++i) {
    const std::string& from = seeds[static_cast<std::size_t>(rng() % seeds.size())];
    static const Nasty json{kJsonNasty, sizeof kJsonNasty / sizeof kJsonNasty[0]};
    static const Nasty http{kHttpNasty, sizeof kHttpNasty / sizeof kHttpNasty[0]};
    const std::string input = frames           ? mutate_frames(from, rng, payloads)
                              : ext == ".yaml" ? mutate(from, rng, seeds)
                              : ext == ".http" ? mutate(from, rng, seeds, http)
                                               : mutate(from, rng, seeds, json);  // JSON inside (safetensors)
    failures += LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size()) != 0;
  }
  std::printf("%zu seeds and %ld mutations (seed %llu): %ld failed\n", seeds.size(), iterations, seed, failures);
  std::printf("%ld passed, %ld failed\n", static_cast<long>(seeds.size()) + iterations - failures, failures);
  return failures ? 1 : 0;
}
