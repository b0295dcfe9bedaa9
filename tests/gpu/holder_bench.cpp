// cupool_holder_bench: what "allocate -> usable in another process -> freed" costs on one GPU
// (device 0), through the holder and through the driver alone.
//
// Paths (--paths, default all):
//   holder      a client process: cupool_alloc -> 1-byte cupool_write (first use) -> cupool_release,
//               against a running `cupool hold` (--socket, pool --pool on device 0, posix_fd), with
//               the client's cache off (cupool_set_cache_limit 0): every round trip is cold (the
//               holder allocates and exports, the client imports, touches and unmaps).
//   holder-warm the same with the client's cache on (the library's default): after the first round
//               trip, every cupool_alloc takes the block the previous cupool_release kept mapped.
//   bare        the same round trip with the driver API only and no cupool code: an exporter
//               process owns a pool (release threshold max), allocates on its stream, records an
//               IPC event and exports the pointer; an importer process imports the pointer, waits
//               for the event, writes 1 byte, frees its mapping; then the exporter frees.
//   bare-t0     bare with the exporter's release threshold at 0, and a cuStreamSynchronize after
//               its free (without a synchronize in the owning process a threshold never releases).
//   bare-stream bare with the importer's first use on its own stream (1-byte cuMemcpyHtoDAsync +
//               cuStreamSynchronize of that stream) instead of the legacy stream (cuMemcpyHtoD).
//   bare-free   bare with the importer's release by cuMemFree instead of cuMemFreeAsync +
//               cuStreamSynchronize. bare-stream and bare-free run only when named: they say which
//               of the importer's steps costs what (issue 12: measure before changing the path).
//   bare-touch  bare-free with the importer's first use made four ways in turn (round trip i uses way
//               i % 4): a pageable cuMemcpyHtoD; the same after a 1 ms pause; cuMemsetD8Async on its
//               stream; cuMemcpyHtoDAsync from pinned memory. Is the first use's cost the copy, or
//               something the import left to finish? Also only when named.
//   attach      what a process that has started CUDA already pays to begin using the holder:
//               cupool_connect, the first cupool_alloc (import_pool included) and the first write, in
//               10 fresh processes one after another (the first size of --sizes). Only when named.
//   legacy      cuMemAlloc + cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle / cuMemFree.
//   ab-*        the driver-only A/B controls of a cold round trip (issue 26; --paths ab runs them all,
//               only when named): how the importer waits for the exporter's work (no wait after the
//               exporter's synchronize, cuEventSynchronize, cuStreamWaitEvent, a cuStreamWaitValue32
//               flag), whether the exporter writes the block, how the importer first uses it, whether
//               a block returns right after its unmap, and legacy IPC the same way (--help lists them).
//   throughput  1, 8, 64 (--clients) client processes looping alloc -> write -> release through
//               the holder for --seconds, started together at a barrier, with the client's cache on
//               (warm); throughput-cold the same with it off. Two controls say what bounds them:
//               throughput-no-write (warm, without the write: the holder and the library alone) and
//               throughput-write-only (only the 1-byte write and its synchronize, each process on a
//               cuMemAlloc of its own: the GPU's share, with no cupool code).
// The pair paths also time every step on both sides, so the table shows where a round trip goes.
//
// The orchestrating process never initialises CUDA (nor loads libcuda): every measuring process
// is fork()ed from it and starts its own driver. Children report over socketpairs; every wait has
// a timeout, and a child that fails says which call failed, in which process, and exits non-zero.
// Exit status: 0 every selected path ran, 1 a path failed, 2 bad usage, 77 no driver or device.
#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cupool/client.h"

namespace {

constexpr const char* kProgram = "cupool_holder_bench";
constexpr int kExitSkip = 77;  // CTest's skip code, used by the GPU tests
constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;
constexpr std::uint64_t kGiB = 1024 * kMiB;

// ------------------------------------------------------------------------------------------------
// Options

struct Options {
  std::string socket;
  std::string pool = "bench";
  std::vector<std::uint64_t> sizes = {kMiB, 64 * kMiB, kGiB};
  int iterations = 0;  // 0: 200 for sizes up to 64 MiB, 50 above
  int warmup = 5;
  std::vector<std::string> paths = {"holder",
                                    "holder-warm",
                                    "bare",
                                    "bare-t0",
                                    "legacy",
                                    "attach",
                                    "throughput",
                                    "throughput-cold",
                                    "throughput-no-write",
                                    "throughput-write-only"};
  std::vector<int> clients = {1, 8, 64};
  double seconds = 3;
  std::uint64_t throughput_size = kMiB;
  std::string json;
  int timeout_s = 60;
  bool allow_simulated = false;
};

Options g_opt;

int iterations_for(std::uint64_t size) {
  if (g_opt.iterations > 0) return g_opt.iterations;
  return size <= 64 * kMiB ? 200 : 50;
}

std::string fmt_size(std::uint64_t bytes) {
  char buf[64];
  if (bytes >= kGiB && bytes % kGiB == 0)
    std::snprintf(buf, sizeof buf, "%" PRIu64 " GiB", bytes / kGiB);
  else if (bytes >= kMiB && bytes % kMiB == 0)
    std::snprintf(buf, sizeof buf, "%" PRIu64 " MiB", bytes / kMiB);
  else if (bytes >= kKiB && bytes % kKiB == 0)
    std::snprintf(buf, sizeof buf, "%" PRIu64 " KiB", bytes / kKiB);
  else
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", bytes);
  return buf;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  out.push_back(cur);
  return out;
}

std::string trim(const std::string& s) {
  std::size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t')) --b;
  return s.substr(a, b - a);
}

bool parse_u64(const std::string& text, std::uint64_t& out) {
  if (text.empty()) return false;
  std::uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  out = v;
  return true;
}

bool parse_int(const std::string& text, int lo, int hi, int& out) {
  std::uint64_t v = 0;
  if (!parse_u64(trim(text), v) || v < static_cast<std::uint64_t>(lo) || v > static_cast<std::uint64_t>(hi))
    return false;
  out = static_cast<int>(v);
  return true;
}

// "1MiB", "64 MiB", "1GiB", "4096", "512KiB": binary units only (K/KiB, M/MiB, G/GiB, T/TiB, B).
bool parse_size(const std::string& raw, std::uint64_t& out) {
  const std::string text = trim(raw);
  std::size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  std::uint64_t n = 0;
  if (!parse_u64(text.substr(0, i), n)) return false;
  std::string unit = trim(text.substr(i));
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::uint64_t mult = 0;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kib")
    mult = kKiB;
  else if (unit == "m" || unit == "mib")
    mult = kMiB;
  else if (unit == "g" || unit == "gib")
    mult = kGiB;
  else if (unit == "t" || unit == "tib")
    mult = 1024 * kGiB;
  else
    return false;
  if (n == 0 || n > (std::uint64_t{1} << 48) / mult) return false;  // the protocol's limit: 1 ..= 2^48
  out = n * mult;
  return true;
}

const char* const kAllPaths[] = {"holder",
                                 "holder-warm",
                                 "bare",
                                 "bare-t0",
                                 "bare-stream",
                                 "bare-free",
                                 "bare-touch",
                                 "attach",
                                 "legacy",
                                 "throughput",
                                 "throughput-cold",
                                 "throughput-no-write",
                                 "throughput-write-only",
                                 "ab-sync",
                                 "ab-event-host",
                                 "ab-event-stream",
                                 "ab-flag",
                                 "ab-nowrite",
                                 "ab-write1",
                                 "ab-holder",
                                 "ab-ring",
                                 "ab-slab",
                                 "ab-access",
                                 "ab-sync-write1",
                                 "ab-flag-write1",
                                 "ab-record-write1",
                                 "ab-legacy"};
// "--paths ab": every driver-only A/B control (issue 26), in this order.
const char* const kAbPaths[] = {"ab-sync",        "ab-event-host",  "ab-event-stream",  "ab-flag",  "ab-nowrite",
                                "ab-write1",      "ab-holder",      "ab-ring",          "ab-slab",  "ab-access",
                                "ab-sync-write1", "ab-flag-write1", "ab-record-write1", "ab-legacy"};
// Whether the client processes forked next keep released blocks in their cache (holder-warm,
// throughput) or not (holder, throughput-cold).
bool g_child_cache = false;
// What a throughput client does in its loop: the round trip through the holder (alloc -> 1-byte
// write -> release), the same without the write (the holder and the library alone), or only the
// write, on memory of its own, through the driver (the GPU part alone: no cupool at all).
enum class Loop { round_trip, no_write, write_only };
Loop g_child_loop = Loop::round_trip;
constexpr int kAttachSamples = 10;

void usage(std::FILE* to) {
  std::fprintf(to,
               "Usage: %s [options]\n"
               "\n"
               "Measures, on device 0, the round trip \"allocate -> usable in another process -> freed\" through\n"
               "the cupool holder and through the CUDA driver alone, and the holder's throughput with concurrent\n"
               "clients. Every measuring process is a fork()ed child; this process never initialises CUDA.\n"
               "\n"
               "Options:\n"
               "  --socket PATH         a running 'cupool hold' (needed by the holder and throughput paths)\n"
               "  --pool NAME           the holder's pool on device 0, handle_types [posix_fd] (default bench)\n"
               "  --sizes LIST          allocation sizes (default 1MiB,64MiB,1GiB; binary units B, KiB, MiB, GiB)\n"
               "  --iterations N        timed round trips per size (default 200 up to 64 MiB, 50 above)\n"
               "  --warmup N            untimed round trips per size first, each verified by reading back (default 5)\n"
               "  --paths LIST          any of holder,bare,bare-t0,bare-stream,bare-free,bare-touch,attach,\n"
               "                        legacy,throughput (default: all but bare-stream, bare-free,\n"
               "                        bare-touch and attach); ab: the driver-only A/B controls of a cold\n"
               "                        round trip (issue 26), each also by name:\n"
               "                          ab-sync          exporter writes 4 bytes and synchronises before it\n"
               "                                           sends; the importer needs no wait\n"
               "                          ab-event-host    exporter writes, records an IPC event; importer\n"
               "                                           cuEventSynchronize\n"
               "                          ab-event-stream  the same with cuStreamWaitEvent on the importer's\n"
               "                                           stream, its uses on that stream\n"
               "                          ab-flag          exporter writes, then cuStreamWriteValue32 on a shared\n"
               "                                           flag; importer cuStreamWaitValue32 on its stream\n"
               "                          ab-nowrite       ab-event-host, the exporter does not write\n"
               "                          ab-write1        ab-event-host, the first use a 1-byte write\n"
               "                          ab-holder        as the holder and the library do: no write by the\n"
               "                                           exporter, host wait, a 1-byte cuMemcpyHtoD first\n"
               "                          ab-ring          ab-holder with the exporter keeping its last 16 blocks\n"
               "                                           (no block is imported again right after its unmap)\n"
               "                          ab-slab          ab-holder on one slab per size, imported once: each\n"
               "                                           round writes a region of it (fresh while they last)\n"
               "                          ab-access        ab-holder with cuMemPoolSetAccess(read-write, device 0)\n"
               "                                           on the imported pool\n"
               "                          ab-sync-write1   ab-holder with the exporter synchronising before it\n"
               "                                           sends, no wait in the importer\n"
               "                          ab-flag-write1   ab-holder with the flag's stream wait, the write on\n"
               "                                           that stream\n"
               "                          ab-record-write1 ab-sync-write1 with the exporter recording its IPC\n"
               "                                           event too (the importer does not wait on it)\n"
               "                          ab-legacy        cuIpc*MemHandle, exporter writes and synchronises\n"
               "                        every ab path reads 4 bytes twice after the wait (first and second use),\n"
               "                        but ab-write1, ab-holder and ab-ring, whose first use is a 1-byte write\n"
               "  --clients LIST        concurrent clients for the throughput path (default 1,8,64)\n"
               "  --seconds S           duration of each throughput run (default 3)\n"
               "  --throughput-size SZ  allocation size of the throughput path (default 1MiB)\n"
               "  --json FILE           also write the results as JSON\n"
               "  --timeout S           how long a process waits for its peer (default 60; the orchestrator\n"
               "                        gives up after S+30 s without a message from its children)\n"
               "  --allow-simulated     accept a holder on a simulated node (tests the bench itself; the holder\n"
               "                        and throughput numbers then mean nothing about a GPU)\n"
               "  --help                this text\n"
               "\n"
               "Times are microseconds from std::chrono::steady_clock (CLOCK_MONOTONIC); median and p99 are\n"
               "nearest-rank on the sorted samples. Exit: 0 all selected paths ran, 1 a path failed,\n"
               "2 bad usage, 77 no NVIDIA driver or no CUDA device (skipped).\n",
               kProgram);
}

// Returns an empty string when the command line is fine, else what is wrong.
std::string parse_args(int argc, char** argv, bool& help) {
  help = false;
  bool paths_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    const std::size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto need = [&](std::string& out) -> bool {
      if (has_value) {
        out = value;
        return true;
      }
      if (i + 1 >= argc) return false;
      out = argv[++i];
      return true;
    };
    if (arg == "--help" || arg == "-h") {
      help = true;
      return "";
    }
    if (arg == "--allow-simulated") {
      if (has_value) return "--allow-simulated takes no value";
      g_opt.allow_simulated = true;
      continue;
    }
    std::string v;
    if (arg == "--socket" || arg == "--pool" || arg == "--sizes" || arg == "--iterations" || arg == "--warmup" ||
        arg == "--paths" || arg == "--clients" || arg == "--seconds" || arg == "--throughput-size" || arg == "--json" ||
        arg == "--timeout") {
      if (!need(v)) return arg + " needs a value";
    } else {
      return "unknown argument '" + arg + "'";
    }
    if (arg == "--socket") {
      if (v.empty()) return "--socket needs a path";
      if (v.size() > 107) return "--socket: the path is longer than 107 bytes (a Unix socket path's limit)";
      g_opt.socket = v;
    } else if (arg == "--pool") {
      if (v.empty() || v.size() > 64) return "--pool needs a name of 1 to 64 characters";
      g_opt.pool = v;
    } else if (arg == "--sizes") {
      std::vector<std::uint64_t> sizes;
      for (const std::string& item : split(v, ',')) {
        std::uint64_t s = 0;
        if (!parse_size(item, s))
          return "--sizes: '" + item + "' is not a size (a whole number of B, KiB, MiB, GiB or TiB, 1 B ..= 256 TiB)";
        if (std::find(sizes.begin(), sizes.end(), s) != sizes.end())
          return "--sizes: " + fmt_size(s) + " is listed twice";
        sizes.push_back(s);
      }
      g_opt.sizes = sizes;
    } else if (arg == "--iterations") {
      if (!parse_int(v, 1, 10000000, g_opt.iterations))
        return "--iterations: '" + v + "' is not a whole number in 1..10000000";
    } else if (arg == "--warmup") {
      if (!parse_int(v, 0, 1000000, g_opt.warmup)) return "--warmup: '" + v + "' is not a whole number in 0..1000000";
    } else if (arg == "--paths") {
      std::vector<std::string> paths;
      for (const std::string& raw : split(v, ',')) {
        const std::string item = trim(raw);
        if (item == "ab") {
          for (const char* p : kAbPaths)
            if (std::find(paths.begin(), paths.end(), p) == paths.end()) paths.emplace_back(p);
          continue;
        }
        bool known = false;
        for (const char* p : kAllPaths) known = known || item == p;
        if (!known)
          return "--paths: unknown path '" + item +
                 "' (known: holder, holder-warm, bare, bare-t0, bare-stream, bare-free, bare-touch, attach, legacy, "
                 "throughput, throughput-cold, throughput-no-write, throughput-write-only, ab (every ab-* path), "
                 "ab-sync, ab-event-host, ab-event-stream, ab-flag, ab-nowrite, ab-write1, ab-holder, ab-ring, "
                 "ab-slab, ab-access, ab-sync-write1, ab-flag-write1, ab-record-write1, ab-legacy)";
        if (std::find(paths.begin(), paths.end(), item) == paths.end()) paths.push_back(item);
      }
      g_opt.paths = paths;
      paths_given = true;
    } else if (arg == "--clients") {
      std::vector<int> clients;
      for (const std::string& item : split(v, ',')) {
        int n = 0;
        if (!parse_int(item, 1, 1000, n)) return "--clients: '" + item + "' is not a whole number in 1..1000";
        clients.push_back(n);
      }
      g_opt.clients = clients;
    } else if (arg == "--seconds") {
      char* end = nullptr;
      errno = 0;
      const double s = std::strtod(v.c_str(), &end);
      if (v.empty() || errno != 0 || !end || *end != '\0' || !(s > 0) || s > 3600)
        return "--seconds: '" + v + "' is not a number of seconds in (0, 3600]";
      g_opt.seconds = s;
    } else if (arg == "--throughput-size") {
      if (!parse_size(v, g_opt.throughput_size)) return "--throughput-size: '" + v + "' is not a size";
    } else if (arg == "--json") {
      if (v.empty()) return "--json needs a file name";
      g_opt.json = v;
    } else if (arg == "--timeout") {
      if (!parse_int(v, 1, 3600, g_opt.timeout_s))
        return "--timeout: '" + v + "' is not a whole number of seconds in 1..3600";
    }
  }
  (void)paths_given;
  return "";
}

