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
#include "holder/driver_start.h"

namespace cupool {

namespace {

// Open files the holder asks for (RLIMIT_NOFILE): 1024 connections and room for the rest.
constexpr rlim_t kWantedFiles = 4096;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

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

std::optional<NodeReport> kept_node_report(const std::vector<custody::Kept>& kept, const std::string& fingerprint,
                                           std::string& why) {
  const auto it =
      std::find_if(kept.begin(), kept.end(), [](const custody::Kept& k) { return k.name == custody::kNodeFdName; });
  if (it == kept.end()) {
    why = "custody keeps none";
    return std::nullopt;
  }
  if (fingerprint.empty()) {
    why = "this node's fingerprint can't be read without the driver";
    return std::nullopt;
  }
  try {
    const custody::KeptNode node = custody::open_node(it->fd.get());
    if (node.fingerprint != fingerprint) {
      why = "the node changed since it was kept (" + node.written +
            "): the boot, the driver, the GPUs or CUDA_VISIBLE_DEVICES";
      return std::nullopt;
    }
    return report_from_json(node.report, std::string(custody::kNodeFdName) + " (kept " + node.written + ")");
  } catch (const std::exception& e) {
    why = e.what();
    return std::nullopt;
  }
}

Desired recheck_held_config(const SourceFile& file, const Desired& want, const NodeReport& used,
                            const NodeReport& driver) {
  const Json a = node_identity(used), b = node_identity(driver);
  if (a == b) return want;
  std::string differs;
  for (const auto& [key, value] : b.items())
    if (!a.contains(key) || a[key] != value) differs += (differs.empty() ? "" : ", ") + key;
  spdlog::warn("the driver's report of the node differs from the one custody kept ({}): checking {} again",
               differs.empty() ? "its fields" : differs, file.path());
  return load_held_config(file, driver);
}

}  // namespace cupool
