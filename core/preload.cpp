// libcupool-preload.so: what `cupool exec CONFIG -- CMD` puts into CMD with LD_PRELOAD. Before the
// application's main (so before its first allocation) it applies the config's process: section
// through cupool_configure; with --report it writes the process's pool figures (cupool_stats) when
// the application exits (before the CUDA runtime's own exit handler tears the pools down). It never aborts the application unless --strict asked it to.
//
// Environment (set by `cupool exec`):
//   CUPOOL_EXEC_CONFIG   the config file (nothing happens without it)
//   CUPOOL_EXEC_STRICT   "1": a failure to apply ends the process (exit 3) before main runs
//   CUPOOL_EXEC_REPORT   "-": the figures go to stderr at exit; else a file they are appended
//                        to, one JSON object per line and process
//   CUPOOL_EXEC_QUIET    "1": no line on stderr when the section was applied
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "cupool/client.h"

namespace {

std::string program_name() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "?";
  buf[n] = '\0';
  return buf;
}

std::atomic<bool> g_reported{false};

void write_report() {
  const char* target = std::getenv("CUPOOL_EXEC_REPORT");
  if (!target || !*target) return;
  if (g_reported.exchange(true)) return;
  char* stats = nullptr;
  const int rc = cupool_stats(&stats);
  std::string line = "{\"pid\": " + std::to_string(::getpid()) + ", \"program\": \"" + program_name() + "\", ";
  if (rc == CUPOOL_OK) {
    line += "\"stats\": " + std::string(stats) + "}\n";
  } else {
    std::string message = cupool_last_error(nullptr);
    for (char& c : message)
      if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = ' ';
    line += "\"error\": \"" + message + "\"}\n";
  }
  cupool_free_string(stats);
  if (std::strcmp(target, "-") == 0) {
    std::fputs(line.c_str(), stderr);
    return;
  }
  if (FILE* f = std::fopen(target, "a")) {
    std::fputs(line.c_str(), f);
    std::fclose(f);
  } else {
    std::fprintf(stderr, "cupool exec: can't write the report to %s\n", target);
  }
}

__attribute__((constructor)) void cupool_exec_apply() {
  const char* config = std::getenv("CUPOOL_EXEC_CONFIG");
  if (!config || !*config) return;
  const bool strict = std::getenv("CUPOOL_EXEC_STRICT") && std::strcmp(std::getenv("CUPOOL_EXEC_STRICT"), "1") == 0;
  const bool quiet = std::getenv("CUPOOL_EXEC_QUIET") && std::strcmp(std::getenv("CUPOOL_EXEC_QUIET"), "1") == 0;
  char* report = nullptr;
  const int rc = cupool_configure(config, &report);
  if (rc != CUPOOL_OK) {
    std::fprintf(stderr, "cupool exec: %s was not applied to pid %d (%s): %s\n", config, static_cast<int>(::getpid()),
                 cupool_status_name(rc), cupool_last_error(nullptr));
    if (strict) {
      std::fprintf(stderr, "cupool exec: --strict: stopping before the application starts\n");
      std::_Exit(3);
    }
  } else if (!quiet) {
    std::fprintf(stderr, "cupool exec: applied %s to pid %d: %s\n", config, static_cast<int>(::getpid()), report);
  }
  cupool_free_string(report);
  if (!std::getenv("CUPOOL_EXEC_REPORT")) return;
  // The CUDA runtime tears its contexts down in an exit handler it registers when it starts; exit
  // handlers run in reverse order, so the report must be registered after the runtime's to see the
  // pools. A watcher registers it once a context appears (10 times a second until then); the
  // handler registered here covers programs that never make one.
  std::atexit(write_report);
  std::thread([] {
    while (true) {
      char* stats = nullptr;
      const bool active = cupool_stats(&stats) == CUPOOL_OK && stats && std::strstr(stats, "\"device\":") != nullptr;
      cupool_free_string(stats);
      if (active) {
        std::atexit(write_report);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }).detach();
}

}  // namespace
