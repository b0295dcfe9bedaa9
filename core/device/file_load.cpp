// The parallel file loader behind Backend::load_file (file_load.h).
#include "device/file_load.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "base/error.h"
#include "base/fd.h"
#include "device/backend.h"
#include "device/gds.h"

namespace cupool {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Chunk {
  std::uint64_t file_offset = 0;
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
};

// Reads `bytes` bytes at `offset` of a file opened with O_DIRECT into `slot` (kDirectAlign-aligned,
// bytes + 2 * kDirectAlign long): the reads start and end on aligned bytes, so the data starts
// `offset % kDirectAlign` bytes into the slot; returns where.
const unsigned char* read_direct(int fd, unsigned char* slot, std::uint64_t bytes, std::uint64_t offset) {
  const std::uint64_t start = offset & ~(kDirectAlign - 1);
  const std::uint64_t lead = offset - start;
  const std::uint64_t need = lead + bytes;
  const std::uint64_t span = (need + kDirectAlign - 1) & ~(kDirectAlign - 1);
  std::uint64_t done = 0;
  while (done < need) {
    const ssize_t got =
        ::pread(fd, slot + done, static_cast<std::size_t>(span - done), static_cast<off_t>(start + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw InputError(std::string("reading the file (O_DIRECT) failed: ") + std::strerror(errno));
    if (got == 0) throw InputError(file_ended(start + done, offset + bytes));
    done += static_cast<std::uint64_t>(got);
    // A short read of a regular file opened with O_DIRECT is its end: the next would be unaligned.
    if (done < need && done % kDirectAlign != 0) throw InputError(file_ended(start + done, offset + bytes));
  }
  return slot + lead;
}

// The ranges cut into chunks of at most `chunk` bytes; adds their bytes to `report`.
std::vector<Chunk> cut(const std::vector<FileRange>& ranges, std::uint64_t chunk, LoadReport& report) {
  std::vector<Chunk> chunks;
  for (const FileRange& r : ranges)
    for (std::uint64_t at = 0; at < r.bytes; at += chunk) {
      const std::uint64_t n = std::min(chunk, r.bytes - at);
      chunks.push_back({r.file_offset + at, r.address + at, n});
      report.bytes += n;
    }
  return chunks;
}

// The worker threads of one load: they take chunks in turn (next), count what they read (done),
// and stop at the first failure, which run() throws once every worker has ended.
struct Crew {
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> done{0};
  std::atomic<bool> stop{false};
  std::vector<double> read_s, wait_s;  // per worker

  explicit Crew(unsigned threads) : read_s(threads, 0.0), wait_s(threads, 0.0) {}

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_) failure_ = std::move(e);
    stop = true;
  }

  // Runs work(t) on each of the threads (work catches nothing it cannot: what it throws fails the
  // load), telling `progress` on this thread about ten times a second and once at the end.
  void run(const std::function<void(unsigned)>& work, const std::function<void(std::uint64_t)>& progress) {
    const auto threads = static_cast<unsigned>(read_s.size());
    std::vector<std::thread> pool;
    try {
      for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([this, &work, t] {
          try {
            work(t);
          } catch (...) {
            fail(std::current_exception());
          }
          std::lock_guard<std::mutex> lock(mutex_);
          ++finished_;
          changed_.notify_all();
        });
    } catch (...) {
      fail(std::current_exception());
    }
    std::exception_ptr told_failure;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      while (finished_ < pool.size()) {
        changed_.wait_for(lock, std::chrono::milliseconds(100));
        if (progress && !stop && finished_ < pool.size()) {
          lock.unlock();
          try {
            progress(done.load());
          } catch (...) {
            told_failure = std::current_exception();
            stop = true;
          }
          lock.lock();
        }
      }
    }
    for (std::thread& th : pool) th.join();
    if (told_failure) std::rethrow_exception(told_failure);
    if (failure_) std::rethrow_exception(failure_);
    if (progress) progress(done.load());
  }

