// The steps of the holder's start that need no server: signals through a descriptor, the
// open-files limit, the held config, and custody chosen and asked what it kept.
#include "holder/start.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/signalfd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "base/error.h"
#include "base/text.h"
#include "custody/custody.h"

namespace cupool {

namespace {

// Open files the holder asks for (RLIMIT_NOFILE): 1024 connections and room for the rest.
constexpr rlim_t kWantedFiles = 4096;
using Clock = std::chrono::steady_clock;

}  // namespace

Fd take_signals() {
  // Signals arrive through a descriptor, so the loop sees them between requests. They are blocked
  // before the driver starts its threads (at cuInit): a thread that doesn't block SIGTERM would
  // take it and the process would die without draining (measured on a real driver).
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  if (sigprocmask(SIG_BLOCK, &mask, nullptr) != 0) throw std::runtime_error("sigprocmask: " + errno_text());
  Fd signals(::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signals) throw std::runtime_error("signalfd: " + errno_text());
  ::signal(SIGPIPE, SIG_IGN);
  return signals;
}

void raise_file_limit() {
  // Every connection is a descriptor: the usual soft limit (1024) is below what the holder serves
  // (1024 connections, plus its pools' descriptors). Raise it as far as the hard limit allows.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < kWantedFiles) {
    const rlim_t before = files.rlim_cur;
    files.rlim_cur = files.rlim_max == RLIM_INFINITY ? kWantedFiles : std::min<rlim_t>(kWantedFiles, files.rlim_max);
    if (files.rlim_cur > before && ::setrlimit(RLIMIT_NOFILE, &files) != 0)
      spdlog::warn("can't raise the open-files limit from {}: {}", before, errno_text());
  }
}

Desired load_held_config(const SourceFile& file, const NodeReport& node) {
  try {
    Loaded loaded = load_config(file, node, Scope::all);
    if (!loaded.warnings.empty()) std::fputs(loaded.warnings.c_str(), stderr);
    return std::move(loaded.desired);
  } catch (const ConfigRejected& e) {
    std::fputs(e.rendered().c_str(), stderr);
    throw Error(e.code(), file.path() + " can't be held (" + e.what() + ")");
  }
}

std::unique_ptr<custody::Custody> choose_custody(const ServerOptions& options) {
  // The holder asks its keeper from the serving thread: a keeper that stops answering (SIGSTOP, a
  // frozen container) may hold it up at most this long a request (twice, with the one retry).
  if (!options.keeper.empty()) return std::make_unique<custody::KeeperClient>(options.keeper, kKeeperStartTimeoutMs);
  if (const char* notify = std::getenv("NOTIFY_SOCKET"); notify && *notify) {
    // systemd 254 and later say how many descriptors the unit may store ($FDSTORE); 0 is none.
    if (const char* max = std::getenv("FDSTORE"); max && std::string(max) == "0") {
      spdlog::warn(
          "the unit has no file-descriptor store (FileDescriptorStoreMax=0): held buffers die with this "
          "process; see configs/systemd/cupool.service");
      return nullptr;
    }
    return custody::systemd_store();
  }
  spdlog::info("no custody for held buffers (no $NOTIFY_SOCKET, no --keeper): they die with this process");
  return nullptr;
}

std::vector<custody::Kept> withdraw_from_custody(custody::Custody& custody, int keeper_wait_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(keeper_wait_ms);
  bool told = false;
  while (true) {
    try {
      return custody.withdraw();
    } catch (const Error& e) {
      // A keeper that can't be trusted (another user's, or at a path others can take) is given
      // nothing and nothing is taken from it: the holder runs without custody and says why.
      if (e.code() == Errc::not_permitted) {
        spdlog::error("custody is off: {}", e.what());
        return {};
      }
      if (e.code() != Errc::unreachable || Clock::now() >= deadline)
        throw Error(e.code(), "custody: " + custody.where() + " did not answer (" + e.what() +
                                  "); start `cupool keeper` first, or hold with --fresh to start from nothing");
      if (!told) spdlog::info("waiting up to {} s for the {}", keeper_wait_ms / 1000, custody.where());
      told = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

}  // namespace cupool
