#include "device/file_load.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/fd.h"
#include "device/backend.h"
#include "device/gds.h"
#include "tests/unit/fixtures.h"

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
    path = cupool::test::temp_path("load.bin");  // its folder goes at exit, also when a check fails
    const int raw = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    REQUIRE(raw >= 0);
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
    const int n = ++c_.sends;
    if (n == c_.fail_at_send) throw cupool::InputError("the test's sink fails here");
    // After the failure, a send takes a millisecond: the other threads stop at their next chunk,
    // and a load that did not stop would send every chunk however slowly its failure travelled
    // (under TSan an exception's unwinding took long enough for the other thread to send them all).
    if (c_.fail_at_send > 0 && n > c_.fail_at_send) std::this_thread::sleep_for(std::chrono::milliseconds(1));
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

TEST_CASE("resident_fraction asks about the ranges only, at a cost bounded whatever the file's size") {
  // Issue 34: a 4 KiB set in a sparse 4 TiB file was mapped and asked whole (10.3 s, 1.03 GiB).
  TempFile f(65'536);
  REQUIRE(::ftruncate(f.fd.get(), off_t{4} << 40) == 0);  // sparse: 4 TiB, 64 KiB written
  std::vector<unsigned char> memory(4096);
  const std::vector<FileRange> small{{4096, reinterpret_cast<std::uintptr_t>(memory.data()), 4096}};
  auto start = std::chrono::steady_clock::now();
  CHECK(cupool::resident_fraction(f.fd.get(), small) > 0.99);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 0.5);
  // A range of the whole hole: sampled, not asked page by page (the hole is in no cache).
  const std::vector<FileRange> hole{{std::uint64_t{1} << 40, 0, std::uint64_t{1} << 40}};
  start = std::chrono::steady_clock::now();
  CHECK(cupool::resident_fraction(f.fd.get(), hole) < 0.01);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 1.0);
}

// ---- GPUDirect Storage: which path a load takes (load_file_ranges) ----

namespace {

// What a GPUDirect path of the test saw (kept outside the path, which the load destroys).
struct DirectCounts {
  std::atomic<int> readers{0};
  std::atomic<int> reads{0};
  int fail_at_read = -1;
};

// A GPUDirect path that preads into host memory, as the simulated node's does; fails on its n-th
// read when asked.
struct FakeDirect : cupool::DirectPath {
  int fd;
  bool direct_mode;
  DirectCounts& counts;
  FakeDirect(int f, bool gpudirect, DirectCounts& c) : fd(f), direct_mode(gpudirect), counts(c) {}
  bool gpudirect() const override { return direct_mode; }
  bool direct_io() const override { return true; }
  std::unique_ptr<cupool::DirectReader> reader() override {
    struct Reader : cupool::DirectReader {
      FakeDirect& p;
      explicit Reader(FakeDirect& path) : p(path) { ++p.counts.readers; }
      void read(std::uint64_t file_offset, std::uint64_t address, std::uint64_t bytes) override {
        if (++p.counts.reads == p.counts.fail_at_read)
          throw cupool::GdsError("cuFileRead", "CU_FILE_IO_ERROR", "the test fails here");
        cupool::read_file_range(p.fd, reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), bytes,
                                file_offset);
      }
    };
    return std::make_unique<Reader>(*this);
  }
};

// What load_file_ranges was offered and did.
struct Node {
  bool nvidia_fs = false;
  bool has_opener = true;
  bool gpudirect = true;  // what the opened path says
  std::string refuse;     // the opener throws GdsError with this, when not empty
  int opens = 0;
  Counters staged;
  DirectCounts direct;