bool path_selected(const std::string& p) {
  return std::find(g_opt.paths.begin(), g_opt.paths.end(), p) != g_opt.paths.end();
}

// ------------------------------------------------------------------------------------------------
// Time

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC on Linux: comparable across processes

std::int64_t now_ns() {
  return static_cast<std::int64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

double us(std::int64_t from, std::int64_t to) { return static_cast<double>(to - from) / 1000.0; }

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// ------------------------------------------------------------------------------------------------
// Who is talking, and failing

bool g_in_child = false;
pid_t g_orchestrator_pid = 0;
std::string g_role = "orchestrator";
std::string g_where;     // what the process is doing now (size, iteration), for messages
std::set<pid_t> g_live;  // orchestrator: children not yet waited for

__attribute__((format(printf, 1, 0))) void vsay(const char* fmt, va_list ap) {
  char msg[4096];
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  std::string line = std::string(kProgram) + " [" + g_role + ", pid " + std::to_string(getpid()) + "]: " + msg;
  if (!g_where.empty()) line += " (at " + g_where + ")";
  line += "\n";
  // One write, so lines of concurrent children don't interleave.
  const ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

void kill_all_children() {
  for (pid_t pid : g_live) ::kill(pid, SIGKILL);
  for (pid_t pid : g_live) {
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
  }
  g_live.clear();
}

__attribute__((noreturn, format(printf, 2, 3))) void die_code(int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsay(fmt, ap);
  va_end(ap);
  if (g_in_child) _exit(code);
  kill_all_children();
  std::fflush(nullptr);
  std::exit(code);
}

__attribute__((noreturn, format(printf, 1, 2))) void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsay(fmt, ap);
  va_end(ap);
  if (g_in_child) _exit(1);
  kill_all_children();
  std::fflush(nullptr);
  std::exit(1);
}

// ------------------------------------------------------------------------------------------------
// The driver, through dlopen (cuda.h for the types only; nothing links CUDA)

#define BENCH_STR2(x) #x
#define BENCH_STR(x) BENCH_STR2(x)  // expands cuda.h's versioning macros (cuMemAlloc -> cuMemAlloc_v2)

// (clang-format lays a list like this out differently on each pass)
// clang-format off
#define BENCH_DRIVER_FUNCTIONS(X)                                                                                             \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet)                                                          \
  X(cuDeviceGetName) X(cuDeviceTotalMem) X(cuDeviceGetAttribute) X(cuGetErrorName)                                            \
  X(cuGetErrorString) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuMemPoolCreate)                                       \
  X(cuMemPoolSetAttribute) X(cuMemPoolGetAttribute) X(cuMemPoolExportToShareableHandle) X(cuMemPoolImportFromShareableHandle) \
  X(cuMemPoolExportPointer) X(cuMemPoolImportPointer) X(cuMemAllocFromPoolAsync) X(cuMemFreeAsync)                            \
  X(cuStreamCreate) X(cuStreamSynchronize) X(cuEventCreate) X(cuEventRecord)                                                  \
  X(cuEventSynchronize) X(cuIpcGetEventHandle) X(cuIpcOpenEventHandle) X(cuMemcpyHtoD)                                        \
  X(cuMemcpyDtoH) X(cuMemAlloc) X(cuMemFree) X(cuIpcGetMemHandle)                                                             \
  X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle) X(cuMemcpyHtoDAsync) X(cuMemsetD8Async)                                        \
  X(cuMemHostAlloc) X(cuMemFreeHost) X(cuStreamWaitEvent) X(cuStreamWriteValue32)                                           \
  X(cuStreamWaitValue32) X(cuMemsetD32Async) X(cuMemcpyDtoHAsync) X(cuMemPoolSetAccess)
// clang-format on

struct Driver {
#define BENCH_DECLARE(name) decltype(&::name) name = nullptr;
  BENCH_DRIVER_FUNCTIONS(BENCH_DECLARE)
#undef BENCH_DECLARE
};

Driver g_cu;

bool load_driver(std::string& why) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    why = std::string("libcuda.so.1 could not be loaded (") + (e ? e : "no reason given") + ")";
    return false;
  }
#define BENCH_LOAD(name)                                                                                        \
  g_cu.name = reinterpret_cast<decltype(g_cu.name)>(dlsym(lib, BENCH_STR(name)));                               \
  if (!g_cu.name) {                                                                                             \
    why = std::string("libcuda.so.1 lacks ") + BENCH_STR(name) + " (the driver is too old for this benchmark)"; \
    return false;                                                                                               \
  }
  BENCH_DRIVER_FUNCTIONS(BENCH_LOAD)
#undef BENCH_LOAD
  return true;
}

std::string cu_error_text(CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (!g_cu.cuGetErrorName || g_cu.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
  if (!g_cu.cuGetErrorString || g_cu.cuGetErrorString(r, &text) != CUDA_SUCCESS) text = nullptr;
  std::string out = name ? name : "an unknown CUresult";
  out += " (CUresult " + std::to_string(static_cast<int>(r));
  if (text) out += std::string(": ") + text;
  return out + ")";
}

void cu_check(CUresult r, const char* call) {
  if (r == CUDA_SUCCESS) return;
  die("%s failed: %s", call, cu_error_text(r).c_str());
}

// CU(cuMemAlloc, &ptr, size): calls the versioned entry point, names the call as written on failure.
#define CU(fn, ...) cu_check(g_cu.fn(__VA_ARGS__), #fn)

CUdevice g_device = 0;

// A measuring child's driver start: device 0's primary context, current on this thread.
void cuda_start() {
  std::string why;
  if (!load_driver(why)) die_code(kExitSkip, "no usable NVIDIA driver: %s", why.c_str());
  CU(cuInit, 0u);
  int count = 0;
  CU(cuDeviceGetCount, &count);
  if (count < 1) die_code(kExitSkip, "the NVIDIA driver reports no CUDA device");
  CU(cuDeviceGet, &g_device, 0);
  CUcontext ctx = nullptr;
  CU(cuDevicePrimaryCtxRetain, &ctx, g_device);
  CU(cuCtxSetCurrent, ctx);
}

// ------------------------------------------------------------------------------------------------
// Descriptors and messages

enum class Io { ok, eof, timeout, error };

Io wait_readable(int fd, int timeout_ms, std::string& err) {
  const std::int64_t deadline = timeout_ms < 0 ? 0 : now_ns() + static_cast<std::int64_t>(timeout_ms) * 1000000;
  while (true) {
    int left = -1;
    if (timeout_ms >= 0) {
      const std::int64_t rest = (deadline - now_ns()) / 1000000;
      left = rest < 0 ? 0 : static_cast<int>(std::min<std::int64_t>(rest, std::numeric_limits<int>::max()));
    }
    pollfd p{};
    p.fd = fd;
    p.events = POLLIN;
    const int r = ::poll(&p, 1, left);
    if (r > 0) return Io::ok;
    if (r == 0) {
      err = "timed out after " + std::to_string(timeout_ms / 1000) + " s";
      return Io::timeout;
    }
    if (errno == EINTR) continue;
    err = std::string("poll: ") + std::strerror(errno);
    return Io::error;
  }
}

// Reads exactly n bytes; each wait for more is at most timeout_ms (-1: no limit).
Io read_exact(int fd, void* buf, std::size_t n, int timeout_ms, std::string& err) {
  auto* p = static_cast<unsigned char*>(buf);
  std::size_t got = 0;
  while (got < n) {
    const Io w = wait_readable(fd, timeout_ms, err);
    if (w != Io::ok) return w;
    const ssize_t r = ::read(fd, p + got, n - got);
    if (r > 0) {
      got += static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) {
      err = got ? "the connection closed in the middle of a message" : "the connection closed";
      return Io::eof;
    }
    if (errno == EINTR || errno == EAGAIN) continue;
    err = std::string("read: ") + std::strerror(errno);
    return Io::error;
  }
  return Io::ok;
}

bool write_exact(int fd, const void* buf, std::size_t n, std::string& err) {
  const auto* p = static_cast<const unsigned char*>(buf);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::write(fd, p + done, n - done);
    if (r > 0) {
      done += static_cast<std::size_t>(r);
      continue;
    }
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    err = std::string("write: ") + (r < 0 ? std::strerror(errno) : "wrote nothing");
    return false;
  }
  return true;
}

// One message with an optional descriptor (SCM_RIGHTS on the message's first byte).
bool send_with_fd(int sock, const void* buf, std::size_t n, int fd, std::string& err) {
  iovec iov{};
  iov.iov_base = const_cast<void*>(buf);
  iov.iov_len = n;
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t r = -1;
  do {
    r = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    err = std::string("sendmsg: ") + std::strerror(errno);
    return false;
  }
  const auto sent = static_cast<std::size_t>(r);
  return sent >= n || write_exact(sock, static_cast<const unsigned char*>(buf) + sent, n - sent, err);
}

Io recv_with_fd(int sock, void* buf, std::size_t n, int* fd_out, int timeout_ms, std::string& err) {
  *fd_out = -1;
  const Io w = wait_readable(sock, timeout_ms, err);
  if (w != Io::ok) return w;
  iovec iov{};
  iov.iov_base = buf;
  iov.iov_len = n;
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t r = -1;
  do {
    r = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    err = std::string("recvmsg: ") + std::strerror(errno);
    return Io::error;
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int received = -1;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*fd_out < 0)
        *fd_out = received;
      else
        ::close(received);
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    err = "a descriptor was lost (MSG_CTRUNC)";
    return Io::error;
  }
  if (r == 0) {
    err = "the connection closed";
    return Io::eof;
  }
  const auto got = static_cast<std::size_t>(r);
  if (got < n) return read_exact(sock, static_cast<unsigned char*>(buf) + got, n - got, timeout_ms, err);
  return Io::ok;
}

// Closes every descriptor but stdin/out/err and `keep` (a child must not hold its siblings'
// sockets, or a sibling's death would never show as end-of-file).
void close_fds_except(const std::vector<int>& keep) {
  std::vector<int> open;
  if (DIR* d = opendir("/proc/self/fd")) {
    const int self = dirfd(d);
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const long fd = std::strtol(e->d_name, nullptr, 10);
      if (fd > 2 && fd != self && fd <= std::numeric_limits<int>::max()) open.push_back(static_cast<int>(fd));
    }
    closedir(d);
  } else {
    rlimit rl{};
    std::uint64_t limit = 65536;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
      limit = std::min<std::uint64_t>(static_cast<std::uint64_t>(rl.rlim_cur), limit);
    for (std::uint64_t fd = 3; fd < limit; ++fd) open.push_back(static_cast<int>(fd));
  }
  for (int fd : open)
    if (std::find(keep.begin(), keep.end(), fd) == keep.end()) ::close(fd);
}

// ---- between an exporter and an importer (fixed size, lockstep) ----

constexpr std::uint32_t kPairMagic = 0x4d425043;  // "CPBM"
enum PairKind : std::uint32_t { kHello = 1, kAlloc = 2, kExported = 3, kFree = 4, kFreed = 5, kDone = 6 };

struct PairMsg {
  std::uint32_t magic;
  std::uint32_t kind;
  std::uint64_t seq;
  std::uint64_t size;
  unsigned char data[64];
};

const char* pair_kind_name(std::uint32_t kind) {
  switch (kind) {
    case kHello: return "the pool handle message";
    case kAlloc: return "an alloc request";
    case kExported: return "the export data";
    case kFree: return "a free request";
    case kFreed: return "the free acknowledgement";
    case kDone: return "the end message";
    default: return "an unknown message";
  }
}

int g_peer_fd = -1;
std::string g_peer = "peer";

void pair_send(std::uint32_t kind, std::uint64_t seq, std::uint64_t size, const void* data, std::size_t len,
               int pass_fd = -1) {
  PairMsg m{};
  m.magic = kPairMagic;
  m.kind = kind;
  m.seq = seq;
  m.size = size;
  if (data && len) std::memcpy(m.data, data, std::min(len, sizeof m.data));
  std::string err;
  if (!send_with_fd(g_peer_fd, &m, sizeof m, pass_fd, err))
    die("could not send %s to the %s: %s (did it fail? its message would be above)", pair_kind_name(kind),
        g_peer.c_str(), err.c_str());
}

PairMsg pair_recv(std::uint32_t kind, std::uint64_t seq, int* fd_out = nullptr) {
  PairMsg m{};
  std::string err;
  int fd = -1;
  const Io io = recv_with_fd(g_peer_fd, &m, sizeof m, &fd, g_opt.timeout_s * 1000, err);
  if (io == Io::eof)
    die("the %s closed the connection while this process waited for %s: it failed or exited (its message, if any, "
        "is above)",
        g_peer.c_str(), pair_kind_name(kind));
  if (io == Io::timeout)
    die("waited %d s (--timeout) for %s from the %s; none came (is it stuck in a driver call?)", g_opt.timeout_s,
        pair_kind_name(kind), g_peer.c_str());
  if (io != Io::ok) die("waiting for %s from the %s: %s", pair_kind_name(kind), g_peer.c_str(), err.c_str());
  if (m.magic != kPairMagic || m.kind != kind || m.seq != seq) {
    if (fd >= 0) ::close(fd);
    die("protocol mix-up between exporter and importer: expected %s #%" PRIu64 ", got kind %u #%" PRIu64
        " (magic 0x%08x)",
        pair_kind_name(kind), seq, m.kind, m.seq, m.magic);
  }
  if (fd_out)
    *fd_out = fd;
  else if (fd >= 0)
    ::close(fd);
  return m;
}

// ---- from a child to the orchestrator: frames with a serialized report ----

constexpr std::uint32_t kFrameMagic = 0x48424243;  // "CBBH"
enum FrameType : std::uint32_t { kFrameReady = 1, kFrameReport = 2 };

struct FrameHeader {
  std::uint32_t magic;
  std::uint32_t type;
  std::uint64_t length;
};

enum SeriesKind : std::uint32_t { kTotal = 0, kStep = 1, kInfo = 2 };

// Samples in microseconds: a round trip's total (kTotal), a disjoint part of it (kStep: the steps
// and the derived "messaging" add up to the total), or a composite span shown for information.
struct Series {
  std::uint64_t size = 0;
  std::string name;
  std::int32_t order = 0;
  std::uint32_t kind = kTotal;
  std::vector<double> us;
};

struct Report {
  std::vector<Series> series;
  std::vector<std::pair<std::string, double>> scalars;  // one-off times in us
  std::vector<std::pair<std::string, std::int64_t>> integers;
  std::vector<std::pair<std::string, std::string>> texts;

  std::vector<double>& add(std::uint64_t size, const std::string& name, std::int32_t order, std::uint32_t kind) {
    for (Series& s : series)
      if (s.size == size && s.name == name) return s.us;
    Series s;
    s.size = size;
    s.name = name;
    s.order = order;
    s.kind = kind;
    series.push_back(std::move(s));
    return series.back().us;
  }
  const Series* find(std::uint64_t size, std::uint32_t kind, const std::string& name = "") const {
    for (const Series& s : series)
      if (s.size == size && s.kind == kind && (name.empty() || s.name == name)) return &s;
    return nullptr;
  }
  std::string text(const std::string& key) const {
    for (const auto& [k, v] : texts)
      if (k == key) return v;
    return "";
  }
  bool integer(const std::string& key, std::int64_t& out) const {
    for (const auto& [k, v] : integers)
      if (k == key) {
        out = v;
        return true;
      }
    return false;
  }
};

class Writer {
 public:
  void u32(std::uint32_t v) { raw(&v, sizeof v); }
  void u64(std::uint64_t v) { raw(&v, sizeof v); }
  void i64(std::int64_t v) { raw(&v, sizeof v); }
  void f64(double v) { raw(&v, sizeof v); }
  void str(const std::string& s) {
    u64(s.size());
    out_.append(s);
  }
  std::string& out() { return out_; }

