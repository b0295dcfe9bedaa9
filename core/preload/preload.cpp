// libcupool-preload.so: what `cupool exec CONFIG -- CMD` puts into CMD with LD_PRELOAD. It applies
// the config's process: section through cupool_configure before the application's first
// allocation; with --report it writes the process's pool figures (cupool_stats) when the
// application exits (before the CUDA runtime's own exit handler tears the pools down). It never
// aborts the application unless --strict asked it to.
//
// When: by default right after the application's own first successful cuInit, not before main.
// Initialising the driver in a process that later forks makes CUDA unusable in the children
// (measured on an H100: cuInit in a forked child then fails with CUDA_ERROR_NOT_INITIALIZED), and
// many programs fork worker processes before they touch the GPU. Every allocation needs cuInit
// first, so applying right after it is still before the first allocation.
//
// How cuInit is seen: the CUDA runtime, Python's ctypes and other loaders reach the driver with
// dlopen("libcuda.so.1") and dlsym (the runtime asks dlsym for cuGetProcAddress and gets cuInit
// through it). This library defines dlsym: for a real library handle it calls the C library's
// dlsym and hands out its own cuInit (and cuGetProcAddress, which hands out its own cuInit) in
// place of the driver's; RTLD_DEFAULT and RTLD_NEXT lookups jump straight to the C library's dlsym
// (an assembly trampoline, so the caller the C library sees is the real one and RTLD_NEXT keeps its
// meaning). It also defines cuInit itself, for programs linked against libcuda. The trampoline
// is written for x86-64; elsewhere the section is applied before main, as with CUPOOL_EXEC_AT=start.
// A process that initialised the driver without these hooks seeing it is named on stderr at exit.
//
// Environment (set by `cupool exec`):
//   CUPOOL_EXEC_CONFIG   the config file (nothing happens without it)
//   CUPOOL_EXEC_AT       "cuinit" (default): after the first successful cuInit; "start": before main
//   CUPOOL_EXEC_STRICT   "1": a failure to apply ends the process (exit 3)
//   CUPOOL_EXEC_REPORT   "-": the figures go to stderr at exit; else a file they are appended
//                        to, one JSON object per line and process
//   CUPOOL_EXEC_QUIET    "1": no line on stderr when the section was applied
//   CUPOOL_EXEC_DEBUG    "1": say on stderr which of the driver's entry points were handed out
//   CUPOOL_EXEC_BUDGET   "UUID=BYTES[,UUID=BYTES...]": per-device memory budgets enforced inside the
//                        process, with or without CUPOOL_EXEC_CONFIG (budget.h, budget_hooks.cpp);
//                        unset or empty: nothing about the process changes
//   CUPOOL_EXEC_GRANT    the holder's grant of that budget: claimed by the first process of the
//                        command that asks the driver about a device; its use is reported
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cupool/client.h"
#include "preload/budget.h"

#define CUPOOL_HIDDEN __attribute__((visibility("hidden")))