  cupool::LoadPaths paths() {
    cupool::LoadPaths p;
    p.sink = [this](std::uint64_t slot_bytes) { return std::make_unique<TestSink>(staged, slot_bytes); };
    p.nvidia_fs = nvidia_fs;
    if (has_opener)
      p.open_direct = [this](int fd, const std::vector<FileRange>&) -> std::unique_ptr<cupool::DirectPath> {
        ++opens;
        if (!refuse.empty()) throw cupool::GdsError("cuFileHandleRegister", "CU_FILE_IO_NOT_SUPPORTED", refuse);
        return std::make_unique<FakeDirect>(fd, gpudirect, direct);
      };
    return p;
  }
};

LoadReport load_via(Node& node, int fd, const std::vector<FileRange>& ranges, cupool::Gds gds,
                    std::uint64_t chunk = 16'384) {
  LoadOptions o;
  o.threads = 3;
  o.chunk_bytes = chunk;
  o.direct = DirectIo::never;
  o.gds = gds;
  return cupool::load_file_ranges(fd, ranges, o, node.paths(), nullptr);
}

void check_bytes(const std::vector<unsigned char>& memory, const std::vector<FileRange>& ranges) {
  const auto base = reinterpret_cast<std::uintptr_t>(memory.data());
  for (const FileRange& range : ranges)
    for (std::uint64_t i = 0; i < range.bytes; ++i)
      REQUIRE(memory[range.address - base + i] == TempFile::at(range.file_offset + i));
}

}  // namespace

