// The per-device memory budget of a process under `cupool exec --budget` (issue 36): what the
// preload does with CUPOOL_EXEC_BUDGET and CUPOOL_EXEC_GRANT. budget.cpp reads the budget, keeps
// the account (Ledger) and talks to the holder; budget_hooks.cpp holds the driver's and NVML's
// entry points that are wrapped, what each one answers and what escapes (its header comment).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace cupool::preload {

// One device's budget as CUPOOL_EXEC_BUDGET gives it.
struct DeviceBudget {
  std::string uuid;  // "GPU-" and 32 lower-case hex digits as 8-4-4-4-12 (cuDeviceGetUuid's 16 bytes)
  std::uint64_t bytes = 0;
};

// CUPOOL_EXEC_BUDGET's value, "UUID=BYTES[,UUID=BYTES...]" (UUIDs in either case, BYTES a whole
// number of bytes), read; nullopt with the reason in `why` when it is not valid (an empty value
// included: the caller treats that as no budget before asking).
std::optional<std::vector<DeviceBudget>> parse_budget(const std::string& text, std::string& why);

// cuDeviceGetUuid's 16 bytes as CUPOOL_EXEC_BUDGET writes them: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
std::string uuid_text(const unsigned char (&bytes)[16]);

// The account of a budgeted process: per budgeted device what it allocated (used) and the most it
// had at once (peak), and what each counted allocation was charged to. A device is a slot: its
// index in the budget list. Thread-safe; bytes are reserved before the driver is asked, so threads
// allocating at once never take a device past its budget.
class Ledger {
 public:
  // What a counted allocation cost: its device's slot and its bytes.
  struct Charge {
    int slot = -1;
    std::uint64_t bytes = 0;
  };
  // What a key names: an address (cuMemAlloc*) or a cuMemCreate handle; the two may coincide.
  enum class Kind { address, handle };

  explicit Ledger(std::vector<DeviceBudget> budgets);

  [[nodiscard]] int size() const { return static_cast<int>(devices_.size()); }
  [[nodiscard]] const DeviceBudget& budget(int slot) const { return at(slot).budget; }
  // The slot of a device by its UUID (either case), -1 when it has no budget.
  [[nodiscard]] int slot_of(const std::string& uuid) const;
  // Takes `bytes` of the slot's budget; false, taking nothing, when used would pass the budget.
  bool reserve(int slot, std::uint64_t bytes);
  // Gives reserved bytes back (a failed allocation, or a free).
  void give_back(int slot, std::uint64_t bytes);
  // Records what an allocation made with reserved bytes was charged.
  void record(Kind kind, std::uint64_t key, Charge charge);
  // Takes a recorded allocation out of the account (its bytes stay reserved until give_back);
  // nullopt when it was never counted (made before the budget, imported, on a device without one).
  std::optional<Charge> take(Kind kind, std::uint64_t key);
  [[nodiscard]] std::uint64_t used(int slot) const { return at(slot).used.load(); }
  [[nodiscard]] std::uint64_t peak(int slot) const { return at(slot).peak.load(); }
  // The budget less what is used, never below 0.
  [[nodiscard]] std::uint64_t left(int slot) const;

 private:
  struct Device {
    DeviceBudget budget;
    std::atomic<std::uint64_t> used{0};
    std::atomic<std::uint64_t> peak{0};
  };
  [[nodiscard]] Device& at(int slot) const { return *devices_[static_cast<std::size_t>(slot)]; }
  std::vector<std::unique_ptr<Device>> devices_;
  std::mutex mu_;  // the two maps
  std::unordered_map<std::uint64_t, Charge> addresses_;
  std::unordered_map<std::uint64_t, Charge> handles_;
};

// The budget in force in this process, or null: CUPOOL_EXEC_BUDGET unset or empty (nothing about
// the process changes), or not valid (said on stderr; with CUPOOL_EXEC_STRICT=1 the process exits
// 3). Read on first use, which may come before this library's constructor. Never freed.
Ledger* budget();

// When the process first asks the driver about a device (the wrappers' device lookup): with a
// budget in force and CUPOOL_EXEC_GRANT set, claims the grant from the holder on a connection kept
// for the process's life, and reports usage from a thread. A launcher that never uses CUDA (a
// shell, `env`) never claims, so the grant is left for the process of the command that does.
void start_budget();

// What the dlsym hook hands out for `name` looked up on `handle`, the library having answered
// `answer`: the wrapper of a wrapped entry point when `answer` is that entry point, else `answer`.
void* budget_dlsym_entry(void* handle, const char* name, void* answer);
// The same for cuGetProcAddress's answer; `driver` is the library cuGetProcAddress came from
// (null when unknown).
void* budget_getproc_entry(void* driver, void* answer);

}  // namespace cupool::preload