namespace {

// cupool_configure's report ({"devices": [...], "changes": [{process_device, field, from, to, ...}], ...}) in
// words for the line exec prints: "device 0: release_threshold 0B -> 75%, ...", or that nothing
// needed changing. The report as it is when it can't be read.
std::string in_words(const char* report) {
  try {
    const nlohmann::json j = nlohmann::json::parse(report);
    auto text = [](const nlohmann::json& v) {
      return v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    };
    std::string devices;
    for (const auto& d : j.at("devices")) devices += (devices.empty() ? "" : ", ") + text(d);
    std::string out;
    long last = -1;
    for (const auto& c : j.at("changes")) {
      const long device = c.at("process_device").get<long>();
      out += device != last ? std::string(out.empty() ? "" : "; ") + "device " + std::to_string(device) + ": " : ", ";
      out += text(c.at("field")) + " " + text(c.at("from")) + " -> " + text(c.at("to"));
      last = device;
    }
    if (out.empty())
      out = "nothing to change (device" + std::string(j.at("devices").size() == 1 ? " " : "s ") + devices +
            " already as the file says)";
    return out;
  } catch (const std::exception&) {
    return report ? report : "";
  }
}

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

// `text` as a JSON string literal, as dump_json writes strings: escaped, and bytes that are not
// UTF-8 as U+FFFD (a path may hold any byte but "/" and NUL).
std::string json_string(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The executable as a JSON value: null where /proc/self/exe can't be read.
std::string program_json() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "null";
  buf[n] = '\0';
  return json_string(buf);
}

void debug(const char* what) {
  if (env_is("CUPOOL_EXEC_DEBUG", "1"))
    std::fprintf(stderr, "cupool exec: [pid %d] %s\n", static_cast<int>(::getpid()), what);
}

std::atomic<bool> g_reported{false};

void write_report() {
  const char* target = std::getenv("CUPOOL_EXEC_REPORT");
  if (!target || !*target) return;
  if (g_reported.exchange(true)) return;
  char* stats = nullptr;
  const int rc = cupool_stats(&stats);
  // One JSON object a line, described by schemas/cupool-exec-report-v1.schema.json.
  std::string line =
      "{\"schema_version\": 1, \"pid\": " + std::to_string(::getpid()) + ", \"program\": " + program_json() + ", ";
  if (rc == CUPOOL_OK) {
    line += "\"stats\": " + std::string(stats) + "}\n";
  } else {
    // The one error object (docs/naming.md): the status in snake_case (CUPOOL_E_CUDA: cuda), the message.
    std::string code = cupool_status_name(rc);
    if (code.rfind("CUPOOL_E_", 0) == 0) code = code.substr(9);
    for (char& c : code) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    line += "\"error\": {\"code\": " + json_string(code) + ", \"message\": " + json_string(cupool_last_error(nullptr)) +
            "}}\n";
  }
  cupool_free_string(stats);
  if (std::strcmp(target, "-") == 0) {
    std::fputs(line.c_str(), stderr);
    return;
  }
  // The file may sit in a directory others can write (issue 22): a link there is not followed
  // (root would append to whatever it names), a FIFO does not hold the process at exit, nothing
  // but a regular file is written, and a new one is the user's alone (0600).
  const int fd = ::open(target, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0600);
  if (fd < 0) {
    std::fprintf(stderr, "cupool exec: can't write the report to %s: %s%s\n", target, std::strerror(errno),
                 errno == ELOOP ? " (it is a symbolic link, which is not followed)" : "");
    return;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    std::fprintf(stderr, "cupool exec: can't write the report to %s: not a regular file\n", target);
    ::close(fd);
    return;
  }
  // One write a line (O_APPEND): lines of processes that exit at once do not interleave.
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::fprintf(stderr, "cupool exec: writing the report to %s failed: %s\n", target, std::strerror(errno));
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

// Set while this library itself is inside cupool_configure or cupool_stats: its own lookups of the
// driver get the driver's entry points, and its own cuInit applies nothing.
thread_local bool t_inside = false;

struct Inside {
  Inside() { t_inside = true; }
  ~Inside() { t_inside = false; }
  Inside(const Inside&) = delete;
  Inside& operator=(const Inside&) = delete;
};

void apply_section() {
  const char* config = std::getenv("CUPOOL_EXEC_CONFIG");
  if (!config || !*config) return;
  Inside inside;
  char* report = nullptr;
  const int rc = cupool_configure(config, &report);
  if (rc != CUPOOL_OK) {
    std::fprintf(stderr, "cupool exec: %s was not applied to pid %d (%s): %s\n", config, static_cast<int>(::getpid()),
                 cupool_status_name(rc), cupool_last_error(nullptr));
    if (env_is("CUPOOL_EXEC_STRICT", "1")) {
      std::fprintf(stderr, "cupool exec: --strict: stopping pid %d\n", static_cast<int>(::getpid()));
      std::_Exit(3);
    }
  } else if (!env_is("CUPOOL_EXEC_QUIET", "1")) {
    std::fprintf(stderr, "cupool exec: applied %s to pid %d: %s\n", config, static_cast<int>(::getpid()),
                 in_words(report).c_str());
  }
  cupool_free_string(report);
  if (!std::getenv("CUPOOL_EXEC_REPORT")) return;
  // The CUDA runtime tears its contexts down in an exit handler it registers when it starts; exit
  // handlers run in reverse order, so the report must be registered after the runtime's to see the
  // pools. A watcher registers it once a context appears (10 times a second until then); the
  // handler registered here covers programs that never make one.
  std::atexit(write_report);
  std::thread([] {
    Inside inside_watcher;
    while (true) {
      char* stats = nullptr;
      const bool active =
          cupool_stats(&stats) == CUPOOL_OK && stats && std::strstr(stats, "\"process_device\":") != nullptr;
      cupool_free_string(stats);
      if (active) {
        std::atexit(write_report);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }).detach();
}

// ---- the hooks ----

using CuInitFn = int (*)(unsigned int);
using GetProcV1Fn = int (*)(const char*, void**, int, std::uint64_t);
using GetProcV2Fn = int (*)(const char*, void**, int, std::uint64_t, void*);

std::atomic<CuInitFn> g_driver_cuinit{nullptr};
std::atomic<void*> g_driver_handle{nullptr};  // the library cuGetProcAddress came from
std::atomic<GetProcV1Fn> g_driver_getproc_v1{nullptr};
std::atomic<GetProcV2Fn> g_driver_getproc_v2{nullptr};
#if defined(__x86_64__)
constexpr bool kHooksBuilt = true;
#else
constexpr bool kHooksBuilt = false;
#endif

// Whether the section is applied at the first cuInit: CUPOOL_EXEC_CONFIG set, CUPOOL_EXEC_AT not
// "start", and the hooks built for this architecture. Decided on first use, not in this library's
// constructor: another library's constructor may call cuInit before that runs.
bool hooks_on() {
  static const bool on = [] {
    const char* config = std::getenv("CUPOOL_EXEC_CONFIG");
    return kHooksBuilt && config && *config && !env_is("CUPOOL_EXEC_AT", "start");
  }();
  return on;
}
std::mutex g_apply_mutex;
bool g_applied = false;  // copied into a forked child as it was: a child of a parent that applied
                         // (and so used CUDA) can't use CUDA anyway

std::atomic<bool> g_saw_cuinit{false};  // a cuInit of the application's went through the hooks

int after_cuinit(int result) {
  if (!t_inside) g_saw_cuinit.store(true);
  if (result != 0 || t_inside || !hooks_on()) return result;
  std::lock_guard<std::mutex> lock(g_apply_mutex);
  if (!g_applied) {
    g_applied = true;
    debug("the application's first cuInit succeeded: applying the section");
    apply_section();
  }
  return result;
}

extern "C" int cuInit(unsigned int flags);  // this library's own (x86-64), below

// The C library's dlsym (resolved on first use; defined below, declared here for swap_entry).
void* real_dlsym(void* handle, const char* name);

extern "C" int cupool_hook_cuinit(unsigned int flags) {
  CuInitFn driver = g_driver_cuinit.load();
  if (!driver) return 3;  // CUDA_ERROR_NOT_INITIALIZED: no driver entry point was ever handed out
  return after_cuinit(driver(flags));
}

// `driver` is what the driver library answered for `symbol`; `handle` the library's dlopen handle
// (null when unknown). A library whose cuInit is preemptible answers with the cuInit its GOT found
// first, which can be this library's own: then the driver's is asked of the library itself.
void* swap_entry(const char* symbol, void* driver, void* handle) {
  if (!driver || !symbol || t_inside || !hooks_on()) return driver;
  if (std::strcmp(symbol, "cuInit") != 0) return driver;
#if defined(__x86_64__)
  if (driver == reinterpret_cast<void*>(&cuInit) || driver == reinterpret_cast<void*>(&cupool_hook_cuinit)) {
    driver = handle ? real_dlsym(handle, "cuInit") : nullptr;
    if (!driver || driver == reinterpret_cast<void*>(&cuInit)) return reinterpret_cast<void*>(&cupool_hook_cuinit);
  }
#endif
  g_driver_cuinit.store(reinterpret_cast<CuInitFn>(driver));
  return reinterpret_cast<void*>(&cupool_hook_cuinit);
}

extern "C" int cupool_hook_getproc_v1(const char* symbol, void** pfn, int version, std::uint64_t flags);
extern "C" int cupool_hook_getproc_v2(const char* symbol, void** pfn, int version, std::uint64_t flags, void* status);

// Whether the hooks hand out anything: the section is applied at cuInit, or a budget is in force.
bool hooking() { return hooks_on() || cupool::preload::budget() != nullptr; }

// What cuGetProcAddress answered: cuInit is swapped, and cuGetProcAddress itself too (asked for
// at CUDA 12.0 or later it is the _v2 entry point), so lookups through it are seen as well; under
// a budget, the entry points it wraps (budget_hooks.cpp).
void* swap_getproc_answer(const char* symbol, void* driver, int version) {
  if (!driver || !symbol || t_inside || !hooking()) return driver;
  if (std::strcmp(symbol, "cuGetProcAddress") != 0) {
    if (cupool::preload::budget()) driver = cupool::preload::budget_getproc_entry(g_driver_handle.load(), driver);
    return swap_entry(symbol, driver, g_driver_handle.load());
  }
  if (version >= 12000) {
    g_driver_getproc_v2.store(reinterpret_cast<GetProcV2Fn>(driver));
    return reinterpret_cast<void*>(&cupool_hook_getproc_v2);
  }
  g_driver_getproc_v1.store(reinterpret_cast<GetProcV1Fn>(driver));
  return reinterpret_cast<void*>(&cupool_hook_getproc_v1);
}

extern "C" int cupool_hook_getproc_v1(const char* symbol, void** pfn, int version, std::uint64_t flags) {
  const int rc = g_driver_getproc_v1.load()(symbol, pfn, version, flags);
  if (rc == 0 && pfn) *pfn = swap_getproc_answer(symbol, *pfn, version);
  return rc;
}

extern "C" int cupool_hook_getproc_v2(const char* symbol, void** pfn, int version, std::uint64_t flags, void* status) {
  const int rc = g_driver_getproc_v2.load()(symbol, pfn, version, flags, status);
  if (rc == 0 && pfn) *pfn = swap_getproc_answer(symbol, *pfn, version);
  return rc;
}

}  // namespace

// The C library's dlsym, found on first use (a library's constructor may call dlsym before ours).
extern "C" {
CUPOOL_HIDDEN void* cupool_real_dlsym = nullptr;
}

extern "C" CUPOOL_HIDDEN void* cupool_resolve_dlsym() {
  if (!cupool_real_dlsym) {
    // dlvsym is not interposed; RTLD_NEXT from here is the C library.
    for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5"})
      if (void* f = ::dlvsym(RTLD_NEXT, "dlsym", version)) {
        cupool_real_dlsym = f;
        break;
      }
  }
  return cupool_real_dlsym;
}

namespace {
void* real_dlsym(void* handle, const char* name) {
  using DlsymFn = void* (*)(void*, const char*);
  auto f = reinterpret_cast<DlsymFn>(cupool_resolve_dlsym());
  return f ? f(handle, name) : nullptr;
}
}  // namespace

// dlsym for a real library handle (the trampoline below sends RTLD_DEFAULT and RTLD_NEXT past it).
extern "C" CUPOOL_HIDDEN void* cupool_dlsym_hook(void* handle, const char* name) {
  void* f = real_dlsym(handle, name);
  if (!f || !name || t_inside || !hooking()) return f;
  if (std::strcmp(name, "cuGetProcAddress_v2") == 0) {
    g_driver_handle.store(handle);
    g_driver_getproc_v2.store(reinterpret_cast<GetProcV2Fn>(f));
    debug("dlsym handed out cuGetProcAddress_v2");
    return reinterpret_cast<void*>(&cupool_hook_getproc_v2);
  }
  if (std::strcmp(name, "cuGetProcAddress") == 0) {
    g_driver_handle.store(handle);
    g_driver_getproc_v1.store(reinterpret_cast<GetProcV1Fn>(f));
    debug("dlsym handed out cuGetProcAddress");
    return reinterpret_cast<void*>(&cupool_hook_getproc_v1);
  }
  if (cupool::preload::budget()) f = cupool::preload::budget_dlsym_entry(handle, name, f);
  if (std::strcmp(name, "cuInit") == 0) debug("dlsym handed out cuInit");
  return swap_entry(name, f, handle);
}

#if defined(__x86_64__)
// void* dlsym(void* handle, const char* name): resolve the C library's dlsym once; RTLD_DEFAULT
// (0) and RTLD_NEXT (-1) tail-jump to it with the caller's return address untouched; any other
// handle goes to cupool_dlsym_hook.
__asm__(R"(
    .text
    .globl dlsym
    .type dlsym, @function
dlsym:
    .cfi_startproc
    movq cupool_real_dlsym(%rip), %rax
    testq %rax, %rax
    jnz 1f
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    subq $8, %rsp
    .cfi_adjust_cfa_offset 8
    call cupool_resolve_dlsym
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    testq %rax, %rax
    jz 3f
1:
    testq %rdi, %rdi
    jz 2f
    cmpq $-1, %rdi
    je 2f
    jmp cupool_dlsym_hook
2:
    jmp *%rax
3:
    ret
    .cfi_endproc
    .size dlsym, .-dlsym
)");

// Programs linked against libcuda call cuInit through their PLT, which finds this one first; so
// may a driver library whose own references go through its GOT (cuGetProcAddress answering
// cuInit), loaded with RTLD_LOCAL where RTLD_NEXT doesn't see it: then it is asked by its soname.
extern "C" __attribute__((visibility("default"))) int cuInit(unsigned int flags) {
  CuInitFn driver = g_driver_cuinit.load();
  if (!driver) {
    Inside inside;  // the lookups below must get the driver's cuInit, not this one
    driver = reinterpret_cast<CuInitFn>(::dlsym(RTLD_NEXT, "cuInit"));
    if (!driver) {
      void* loaded = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);  // kept open, as the pointer is
      void* f = loaded ? real_dlsym(loaded, "cuInit") : nullptr;
      const CuInitFn self = &cuInit;
      if (f != reinterpret_cast<void*>(self)) driver = reinterpret_cast<CuInitFn>(f);
    }
    if (!driver) return 3;  // no driver library is loaded: CUDA_ERROR_NOT_INITIALIZED
    g_driver_cuinit.store(driver);
  }
  return after_cuinit(driver(flags));
}
#endif

namespace {

// At exit, in --at cuinit mode: a process whose driver was initialised without this library seeing
// the cuInit (a library that reaches the driver in another way, e.g. loaded with RTLD_DEEPBIND) got
// nothing applied; say so rather than let it pass unnoticed. The driver answers cuDeviceGetCount
// with CUDA_ERROR_NOT_INITIALIZED (3) until this process's cuInit, so asking initialises nothing;
// by the time this runs the driver may have shut down already (its own exit handler runs first)
// and answer CUDA_ERROR_DEINITIALIZED: any answer but 3 means it was initialised.
void warn_if_missed() {
  {
    std::lock_guard<std::mutex> lock(g_apply_mutex);
    if (g_applied || g_saw_cuinit.load()) return;
  }
  Inside inside;
  void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!driver) return;  // this process never loaded the driver
  using CountFn = int (*)(int*);
  auto count = reinterpret_cast<CountFn>(real_dlsym(driver, "cuDeviceGetCount"));
  int devices = 0;
  const bool missed = count && count(&devices) != 3;
  if (missed)
    std::fprintf(stderr,
                 "cupool exec: pid %d initialised the CUDA driver without cupool seeing its cuInit: the process: "
                 "section was not applied to it (run it with --at start)\n",
                 static_cast<int>(::getpid()));
  ::dlclose(driver);
  // --strict: a process that used CUDA with nothing applied fails (issue 22), as one whose
  // section failed to apply does. Its own output is flushed first; exit handlers registered
  // before this one (the application's earliest) do not run.
  if (missed && env_is("CUPOOL_EXEC_STRICT", "1")) {
    std::fprintf(stderr, "cupool exec: --strict: pid %d exits 3\n", static_cast<int>(::getpid()));
    std::fflush(nullptr);
    std::_Exit(3);
  }
}

__attribute__((constructor)) void cupool_exec_start() {
  const char* config = std::getenv("CUPOOL_EXEC_CONFIG");
  if (!config || !*config) return;
  if (hooks_on()) {  // applied at the application's first cuInit
    std::atexit(warn_if_missed);
    return;
  }
  if (!kHooksBuilt && !env_is("CUPOOL_EXEC_AT", "start") && !env_is("CUPOOL_EXEC_QUIET", "1"))
    std::fprintf(stderr, "cupool exec: this build can't wait for cuInit on this architecture: applying before main\n");
  std::lock_guard<std::mutex> lock(g_apply_mutex);
  g_applied = true;
  apply_section();
}

}  // namespace