  // Each worker's busy times, averaged over the workers, into the report.
  void account(LoadReport& report) const {
    const double n = static_cast<double>(read_s.size());
    for (std::size_t t = 0; t < read_s.size(); ++t) {
      report.read_seconds += read_s[t] / n;
      report.copy_wait_seconds += wait_s[t] / n;
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::size_t finished_ = 0;
  std::exception_ptr failure_;
};

unsigned thread_count(const LoadOptions& options, std::size_t chunks) {
  const unsigned threads =
      options.threads ? options.threads : default_load_threads(std::thread::hardware_concurrency());
  return static_cast<unsigned>(std::min<std::size_t>(threads, chunks));
}

// Which kind of slots a load had: every thread's, or the first fallback one took (with its reason).
struct StagingSeen {
  std::mutex mutex;
  bool any = false;
  Staging staging = Staging::host;
  std::string note;

  void saw(const LoadSink& sink) {
    std::lock_guard<std::mutex> lock(mutex);
    if (any && (staging != Staging::huge_pages || sink.staging() == Staging::huge_pages)) return;
    any = true;
    staging = sink.staging();
    note = sink.staging_note();
  }
};

}  // namespace

unsigned default_load_threads(unsigned cores) { return std::clamp(cores, 2u, kMaxDefaultThreads); }

std::uint64_t load_chunk(const LoadOptions& options, bool direct_io) {
  if (options.chunk_bytes) return options.chunk_bytes;
  return direct_io ? kDirectChunk : kCachedChunk;
}

std::string file_ended(std::uint64_t at, std::uint64_t wanted) {
  return "the file ended at byte " + std::to_string(at) + ", before byte " + std::to_string(wanted) +
         " (was it truncated while being read?)";
}

Fd reopen_direct(int fd) {
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  return Fd(::open(self.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
}

const char* to_string(ReadMethod method) {
  switch (method) {
    case ReadMethod::staged: return "staged";
    case ReadMethod::gpudirect: return "gpudirect";
    case ReadMethod::gpudirect_compatibility: return "gpudirect_compatibility";
  }
  return "staged";
}

double resident_fraction(int fd, const std::vector<FileRange>& ranges) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) return 1;
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (page_size <= 0) return 1;
  const auto page = static_cast<std::uint64_t>(page_size);
  // Only the ranges' pages are asked, in windows of kWindow pages, and at most kWindows windows
  // spread evenly over them: the cost stays small whatever the file's size (a 4 KiB set in a sparse
  // 4 TiB file once mapped and asked all of it: 10 s and 1 GiB) and the ranges'.
  constexpr std::uint64_t kWindow = 256;
  constexpr std::uint64_t kWindows = 256;
  std::uint64_t windows = 0;
  for (const FileRange& r : ranges)
    if (r.bytes && r.file_offset < size) {
      const std::uint64_t pages = (std::min(size, r.file_offset + r.bytes) - 1) / page - r.file_offset / page + 1;
      windows += (pages + kWindow - 1) / kWindow;
    }
  const std::uint64_t every = std::max<std::uint64_t>(1, windows / kWindows);
  std::vector<unsigned char> in_core(kWindow);
  std::uint64_t pages = 0, resident = 0, window = 0;
  for (const FileRange& r : ranges) {
    if (!r.bytes || r.file_offset >= size) continue;
    const std::uint64_t last = (std::min(size, r.file_offset + r.bytes) - 1) / page;
    for (std::uint64_t first = r.file_offset / page; first <= last; first += kWindow) {
      if (window++ % every != 0) continue;
      const std::uint64_t count = std::min(kWindow, last - first + 1);
      const auto bytes = static_cast<std::size_t>(count * page);
      void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(first * page));
      if (map == MAP_FAILED) return 1;
      const bool told = ::mincore(map, bytes, in_core.data()) == 0;
      ::munmap(map, bytes);
      if (!told) return 1;
      pages += count;
      for (std::uint64_t p = 0; p < count; ++p) resident += in_core[p] & 1u;
    }
  }
  return pages ? static_cast<double>(resident) / static_cast<double>(pages) : 1;
}

