#include "cli/watch.h"

#include <chrono>
#include <ctime>
#include <sstream>

namespace cupool::cli {

volatile std::sig_atomic_t g_interrupted = 0;

namespace {
void on_interrupt(int) { g_interrupted = 1; }
}  // namespace

InterruptGuard::InterruptGuard() {
  g_interrupted = 0;
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a sleep or a blocked read returns at once
  sigaction(SIGINT, &action, &old_int_);
  sigaction(SIGTERM, &action, &old_term_);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

// Sleeps `seconds`; false when a signal asked to stop first.
bool pause_for(double seconds) {
  using clock = std::chrono::steady_clock;
  const auto deadline =
      clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
  while (!g_interrupted) {
    const auto left = deadline - clock::now();
    if (left <= clock::duration::zero()) return true;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{};
    ts.tv_sec = static_cast<std::time_t>(ns / 1000000000);
    ts.tv_nsec = static_cast<long>(ns % 1000000000);
    nanosleep(&ts, nullptr);  // EINTR: the loop looks at the flag
  }
  return false;
}

// The line above each refresh of --watch: when, in local time, and how often.
std::string when_line(const std::string& verb, double every) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  char when[64] = "";
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %Z", &local);
  std::ostringstream line;
  line << "cupool " << verb << " at " << when << ", every " << every << " s (Ctrl-C ends it)\n";
  return line.str();
}

}  // namespace cupool::cli
