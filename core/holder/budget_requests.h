// The budget requests (docs/budgets.md): exec asks for a grant (budget_grant), the preload inside
// the process claims it and reports its use (budget_claim, budget_usage), anyone reads the ledger
// (ledger). The ledger is the one account of each device's bytes that grants are checked against:
// a refusal quotes its figures.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "device/backend.h"
#include "device/node.h"
#include "holder/budgets.h"
#include "holder/buffer_store.h"
#include "holder/client_table.h"
#include "holder/pool_table.h"
#include "holder/reply.h"
#include "holder/request.h"
#include "model/model.h"

namespace cupool {

// What NVML says of one device (the backend's DeviceUsage role), as the ledger reads it.
struct DeviceUse {
  std::string source = "unavailable";  // "nvml", "simulated", "unavailable"
  std::string note;
  std::optional<model::LedgerMemory> memory;
  bool listed = false;  // NVML listed the processes (else `processes` is empty for want of them)
  std::map<std::int64_t, std::optional<std::uint64_t>> processes;  // pid -> NVML's figure
};

class BudgetRequests {
 public:
  // `context_bytes`: the allowance for a process's CUDA context on each device it has a budget on
  // (and the holder's own), charged beside its budget.
  BudgetRequests(Backend& backend, const NodeReport& node, ClientTable& clients, PoolTable& pools, BufferStore& buffers,
                 Budgets& budgets, std::uint64_t context_bytes, const bool& draining)
      : backend_(backend),
        node_(node),
        clients_(clients),
        pools_(pools),
        buffers_(buffers),
        budgets_(budgets),
        context_bytes_(context_bytes),
        draining_(draining) {}

  Reply grant(Request& r);
  Reply claim(Request& r);
  Reply usage(Request& r);
  Reply ledger(Request& r);

  // Every device's account now. For `viewer` (a user who is not an admin), the command lines of
  // other users' processes are left out: the holder may read /proc past hidepid, its clients may not.
  model::Ledger ledger(std::optional<std::uint32_t> viewer = std::nullopt) const;
  // Grants one user who is not an admin may hold at once, so no one user fills every device.
  static constexpr std::size_t kMaxGrantsPerUser = 64;

 private:
  model::LedgerDevice account(int device, std::optional<std::uint32_t> viewer = std::nullopt) const;
  DeviceUse device_use(int device) const;

  Backend& backend_;
  const NodeReport& node_;
  ClientTable& clients_;
  PoolTable& pools_;
  BufferStore& buffers_;
  Budgets& budgets_;
  std::uint64_t context_bytes_;
  const bool& draining_;
};

// A process's command line as /proc shows it (arguments joined by spaces, at most `max` bytes);
// "" when it can't be read.
std::string command_of(std::int64_t pid, std::size_t max = 256);
// The real user id of a process (/proc/PID/status); nullopt when it can't be read.
std::optional<std::uint32_t> owner_of(std::int64_t pid);

}  // namespace cupool
