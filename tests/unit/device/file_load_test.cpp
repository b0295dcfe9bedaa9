#include "device/file_load.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/fd.h"
#include "device/backend.h"

namespace {

using cupool::DirectIo;
using cupool::FileRange;
using cupool::LoadOptions;
using cupool::LoadReport;
using cupool::LoadSink;

// A file of `size` bytes, byte i = (i * 7 + 3) mod 251, removed when the test ends.
struct TempFile {
  std::string path;
  cupool::Fd fd;
  explicit TempFile(std::uint64_t size) {
    char name[] = "/tmp/cupool-file-load-XXXXXX";
    const int raw = ::mkstemp(name);
    REQUIRE(raw >= 0);
    path = name;
    fd.reset(raw);
    std::vector<unsigned char> bytes(size);
    for (std::uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<unsigned char>((i * 7 + 3) % 251);
    REQUIRE(::write(raw, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  }
  ~TempFile() { ::unlink(path.c_str()); }
  static unsigned char at(std::uint64_t i) { return static_cast<unsigned char>((i * 7 + 3) % 251); }
};

// Copies slots into host memory (as the simulated node does), counting what it saw; optionally
// fails on its n-th send.
struct Counters {
  std::atomic<int> sinks{0};
  std::atomic<int> sends{0};
  std::atomic<int> finishes{0};
  int fail_at_send = -1;
};

class TestSink : public LoadSink {
 public:
  TestSink(Counters& c, std::uint64_t slot_bytes) : c_(c) {
    ++c_.sinks;
    for (auto& s : slots_) {
      void* p = nullptr;
      REQUIRE(::posix_memalign(&p, cupool::kDirectAlign, slot_bytes) == 0);
      s.reset(static_cast<unsigned char*>(p));
    }
  }
  unsigned char* slot(unsigned i) override { return slots_[i].get(); }
  void wait(unsigned) override {}
  void send(unsigned, const unsigned char* from, std::uint64_t address, std::uint64_t bytes) override {
    if (++c_.sends == c_.fail_at_send) throw cupool::InputError("the test's sink fails here");
    std::memcpy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), from, bytes);
  }
  void finish() override { ++c_.finishes; }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  Counters& c_;
  std::unique_ptr<unsigned char, Free> slots_[kSlots];
};

LoadReport load(int fd, const std::vector<FileRange>& ranges, const LoadOptions& o, Counters& c,
                std::vector<std::uint64_t>* told = nullptr) {
  return cupool::load_ranges(
      fd, ranges, o, [&](std::uint64_t slot_bytes) { return std::make_unique<TestSink>(c, slot_bytes); },
      [&](std::uint64_t done) {
        if (told) told->push_back(done);
      });
}

}  // namespace

TEST_CASE("load_ranges: every byte of every range arrives, over several threads and many chunks") {
  TempFile f(1'000'003);
  std::vector<unsigned char> memory(1'200'000, 0xee);
  const auto base = reinterpret_cast<std::uintptr_t>(memory.data());
  // Unaligned offsets and sizes, a range smaller than a chunk, one spanning many.
  const std::vector<FileRange> ranges{
      {17, base + 5, 300'001}, {400'000, base + 400'000, 600'003}, {3, base + 350'000, 11}};
  Counters c;
  LoadOptions o;
  o.threads = 4;
  o.chunk_bytes = 65'536;
  o.direct = DirectIo::never;
  std::vector<std::uint64_t> told;
  const LoadReport r = load(f.fd.get(), ranges, o, c, &told);
  for (const FileRange& range : ranges)
    for (std::uint64_t i = 0; i < range.bytes; ++i)
      REQUIRE(memory[range.address - base + i] == TempFile::at(range.file_offset + i));
  CHECK(memory[4] == 0xee);  // nothing outside the ranges
  CHECK(r.bytes == 300'001 + 600'003 + 11);
  CHECK(r.threads == 4);
  CHECK(c.sinks == 4);
  CHECK(c.finishes == 4);
  CHECK(c.sends == 5 + 10 + 1);  // ceil(300001/65536) + ceil(600003/65536) + 1
  CHECK_FALSE(r.direct_io);
  REQUIRE_FALSE(told.empty());
  CHECK(told.back() == r.bytes);  // the last word is everything
}

TEST_CASE("load_ranges: fewer chunks than threads start only as many threads") {
  TempFile f(4096);
  std::vector<unsigned char> memory(4096);
  Counters c;
  LoadOptions o;
  o.threads = 8;
  o.direct = DirectIo::never;
  const LoadReport r = load(f.fd.get(), {{0, reinterpret_cast<std::uintptr_t>(memory.data()), 4096}}, o, c);
  CHECK(r.threads == 1);
  CHECK(c.sinks == 1);
  CHECK(memory[4095] == TempFile::at(4095));
}

TEST_CASE("load_ranges: a file that ends first is an InputError that names the byte, and every sink finishes") {
  TempFile f(100'000);
  std::vector<unsigned char> memory(200'000);
  Counters c;
  LoadOptions o;
  o.threads = 3;
  o.chunk_bytes = 8192;
  o.direct = DirectIo::never;
  try {
    load(f.fd.get(), {{0, reinterpret_cast<std::uintptr_t>(memory.data()), 150'000}}, o, c);
    FAIL("no error");
  } catch (const cupool::InputError& e) {
    // Whichever thread saw the end first says where: at or past byte 100000.
    const std::string what = e.what();
    const auto at = what.find("the file ended at byte ");
    REQUIRE(at != std::string::npos);
    CHECK(std::stoull(what.substr(at + 23)) >= 100'000);
  }
  CHECK(c.finishes == c.sinks);  // what was sent is waited for on the failing path too
}

TEST_CASE("load_ranges: a sink's failure stops the load and is thrown") {
  TempFile f(500'000);
  std::vector<unsigned char> memory(500'000);
  Counters c;
  c.fail_at_send = 3;
  LoadOptions o;
  o.threads = 2;
  o.chunk_bytes = 16'384;
  o.direct = DirectIo::never;
  CHECK_THROWS_WITH_AS(load(f.fd.get(), {{0, reinterpret_cast<std::uintptr_t>(memory.data()), 500'000}}, o, c),
                       "the test's sink fails here", cupool::InputError);
  CHECK(c.sends < 31);  // it stopped: 31 chunks in all
  CHECK(c.finishes == c.sinks);
}

TEST_CASE("load_ranges: O_DIRECT reads aligned spans and hands over the bytes asked for") {
  TempFile f(300'000);
  // Where O_DIRECT cannot be had (tmpfs), `always` says so and the test ends there.
  const std::string self = "/proc/self/fd/" + std::to_string(f.fd.get());
  cupool::Fd probe(::open(self.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
  std::vector<unsigned char> memory(300'000, 0);
  const auto base = reinterpret_cast<std::uintptr_t>(memory.data());
  const std::vector<FileRange> ranges{{1, base, 100'000}, {123'457, base + 100'000, 176'543}};
  Counters c;
  LoadOptions o;
  o.threads = 2;
  o.chunk_bytes = 40'000;  // not a multiple of the alignment either
  o.direct = DirectIo::always;
  if (!probe) {
    CHECK_THROWS_WITH_AS(load(f.fd.get(), ranges, o, c), doctest::Contains("cannot be read with O_DIRECT"),
                         cupool::InputError);
    return;
  }
  const LoadReport r = load(f.fd.get(), ranges, o, c);
  CHECK(r.direct_io);
  for (const FileRange& range : ranges)
    for (std::uint64_t i = 0; i < range.bytes; ++i)
      REQUIRE(memory[range.address - base + i] == TempFile::at(range.file_offset + i));
}

TEST_CASE("load_ranges: automatic reads a file in the page cache without O_DIRECT") {
  TempFile f(65'536);  // just written: in the page cache
  std::vector<unsigned char> memory(65'536);
  const std::vector<FileRange> ranges{{0, reinterpret_cast<std::uintptr_t>(memory.data()), 65'536}};
  CHECK(cupool::resident_fraction(f.fd.get(), ranges) > 0.99);
  Counters c;
  const LoadReport r = load(f.fd.get(), ranges, LoadOptions{}, c);
  CHECK_FALSE(r.direct_io);
  CHECK(r.resident_fraction > 0.99);
  CHECK(memory[65'535] == TempFile::at(65'535));
}