TEST_CASE("load_file_ranges: auto reads through cuFile only where nvidia-fs is loaded and cuFile takes the file") {
  TempFile f(200'000);
  std::vector<unsigned char> memory(200'000, 0);
  const auto base = reinterpret_cast<std::uintptr_t>(memory.data());
  const std::vector<FileRange> ranges{{5, base, 100'000}, {120'001, base + 100'000, 79'999}};

  SUBCASE("nvidia-fs loaded, a gpudirect path: every chunk by the direct readers, none staged") {
    Node node;
    node.nvidia_fs = true;
    const LoadReport r = load_via(node, f.fd.get(), ranges, cupool::Gds::automatic);
    CHECK(r.method == cupool::ReadMethod::gpudirect);
    CHECK(r.gds_note.empty());
    CHECK(r.direct_io);
    CHECK(r.bytes == 179'999);
    CHECK(r.threads == 3);
    CHECK(node.direct.readers == 3);
    CHECK(node.direct.reads == 7 + 5);  // ceil(100000/16384) + ceil(79999/16384)
    CHECK(node.staged.sends == 0);
    check_bytes(memory, ranges);
  }
  SUBCASE("no nvidia-fs: cuFile is not even opened, and the note says why") {
    Node node;
    const LoadReport r = load_via(node, f.fd.get(), ranges, cupool::Gds::automatic);
    CHECK(node.opens == 0);
    CHECK(r.method == cupool::ReadMethod::staged);
    CHECK(r.gds_note.find("nvidia-fs kernel module is not loaded") != std::string::npos);
    CHECK(node.staged.sends == 12);
    check_bytes(memory, ranges);
  }
  SUBCASE("cuFile opens only in compatibility mode: the staged reads, which are faster") {
    Node node;
    node.nvidia_fs = true;
    node.gpudirect = false;
    const LoadReport r = load_via(node, f.fd.get(), ranges, cupool::Gds::automatic);
    CHECK(node.opens == 1);
    CHECK(r.method == cupool::ReadMethod::staged);
    CHECK(r.gds_note.find("compatibility mode") != std::string::npos);
    CHECK(node.staged.sends == 12);  // the path was dropped before any read
    check_bytes(memory, ranges);
  }
  SUBCASE("cuFile refuses the file: the staged reads, with cuFile's words") {
    Node node;
    node.nvidia_fs = true;
    node.refuse = "cuFile will not read this file (cuFileHandleRegister: CU_FILE_IO_NOT_SUPPORTED)";
    const LoadReport r = load_via(node, f.fd.get(), ranges, cupool::Gds::automatic);
    CHECK(r.method == cupool::ReadMethod::staged);
    CHECK(r.gds_note == node.refuse);
    check_bytes(memory, ranges);
  }
  SUBCASE("never: no cuFile and no note") {
    Node node;
    node.nvidia_fs = true;
    const LoadReport r = load_via(node, f.fd.get(), ranges, cupool::Gds::never);
    CHECK(node.opens == 0);
    CHECK(r.method == cupool::ReadMethod::staged);
    CHECK(r.gds_note.empty());
  }
}

TEST_CASE("load_file_ranges: always reads through cuFile, in compatibility mode too, or fails saying why") {
  TempFile f(100'000);
  std::vector<unsigned char> memory(100'000, 0);
  const std::vector<FileRange> ranges{{0, reinterpret_cast<std::uintptr_t>(memory.data()), 100'000}};

  SUBCASE("compatibility mode: cuFile reads anyway") {
    Node node;
    node.gpudirect = false;
    const LoadReport r = load_via(node, f.fd.get(), ranges, cupool::Gds::always);
    CHECK(r.method == cupool::ReadMethod::gpudirect_compatibility);
    CHECK(node.staged.sends == 0);
    check_bytes(memory, ranges);
  }
  SUBCASE("cuFile refuses the file: GdsError naming the call and the way out, nothing staged") {
    Node node;
    node.refuse = "cuFile will not read this file";
    try {
      load_via(node, f.fd.get(), ranges, cupool::Gds::always);
      FAIL("no error");
    } catch (const cupool::GdsError& e) {
      CHECK(e.api() == "cuFileHandleRegister");
      CHECK(e.result() == "CU_FILE_IO_NOT_SUPPORTED");
      CHECK(std::string(e.what()) == "cuFile will not read this file; load without --gds always");
    }
    CHECK(node.staged.sinks == 0);
  }
  SUBCASE("a backend without a GPUDirect path") {
    Node node;
    node.has_opener = false;
    CHECK_THROWS_WITH_AS(load_via(node, f.fd.get(), ranges, cupool::Gds::always),
                         doctest::Contains("not available on this backend"), cupool::InputError);
  }
  SUBCASE("a read that fails stops the load and is thrown") {
    Node node;
    node.direct.fail_at_read = 2;
    CHECK_THROWS_WITH_AS(load_via(node, f.fd.get(), ranges, cupool::Gds::always, 1024), "the test fails here",
                         cupool::GdsError);
    CHECK(node.direct.reads < 98);  // 98 chunks in all; the others stopped
  }
  SUBCASE("a file that ends first names the byte") {
    Node node;
    std::vector<unsigned char> more(150'000);
    CHECK_THROWS_WITH_AS(
        load_via(node, f.fd.get(), {{0, reinterpret_cast<std::uintptr_t>(more.data()), 150'000}}, cupool::Gds::always),
        doctest::Contains("the file ended at byte"), cupool::InputError);
  }
}

TEST_CASE(
    "the loader's defaults: one thread per core, 2 to 16; 2 MiB chunks from the page cache, 64 MiB with O_DIRECT") {
  CHECK(cupool::default_load_threads(0) == 2);  // not known
  CHECK(cupool::default_load_threads(1) == 2);
  CHECK(cupool::default_load_threads(6) == 6);
  CHECK(cupool::default_load_threads(16) == 16);
  CHECK(cupool::default_load_threads(128) == 16);
  LoadOptions o;
  CHECK(cupool::load_chunk(o, false) == 2ULL << 20);
  CHECK(cupool::load_chunk(o, true) == 64ULL << 20);
  o.chunk_bytes = 65'536;  // what a caller asks wins either way
  CHECK(cupool::load_chunk(o, false) == 65'536);
  CHECK(cupool::load_chunk(o, true) == 65'536);
}

TEST_CASE("load_ranges: from the page cache by default 2 MiB chunks, slots of the largest chunk only") {
  TempFile f(5ULL << 20);  // just written: in the page cache
  std::vector<unsigned char> memory(5ULL << 20);
  const std::vector<FileRange> ranges{{0, reinterpret_cast<std::uintptr_t>(memory.data()), 5ULL << 20}};
  Counters c;
  std::vector<std::uint64_t> slot_sizes;
  std::mutex m;
  const cupool::SinkFactory recording = [&](std::uint64_t slot_bytes) -> std::unique_ptr<LoadSink> {
    std::lock_guard<std::mutex> lock(m);
    slot_sizes.push_back(slot_bytes);
    return std::make_unique<TestSink>(c, slot_bytes);
  };
  LoadOptions o;
  o.threads = 2;
  const LoadReport r = cupool::load_ranges(f.fd.get(), ranges, o, recording, {});
  CHECK_FALSE(r.direct_io);
  CHECK(r.chunk_bytes == 2ULL << 20);
  CHECK(c.sends == 3);                                                      // 2 + 2 + 1 MiB
  CHECK(slot_sizes == std::vector<std::uint64_t>{2ULL << 20, 2ULL << 20});  // no O_DIRECT slack
  CHECK(r.staging == cupool::Staging::host);                                // the test's sinks
  CHECK(memory[(5ULL << 20) - 1] == TempFile::at((5ULL << 20) - 1));

  // A small load gets slots of its size, not of a chunk (with O_DIRECT: and the alignment slack).
  slot_sizes.clear();
  const std::vector<FileRange> small{{3, reinterpret_cast<std::uintptr_t>(memory.data()), 10'000}};
  o.direct = DirectIo::always;
  try {
    const LoadReport d = cupool::load_ranges(f.fd.get(), small, o, recording, {});
    CHECK(d.direct_io);
    CHECK(d.chunk_bytes == 64ULL << 20);
    CHECK(slot_sizes == std::vector<std::uint64_t>{10'000 + 2 * cupool::kDirectAlign});
    CHECK(memory[9'999] == TempFile::at(10'002));
  } catch (const cupool::InputError& e) {
    CHECK(std::string(e.what()).find("cannot be read with O_DIRECT") != std::string::npos);  // tmpfs
  }
}

namespace {

// A sink that says its slots are of `staging` (the first `fallbacks` sinks made fall back).
class StagedSink : public TestSink {
 public:
  StagedSink(Counters& c, std::uint64_t slot_bytes, bool fallback) : TestSink(c, slot_bytes), fallback_(fallback) {}
  cupool::Staging staging() const override { return fallback_ ? cupool::Staging::pinned : cupool::Staging::huge_pages; }
  std::string staging_note() const override { return fallback_ ? "cuMemHostRegister failed: NOT_SUPPORTED" : ""; }

 private:
  bool fallback_;
};

}  // namespace

TEST_CASE("load_ranges reports huge-page slots only when every thread had them, else the fallback and why") {
  TempFile f(65'536);
  std::vector<unsigned char> memory(65'536);
  const std::vector<FileRange> ranges{{0, reinterpret_cast<std::uintptr_t>(memory.data()), 65'536}};
  LoadOptions o;
  o.threads = 4;
  o.chunk_bytes = 4096;
  o.direct = DirectIo::never;
  for (const int fallbacks : {0, 1, 4}) {
    CAPTURE(fallbacks);
    Counters c;
    std::atomic<int> made{0};
    const LoadReport r = cupool::load_ranges(
        f.fd.get(), ranges, o,
        [&](std::uint64_t slot_bytes) { return std::make_unique<StagedSink>(c, slot_bytes, made++ < fallbacks); }, {});
    CHECK(r.threads == 4);
    CHECK(r.staging == (fallbacks ? cupool::Staging::pinned : cupool::Staging::huge_pages));
    CHECK(r.staging_note == (fallbacks ? "cuMemHostRegister failed: NOT_SUPPORTED" : ""));
  }
}