 private:
  void raw(const void* p, std::size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  bool u32(std::uint32_t& v) { return raw(&v, sizeof v); }
  bool u64(std::uint64_t& v) { return raw(&v, sizeof v); }
  bool i64(std::int64_t& v) { return raw(&v, sizeof v); }
  bool f64(double& v) { return raw(&v, sizeof v); }
  bool str(std::string& s) {
    std::uint64_t n = 0;
    if (!u64(n) || n > in_.size() - pos_) return false;
    s.assign(in_, pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return true;
  }
  bool count(std::uint64_t& n, std::size_t min_item_bytes) {
    return u64(n) && (min_item_bytes == 0 || n <= (in_.size() - pos_) / min_item_bytes);
  }
  bool at_end() const { return pos_ == in_.size(); }

 private:
  bool raw(void* p, std::size_t n) {
    if (n > in_.size() - pos_) return false;
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  const std::string& in_;
  std::size_t pos_ = 0;
};

std::string encode(const Report& r) {
  Writer w;
  w.u64(r.series.size());
  for (const Series& s : r.series) {
    w.u64(s.size);
    w.str(s.name);
    w.u32(static_cast<std::uint32_t>(s.order));
    w.u32(s.kind);
    w.u64(s.us.size());
    for (double v : s.us) w.f64(v);
  }
  w.u64(r.scalars.size());
  for (const auto& [k, v] : r.scalars) {
    w.str(k);
    w.f64(v);
  }
  w.u64(r.integers.size());
  for (const auto& [k, v] : r.integers) {
    w.str(k);
    w.i64(v);
  }
  w.u64(r.texts.size());
  for (const auto& [k, v] : r.texts) {
    w.str(k);
    w.str(v);
  }
  return std::move(w.out());
}

bool decode(const std::string& in, Report& r) {
  Reader rd(in);
  std::uint64_t n = 0;
  if (!rd.count(n, 8)) return false;
  for (std::uint64_t i = 0; i < n; ++i) {
    Series s;
    std::uint32_t order = 0;
    std::uint64_t m = 0;
    if (!rd.u64(s.size) || !rd.str(s.name) || !rd.u32(order) || !rd.u32(s.kind) || !rd.count(m, sizeof(double)))
      return false;
    s.order = static_cast<std::int32_t>(order);
    s.us.resize(static_cast<std::size_t>(m));
    for (double& v : s.us)
      if (!rd.f64(v)) return false;
    r.series.push_back(std::move(s));
  }
  if (!rd.count(n, 8)) return false;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::string k;
    double v = 0;
    if (!rd.str(k) || !rd.f64(v)) return false;
    r.scalars.emplace_back(k, v);
  }
  if (!rd.count(n, 8)) return false;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::string k;
    std::int64_t v = 0;
    if (!rd.str(k) || !rd.i64(v)) return false;
    r.integers.emplace_back(k, v);
  }
  if (!rd.count(n, 8)) return false;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::string k, v;
    if (!rd.str(k) || !rd.str(v)) return false;
    r.texts.emplace_back(k, v);
  }
  return rd.at_end();
}

int g_result_fd = -1;  // a child's end of its socket to the orchestrator

void send_frame(std::uint32_t type, const std::string& payload) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.type = type;
  h.length = payload.size();
  std::string err;
  if (!write_exact(g_result_fd, &h, sizeof h, err) || !write_exact(g_result_fd, payload.data(), payload.size(), err))
    die("could not send its %s to the orchestrator: %s", type == kFrameReady ? "ready message" : "report", err.c_str());
}

std::string where(const char* what, std::uint64_t size, int iteration, int warmup) {
  char buf[160];
  if (iteration < warmup)
    std::snprintf(buf, sizeof buf, "%s, size %s, warm-up round trip %d of %d", what, fmt_size(size).c_str(),
                  iteration + 1, warmup);
  else
    std::snprintf(buf, sizeof buf, "%s, size %s, timed round trip %d of %d", what, fmt_size(size).c_str(),
                  iteration - warmup + 1, iterations_for(size));
  return buf;
}

// ------------------------------------------------------------------------------------------------
// Children: the device probe

// Loads the driver and describes device 0, creating no context. Exit 77 (with a "skip" report)
// when there is no driver or no device.
void probe_main() {
  Report rep;
  auto skip = [&](const std::string& why) {
    rep.texts.emplace_back("skip", why);
    send_frame(kFrameReport, encode(rep));
    _exit(kExitSkip);
  };
  std::string why;
  if (!load_driver(why)) skip("no usable NVIDIA driver: " + why);
  const CUresult r = g_cu.cuInit(0);
  if (r != CUDA_SUCCESS) skip("no usable GPU: cuInit(0) failed with " + cu_error_text(r));
  int count = 0;
  CU(cuDeviceGetCount, &count);
  if (count < 1) skip("no usable GPU: the NVIDIA driver reports no CUDA device");
  CUdevice dev = 0;
  CU(cuDeviceGet, &dev, 0);
  char name[256] = {};
  CU(cuDeviceGetName, name, static_cast<int>(sizeof name - 1), dev);
  std::size_t total = 0;
  CU(cuDeviceTotalMem, &total, dev);
  int driver = 0;
  CU(cuDriverGetVersion, &driver);
  int pools = 0, handle_types = 0;
  CU(cuDeviceGetAttribute, &pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev);
  CU(cuDeviceGetAttribute, &handle_types, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, dev);
  rep.texts.emplace_back("name", name);
  rep.integers.emplace_back("device_count", count);
  rep.integers.emplace_back("total_bytes", static_cast<std::int64_t>(total));
  rep.integers.emplace_back("driver_api_version", driver);
  rep.integers.emplace_back("memory_pools_supported", pools);
  rep.integers.emplace_back("mempool_handle_types", handle_types);
  send_frame(kFrameReport, encode(rep));
  _exit(0);
}

// ------------------------------------------------------------------------------------------------
// Children: the holder path and the throughput clients

cupool_conn* holder_connect(const std::string& name) {
  cupool_conn* conn = nullptr;
  const int rc = cupool_connect(g_opt.socket.c_str(), name.c_str(), &conn);
  if (rc != CUPOOL_OK || !conn)
    die("cupool_connect(\"%s\") failed: %s: %s", g_opt.socket.c_str(), cupool_status_name(rc),
        cupool_last_error(nullptr));
  const std::string backend = cupool_backend(conn);
  if (backend != "cuda" && !g_opt.allow_simulated)
    die("the holder at %s runs on a '%s' node, not on the GPU driver: its numbers would say nothing about the GPU "
        "(start it without --profile, or pass --allow-simulated to test the benchmark itself)",
        g_opt.socket.c_str(), backend.c_str());
  return conn;
}

struct OpTimes {
  std::int64_t start = 0, allocated = 0, written = 0, release_start = 0, end = 0;
  std::int64_t second_start = 0, second_end = 0;  // a second 1-byte write, left out of the round trip
};

// One round trip through the holder: alloc, 1-byte write (the first use), release. With `verify`
// the byte is read back (between the write and the release, outside what a timed trip measures).
// Without `verify`, a second write is timed (for the holder paths' tables) unless `second_write` is
// false: the throughput loops leave it out, since under contention it would cost GPU time that is
// not part of a round trip (throughput before 2026-11-23 20:15 UTC included it).
OpTimes holder_round_trip(cupool_conn* conn, std::uint64_t size, unsigned char byte, bool verify,
                          bool second_write = true) {
  OpTimes t;
  cupool_lease* lease = nullptr;
  t.start = now_ns();
  int rc = cupool_alloc(conn, g_opt.pool.c_str(), 0, size, &lease);
  t.allocated = now_ns();
  if (rc != CUPOOL_OK || !lease)
    die("cupool_alloc(pool \"%s\", device 0, %s) failed: %s: %s", g_opt.pool.c_str(), fmt_size(size).c_str(),
        cupool_status_name(rc), cupool_last_error(conn));
  rc = cupool_write(conn, lease, 0, &byte, 1);
  t.written = now_ns();
  if (rc != CUPOOL_OK)
    die("cupool_write (1 byte at offset 0 of a %s lease) failed: %s: %s", fmt_size(size).c_str(),
        cupool_status_name(rc), cupool_last_error(conn));
  if (verify) {
    if (cupool_lease_address(lease) == 0) die("cupool_alloc returned a lease with address 0");
    if (cupool_lease_size(lease) < size)
      die("cupool_alloc returned a lease of %" PRIu64 " bytes for a request of %" PRIu64, cupool_lease_size(lease),
          size);
    unsigned char back = static_cast<unsigned char>(~byte);
    rc = cupool_read(conn, lease, 0, &back, 1);
    if (rc != CUPOOL_OK)
      die("cupool_read (verifying the write) failed: %s: %s", cupool_status_name(rc), cupool_last_error(conn));
    if (back != byte)
      die("read back 0x%02x after writing 0x%02x: the lease's memory is not what was written", back, byte);
  } else if (second_write) {
    // Is the first write's cost the first touch of the imported memory, or every write's?
    t.second_start = now_ns();
    rc = cupool_write(conn, lease, 0, &byte, 1);
    t.second_end = now_ns();
    if (rc != CUPOOL_OK) die("second cupool_write failed: %s: %s", cupool_status_name(rc), cupool_last_error(conn));
  }
  t.release_start = now_ns();
  rc = cupool_release(conn, lease);
  t.end = now_ns();
  if (rc != CUPOOL_OK)
    die("cupool_release of a %s lease failed: %s: %s", fmt_size(size).c_str(), cupool_status_name(rc),
        cupool_last_error(conn));
  return t;
}

void holder_main() {
  Report rep;
  cupool_conn* conn = holder_connect("cupool_holder_bench");
  if (!g_child_cache && cupool_set_cache_limit(conn, 0) != CUPOOL_OK)
    die("cupool_set_cache_limit(0) failed: %s", cupool_last_error(conn));
  rep.texts.emplace_back("backend", cupool_backend(conn));
  char* status = nullptr;
  const int src = cupool_request(conn, "{\"op\": \"status\"}", &status);
  if (src == CUPOOL_OK && status)
    rep.texts.emplace_back("holder_status", status);
  else
    rep.texts.emplace_back("holder_status_error",
                           std::string(cupool_status_name(src)) + ": " + cupool_last_error(conn));
  cupool_free_string(status);

  bool first = true;
  for (std::uint64_t size : g_opt.sizes) {
    const int total = g_opt.warmup + iterations_for(size);
    for (int i = 0; i < total; ++i) {
      g_where = where("holder path", size, i, g_opt.warmup);
      const bool timed = i >= g_opt.warmup;
      const OpTimes t = holder_round_trip(conn, size, static_cast<unsigned char>(0x5a ^ (i & 0xff)), !timed);
      if (first) {
        rep.scalars.emplace_back("client: first cupool_alloc (" + fmt_size(size) +
                                     "; includes this process's CUDA start-up and import_pool)",
                                 us(t.start, t.allocated));
        first = false;
      }
      if (!timed) continue;
      rep.add(size, "round trip", 0, kTotal).push_back(us(t.start, t.end) - us(t.second_start, t.second_end));
      rep.add(size,
              g_child_cache ? "cupool_alloc (a cached block: one quiet reuse, no wait)"
                            : "cupool_alloc (request, cuMemPoolImportPointer, ready-event wait)",
              10, kStep)
          .push_back(us(t.start, t.allocated));
      rep.add(size,
              g_child_cache ? "cupool_write (1-byte cuMemcpyHtoD + synchronize)"
                            : "cupool_write (first use: 1-byte cuMemcpyHtoD + synchronize)",
              20, kStep)
          .push_back(us(t.allocated, t.written));
      rep.add(size,
              g_child_cache ? "cupool_release (into the cache: one quiet free, no wait)"
                            : "cupool_release (cuMemFree here, then a quiet free)",
              30, kStep)
          .push_back(us(t.release_start, t.end));
      rep.add(size, "a second 1-byte cupool_write right after the first (not in the round trip)", 40, kInfo)
          .push_back(us(t.second_start, t.second_end));
    }
  }
  g_where.clear();
  send_frame(kFrameReport, encode(rep));
  cupool_disconnect(conn);
  _exit(0);
}

// attach: one process that starts CUDA as an application would, then begins using the holder.
void attach_main() {
  Report rep;
  const std::uint64_t size = g_opt.sizes.front();
  const std::int64_t c0 = now_ns();
  cuda_start();  // the application's own CUDA start-up (cuInit, primary context): not in the attach
  const std::int64_t c1 = now_ns();
  cupool_conn* conn = holder_connect("cupool_holder_bench attach");
  const std::int64_t t1 = now_ns();
  cupool_lease* lease = nullptr;
  int rc = cupool_alloc(conn, g_opt.pool.c_str(), 0, size, &lease);
  if (rc != CUPOOL_OK) die("the first cupool_alloc failed: %s: %s", cupool_status_name(rc), cupool_last_error(conn));
  const std::int64_t t2 = now_ns();
  const unsigned char byte = 0x3c;
  rc = cupool_write(conn, lease, 0, &byte, 1);
  if (rc != CUPOOL_OK) die("the first cupool_write failed: %s: %s", cupool_status_name(rc), cupool_last_error(conn));
  const std::int64_t t3 = now_ns();
  rc = cupool_release(conn, lease);
  if (rc != CUPOOL_OK) die("cupool_release failed: %s: %s", cupool_status_name(rc), cupool_last_error(conn));
  const std::int64_t t4 = now_ns();
  rc = cupool_alloc(conn, g_opt.pool.c_str(), 0, size, &lease);
  if (rc != CUPOOL_OK) die("the second cupool_alloc failed: %s: %s", cupool_status_name(rc), cupool_last_error(conn));
  const std::int64_t t5 = now_ns();
  cupool_release(conn, lease);
  cupool_disconnect(conn);
  rep.add(size, "attach: cupool_connect -> first lease written (CUDA started before)", 0, kTotal).push_back(us(c1, t3));
  rep.add(size, "cupool_connect (socket, hello)", 10, kStep).push_back(us(c1, t1));
  rep.add(size, "first cupool_alloc (import_pool, ready event, alloc, import, wait)", 20, kStep).push_back(us(t1, t2));
  rep.add(size, "first cupool_write (first use)", 30, kStep).push_back(us(t2, t3));
  rep.add(size, "the application's CUDA start-up before it (cuInit, primary context)", 100, kInfo)
      .push_back(us(c0, c1));
  rep.add(size, "a second cupool_alloc on the same connection, for comparison", 101, kInfo).push_back(us(t4, t5));
  send_frame(kFrameReport, encode(rep));
  _exit(0);
}

// One timed iteration of a throughput client's loop (g_child_loop); returns its microseconds.
double throughput_step(cupool_conn* conn, CUdeviceptr own, std::uint64_t size, unsigned char byte) {
  if (g_child_loop == Loop::write_only) {
    const std::int64_t t0 = now_ns();
    CU(cuMemcpyHtoD, own, &byte, std::size_t{1});
    return us(t0, now_ns());
  }
  if (g_child_loop == Loop::no_write) {
    cupool_lease* lease = nullptr;
    const std::int64_t t0 = now_ns();
    int rc = cupool_alloc(conn, g_opt.pool.c_str(), 0, size, &lease);
    if (rc != CUPOOL_OK) die("cupool_alloc failed: %s: %s", cupool_status_name(rc), cupool_last_error(conn));
    rc = cupool_release(conn, lease);
    const double t = us(t0, now_ns());
    if (rc != CUPOOL_OK) die("cupool_release failed: %s: %s", cupool_status_name(rc), cupool_last_error(conn));
    return t;
  }
  const OpTimes t = holder_round_trip(conn, size, byte, false, /*second_write=*/false);
  return us(t.start, t.end);
}

void throughput_main(int index, int clients, int barrier_fd) {
  Report rep;
  const std::uint64_t size = g_opt.throughput_size;
  cupool_conn* conn = nullptr;
  CUdeviceptr own = 0;
  if (g_child_loop == Loop::write_only) {
    cuda_start();
    CU(cuMemAlloc, &own, static_cast<std::size_t>(size));
  } else {
    conn =
        holder_connect("cupool_holder_bench throughput " + std::to_string(index + 1) + "/" + std::to_string(clients));
    if (!g_child_cache && cupool_set_cache_limit(conn, 0) != CUPOOL_OK)
      die("cupool_set_cache_limit(0) failed: %s", cupool_last_error(conn));
  }
  // At least one untimed round trip: CUDA start-up and import_pool must not fall in the window.
  const int warm = std::max(1, g_opt.warmup);
  for (int i = 0; i < warm; ++i) {
    g_where = "throughput warm-up round trip " + std::to_string(i + 1) + " of " + std::to_string(warm);
    if (conn)
      holder_round_trip(conn, size, static_cast<unsigned char>(i & 0xff), true);
    else
      (void)throughput_step(nullptr, own, size, static_cast<unsigned char>(i & 0xff));
  }
  g_where = "throughput: waiting at the start barrier";
  send_frame(kFrameReady, "");
  std::string err;
  const Io io = wait_readable(barrier_fd, 600 * 1000, err);
  if (io != Io::ok) die("no start signal from the orchestrator: %s", err.c_str());
  unsigned char go = 0;
  ssize_t r = -1;
  do {
    r = ::read(barrier_fd, &go, 1);
  } while (r < 0 && errno == EINTR);
  if (r != 1) die("the orchestrator went away before the start signal (read returned %zd)", r);

  const std::int64_t start = now_ns();
  const std::int64_t deadline = start + static_cast<std::int64_t>(g_opt.seconds * 1e9);
  std::vector<double> lat;
  lat.reserve(1 << 16);
  std::uint64_t n = 0;
  while (now_ns() < deadline) {
    g_where = "throughput round trip " + std::to_string(n + 1);
    lat.push_back(throughput_step(conn, own, size, static_cast<unsigned char>(n & 0xff)));
    ++n;
  }
  const std::int64_t end = now_ns();
  g_where.clear();
  rep.add(size, "round trip", 0, kTotal) = std::move(lat);
  rep.integers.emplace_back("start_ns", start);
  rep.integers.emplace_back("end_ns", end);
  send_frame(kFrameReport, encode(rep));
  if (conn) cupool_disconnect(conn);
  if (own) CU(cuMemFree, own);
  _exit(0);
}