LoadReport load_ranges(int fd, const std::vector<FileRange>& ranges, const LoadOptions& options,
                       const SinkFactory& make_sink, const std::function<void(std::uint64_t)>& progress) {
  const auto started = Clock::now();
  LoadReport report;
  std::uint64_t total = 0;
  for (const FileRange& r : ranges) total += r.bytes;
  if (total == 0) {
    if (progress) progress(0);
    return report;
  }

  Fd direct;
  if (options.direct != DirectIo::never) {
    bool wanted = options.direct == DirectIo::always;
    if (options.direct == DirectIo::automatic) {
      report.resident_fraction = resident_fraction(fd, ranges);
      wanted = report.resident_fraction < 0.5;
    }
    if (wanted) {
      direct = reopen_direct(fd);
      if (!direct && options.direct == DirectIo::always)
        throw InputError(std::string("the file cannot be read with O_DIRECT (") + std::strerror(errno) +
                         "); load it without --direct-io always");
    }
  }
  report.direct_io = static_cast<bool>(direct);
  report.chunk_bytes = load_chunk(options, report.direct_io);
  const std::vector<Chunk> chunks = cut(ranges, report.chunk_bytes, report);
  std::uint64_t largest = 0;
  for (const Chunk& c : chunks) largest = std::max(largest, c.bytes);
  // A small load gets small slots; O_DIRECT reads from the aligned byte before and to the one after.
  const std::uint64_t slot_bytes = largest + (direct ? 2 * kDirectAlign : 0);
  report.threads = thread_count(options, chunks.size());
  StagingSeen seen;
  Crew crew(report.threads);
  crew.run(
      [&](unsigned t) {
        std::unique_ptr<LoadSink> sink = make_sink(slot_bytes);
        seen.saw(*sink);
        try {
          bool busy[LoadSink::kSlots] = {};
          unsigned s = 0;
          while (!crew.stop) {
            const std::size_t k = crew.next.fetch_add(1);
            if (k >= chunks.size()) break;
            const Chunk& c = chunks[k];
            if (busy[s]) {
              const auto w0 = Clock::now();
              sink->wait(s);
              crew.wait_s[t] += seconds(Clock::now() - w0);
            }
            unsigned char* slot = sink->slot(s);
            const auto r0 = Clock::now();
            const unsigned char* from = slot;
            if (direct)
              from = read_direct(direct.get(), slot, c.bytes, c.file_offset);
            else
              read_file_range(fd, slot, c.bytes, c.file_offset);
            crew.read_s[t] += seconds(Clock::now() - r0);
            sink->send(s, from, c.address, c.bytes);
            busy[s] = true;
            s = (s + 1) % LoadSink::kSlots;
            crew.done += c.bytes;
          }
        } catch (...) {
          crew.fail(std::current_exception());
        }
        // What was sent is waited for before the slots go, on every path.
        const auto w0 = Clock::now();
        sink->finish();
        crew.wait_s[t] += seconds(Clock::now() - w0);
      },
      progress);
  crew.account(report);
  report.staging = seen.staging;
  report.staging_note = seen.note;
  report.seconds = seconds(Clock::now() - started);
  return report;
}

LoadReport load_ranges_direct(const std::vector<FileRange>& ranges, const LoadOptions& options, DirectPath& path,
                              const std::function<void(std::uint64_t)>& progress) {
  const auto started = Clock::now();
  LoadReport report;
  report.chunk_bytes = options.chunk_bytes ? options.chunk_bytes : kGdsChunk;
  report.method = path.gpudirect() ? ReadMethod::gpudirect : ReadMethod::gpudirect_compatibility;
  report.direct_io = path.direct_io();
  const std::vector<Chunk> chunks = cut(ranges, report.chunk_bytes, report);
  if (chunks.empty()) {
    if (progress) progress(0);
    return report;
  }
  report.threads = thread_count(options, chunks.size());
  Crew crew(report.threads);
  crew.run(
      [&](unsigned t) {
        std::unique_ptr<DirectReader> reader = path.reader();
        while (!crew.stop) {
          const std::size_t k = crew.next.fetch_add(1);
          if (k >= chunks.size()) break;
          const Chunk& c = chunks[k];
          const auto r0 = Clock::now();
          reader->read(c.file_offset, c.address, c.bytes);
          crew.read_s[t] += seconds(Clock::now() - r0);
          crew.done += c.bytes;
        }
      },
      progress);
  crew.account(report);
  report.seconds = seconds(Clock::now() - started);
  return report;
}

LoadReport load_file_ranges(int fd, const std::vector<FileRange>& ranges, const LoadOptions& options,
                            const LoadPaths& paths, const std::function<void(std::uint64_t)>& progress) {
  std::string note;
  std::uint64_t total = 0;
  for (const FileRange& r : ranges) total += r.bytes;
  if (options.gds != Gds::never && total > 0) {
    const bool always = options.gds == Gds::always;
    if (!paths.open_direct) {
      if (always) throw InputError("GPUDirect Storage is not available on this backend; load without --gds always");
      note = "this backend has no GPUDirect Storage";
    } else if (!always && !paths.nvidia_fs) {
      note =
          "the nvidia-fs kernel module is not loaded, so GPUDirect Storage would read through host memory "
          "(cuFile's compatibility mode), which cupool's own reads beat";
    } else {
      // Only opening falls back: a read that fails once cuFile has the file fails the load.
      std::unique_ptr<DirectPath> path;
      try {
        path = paths.open_direct(fd, ranges);
      } catch (const GdsError& e) {
        if (always) throw GdsError(e.api(), e.result(), std::string(e.what()) + "; load without --gds always");
        note = e.what();
      }
      if (path && (always || path->gpudirect())) return load_ranges_direct(ranges, options, *path, progress);
      if (path)
        note = "cuFile opened only in its compatibility mode (without nvidia-fs), which cupool's own reads beat";
    }
  }
  LoadReport report = load_ranges(fd, ranges, options, paths.sink, progress);
  report.gds_note = note;
  return report;
}

}  // namespace cupool
