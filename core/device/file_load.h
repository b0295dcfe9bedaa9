// Ranges of a file into device memory, read by several threads at once (issue 26: one thread
// reading from the page cache was the bound of `cupool buffer load`, at a tenth of the bus's
// speed). The work is cut into chunks; each worker thread reads a chunk into a staging slot of
// its own and hands it to a Sink, which copies it on (the CUDA backend: an asynchronous copy from
// pinned memory on the worker's stream; the simulated node: a memcpy into its memory). A file
// that is mostly not in the page cache is read with O_DIRECT (aligned reads, no cache pollution).
// Where the node has GPUDirect Storage (gds.h), the same chunks and threads can instead be read
// by cuFile straight into device memory (load_file_ranges chooses).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/fd.h"
#include "device/staging.h"

namespace cupool {

struct FileRange;

// How a file is read: O_DIRECT when most of it is not in the page cache (automatic), always, or
// never.
enum class DirectIo { automatic, always, never };

// Whether a load reads through GPUDirect Storage (cuFile): when the nvidia-fs module is loaded and
// cuFile takes the file (automatic), always (an error where it cannot: no libcufile, cuFile refuses
// the file; in cuFile's compatibility mode too), or never.
enum class Gds { automatic, always, never };

struct LoadOptions {
  unsigned threads = 0;  // 0: default_load_threads (one per core, 2 to 16)
  DirectIo direct = DirectIo::automatic;
  Gds gds = Gds::automatic;
  std::uint64_t chunk_bytes = 0;  // 0: load_chunk's choice (tests use small chunks)
};

// How a load's bytes travelled: read into pinned host slots and copied (staged), by cuFile with
// nvidia-fs (gpudirect), or by cuFile without it (gpudirect_compatibility: cuFile's own reads
// through host memory, only with Gds::always).
enum class ReadMethod { staged, gpudirect, gpudirect_compatibility };
const char* to_string(ReadMethod method);

// What a load did and where its time went. The stages overlap (reads run while copies run), so
// read and wait are each thread's busy time, averaged over the threads: a load that waits little
// for its copies is bound by its reads.
struct LoadReport {
  std::uint64_t bytes = 0;
  double seconds = 0;            // the whole load, wall clock
  double read_seconds = 0;       // reading the file (per thread, averaged)
  double copy_wait_seconds = 0;  // waiting for a staging slot's copy to finish (per thread, averaged)
  unsigned threads = 0;
  bool direct_io = false;        // read with O_DIRECT
  double resident_fraction = 1;  // of the ranges' pages in the page cache before the load (automatic)
  ReadMethod method = ReadMethod::staged;
  std::uint64_t chunk_bytes = 0;    // the size of a read (the last of a range may be shorter)
  Staging staging = Staging::host;  // the staging slots (staged loads): of every thread, or the fallback any took
  std::string staging_note;         // why some slots are not on huge pages; empty when all are
  std::string gds_note;  // why GPUDirect Storage was not used (Gds::automatic); empty when it was, or never asked
};

// The defaults, from issue 38's measurements on an H200 (16 cores, pinned copies at 55 GB/s): from
// the page cache 2 MiB reads with 16 threads (45.9 GB/s; 16 MiB ones 19-33), from storage with
// O_DIRECT 64 MiB reads with 16 threads (the disk's best, 1.5 GB/s there), through cuFile 16 MiB.
// A load pins at most threads x LoadSink::kSlots slots of a chunk each (plus 8 KiB of alignment
// with O_DIRECT, rounded up to 2 MiB on huge pages): 16 x 2 x 2 MiB = 64 MiB from the page cache,
// 16 x 2 x 64 MiB = about 2 GiB with O_DIRECT, for the load's duration only.
constexpr std::uint64_t kCachedChunk = 2ULL << 20;
constexpr std::uint64_t kDirectChunk = 64ULL << 20;
constexpr std::uint64_t kGdsChunk = 16ULL << 20;
constexpr unsigned kMaxDefaultThreads = 16;

// The default number of reading threads on a machine of `cores` cores (0: not known): one per
// core, at least 2 and at most kMaxDefaultThreads.
unsigned default_load_threads(unsigned cores);
// The chunk a staged load reads at once: options.chunk_bytes, or by default kDirectChunk with
// O_DIRECT and kCachedChunk without.
std::uint64_t load_chunk(const LoadOptions& options, bool direct_io);

// Alignment of an O_DIRECT read (offset, length and buffer); staging slots are this much larger
// than a chunk at each end.
constexpr std::uint64_t kDirectAlign = 4096;

// One worker's end of the pipeline, made and used on the worker's thread.
class LoadSink {
 public:
  virtual ~LoadSink() = default;
  // Staging slot `i` (0 <= i < kSlots): at least the factory's slot_bytes, kDirectAlign-aligned.
  virtual unsigned char* slot(unsigned i) = 0;
  // Waits until what was last handed over from slot `i` no longer needs it.
  virtual void wait(unsigned i) = 0;
  // Sends `bytes` bytes at `from` (inside slot `i`) to `address`.
  virtual void send(unsigned i, const unsigned char* from, std::uint64_t address, std::uint64_t bytes) = 0;
  // Waits for everything sent (the load returns only once the memory holds the file's bytes).
  virtual void finish() = 0;
  // What the slots are (StagingSlots' choice), and why not on huge pages.
  virtual Staging staging() const { return Staging::host; }
  virtual std::string staging_note() const { return {}; }
  static constexpr unsigned kSlots = 2;
};

// Makes a worker's sink on the worker's thread (a CUDA context is made current there). Its slots
// are of `slot_bytes`: the load's largest chunk, plus 2 * kDirectAlign with O_DIRECT.
using SinkFactory = std::function<std::unique_ptr<LoadSink>(std::uint64_t slot_bytes)>;

// Loads every range of the file open at `fd`. `progress` (may be empty) is called on the calling
// thread with the bytes read so far, at most about ten times a second and once at the end. The
// first failure of any worker stops the others and is thrown here (InputError for the file,
// CudaError from a sink); whatever was sent before is waited for first.
LoadReport load_ranges(int fd, const std::vector<FileRange>& ranges, const LoadOptions& options,
                       const SinkFactory& make_sink, const std::function<void(std::uint64_t)>& progress);

// ---- GPUDirect Storage ----

// One worker's reader on the GPUDirect path: file bytes straight into device memory.
class DirectReader {
 public:
  virtual ~DirectReader() = default;
  virtual void read(std::uint64_t file_offset, std::uint64_t address, std::uint64_t bytes) = 0;
};

// The GPUDirect path of one load, as a backend opens it for a file (cuFile, the file registered,
// the target memory registered where cuFile allows).
class DirectPath {
 public:
  virtual ~DirectPath() = default;
  virtual bool gpudirect() const = 0;  // false: cuFile's compatibility mode
  virtual bool direct_io() const = 0;  // the registered descriptor was opened with O_DIRECT
  // A reader for one worker thread, made on it (a CUDA context is made current there).
  virtual std::unique_ptr<DirectReader> reader() = 0;
};

// What a backend offers a load: its staged sinks, and the GPUDirect path where it has one.
struct LoadPaths {
  SinkFactory sink;
  bool nvidia_fs = false;  // the node has the nvidia-fs module: Gds::automatic tries cuFile only then
  // Opens the GPUDirect path for the file at `fd` and the ranges' memory; throws GdsError (gds.h)
  // when the node or cuFile will not. Empty: the backend has no GPUDirect path.
  std::function<std::unique_ptr<DirectPath>(int fd, const std::vector<FileRange>& ranges)> open_direct;
};

// Loads the ranges by the path that `options.gds` and the node choose: GPUDirect (load_ranges_direct)
// or staged (load_ranges). A GPUDirect path that Gds::automatic could not take is said in the
// report's gds_note; with Gds::always its failure is thrown (GdsError, an InputError).
LoadReport load_file_ranges(int fd, const std::vector<FileRange>& ranges, const LoadOptions& options,
                            const LoadPaths& paths, const std::function<void(std::uint64_t)>& progress);

// The GPUDirect loader: the same chunks, threads, progress and failures as load_ranges, each
// worker reading its chunks with a reader of `path`.
LoadReport load_ranges_direct(const std::vector<FileRange>& ranges, const LoadOptions& options, DirectPath& path,
                              const std::function<void(std::uint64_t)>& progress);

// "the file ended at byte AT, before byte WANTED (...)": every loader's words for a file that ends
// before the ranges do.
std::string file_ended(std::uint64_t at, std::uint64_t wanted);

// The file open at `fd` opened again with O_DIRECT (through /proc/self/fd: the same file, no second
// path lookup); an empty Fd, errno set, where it cannot be (tmpfs, for one).
Fd reopen_direct(int fd);

// The share (0 to 1) of the ranges' pages that are in the page cache now (mincore on mappings of
// the ranges alone, sampled: at most 65,536 pages asked; 1 when that cannot be told).
double resident_fraction(int fd, const std::vector<FileRange>& ranges);

}  // namespace cupool