// ------------------------------------------------------------------------------------------------
// Children: the driver-only pairs

void require_pool_support() {
  int pools = 0, types = 0;
  CU(cuDeviceGetAttribute, &pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, g_device);
  if (!pools) die("device 0 does not support memory pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED is 0)");
  CU(cuDeviceGetAttribute, &types, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, g_device);
  if (!(types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    die("device 0's pools cannot be shared by file descriptor (CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES "
        "is 0x%x, without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)",
        static_cast<unsigned>(types));
}

// The pool's owner: alloc on its stream, record the IPC event, export; on "free", cuMemFreeAsync.
void pool_exporter_main(bool threshold_zero) {
  Report rep;
  cuda_start();
  require_pool_support();
  CUmemPoolProps props;
  std::memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool = nullptr;
  CU(cuMemPoolCreate, &pool, &props);
  cuuint64_t threshold = threshold_zero ? 0 : std::numeric_limits<cuuint64_t>::max();
  CU(cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
  cuuint64_t readback = 1;
  CU(cuMemPoolGetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &readback);
  if (readback != threshold)
    die("the pool's release threshold reads back as %llu after setting %llu", static_cast<unsigned long long>(readback),
        static_cast<unsigned long long>(threshold));
  rep.texts.emplace_back("exporter release threshold", threshold_zero ? "0" : "max (UINT64_MAX)");
  CUstream stream = nullptr;
  CU(cuStreamCreate, &stream, static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
  CUevent event = nullptr;
  CU(cuEventCreate, &event,
     static_cast<unsigned>(CU_EVENT_INTERPROCESS) | static_cast<unsigned>(CU_EVENT_DISABLE_TIMING));
  int pool_fd = -1;
  CU(cuMemPoolExportToShareableHandle, &pool_fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0ULL);
  CUipcEventHandle event_handle;
  std::memset(&event_handle, 0, sizeof event_handle);
  static_assert(sizeof(CUipcEventHandle) == 64, "CUipcEventHandle is 64 bytes");
  CU(cuIpcGetEventHandle, &event_handle, event);
  pair_send(kHello, 0, 0, &event_handle, sizeof event_handle, pool_fd);
  ::close(pool_fd);

  std::uint64_t seq = 0;
  for (std::uint64_t size : g_opt.sizes) {
    const int total = g_opt.warmup + iterations_for(size);
    for (int i = 0; i < total; ++i) {
      ++seq;
      g_where = where("exporter", size, i, g_opt.warmup);
      const PairMsg req = pair_recv(kAlloc, seq);
      if (req.size != size) die("the importer asked for %" PRIu64 " bytes where %" PRIu64 " were due", req.size, size);
      CUdeviceptr ptr = 0;
      const std::int64_t a0 = now_ns();
      CU(cuMemAllocFromPoolAsync, &ptr, static_cast<std::size_t>(size), pool, stream);
      const std::int64_t a1 = now_ns();
      CU(cuEventRecord, event, stream);
      const std::int64_t a2 = now_ns();
      CUmemPoolPtrExportData data;
      std::memset(&data, 0, sizeof data);
      static_assert(sizeof(CUmemPoolPtrExportData) == 64, "CUmemPoolPtrExportData is 64 bytes");
      CU(cuMemPoolExportPointer, &data, ptr);
      const std::int64_t a3 = now_ns();
      pair_send(kExported, seq, size, &data, sizeof data);
      pair_recv(kFree, seq);
      const std::int64_t f0 = now_ns();
      CU(cuMemFreeAsync, ptr, stream);
      const std::int64_t f1 = now_ns();
      if (threshold_zero) CU(cuStreamSynchronize, stream);
      const std::int64_t f2 = now_ns();
      pair_send(kFreed, seq, size, nullptr, 0);
      if (i < g_opt.warmup) continue;
      rep.add(size, "exporter: cuMemAllocFromPoolAsync", 10, kStep).push_back(us(a0, a1));
      rep.add(size, "exporter: cuEventRecord (IPC ready event)", 11, kStep).push_back(us(a1, a2));
      rep.add(size, "exporter: cuMemPoolExportPointer", 12, kStep).push_back(us(a2, a3));
      rep.add(size, "exporter: cuMemFreeAsync", 30, kStep).push_back(us(f0, f1));
      if (threshold_zero)
        rep.add(size, "exporter: cuStreamSynchronize after the free (threshold 0 releases here)", 31, kStep)
            .push_back(us(f1, f2));
    }
    cuuint64_t reserved = 0;
    CU(cuMemPoolGetAttribute, pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
    rep.integers.emplace_back("exporter pool reserved bytes after " + fmt_size(size),
                              static_cast<std::int64_t>(reserved));
  }
  g_where.clear();
  pair_recv(kDone, seq + 1);
  cuuint64_t high = 0;
  CU(cuMemPoolGetAttribute, pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &high);
  rep.integers.emplace_back("exporter pool reserved bytes, high-water mark", static_cast<std::int64_t>(high));
  CU(cuStreamSynchronize, stream);
  send_frame(kFrameReport, encode(rep));
  _exit(0);
}

// How the importer uses and releases each allocation (the bare-stream and bare-free paths).
struct ImporterWay {
  bool use_on_stream = false;  // first use: cuMemcpyHtoDAsync on its stream (else cuMemcpyHtoD)
  bool free_sync = false;      // release: cuMemFree (else cuMemFreeAsync + cuStreamSynchronize)
  bool touch_ways = false;     // bare-touch: the first use made four ways in turn
};

const char* const kTouchWays[] = {
    "importer: first use, way 0: pageable 1-byte cuMemcpyHtoD + cuStreamSynchronize",
    "importer: first use, way 1: the same after a 1 ms pause (not counted)",
    "importer: first use, way 2: 1-byte cuMemsetD8Async on its stream + cuStreamSynchronize",
    "importer: first use, way 3: 1-byte cuMemcpyHtoDAsync from pinned memory + cuStreamSynchronize"};

// The other process: imports the pool once, then each allocation's pointer.
void pool_importer_main(ImporterWay way) {
  Report rep;
  cuda_start();
  CUstream stream = nullptr;
  CU(cuStreamCreate, &stream, static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
  int pool_fd = -1;
  g_where = "waiting for the exporter's pool handle";
  const PairMsg hello = pair_recv(kHello, 0, &pool_fd);
  if (pool_fd < 0) die("the exporter's pool handle message carried no file descriptor");
  CUipcEventHandle event_handle;
  std::memcpy(&event_handle, hello.data, sizeof event_handle);
  CUmemoryPool pool = nullptr;
  g_where = "importing the pool";
  const std::int64_t i0 = now_ns();
  CU(cuMemPoolImportFromShareableHandle, &pool, reinterpret_cast<void*>(static_cast<std::uintptr_t>(pool_fd)),
     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0ULL);
  const std::int64_t i1 = now_ns();
  CUevent event = nullptr;
  CU(cuIpcOpenEventHandle, &event, event_handle);
  const std::int64_t i2 = now_ns();
  ::close(pool_fd);
  rep.scalars.emplace_back("importer: pool import once (cuMemPoolImportFromShareableHandle)", us(i0, i1));
  rep.scalars.emplace_back("importer: ready event open once (cuIpcOpenEventHandle)", us(i1, i2));

  unsigned char* pinned = nullptr;
  if (way.touch_ways) CU(cuMemHostAlloc, reinterpret_cast<void**>(&pinned), 1, 0u);

  std::uint64_t seq = 0;
  for (std::uint64_t size : g_opt.sizes) {
    const int total = g_opt.warmup + iterations_for(size);
    for (int i = 0; i < total; ++i) {
      ++seq;
      g_where = where("importer", size, i, g_opt.warmup);
      const int touch = way.touch_ways ? i % 4 : 0;
      const bool timed = i >= g_opt.warmup;
      const unsigned char byte = static_cast<unsigned char>(0xa5 ^ (seq & 0xff));
      const std::int64_t t0 = now_ns();
      pair_send(kAlloc, seq, size, nullptr, 0);
      const PairMsg got = pair_recv(kExported, seq);
      const std::int64_t t_rx = now_ns();
      CUmemPoolPtrExportData data;
      std::memcpy(&data, got.data, sizeof data);
      CUdeviceptr ptr = 0;
      CU(cuMemPoolImportPointer, &ptr, pool, &data);
      const std::int64_t t_imp = now_ns();
      CU(cuEventSynchronize, event);
      if (touch == 1) ::usleep(1000);
      const std::int64_t t_ev = now_ns();
      if (touch == 2) {
        CU(cuMemsetD8Async, ptr, byte, 1, stream);
        CU(cuStreamSynchronize, stream);
      } else if (touch == 3) {
        *pinned = byte;
        CU(cuMemcpyHtoDAsync, ptr, pinned, 1, stream);
        CU(cuStreamSynchronize, stream);
      } else if (way.use_on_stream) {
        CU(cuMemcpyHtoDAsync, ptr, &byte, 1, stream);
        CU(cuStreamSynchronize, stream);
      } else {
        CU(cuMemcpyHtoD, ptr, &byte, 1);
        CU(cuStreamSynchronize, nullptr);  // from pageable memory the copy may return before its DMA is done
      }
      const std::int64_t t_use = now_ns();
      if (!timed) {
        unsigned char back = static_cast<unsigned char>(~byte);
        CU(cuMemcpyDtoH, &back, ptr, 1);
        if (back != byte) die("read back 0x%02x after writing 0x%02x to the imported allocation", back, byte);
      }
      const std::int64_t t_f0 = now_ns();
      if (way.free_sync) {
        CU(cuMemFree, ptr);
      } else {
        CU(cuMemFreeAsync, ptr, stream);
        CU(cuStreamSynchronize, stream);
      }
      const std::int64_t t_f1 = now_ns();
      pair_send(kFree, seq, size, nullptr, 0);
      pair_recv(kFreed, seq);
      const std::int64_t t1 = now_ns();
      if (!timed) continue;
      rep.add(size, "round trip", 0, kTotal).push_back(us(t0, t1));
      rep.add(size, "importer: cuMemPoolImportPointer (maps the allocation)", 20, kStep).push_back(us(t_rx, t_imp));
      rep.add(size, "importer: cuEventSynchronize (ready event)", 21, kStep).push_back(us(t_imp, t_ev));
      rep.add(size,
              way.touch_ways      ? "importer: first use (four ways in turn, below)"
              : way.use_on_stream ? "importer: first use (1-byte cuMemcpyHtoDAsync on its stream + cuStreamSynchronize)"
                                  : "importer: first use (1-byte cuMemcpyHtoD + cuStreamSynchronize)",
              22, kStep)
          .push_back(us(t_ev, t_use));
      if (way.touch_ways) rep.add(size, kTouchWays[touch], 102 + touch, kInfo).push_back(us(t_ev, t_use));
      rep.add(
             size,
             way.free_sync ? "importer: cuMemFree (unmaps)" : "importer: cuMemFreeAsync + cuStreamSynchronize (unmaps)",
             23, kStep)
          .push_back(us(t_f0, t_f1));
      rep.add(size, "importer: alloc request sent -> export data received (exporter steps + messaging)", 100, kInfo)
          .push_back(us(t0, t_rx));
      rep.add(size, "importer: free request sent -> acknowledgement received (exporter free + messaging)", 101, kInfo)
          .push_back(us(t_f1, t1));
    }
  }
  g_where.clear();
  if (pinned) CU(cuMemFreeHost, pinned);
  pair_send(kDone, seq + 1, 0, nullptr, 0);
  send_frame(kFrameReport, encode(rep));
  _exit(0);
}

// Legacy IPC: cuMemAlloc + cuIpcGetMemHandle per allocation; cuMemFree on "free".
void legacy_exporter_main() {
  Report rep;
  cuda_start();
  std::uint64_t seq = 0;
  for (std::uint64_t size : g_opt.sizes) {
    const int total = g_opt.warmup + iterations_for(size);
    for (int i = 0; i < total; ++i) {
      ++seq;
      g_where = where("legacy exporter", size, i, g_opt.warmup);
      const PairMsg req = pair_recv(kAlloc, seq);
      if (req.size != size) die("the importer asked for %" PRIu64 " bytes where %" PRIu64 " were due", req.size, size);
      CUdeviceptr ptr = 0;
      const std::int64_t a0 = now_ns();
      CU(cuMemAlloc, &ptr, static_cast<std::size_t>(size));
      const std::int64_t a1 = now_ns();
      CUipcMemHandle handle;
      std::memset(&handle, 0, sizeof handle);
      static_assert(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle is 64 bytes");
      CU(cuIpcGetMemHandle, &handle, ptr);
      const std::int64_t a2 = now_ns();
      pair_send(kExported, seq, size, &handle, sizeof handle);
      pair_recv(kFree, seq);
      const std::int64_t f0 = now_ns();
      CU(cuMemFree, ptr);
      const std::int64_t f1 = now_ns();
      pair_send(kFreed, seq, size, nullptr, 0);
      if (i < g_opt.warmup) continue;
      rep.add(size, "exporter: cuMemAlloc", 10, kStep).push_back(us(a0, a1));
      rep.add(size, "exporter: cuIpcGetMemHandle", 12, kStep).push_back(us(a1, a2));
      rep.add(size, "exporter: cuMemFree", 30, kStep).push_back(us(f0, f1));
    }
  }
  g_where.clear();
  pair_recv(kDone, seq + 1);
  send_frame(kFrameReport, encode(rep));
  _exit(0);
}

void legacy_importer_main() {
  Report rep;
  cuda_start();
  std::uint64_t seq = 0;
  for (std::uint64_t size : g_opt.sizes) {
    const int total = g_opt.warmup + iterations_for(size);
    for (int i = 0; i < total; ++i) {
      ++seq;
      g_where = where("legacy importer", size, i, g_opt.warmup);
      const bool timed = i >= g_opt.warmup;
      const unsigned char byte = static_cast<unsigned char>(0x3c ^ (seq & 0xff));
      const std::int64_t t0 = now_ns();
      pair_send(kAlloc, seq, size, nullptr, 0);
      const PairMsg got = pair_recv(kExported, seq);
      const std::int64_t t_rx = now_ns();
      CUipcMemHandle handle;
      std::memcpy(&handle, got.data, sizeof handle);
      CUdeviceptr ptr = 0;
      CU(cuIpcOpenMemHandle, &ptr, handle, static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
      const std::int64_t t_open = now_ns();
      CU(cuMemcpyHtoD, ptr, &byte, 1);
      CU(cuStreamSynchronize, nullptr);
      const std::int64_t t_use = now_ns();
      if (!timed) {
        unsigned char back = static_cast<unsigned char>(~byte);
        CU(cuMemcpyDtoH, &back, ptr, 1);
        if (back != byte) die("read back 0x%02x after writing 0x%02x to the opened allocation", back, byte);
      }
      const std::int64_t t_c0 = now_ns();
      CU(cuIpcCloseMemHandle, ptr);
      const std::int64_t t_c1 = now_ns();
      pair_send(kFree, seq, size, nullptr, 0);
      pair_recv(kFreed, seq);
      const std::int64_t t1 = now_ns();
      if (!timed) continue;
      rep.add(size, "round trip", 0, kTotal).push_back(us(t0, t1));
      rep.add(size, "importer: cuIpcOpenMemHandle (maps the allocation)", 20, kStep).push_back(us(t_rx, t_open));
      rep.add(size, "importer: first use (1-byte cuMemcpyHtoD + cuStreamSynchronize)", 22, kStep)
          .push_back(us(t_open, t_use));
      rep.add(size, "importer: cuIpcCloseMemHandle (unmaps)", 23, kStep).push_back(us(t_c0, t_c1));
      rep.add(size, "importer: alloc request sent -> handle received (exporter steps + messaging)", 100, kInfo)
          .push_back(us(t0, t_rx));
      rep.add(size, "importer: free request sent -> acknowledgement received (exporter free + messaging)", 101, kInfo)
          .push_back(us(t_c1, t1));
    }
  }
  g_where.clear();
  pair_send(kDone, seq + 1, 0, nullptr, 0);
  send_frame(kFrameReport, encode(rep));
  _exit(0);
}

// ---- the A/B controls of a cold round trip (issue 26) ----
//
// One exporter and one importer process, driver only, as bare-free (the importer unmaps with
// cuMemFree, as the client library does), each changing one thing: how the importer waits for the
// exporter's work, whether the exporter writes the block, how the importer first uses it, whether
// a block comes back right after its unmap, and legacy IPC as the control.

struct AbWay {
  enum class Wait { synchronized, event_host, event_stream, flag };
  Wait wait = Wait::event_host;
  bool exporter_writes = true;  // a 4-byte cuMemsetD32Async before the signal
  bool read_first = true;       // first use: a 4-byte read on the importer's stream (else a 1-byte cuMemcpyHtoD)
  bool ring = false;            // the exporter keeps its last kAbRing blocks allocated
  bool legacy = false;          // cuMemAlloc + cuIpc*MemHandle instead of a pool
  bool slab = false;            // one allocation per size, imported once, a region of it per round
  bool set_access = false;      // the importer sets read-write access on the imported pool
  bool record_too = false;      // synchronized: the exporter records its IPC event as well
};
constexpr std::size_t kAbRing = 16;

bool is_ab_path(const std::string& path) { return path.rfind("ab-", 0) == 0; }

AbWay ab_way(const std::string& path) {
  AbWay w;
  using W = AbWay::Wait;
  if (path == "ab-sync" || path == "ab-sync-write1" || path == "ab-record-write1") w.wait = W::synchronized;
  w.record_too = path == "ab-record-write1";
  if (path == "ab-event-stream") w.wait = W::event_stream;
  if (path == "ab-flag" || path == "ab-flag-write1") w.wait = W::flag;
  const bool holder_like = path == "ab-holder" || path == "ab-ring" || path == "ab-slab" || path == "ab-access" ||
                           path == "ab-sync-write1" || path == "ab-flag-write1" || path == "ab-record-write1";
  if (path == "ab-nowrite" || holder_like) w.exporter_writes = false;
  if (path == "ab-write1" || holder_like) w.read_first = false;
  w.ring = path == "ab-ring";
  w.slab = path == "ab-slab";
  w.set_access = path == "ab-access";
  if (path == "ab-legacy") {
    w.legacy = true;
    w.wait = W::synchronized;
  }
  return w;
}

// ab-slab: the regions of one size's slab (every round a fresh one, as far as 2 GiB goes: the
// importer of an 8 GiB pool allocation was killed by SIGSEGV in the driver on the H100 with 580,
// as the loader of a set over 8 GiB was on 2026-11-25; RESULTS.md).
std::uint64_t ab_slab_regions(std::uint64_t size) {
  const std::uint64_t rounds = static_cast<std::uint64_t>(g_opt.warmup + iterations_for(size));
  return std::max<std::uint64_t>(1, std::min(rounds, (2 * kGiB) / size));
}

std::uint32_t ab_pattern(std::uint64_t seq) { return 0x5a000000u | static_cast<std::uint32_t>(seq & 0xffffff); }

const char* ab_signal_name(const AbWay& w) {
  switch (w.wait) {
    case AbWay::Wait::synchronized: return "exporter: cuStreamSynchronize (before it sends)";
    case AbWay::Wait::flag: return "exporter: cuStreamWriteValue32 (the flag)";
    default: return "exporter: cuEventRecord (IPC event)";
  }
}

const char* ab_wait_name(const AbWay& w) {
  switch (w.wait) {
    case AbWay::Wait::synchronized: return "importer: wait (none: the exporter synchronised)";
    case AbWay::Wait::event_host: return "importer: wait (cuEventSynchronize on the IPC event)";
    case AbWay::Wait::event_stream: return "importer: wait (cuStreamWaitEvent on its stream, returns at once)";
    case AbWay::Wait::flag: return "importer: wait (cuStreamWaitValue32 on its stream, returns at once)";
  }
  return "importer: wait";
}

void ab_exporter_main(const AbWay& way) {
  Report rep;
  cuda_start();
  if (!way.legacy) require_pool_support();
  CUstream stream = nullptr;
  CU(cuStreamCreate, &stream, static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
  CUmemoryPool pool = nullptr;
  CUevent event = nullptr;
  CUdeviceptr flag = 0;
  if (!way.legacy) {
    CUmemPoolProps props;
    std::memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CU(cuMemPoolCreate, &pool, &props);
    cuuint64_t threshold = std::numeric_limits<cuuint64_t>::max();
    CU(cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
    CU(cuEventCreate, &event,
       static_cast<unsigned>(CU_EVENT_INTERPROCESS) | static_cast<unsigned>(CU_EVENT_DISABLE_TIMING));
    int pool_fd = -1;
    CU(cuMemPoolExportToShareableHandle, &pool_fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0ULL);
    CUipcEventHandle event_handle;
    std::memset(&event_handle, 0, sizeof event_handle);
    CU(cuIpcGetEventHandle, &event_handle, event);
    pair_send(kHello, 0, 0, &event_handle, sizeof event_handle, pool_fd);
    ::close(pool_fd);
    if (way.wait == AbWay::Wait::flag) {
      // The flag: 4 bytes of legacy IPC memory the importer opens once (its first use is cheap).
      CU(cuMemAlloc, &flag, static_cast<std::size_t>(2 * kMiB));
      CU(cuMemsetD32Async, flag, 0u, 1, stream);
      CU(cuStreamSynchronize, stream);
      CUipcMemHandle handle;
      std::memset(&handle, 0, sizeof handle);
      CU(cuIpcGetMemHandle, &handle, flag);
      pair_send(kHello, 1, 0, &handle, sizeof handle);
    }
  }
  std::deque<CUdeviceptr> kept;  // ab-ring
  CUdeviceptr slab = 0;          // ab-slab
  std::uint64_t seq = 0;
  for (std::uint64_t size : g_opt.sizes) {
    const int total = g_opt.warmup + iterations_for(size);
    for (int i = 0; i < total; ++i) {
      ++seq;
      g_where = where("A/B exporter", size, i, g_opt.warmup);
      const PairMsg req = pair_recv(kAlloc, seq);
      if (req.size != size) die("the importer asked for %" PRIu64 " bytes where %" PRIu64 " were due", req.size, size);
      CUdeviceptr ptr = 0;
      const std::int64_t a0 = now_ns();
      if (way.legacy)
        CU(cuMemAlloc, &ptr, static_cast<std::size_t>(size));
      else if (way.slab && i > 0)
        ptr = slab;  // the same allocation, exported again
      else
        CU(cuMemAllocFromPoolAsync, &ptr, static_cast<std::size_t>(way.slab ? size * ab_slab_regions(size) : size),
           pool, stream);
      if (way.slab) slab = ptr;
      const std::int64_t a1 = now_ns();
      if (way.exporter_writes) CU(cuMemsetD32Async, ptr, ab_pattern(seq), 1, stream);
      const std::int64_t a2 = now_ns();
      if (way.wait == AbWay::Wait::synchronized && way.record_too) {
        CU(cuEventRecord, event, stream);
        CU(cuStreamSynchronize, stream);
      } else if (way.wait == AbWay::Wait::synchronized) {
        CU(cuStreamSynchronize, stream);
      } else if (way.wait == AbWay::Wait::flag)
        CU(cuStreamWriteValue32, stream, flag, static_cast<cuuint32_t>(seq), 0u);
      else
        CU(cuEventRecord, event, stream);
      const std::int64_t a3 = now_ns();
      unsigned char data[64] = {0};
      if (way.legacy) {
        CUipcMemHandle handle;
        std::memset(&handle, 0, sizeof handle);
        CU(cuIpcGetMemHandle, &handle, ptr);
        std::memcpy(data, &handle, sizeof handle);
      } else {
        CUmemPoolPtrExportData exported;
        std::memset(&exported, 0, sizeof exported);
        CU(cuMemPoolExportPointer, &exported, ptr);
        std::memcpy(data, &exported, sizeof exported);
      }
      const std::int64_t a4 = now_ns();
      pair_send(kExported, seq, size, data, sizeof data);
      pair_recv(kFree, seq);
      const std::int64_t f0 = now_ns();
      if (way.legacy) {
        CU(cuMemFree, ptr);
      } else if (way.slab) {
        if (i + 1 == total) CU(cuMemFreeAsync, ptr, stream);  // the importer unmapped it in its last round
      } else if (way.ring) {
        kept.push_back(ptr);
        if (kept.size() > kAbRing) {
          CU(cuMemFreeAsync, kept.front(), stream);
          kept.pop_front();
        }
      } else {
        CU(cuMemFreeAsync, ptr, stream);
      }
      const std::int64_t f1 = now_ns();
      pair_send(kFreed, seq, size, nullptr, 0);
      if (i < g_opt.warmup) continue;
      rep.add(size, way.legacy ? "exporter: cuMemAlloc" : "exporter: cuMemAllocFromPoolAsync", 10, kStep)
          .push_back(us(a0, a1));
      if (way.exporter_writes)
        rep.add(size, "exporter: 4-byte cuMemsetD32Async (enqueue)", 11, kStep).push_back(us(a1, a2));
      rep.add(size, ab_signal_name(way), 12, kStep).push_back(us(a2, a3));
      rep.add(size, way.legacy ? "exporter: cuIpcGetMemHandle" : "exporter: cuMemPoolExportPointer", 13, kStep)
          .push_back(us(a3, a4));
      rep.add(size, way.legacy ? "exporter: cuMemFree" : "exporter: cuMemFreeAsync", 30, kStep).push_back(us(f0, f1));
    }
    for (CUdeviceptr p : kept) CU(cuMemFreeAsync, p, stream);
    kept.clear();
  }
  g_where.clear();
  pair_recv(kDone, seq + 1);
  CU(cuStreamSynchronize, stream);
  if (flag) CU(cuMemFree, flag);
  send_frame(kFrameReport, encode(rep));
  _exit(0);
}

void ab_importer_main(const AbWay& way) {
  Report rep;
  cuda_start();
  CUstream stream = nullptr;
  CU(cuStreamCreate, &stream, static_cast<unsigned>(CU_STREAM_NON_BLOCKING));
  CUmemoryPool pool = nullptr;
  CUevent event = nullptr;
  CUdeviceptr flag = 0;
  if (!way.legacy) {
    int pool_fd = -1;
    g_where = "waiting for the exporter's pool handle";
    const PairMsg hello = pair_recv(kHello, 0, &pool_fd);
    if (pool_fd < 0) die("the exporter's pool handle message carried no file descriptor");
    CUipcEventHandle event_handle;
    std::memcpy(&event_handle, hello.data, sizeof event_handle);
    CU(cuMemPoolImportFromShareableHandle, &pool, reinterpret_cast<void*>(static_cast<std::uintptr_t>(pool_fd)),
       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0ULL);
    ::close(pool_fd);
    CU(cuIpcOpenEventHandle, &event, event_handle);
    if (way.set_access) {
      CUmemAccessDesc desc;
      std::memset(&desc, 0, sizeof desc);
      desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      desc.location.id = 0;
      desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      const CUresult r = g_cu.cuMemPoolSetAccess(pool, &desc, 1);
      rep.texts.emplace_back("importer: cuMemPoolSetAccess(read-write, device 0) on the imported pool",
                             r == CUDA_SUCCESS ? "CUDA_SUCCESS" : cu_error_text(r));
    }
    if (way.wait == AbWay::Wait::flag) {
      const PairMsg f = pair_recv(kHello, 1);
      CUipcMemHandle handle;
      std::memcpy(&handle, f.data, sizeof handle);
      CU(cuIpcOpenMemHandle, &flag, handle, static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    }
  }
  std::uint32_t* pinned = nullptr;
  CU(cuMemHostAlloc, reinterpret_cast<void**>(&pinned), 16, 0u);
  CUdeviceptr slab = 0;  // ab-slab: this size's import
  auto read4 = [&](CUdeviceptr ptr) {
    CU(cuMemcpyDtoHAsync, pinned, ptr, 4, stream);
    CU(cuStreamSynchronize, stream);
    return *pinned;
  };
  const char* first_name = way.read_first
                               ? "importer: first use (4-byte cuMemcpyDtoHAsync on its stream + cuStreamSynchronize)"
                               : "importer: first use (1-byte cuMemcpyHtoD + cuStreamSynchronize, as cupool_write)";
  std::uint64_t seq = 0;
  for (std::uint64_t size : g_opt.sizes) {
    const int total = g_opt.warmup + iterations_for(size);
    for (int i = 0; i < total; ++i) {
      ++seq;
      g_where = where("A/B importer", size, i, g_opt.warmup);
      const bool timed = i >= g_opt.warmup;
      const unsigned char byte = static_cast<unsigned char>(0xc3 ^ (seq & 0xff));
      const std::int64_t t0 = now_ns();
      pair_send(kAlloc, seq, size, nullptr, 0);
      const PairMsg got = pair_recv(kExported, seq);
      const std::int64_t t_rx = now_ns();
      CUdeviceptr ptr = 0;
      if (way.legacy) {
        CUipcMemHandle handle;
        std::memcpy(&handle, got.data, sizeof handle);
        CU(cuIpcOpenMemHandle, &ptr, handle, static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
      } else if (way.slab && i > 0) {
        ptr = slab + (static_cast<std::uint64_t>(i) % ab_slab_regions(size)) * size;  // imported in round 0
      } else {
        CUmemPoolPtrExportData data;
        std::memcpy(&data, got.data, sizeof data);
        CU(cuMemPoolImportPointer, &ptr, pool, &data);
        if (way.slab) slab = ptr;
      }
      const std::int64_t t_imp = now_ns();
      switch (way.wait) {
        case AbWay::Wait::synchronized: break;
        case AbWay::Wait::event_host: CU(cuEventSynchronize, event); break;
        case AbWay::Wait::event_stream: CU(cuStreamWaitEvent, stream, event, 0u); break;
        case AbWay::Wait::flag:
          CU(cuStreamWaitValue32, stream, flag, static_cast<cuuint32_t>(seq),
             static_cast<unsigned>(CU_STREAM_WAIT_VALUE_GEQ));
          break;
      }
      const std::int64_t t_wait = now_ns();
      std::uint32_t first = 0;
      if (way.read_first) {
        first = read4(ptr);
      } else if (way.wait == AbWay::Wait::event_stream || way.wait == AbWay::Wait::flag) {
        CU(cuMemcpyHtoDAsync, ptr, &byte, 1, stream);  // ordered after the wait on the stream
        CU(cuStreamSynchronize, stream);
      } else {
        CU(cuMemcpyHtoD, ptr, &byte, 1);
        CU(cuStreamSynchronize, nullptr);  // from pageable memory the copy may return before its DMA is done
      }
      const std::int64_t t_u1 = now_ns();
      const std::uint32_t second = read4(ptr);
      const std::int64_t t_u2 = now_ns();
      if (way.exporter_writes && way.read_first && first != ab_pattern(seq))
        die("the first read saw 0x%08x where the exporter wrote 0x%08x: it ran before the exporter's work", first,
            ab_pattern(seq));
      if (way.exporter_writes && way.read_first && second != ab_pattern(seq))
        die("the second read saw 0x%08x where the exporter wrote 0x%08x", second, ab_pattern(seq));
      if (!way.read_first && static_cast<unsigned char>(second & 0xff) != byte)
        die("read back 0x%02x after writing 0x%02x", static_cast<unsigned>(second & 0xff), byte);
      const std::int64_t t_f0 = now_ns();
      if (way.legacy)
        CU(cuIpcCloseMemHandle, ptr);
      else if (!way.slab)
        CU(cuMemFree, ptr);
      else if (i + 1 == total)
        CU(cuMemFree, slab);  // the slab's last round
      const std::int64_t t_f1 = now_ns();
      pair_send(kFree, seq, size, nullptr, 0);
      pair_recv(kFreed, seq);
      const std::int64_t t1 = now_ns();
      if (!timed) continue;
      rep.add(size, "round trip", 0, kTotal).push_back(us(t0, t1));
      rep.add(size, way.legacy ? "importer: import (cuIpcOpenMemHandle)" : "importer: import (cuMemPoolImportPointer)",
              20, kStep)
          .push_back(us(t_rx, t_imp));
      rep.add(size, ab_wait_name(way), 21, kStep).push_back(us(t_imp, t_wait));
      rep.add(size, first_name, 22, kStep).push_back(us(t_wait, t_u1));
      rep.add(size, "importer: second use (4-byte read on its stream + cuStreamSynchronize)", 23, kStep)
          .push_back(us(t_u1, t_u2));
      rep.add(size, way.legacy ? "importer: release (cuIpcCloseMemHandle)" : "importer: release (cuMemFree)", 24, kStep)
          .push_back(us(t_f0, t_f1));
      rep.add(size, "importer: own work (import, wait, two uses, release)", 100, kInfo).push_back(us(t_rx, t_f1));
      if (way.slab)
        rep.add(size,
                static_cast<std::uint64_t>(i) < ab_slab_regions(size)
                    ? "importer: first use of a region never written before (of the slab imported once)"
                    : "importer: first use of a region written in an earlier round",
                102, kInfo)
            .push_back(us(t_wait, t_u1));
      rep.add(size, "importer: alloc request sent -> export data received (exporter steps + messaging)", 101, kInfo)
          .push_back(us(t0, t_rx));
    }
  }
  g_where.clear();
  CU(cuMemFreeHost, pinned);
  if (flag) CU(cuIpcCloseMemHandle, flag);
  pair_send(kDone, seq + 1, 0, nullptr, 0);
  send_frame(kFrameReport, encode(rep));
  _exit(0);
}

// ------------------------------------------------------------------------------------------------
// The orchestrator: children, their reports, their ends

struct Kid {
  pid_t pid = -1;
  std::string role;
  int fd = -1;  // the orchestrator's end of the child's report socket
  bool got = false;
  bool reaped = false;
  int status = 0;
  Report report;
};

// fork()s a child that keeps only `keep` (and stdio) and runs `body`, which must _exit.
pid_t spawn(const std::string& role, const std::vector<int>& keep, const std::function<void()>& body) {
  std::fflush(nullptr);  // nothing buffered may be written twice
  const pid_t pid = ::fork();
  if (pid != 0) {
    if (pid > 0) g_live.insert(pid);
    return pid;
  }
  g_in_child = true;
  g_role = role;
  g_where.clear();
  g_live.clear();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the orchestrator's death ends every child
  if (::getppid() != g_orchestrator_pid) _exit(1);
  close_fds_except(keep);
  try {
    body();
  } catch (const std::exception& e) {
    die("unexpected exception: %s", e.what());
  } catch (...) {
    die("unexpected exception");
  }
  die("internal error: the child's work returned without reporting");
}

std::string describe_status(int st) {
  char buf[128];
  if (WIFEXITED(st))
    std::snprintf(buf, sizeof buf, "exited with status %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    std::snprintf(buf, sizeof buf, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else
    std::snprintf(buf, sizeof buf, "ended with wait status 0x%x", static_cast<unsigned>(st));
  return buf;
}

// Waits up to wait_ms for the child to end (then kills it); says how it ended.
std::string reap(Kid& k, int wait_ms) {
  if (k.reaped) return describe_status(k.status);
  const std::int64_t deadline = now_ns() + static_cast<std::int64_t>(wait_ms) * 1000000;
  while (true) {
    int st = 0;
    const pid_t r = ::waitpid(k.pid, &st, WNOHANG);
    if (r == k.pid) {
      k.reaped = true;
      k.status = st;
      g_live.erase(k.pid);
      return describe_status(st);
    }
    if (r < 0 && errno != EINTR) {
      const std::string why = std::strerror(errno);
      k.reaped = true;
      k.status = -1;
      g_live.erase(k.pid);
      return "could not be waited for (" + why + ")";
    }
    if (now_ns() > deadline) {
      ::kill(k.pid, SIGKILL);
      while (::waitpid(k.pid, &st, 0) < 0 && errno == EINTR) {
      }
      k.reaped = true;
      k.status = -1;
      g_live.erase(k.pid);
      return "was still running " + std::to_string(wait_ms / 1000) + " s after it should have ended, and was killed";
    }
    ::usleep(5000);
  }
}

void close_kid_fds(std::vector<Kid>& kids) {
  for (Kid& k : kids)
    if (k.fd >= 0) {
      ::close(k.fd);
      k.fd = -1;
    }
}

void abort_kids(std::vector<Kid>& kids) {
  for (Kid& k : kids)
    if (!k.reaped && k.pid > 0) ::kill(k.pid, SIGKILL);
  for (Kid& k : kids)
    if (!k.reaped && k.pid > 0) reap(k, 30000);
  close_kid_fds(kids);
}

std::string kid_name(const Kid& k) { return k.role + " (pid " + std::to_string(k.pid) + ")"; }

// Waits until every kid has sent one frame of `type`. The wait ends in failure when a kid's
// socket closes first (it died), on a malformed frame, or after --timeout + 30 s without any frame.
bool collect(std::vector<Kid>& kids, std::uint32_t type, std::string& err) {
  for (Kid& k : kids) k.got = false;
  const int idle_ms = (g_opt.timeout_s + 30) * 1000;
  const char* what = type == kFrameReady ? "ready message" : "report";
  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < kids.size(); ++i)
      if (!kids[i].got) {
        pollfd p{};
        p.fd = kids[i].fd;
        p.events = POLLIN;
        fds.push_back(p);
        which.push_back(i);
      }
    if (fds.empty()) return true;
    const int r = ::poll(fds.data(), static_cast<nfds_t>(fds.size()), idle_ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      err = std::string("poll: ") + std::strerror(errno);
      return false;
    }
    if (r == 0) {
      err = "timed out: no " + std::string(what) + " for " + std::to_string(idle_ms / 1000) + " s from";
      for (std::size_t i : which) err += " " + kid_name(kids[i]) + ";";
      err += " they were killed (a hung driver call? raise --timeout if the machine is just slow)";
      return false;
    }
    for (std::size_t j = 0; j < fds.size(); ++j) {
      if (!fds[j].revents) continue;
      Kid& k = kids[which[j]];
      FrameHeader h{};
      std::string e;
      Io io = read_exact(k.fd, &h, sizeof h, idle_ms, e);
      if (io == Io::eof) {
        err = kid_name(k) + " " + reap(k, 10000) + " before sending its " + what +
              "; its own message, if it printed one, is above on stderr";
        return false;
      }
      if (io != Io::ok) {
        err = "reading the " + std::string(what) + " of " + kid_name(k) + ": " + e;
        return false;
      }
      if (h.magic != kFrameMagic || h.type != type || h.length > (std::uint64_t{1} << 32)) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "magic 0x%08x, type %u, length %" PRIu64, h.magic, h.type, h.length);
        err = kid_name(k) + " sent a malformed frame while its " + what + " was due (" + buf + ")";
        return false;
      }
      std::string payload(static_cast<std::size_t>(h.length), '\0');
      io = read_exact(k.fd, payload.empty() ? nullptr : &payload[0], payload.size(), idle_ms, e);
      if (io != Io::ok) {
        err = "reading the " + std::string(what) + " of " + kid_name(k) + ": " + e;
        return false;
      }
      if (type == kFrameReport && !decode(payload, k.report)) {
        err = kid_name(k) + " sent a report that does not decode";
        return false;
      }
      k.got = true;
    }
  }
}

// After every report: each kid must end with status 0.
bool finish_kids(std::vector<Kid>& kids, std::string& err) {
  bool ok = true;
  for (Kid& k : kids) {
    const std::string how = reap(k, 30000);
    if (!(k.status >= 0 && WIFEXITED(k.status) && WEXITSTATUS(k.status) == 0)) {
      if (!err.empty()) err += "; ";
      err += kid_name(k) + " " + how + " after reporting";
      ok = false;
    }
  }
  close_kid_fds(kids);
  return ok;
}

// ------------------------------------------------------------------------------------------------
// Statistics

struct Stats {
  std::size_t n = 0;
  double median = NAN, p99 = NAN, min = NAN, max = NAN, mean = NAN;
};

// Nearest rank: the smallest sample with at least per_mille/1000 of the samples at or below it.
double nearest_rank(const std::vector<double>& sorted, std::size_t per_mille) {
  const std::size_t n = sorted.size();
  std::size_t rank = (per_mille * n + 999) / 1000;
  if (rank < 1) rank = 1;
  if (rank > n) rank = n;
  return sorted[rank - 1];
}

Stats stats_of(std::vector<double> v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.median = nearest_rank(v, 500);
  s.p99 = nearest_rank(v, 990);
  s.min = v.front();
  s.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

// ------------------------------------------------------------------------------------------------
// Running the paths

struct PathResult {
  std::string path;
  std::string status = "ok";  // ok, failed, skipped
  std::string note;
  double wall_s = 0;
  std::vector<Series> series;
  std::vector<std::pair<std::string, double>> scalars;
  std::vector<std::pair<std::string, std::int64_t>> integers;
  std::vector<std::pair<std::string, std::string>> texts;

  const Series* find(std::uint64_t size, std::uint32_t kind) const {
    for (const Series& s : series)
      if (s.size == size && s.kind == kind) return &s;
    return nullptr;
  }
};

void take(PathResult& r, const Report& rep) {
  r.series.insert(r.series.end(), rep.series.begin(), rep.series.end());
  r.scalars.insert(r.scalars.end(), rep.scalars.begin(), rep.scalars.end());
  r.integers.insert(r.integers.end(), rep.integers.begin(), rep.integers.end());
  r.texts.insert(r.texts.end(), rep.texts.begin(), rep.texts.end());
}

// total - every step, per round trip: what the messages and the waits for the other process cost.
void add_messaging(PathResult& r) {
  for (std::uint64_t size : g_opt.sizes) {
    const Series* total = r.find(size, kTotal);
    if (!total) continue;
    std::vector<double> rest = total->us;
    bool aligned = true;
    for (const Series& s : r.series) {
      if (s.size != size || s.kind != kStep) continue;
      if (s.us.size() != rest.size()) {
        aligned = false;
        break;
      }
      for (std::size_t i = 0; i < rest.size(); ++i) rest[i] -= s.us[i];
    }
    if (!aligned) {
      r.note += (r.note.empty() ? "" : "; ") + std::string("step samples of ") + fmt_size(size) +
                " do not line up with the round trips: no messaging figure";
      continue;
    }
    Series m;
    m.size = size;
    m.name = "messaging and waiting for the other process (round trip - all steps above)";
    m.order = 90;
    m.kind = kStep;
    m.us = std::move(rest);
    r.series.push_back(std::move(m));
  }
}

void say_progress(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say_progress(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::printf("# ");
  std::vprintf(fmt, ap);
  std::printf("\n");
  va_end(ap);
  std::fflush(stdout);
}

std::string sizes_text() {
  std::string out;
  for (std::uint64_t s : g_opt.sizes) {
    if (!out.empty()) out += ", ";
    out += fmt_size(s) + " x " + std::to_string(iterations_for(s));
  }
  return out;
}

bool make_socketpair(int sv[2], std::string& err) {
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0) return true;
  err = std::string("socketpair: ") + std::strerror(errno);
  return false;
}

void fail_path(PathResult& r, const std::string& why) {
  r.status = "failed";
  r.note = why;
  say_progress("path %s FAILED: %s", r.path.c_str(), why.c_str());
}

// One child process running `body` and sending its report. `reported`: the report came (then
// `ended` says whether the child ended well); otherwise `err` says what failed.
struct OneKid {
  bool reported = false;
  bool ended = false;
  std::string err;
  Report report;
};

OneKid run_one_kid(const std::string& role, const std::function<void()>& body) {
  OneKid out;
  int sv[2];
  if (!make_socketpair(sv, out.err)) return out;
  std::vector<Kid> kids(1);
  kids[0].role = role;
  kids[0].pid = spawn(role, {sv[1]}, [&] {
    g_result_fd = sv[1];
    body();
  });
  ::close(sv[1]);
  kids[0].fd = sv[0];
  if (kids[0].pid < 0) {
    const std::string why = std::strerror(errno);
    close_kid_fds(kids);
    out.err = "fork: " + why;
    return out;
  }
  if (!collect(kids, kFrameReport, out.err)) {
    abort_kids(kids);
    return out;
  }
  out.reported = true;
  out.ended = finish_kids(kids, out.err);
  out.report = std::move(kids[0].report);
  return out;
}

PathResult run_holder_path(bool warm) {
  PathResult r;
  r.path = warm ? "holder-warm" : "holder";
  g_child_cache = warm;
  if (g_opt.socket.empty()) {
    r.status = "skipped";
    r.note = "no --socket given: this path needs a running 'cupool hold' (scripts/holder-bench.sh starts one)";
    say_progress("path holder: skipped: %s", r.note.c_str());
    return r;
  }
  say_progress("path %s: socket %s, pool %s on device 0, %s round trips (+%d warm-up each)...", r.path.c_str(),
               g_opt.socket.c_str(), g_opt.pool.c_str(), sizes_text().c_str(), g_opt.warmup);
  const std::int64_t t0 = now_ns();
  OneKid kid = run_one_kid("holder client", holder_main);
  if (!kid.reported) {
    fail_path(r, kid.err);
    return r;
  }
  take(r, kid.report);
  r.wall_s = us(t0, now_ns()) / 1e6;
  if (!kid.ended)
    fail_path(r, kid.err);
  else
    say_progress("path %s: done in %.1f s", r.path.c_str(), r.wall_s);
  return r;
}

// attach: kAttachSamples processes, one after another; their samples pooled.
PathResult run_attach_path() {
  PathResult r;
  r.path = "attach";
  if (g_opt.socket.empty()) {
    r.status = "skipped";
    r.note = "no --socket given: this path needs a running 'cupool hold' (scripts/holder-bench.sh starts one)";
    say_progress("path attach: skipped: %s", r.note.c_str());
    return r;
  }
  say_progress("path attach: %d processes, one after another...", kAttachSamples);
  const std::int64_t t0 = now_ns();
  for (int i = 0; i < kAttachSamples; ++i) {
    const OneKid kid = run_one_kid("attaching client " + std::to_string(i + 1), attach_main);
    if (!kid.reported) {
      fail_path(r, kid.err);
      return r;
    }
    for (const Series& s : kid.report.series) {
      Series* into = nullptr;
      for (Series& have : r.series)
        if (have.size == s.size && have.name == s.name) into = &have;
      if (into)
        into->us.insert(into->us.end(), s.us.begin(), s.us.end());
      else
        r.series.push_back(s);
    }
    if (!kid.ended) {
      fail_path(r, kid.err);
      return r;
    }
  }
  r.wall_s = us(t0, now_ns()) / 1e6;
  say_progress("path attach: done in %.1f s", r.wall_s);
  return r;
}

// bare, bare-t0, legacy: an exporter and an importer process.
PathResult run_pair_path(const std::string& path) {
  PathResult r;
  r.path = path;
  const bool legacy = path == "legacy";
  const bool t0 = path == "bare-t0";
  ImporterWay way;
  way.use_on_stream = path == "bare-stream";
  way.free_sync = path == "bare-free" || path == "bare-touch";
  way.touch_ways = path == "bare-touch";
  say_progress("path %s: %s round trips (+%d warm-up each)...", path.c_str(), sizes_text().c_str(), g_opt.warmup);
  const std::int64_t start = now_ns();
  std::string err;
  int pair[2], rex[2], rim[2];
  if (!make_socketpair(pair, err)) {
    fail_path(r, err);
    return r;
  }
  if (!make_socketpair(rex, err)) {
    ::close(pair[0]);
    ::close(pair[1]);
    fail_path(r, err);
    return r;
  }
  if (!make_socketpair(rim, err)) {
    for (int fd : {pair[0], pair[1], rex[0], rex[1]}) ::close(fd);
    fail_path(r, err);
    return r;
  }
  std::vector<Kid> kids(2);
  kids[0].role = path + " exporter";
  kids[1].role = path + " importer";
  kids[0].fd = rex[0];
  kids[1].fd = rim[0];
  const std::string importer_role = kids[1].role, exporter_role = kids[0].role;
  kids[0].pid = spawn(kids[0].role, {pair[0], rex[1]}, [&] {
    g_result_fd = rex[1];
    g_peer_fd = pair[0];
    g_peer = importer_role;
    if (is_ab_path(path))
      ab_exporter_main(ab_way(path));
    else if (legacy)
      legacy_exporter_main();
    else
      pool_exporter_main(t0);
  });
  const int fork_errno = errno;
  if (kids[0].pid > 0) {
    kids[1].pid = spawn(kids[1].role, {pair[1], rim[1]}, [&] {
      g_result_fd = rim[1];
      g_peer_fd = pair[1];
      g_peer = exporter_role;
      if (is_ab_path(path))
        ab_importer_main(ab_way(path));
      else if (legacy)
        legacy_importer_main();
      else
        pool_importer_main(way);
    });
  }
  const int fork_errno2 = errno;
  for (int fd : {pair[0], pair[1], rex[1], rim[1]}) ::close(fd);
  if (kids[0].pid < 0 || kids[1].pid < 0) {
    std::vector<Kid> started;
    for (Kid& k : kids)
      if (k.pid > 0) started.push_back(k);
    abort_kids(started);
    for (Kid& k : kids)
      if (k.pid <= 0 && k.fd >= 0) ::close(k.fd);
    fail_path(r, std::string("fork: ") + std::strerror(kids[0].pid < 0 ? fork_errno : fork_errno2));
    return r;
  }
  if (!collect(kids, kFrameReport, err)) {
    abort_kids(kids);
    fail_path(r, err);
    return r;
  }
  const bool ended = finish_kids(kids, err);
  take(r, kids[1].report);  // importer first: its totals and steps
  take(r, kids[0].report);
  add_messaging(r);
  r.wall_s = us(start, now_ns()) / 1e6;
  if (!ended)
    fail_path(r, err);
  else
    say_progress("path %s: done in %.1f s", path.c_str(), r.wall_s);
  return r;
}

struct ThroughputResult {
  int clients = 0;
  std::string mode = "warm";  // warm, cold, warm-no-write, write-only (the path's loop)
  std::string status = "ok";
  std::string note;
  std::uint64_t ops = 0;
  double window_s = 0;
  double ops_per_s = 0;
  std::uint64_t per_client_min = 0, per_client_max = 0;
  Stats latency;
};

ThroughputResult run_throughput(int clients, const std::string& path) {
  ThroughputResult t;
  t.clients = clients;
  t.mode = path == "throughput"            ? "warm"
           : path == "throughput-cold"     ? "cold"
           : path == "throughput-no-write" ? "warm-no-write"
                                           : "write-only";
  g_child_cache = path != "throughput-cold";
  g_child_loop = path == "throughput-no-write"     ? Loop::no_write
                 : path == "throughput-write-only" ? Loop::write_only
                                                   : Loop::round_trip;
  auto fail = [&](const std::string& why) {
    t.status = "failed";
    t.note = why;
    say_progress("throughput with %d client%s FAILED: %s", clients, clients == 1 ? "" : "s", why.c_str());
    return t;
  };
  say_progress("%s: %d client process%s, %s for %.1f s...", path.c_str(), clients, clients == 1 ? "" : "es",
               fmt_size(g_opt.throughput_size).c_str(), g_opt.seconds);
  int barrier[2];
  if (::pipe(barrier) != 0) return fail(std::string("pipe: ") + std::strerror(errno));
  std::vector<Kid> kids;
  kids.reserve(static_cast<std::size_t>(clients));
  for (int i = 0; i < clients; ++i) {
    int sv[2];
    std::string err;
    if (!make_socketpair(sv, err)) {
      abort_kids(kids);
      ::close(barrier[0]);
      ::close(barrier[1]);
      return fail(err + " (for client " + std::to_string(i + 1) + ")");
    }
    Kid k;
    k.role = "throughput client " + std::to_string(i + 1) + " of " + std::to_string(clients);
    k.fd = sv[0];
    const int barrier_read = barrier[0];
    k.pid = spawn(k.role, {sv[1], barrier_read}, [&, i, barrier_read] {
      g_result_fd = sv[1];
      throughput_main(i, clients, barrier_read);
    });
    const int fork_errno = errno;
    ::close(sv[1]);
    if (k.pid < 0) {
      ::close(sv[0]);
      abort_kids(kids);
      ::close(barrier[0]);
      ::close(barrier[1]);
      return fail(std::string("fork of client ") + std::to_string(i + 1) + ": " + std::strerror(fork_errno));
    }
    kids.push_back(std::move(k));
  }
  ::close(barrier[0]);
  std::string err;
  if (!collect(kids, kFrameReady, err)) {
    ::close(barrier[1]);
    abort_kids(kids);
    return fail(err);
  }
  // Every client is connected, warm and waiting: one byte each starts them together.
  const std::string go(static_cast<std::size_t>(clients), 'G');
  if (!write_exact(barrier[1], go.data(), go.size(), err)) {
    ::close(barrier[1]);
    abort_kids(kids);
    return fail("releasing the start barrier: " + err);
  }
  ::close(barrier[1]);
  if (!collect(kids, kFrameReport, err)) {
    abort_kids(kids);
    return fail(err);
  }
  const bool ended = finish_kids(kids, err);
  std::vector<double> all;
  std::int64_t first_start = std::numeric_limits<std::int64_t>::max(),
               last_end = std::numeric_limits<std::int64_t>::min();
  t.per_client_min = std::numeric_limits<std::uint64_t>::max();
  for (const Kid& k : kids) {
    const Series* s = k.report.find(g_opt.throughput_size, kTotal);
    std::int64_t a = 0, b = 0;
    if (!s || !k.report.integer("start_ns", a) || !k.report.integer("end_ns", b))
      return fail(kid_name(k) + " sent a report without its samples or its start and end");
    all.insert(all.end(), s->us.begin(), s->us.end());
    t.per_client_min = std::min<std::uint64_t>(t.per_client_min, s->us.size());
    t.per_client_max = std::max<std::uint64_t>(t.per_client_max, s->us.size());
    first_start = std::min(first_start, a);
    last_end = std::max(last_end, b);
  }
  t.ops = all.size();
  t.window_s = static_cast<double>(last_end - first_start) / 1e9;
  t.ops_per_s = t.window_s > 0 ? static_cast<double>(t.ops) / t.window_s : NAN;
  t.latency = stats_of(std::move(all));
  if (!ended) return fail(err);
  say_progress("throughput with %d client%s: done", clients, clients == 1 ? "" : "s");
  return t;
}

struct DeviceInfo {
  bool known = false;
  std::string name;
  std::int64_t count = 0, total = 0, driver = 0, pools = 0, handle_types = 0;
};

// 0: the device is there; 77: no driver or device (`why` says which); 1: the probe failed.
int run_probe(DeviceInfo& dev, std::string& why) {
  int sv[2];
  if (!make_socketpair(sv, why)) return 1;
  std::vector<Kid> kids(1);
  kids[0].role = "device probe";
  kids[0].pid = spawn(kids[0].role, {sv[1]}, [&] {
    g_result_fd = sv[1];
    probe_main();
  });
  const int fork_errno = errno;
  ::close(sv[1]);
  kids[0].fd = sv[0];
  if (kids[0].pid < 0) {
    close_kid_fds(kids);
    why = std::string("fork: ") + std::strerror(fork_errno);
    return 1;
  }
  if (!collect(kids, kFrameReport, why)) {
    abort_kids(kids);
    return 1;
  }
  const std::string how = reap(kids[0], 30000);
  close_kid_fds(kids);
  const Report& rep = kids[0].report;
  const std::string skip = rep.text("skip");
  if (!skip.empty()) {
    why = skip;
    return kExitSkip;
  }
  if (!(kids[0].status >= 0 && WIFEXITED(kids[0].status) && WEXITSTATUS(kids[0].status) == 0)) {
    why = "the device probe " + how;
    return 1;
  }
  dev.known = true;
  dev.name = rep.text("name");
  rep.integer("device_count", dev.count);
  rep.integer("total_bytes", dev.total);
  rep.integer("driver_api_version", dev.driver);
  rep.integer("memory_pools_supported", dev.pools);
  rep.integer("mempool_handle_types", dev.handle_types);
  return 0;
}

// ------------------------------------------------------------------------------------------------
// Output

std::string jstr(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"')
      out += "\\\"";
    else if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(u));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string jnum(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

std::string jint(std::int64_t v) { return std::to_string(v); }
std::string juint(std::uint64_t v) { return std::to_string(v); }
std::string jbool(bool v) { return v ? "true" : "false"; }

struct JObj {
  std::vector<std::string> items;
  JObj& add(const std::string& key, const std::string& raw) {
    items.push_back(jstr(key) + ": " + raw);
    return *this;
  }
  std::string str() const {
    std::string out = "{";
    for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
    return out + "}";
  }
};

std::string jarr(const std::vector<std::string>& raws, const char* indent = "\n    ") {
  if (raws.empty()) return "[]";
  std::string out = "[";
  for (std::size_t i = 0; i < raws.size(); ++i) out += (i ? "," : "") + std::string(indent) + raws[i];
  return out + "\n  ]";
}

std::string jstats(JObj o, const Stats& s) {
  o.add("n", juint(s.n))
      .add("median_us", jnum(s.median))
      .add("p99_us", jnum(s.p99))
      .add("min_us", jnum(s.min))
      .add("mean_us", jnum(s.mean))
      .add("max_us", jnum(s.max));
  return o.str();
}

std::string fratio(double v) {
  if (!std::isfinite(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", v);
  return buf;
}

std::string fus(double v) {
  if (!std::isfinite(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

const PathResult* find_path(const std::vector<PathResult>& results, const std::string& name) {
  for (const PathResult& r : results)
    if (r.path == name) return &r;
  return nullptr;
}

double median_of(const std::vector<PathResult>& results, const std::string& path, std::uint64_t size) {
  const PathResult* r = find_path(results, path);
  if (!r || r->status != "ok") return NAN;
  const Series* s = r->find(size, kTotal);
  return s ? stats_of(s->us).median : NAN;
}

struct Goal {
  std::uint64_t size = 0;
  double warm = NAN, holder = NAN, bare = NAN, legacy = NAN;
  double legacy_over_holder = NAN, legacy_over_warm = NAN;
};

std::vector<Goal> goals_of(const std::vector<PathResult>& results) {
  std::vector<Goal> out;
  for (std::uint64_t size : g_opt.sizes) {
    Goal g;
    g.size = size;
    g.warm = median_of(results, "holder-warm", size);
    g.holder = median_of(results, "holder", size);
    g.bare = median_of(results, "bare", size);
    g.legacy = median_of(results, "legacy", size);
    if (std::isfinite(g.holder) && std::isfinite(g.legacy) && g.holder > 0) g.legacy_over_holder = g.legacy / g.holder;
    if (std::isfinite(g.warm) && std::isfinite(g.legacy) && g.warm > 0) g.legacy_over_warm = g.legacy / g.warm;
    out.push_back(g);
  }
  return out;
}

const char* met(double ratio, bool at_most, double bound) {
  if (!std::isfinite(ratio)) return "n/a";
  return (at_most ? ratio <= bound : ratio >= bound) ? "met" : "NOT MET";
}

std::vector<const Series*> ordered_parts(const PathResult& r, std::uint64_t size) {
  std::vector<const Series*> parts;
  for (const Series& s : r.series)
    if (s.size == size && s.kind != kTotal) parts.push_back(&s);
  std::stable_sort(parts.begin(), parts.end(), [](const Series* a, const Series* b) { return a->order < b->order; });
  return parts;
}

// The A/B controls side by side: where each way of a cold round trip spends its time.
void print_ab_table(const std::vector<PathResult>& results) {
  auto median_of = [](const PathResult& r, std::uint64_t size, std::int32_t order, std::uint32_t kind) -> double {
    for (const Series& s : r.series)
      if (s.size == size && s.order == order && s.kind == kind) return stats_of(s.us).median;
    return NAN;
  };
  bool header = false;
  for (const PathResult& r : results) {
    if (!is_ab_path(r.path)) continue;
    if (!header)
      std::printf(
          "\n== A/B: a cold round trip through the driver alone (issue 26), medians in us ==\n"
          "%-16s %-9s %8s %8s %8s %8s %8s %9s %10s\n",
          "path", "size", "import", "wait", "1st use", "2nd use", "release", "importer", "round trip");
    header = true;
    if (r.status != "ok") {
      std::printf("%-16s %s: %s\n", r.path.c_str(), r.status.c_str(), r.note.c_str());
      continue;
    }
    for (std::uint64_t size : g_opt.sizes)
      std::printf("%-16s %-9s %8s %8s %8s %8s %8s %9s %10s\n", r.path.c_str(), fmt_size(size).c_str(),
                  fus(median_of(r, size, 20, kStep)).c_str(), fus(median_of(r, size, 21, kStep)).c_str(),
                  fus(median_of(r, size, 22, kStep)).c_str(), fus(median_of(r, size, 23, kStep)).c_str(),
                  fus(median_of(r, size, 24, kStep)).c_str(), fus(median_of(r, size, 100, kInfo)).c_str(),
                  fus(median_of(r, size, 0, kTotal)).c_str());
  }
  if (header)
    std::printf(
        "importer: its own work (import, wait, both uses, release); the round trip adds the exporter's steps and\n"
        "the messages. A wait on the stream returns at once: its cost shows in the first use.\n");
}

void print_text(const DeviceInfo& dev, const std::vector<PathResult>& results,
                const std::vector<ThroughputResult>& tput, const std::vector<std::string>& failures) {
  std::printf("\n== round trip: allocate -> first use in another process -> freed (microseconds) ==\n");
  std::printf("%-8s %-9s %6s %10s %10s %10s %10s %10s\n", "path", "size", "n", "median", "p99", "min", "mean", "max");
  for (const PathResult& r : results) {
    if (r.status != "ok") {
      std::printf("%-8s %s: %s\n", r.path.c_str(), r.status.c_str(), r.note.c_str());
      continue;
    }
    for (std::uint64_t size : g_opt.sizes) {
      const Series* s = r.find(size, kTotal);
      if (!s) continue;
      const Stats st = stats_of(s->us);
      std::printf("%-8s %-9s %6zu %10s %10s %10s %10s %10s\n", r.path.c_str(), fmt_size(size).c_str(), st.n,
                  fus(st.median).c_str(), fus(st.p99).c_str(), fus(st.min).c_str(), fus(st.mean).c_str(),
                  fus(st.max).c_str());
    }
  }
  bool any_one_off = false;
  for (const PathResult& r : results)
    for (const auto& [k, v] : r.scalars) {
      if (!any_one_off) std::printf("\none-off costs (not in the round trips):\n");
      any_one_off = true;
      std::printf("  %-8s %s: %s us\n", r.path.c_str(), k.c_str(), fus(v).c_str());
    }

  // Issue 12's goals, from this run's figures (medians).
  std::printf("\n== goals ==\n");
  std::printf("%-9s %12s %14s %12s %10s %14s %-8s\n", "size", "holder-warm", "<= 50 us", "holder", "legacy",
              "legacy/holder", ">= 2x");
  for (const Goal& g : goals_of(results))
    std::printf("%-9s %12s %14s %12s %10s %14s %-8s\n", fmt_size(g.size).c_str(), fus(g.warm).c_str(),
                std::isfinite(g.warm) ? (g.warm <= 50 ? "met" : "NOT MET") : "n/a", fus(g.holder).c_str(),
                fus(g.legacy).c_str(), fratio(g.legacy_over_holder).c_str(), met(g.legacy_over_holder, false, 2.0));
  for (const ThroughputResult& t : tput)
    if (t.mode == "warm" && t.clients == 64 && t.status == "ok")
      std::printf("throughput, 64 clients, warm: %.0f round trips/s (goal >= 20000: %s)\n", t.ops_per_s,
                  t.ops_per_s >= 20000 ? "met" : "NOT MET");
  for (const PathResult& r : results)
    if (r.path == "attach" && r.status == "ok" && !g_opt.sizes.empty())
      if (const Series* s = r.find(g_opt.sizes.front(), kTotal)) {
        const double p50 = stats_of(s->us).median;
        std::printf("first attach (CUDA started before): median %s us (goal <= 5000 us: %s)\n", fus(p50).c_str(),
                    p50 <= 5000 ? "met" : "NOT MET");
      }
  std::printf("n/a: a path did not run or failed\n");
  print_ab_table(results);

  std::printf(
      "\n== where the time goes: steps of one round trip (microseconds; the steps and the messaging add up "
      "to the round trip, so their means add up to the mean) ==\n");
  for (const PathResult& r : results) {
    if (r.status != "ok") continue;
    for (std::uint64_t size : g_opt.sizes) {
      const Series* total = r.find(size, kTotal);
      if (!total) continue;
      const Stats ts = stats_of(total->us);
      std::printf("\n%s, %s: %zu round trips, median %s, mean %s", r.path.c_str(), fmt_size(size).c_str(), ts.n,
                  fus(ts.median).c_str(), fus(ts.mean).c_str());
      for (const auto& [k, v] : r.integers)
        if (k == "exporter pool reserved bytes after " + fmt_size(size))
          std::printf("; exporter pool reserved afterwards: %s", fmt_size(static_cast<std::uint64_t>(v)).c_str());
      std::printf("\n  %-96s %9s %9s %9s %7s\n", "step", "median", "p99", "mean", "% mean");
      bool info_header = false;
      for (const Series* s : ordered_parts(r, size)) {
        const Stats st = stats_of(s->us);
        if (s->kind == kInfo && !info_header) {
          std::printf("  spans that overlap the steps (for reading, not for adding):\n");
          info_header = true;
        }
        const double share = ts.mean > 0 ? 100.0 * st.mean / ts.mean : NAN;
        std::printf("  %-96s %9s %9s %9s %7s\n", s->name.c_str(), fus(st.median).c_str(), fus(st.p99).c_str(),
                    fus(st.mean).c_str(), s->kind == kStep ? fus(share).c_str() : "");
      }
    }
  }
  // The biggest parts of the largest size, per path: the short answer to "where does it go".
  if (!g_opt.sizes.empty()) {
    const std::uint64_t largest = *std::max_element(g_opt.sizes.begin(), g_opt.sizes.end());
    bool header = false;
    for (const PathResult& r : results) {
      if (r.status != "ok" || r.path == "holder") continue;
      const Series* total = r.find(largest, kTotal);
      if (!total) continue;
      const double mean_total = stats_of(total->us).mean;
      std::vector<std::pair<double, std::string>> parts;
      for (const Series* s : ordered_parts(r, largest))
        if (s->kind == kStep) parts.emplace_back(stats_of(s->us).mean, s->name);
      std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      if (!header)
        std::printf("\nlargest parts at %s (mean us, share of the mean round trip):\n", fmt_size(largest).c_str());
      header = true;
      std::printf("  %s (round trip mean %s us):\n", r.path.c_str(), fus(mean_total).c_str());
      for (std::size_t i = 0; i < parts.size() && i < 3; ++i)
        std::printf("    %8s us %5s%%  %s\n", fus(parts[i].first).c_str(),
                    fus(mean_total > 0 ? 100.0 * parts[i].first / mean_total : NAN).c_str(), parts[i].second.c_str());
    }
  }

  if (!tput.empty()) {
    std::printf(
        "\n== throughput: client processes each in a loop for %.1f s, %s ==\n"
        "warm / cold: alloc -> 1-byte write -> release through the holder, the client's cache on / off;\n"
        "warm-no-write: alloc -> release (the holder and the library alone); write-only: the 1-byte write\n"
        "and its synchronize on a cuMemAlloc of the process's own (the GPU's part alone, no cupool)\n",
        g_opt.seconds, fmt_size(g_opt.throughput_size).c_str());
    std::printf("%-13s %7s %9s %9s %11s %10s %10s %10s %10s %17s\n", "loop", "clients", "ops", "window s", "ops/s",
                "p50 us", "p99 us", "min us", "max us", "ops per client");
    for (const ThroughputResult& t : tput) {
      if (t.status != "ok") {
        std::printf("%-13s %7d %s: %s\n", t.mode.c_str(), t.clients, t.status.c_str(), t.note.c_str());
        continue;
      }
      char per[64];
      std::snprintf(per, sizeof per, "%" PRIu64 "..%" PRIu64, t.per_client_min, t.per_client_max);
      std::printf("%-13s %7d %9" PRIu64 " %9.3f %11.0f %10s %10s %10s %10s %17s\n", t.mode.c_str(), t.clients, t.ops,
                  t.window_s, t.ops_per_s, fus(t.latency.median).c_str(), fus(t.latency.p99).c_str(),
                  fus(t.latency.min).c_str(), fus(t.latency.max).c_str(), per);
    }
    std::printf(
        "ops/s = all clients' round trips / (last client's end - first client's start); latencies pooled over "
        "all clients\n");
  }
  (void)dev;
  std::printf("\n");
  if (failures.empty())
    std::printf("RESULT: every selected path ran\n");
  else {
    std::printf("RESULT: %zu failure%s:\n", failures.size(), failures.size() == 1 ? "" : "s");
    for (const std::string& f : failures) std::printf("  - %s\n", f.c_str());
  }
  std::fflush(stdout);
}

bool write_json(const std::string& file, const std::string& date, const DeviceInfo& dev,
                const std::vector<PathResult>& results, const std::vector<ThroughputResult>& tput,
                const std::vector<std::string>& failures, const std::vector<std::string>& notes, int exit_status,
                std::string& err) {
  std::vector<std::string> top;
  top.push_back(jstr("tool") + ": " + jstr(kProgram));
  top.push_back(jstr("schema") + ": 1");
  top.push_back(jstr("date_utc") + ": " + jstr(date));
  top.push_back(jstr("units") + ": " + jstr("microseconds"));
  top.push_back(jstr("clock") + ": " + jstr("std::chrono::steady_clock (CLOCK_MONOTONIC)"));
  top.push_back(jstr("percentiles") + ": " + jstr("nearest rank on the sorted samples"));
  if (dev.known) {
    JObj d;
    d.add("ordinal", "0")
        .add("name", jstr(dev.name))
        .add("device_count", jint(dev.count))
        .add("total_bytes", jint(dev.total))
        .add("driver_api_version", jint(dev.driver))
        .add("headers_cuda_version", jint(CUDA_VERSION))
        .add("memory_pools_supported", jint(dev.pools))
        .add("mempool_handle_types", jint(dev.handle_types));
    top.push_back(jstr("device") + ": " + d.str());
  } else {
    top.push_back(jstr("device") + ": null");
  }
  {
    JObj c;
    std::vector<std::string> sizes, paths, clients;
    for (std::uint64_t s : g_opt.sizes)
      sizes.push_back(JObj()
                          .add("bytes", juint(s))
                          .add("text", jstr(fmt_size(s)))
                          .add("iterations", jint(iterations_for(s)))
                          .str());
    for (const std::string& p : g_opt.paths) paths.push_back(jstr(p));
    for (int n : g_opt.clients) clients.push_back(jint(n));
    auto inline_arr = [](const std::vector<std::string>& v) {
      std::string out = "[";
      for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
      return out + "]";
    };
    c.add("socket", g_opt.socket.empty() ? "null" : jstr(g_opt.socket))
        .add("pool", jstr(g_opt.pool))
        .add("sizes", inline_arr(sizes))
        .add("warmup", jint(g_opt.warmup))
        .add("paths", inline_arr(paths))
        .add("clients", inline_arr(clients))
        .add("seconds", jnum(g_opt.seconds))
        .add("throughput_size", juint(g_opt.throughput_size))
        .add("timeout_s", jint(g_opt.timeout_s))
        .add("allow_simulated", jbool(g_opt.allow_simulated));
    top.push_back(jstr("config") + ": " + c.str());
  }
  std::vector<std::string> latency, steps, one_off, values, path_status;
  for (const PathResult& r : results) {
    JObj ps;
    ps.add("path", jstr(r.path)).add("status", jstr(r.status)).add("note", jstr(r.note)).add("wall_s", jnum(r.wall_s));
    for (const auto& [k, v] : r.texts) ps.add(k, jstr(v));
    path_status.push_back(ps.str());
    for (const auto& [k, v] : r.scalars)
      one_off.push_back(JObj().add("path", jstr(r.path)).add("what", jstr(k)).add("us", jnum(v)).str());
    for (const auto& [k, v] : r.integers)
      values.push_back(JObj().add("path", jstr(r.path)).add("name", jstr(k)).add("value", jint(v)).str());
    if (r.status != "ok") continue;
    for (std::uint64_t size : g_opt.sizes) {
      const Series* total = r.find(size, kTotal);
      if (!total) continue;
      const Stats ts = stats_of(total->us);
      latency.push_back(
          jstats(JObj().add("path", jstr(r.path)).add("size", juint(size)).add("size_text", jstr(fmt_size(size))), ts));
      for (const Series* s : ordered_parts(r, size)) {
        const Stats st = stats_of(s->us);
        JObj o;
        o.add("path", jstr(r.path))
            .add("size", juint(size))
            .add("size_text", jstr(fmt_size(size)))
            .add("step", jstr(s->name))
            .add("kind", jstr(s->kind == kStep ? "step" : "span"))
            .add("share_of_mean_round_trip",
                 s->kind == kStep && ts.mean > 0 ? jnum(st.mean / ts.mean) : std::string("null"));
        steps.push_back(jstats(o, st));
      }
    }
  }
  top.push_back(jstr("paths") + ": " + jarr(path_status));
  top.push_back(jstr("latency") + ": " + jarr(latency));
  top.push_back(jstr("steps") + ": " + jarr(steps));
  top.push_back(jstr("one_off") + ": " + jarr(one_off));
  top.push_back(jstr("values") + ": " + jarr(values));
  std::vector<std::string> goals;
  for (const Goal& g : goals_of(results)) {
    JObj o;
    o.add("size", juint(g.size))
        .add("size_text", jstr(fmt_size(g.size)))
        .add("warm_median_us", jnum(g.warm))
        .add("warm_p50_at_most_50_us", std::isfinite(g.warm) ? jbool(g.warm <= 50) : std::string("null"))
        .add("legacy_over_warm", jnum(g.legacy_over_warm))
        .add("cold_median_us", jnum(g.holder))
        .add("bare_median_us", jnum(g.bare))
        .add("legacy_median_us", jnum(g.legacy))
        .add("legacy_over_cold", jnum(g.legacy_over_holder))
        .add("cold_2x_faster_than_legacy",
             std::isfinite(g.legacy_over_holder) ? jbool(g.legacy_over_holder >= 2.0) : std::string("null"));
    goals.push_back(o.str());
  }
  top.push_back(jstr("goals") + ": " + jarr(goals));
  std::vector<std::string> tp;
  for (const ThroughputResult& t : tput) {
    JObj o;
    o.add("clients", jint(t.clients))
        .add("mode", jstr(t.mode))
        .add("status", jstr(t.status))
        .add("note", jstr(t.note))
        .add("size", juint(g_opt.throughput_size))
        .add("seconds_per_client", jnum(g_opt.seconds))
        .add("ops", juint(t.ops))
        .add("window_s", jnum(t.window_s))
        .add("ops_per_s", jnum(t.ops_per_s))
        .add("ops_per_client_min", juint(t.status == "ok" ? t.per_client_min : 0))
        .add("ops_per_client_max", juint(t.per_client_max));
    tp.push_back(jstats(o, t.latency));
  }
  top.push_back(jstr("throughput") + ": " + jarr(tp));
  std::vector<std::string> f, n;
  for (const std::string& s : failures) f.push_back(jstr(s));
  for (const std::string& s : notes) n.push_back(jstr(s));
  top.push_back(jstr("failures") + ": " + jarr(f));
  top.push_back(jstr("notes") + ": " + jarr(n));
  top.push_back(jstr("exit_status") + ": " + jint(exit_status));
  std::string text = "{";
  for (std::size_t i = 0; i < top.size(); ++i) text += (i ? ",\n  " : "\n  ") + top[i];
  text += "\n}\n";

  std::FILE* out = std::fopen(file.c_str(), "w");
  if (!out) {
    err = "cannot open " + file + " for writing: " + std::strerror(errno);
    return false;
  }
  const bool ok = std::fwrite(text.data(), 1, text.size(), out) == text.size();
  const bool closed = std::fclose(out) == 0;
  if (!ok || !closed) {
    err = "writing " + file + " failed: " + std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  g_orchestrator_pid = ::getpid();
  bool help = false;
  const std::string bad = parse_args(argc, argv, help);
  if (help) {
    usage(stdout);
    return 0;
  }
  if (!bad.empty()) {
    std::fprintf(stderr, "%s: %s\n(see %s --help)\n", kProgram, bad.c_str(), kProgram);
    return 2;
  }
  if (!g_opt.json.empty()) {
    // Fail now, not after the run, when the JSON file can't be written.
    std::FILE* f = std::fopen(g_opt.json.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "%s: --json: cannot open %s for writing: %s\n", kProgram, g_opt.json.c_str(),
                   std::strerror(errno));
      return 2;
    }
    std::fclose(f);
  }

  const std::string date = utc_now();
  std::printf("%s: allocate -> usable in another process -> freed, on device 0\n", kProgram);
  std::printf("date (UTC): %s\n", date.c_str());

  std::vector<std::string> failures, notes;
  DeviceInfo dev;
  std::string why;
  const int probe = run_probe(dev, why);
  const bool needs_driver_here = path_selected("bare") || path_selected("bare-t0") || path_selected("bare-stream") ||
                                 path_selected("bare-free") || path_selected("bare-touch") || path_selected("legacy") ||
                                 path_selected("throughput-write-only") ||
                                 std::any_of(g_opt.paths.begin(), g_opt.paths.end(), is_ab_path);
  if (probe == kExitSkip) {
    if (g_opt.allow_simulated && !needs_driver_here) {
      notes.push_back("no GPU here (" + why + "); --allow-simulated: only the holder-side paths run");
    } else {
      std::printf("%s: skipped (exit 77): %s\n", kProgram, why.c_str());
      std::fflush(stdout);
      return kExitSkip;
    }
  } else if (probe != 0) {
    std::fprintf(stderr, "%s: the device probe failed: %s\n", kProgram, why.c_str());
    return 1;
  }
  if (dev.known) {
    std::printf("device 0: %s, %.1f GiB; %" PRId64 " device(s) visible; driver API %" PRId64 "; cuda.h %d\n",
                dev.name.c_str(), static_cast<double>(dev.total) / static_cast<double>(kGiB), dev.count, dev.driver,
                CUDA_VERSION);
    if (!dev.pools)
      notes.push_back("device 0 reports no memory-pool support: the bare paths will fail");
    else if (!(dev.handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
      notes.push_back("device 0's pools have no posix_fd handle type: the bare paths will fail");
  }
  std::printf("holder: %s, pool %s\n",
              g_opt.socket.empty() ? "(no --socket: holder and throughput paths skipped)" : g_opt.socket.c_str(),
              g_opt.pool.c_str());
  std::printf("sizes: %s (timed round trips each, after %d warm-up round trips that are verified by reading back)\n",
              sizes_text().c_str(), g_opt.warmup);
  std::printf("times: microseconds, std::chrono::steady_clock; median and p99 by nearest rank\n");
  std::printf(
      "paths: holder = cupool_alloc -> cupool_write(1 byte) -> cupool_release against the holder;\n"
      "       bare = driver only: exporter process with a pool (release threshold max) allocates, records an\n"
      "              IPC event and exports the pointer; importer process imports it, waits for the event,\n"
      "              writes 1 byte, unmaps; then the exporter frees;\n"
      "       bare-t0 = bare with the exporter's threshold at 0 and a cuStreamSynchronize after its free\n"
      "              (without a synchronize in the owning process a threshold never releases anything);\n"
      "       bare-stream, bare-free = bare with the importer's first use on its own stream, or its\n"
      "              release by cuMemFree; bare-touch = bare-free with the first use made four ways in\n"
      "              turn; attach = 10 processes that started CUDA connect, allocate and write once\n"
      "              (these four run only when named);\n"
      "       legacy = cuMemAlloc + cuIpcGetMemHandle / cuIpcOpenMemHandle, 1-byte write, cuIpcCloseMemHandle\n"
      "              / cuMemFree.\n\n");
  for (const std::string& n : notes) std::printf("note: %s\n", n.c_str());
  std::fflush(stdout);

  std::vector<PathResult> results;
  std::vector<ThroughputResult> tput;
  for (const std::string& path : g_opt.paths) {
    if (path.rfind("throughput", 0) == 0) {
      if (g_opt.socket.empty()) {
        const std::string n = "throughput skipped: no --socket given (it needs a running 'cupool hold')";
        notes.push_back(n);
        say_progress("%s", n.c_str());
        continue;
      }
      for (int clients : g_opt.clients) {
        tput.push_back(run_throughput(clients, path));
        if (tput.back().status != "ok")
          failures.push_back(path + " with " + std::to_string(clients) + " clients: " + tput.back().note);
      }
      continue;
    }
    PathResult r = path == "holder"        ? run_holder_path(false)
                   : path == "holder-warm" ? run_holder_path(true)
                   : path == "attach"      ? run_attach_path()
                                           : run_pair_path(path);
    if (r.status == "failed") failures.push_back("path " + r.path + ": " + r.note);
    if (r.status == "skipped") notes.push_back("path " + r.path + " skipped: " + r.note);
    if (r.status == "ok" && !r.note.empty()) notes.push_back("path " + r.path + ": " + r.note);
    results.push_back(std::move(r));
  }

  print_text(dev, results, tput, failures);
  const int exit_status = failures.empty() ? 0 : 1;
  if (!g_opt.json.empty()) {
    std::string err;
    if (!write_json(g_opt.json, date, dev, results, tput, failures, notes, exit_status, err)) {
      std::fprintf(stderr, "%s: %s\n", kProgram, err.c_str());
      return 1;
    }
    std::printf("JSON: %s\n", g_opt.json.c_str());
  }
  return exit_status;
}
