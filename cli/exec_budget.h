// cupool exec --budget: asks the running holder for a grant before CMD runs, and hands it to the
// preload inside CMD through the environment (docs/budgets.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cupool::cli {

// One device's budget as exec asks for it: a device by the node's ordinal or UUID (none: every
// device the process may use) and bytes or a percentage of the device's memory.
struct BudgetSpec {
  std::optional<std::string> device;  // as written: "0", "GPU-8d1c...", a PCI bus id
  std::optional<std::uint64_t> bytes;
  std::optional<double> percent;
  std::string text;  // as written, for messages
};

// Parses --budget's values: each "SIZE", "PCT%" or "DEVICE=SIZE|PCT%", several joined by commas.
// Throws cupool::Error (invalid_input) naming the value and what would be valid.
std::vector<BudgetSpec> parse_budget_specs(const std::vector<std::string>& values);

struct BudgetRequest {
  std::vector<BudgetSpec> specs;
  // From the config's process.budget: per device of the section (by UUID), the bytes; used when
  // --budget is not given.
  std::vector<std::pair<std::string, std::uint64_t>> from_config;
  std::string socket;          // "" : $CUPOOL_SOCKET, else the default
  std::optional<double> wait;  // seconds to wait for room (0: no limit); none: refuse at once
  std::string command;         // shown in the ledger
  bool quiet = false;
};

// Asks the holder for the budget and, once granted, sets CUPOOL_EXEC_BUDGET, CUPOOL_EXEC_GRANT and
// CUPOOL_SOCKET for the preload. Throws cupool::Error: a budget that does not fit (exit 1, the
// ledger's figures in the message), a bad one (exit 2), no holder (exit 4).
void ask_for_budget(const BudgetRequest& request);

}  // namespace cupool::cli
