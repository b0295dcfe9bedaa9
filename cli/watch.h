// --watch, shared by the verbs that poll the holder (stats, ledger): Ctrl-C (or SIGTERM) ends the
// polling cleanly, a pause ends early when it comes, and each refresh is headed by when it was read.
#pragma once

#include <csignal>
#include <string>

namespace cupool::cli {

// Set by SIGINT or SIGTERM while an InterruptGuard is alive.
extern volatile std::sig_atomic_t g_interrupted;

// SIGINT and SIGTERM end --watch cleanly while installed; the old handlers come back after.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// Sleeps `seconds`; false when a signal asked to stop first.
bool pause_for(double seconds);

// The line above each refresh of --watch: "cupool VERB at <local time>, every N s (Ctrl-C ends it)".
std::string when_line(const std::string& verb, double every);

}  // namespace cupool::cli
