// What the holder says about itself and the requests of `cupool status`, `stats`, `trim`, `plan`,
// `apply` and `export`: the reports (reports.cpp) and their handlers (admin_requests.cpp), with
// the record of what `cupool apply` put in place and the account book plan and apply look names up in.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "device/backend.h"
#include "device/node.h"
#include "holder/account_book.h"
#include "holder/budget_requests.h"
#include "holder/buffer_store.h"
#include "holder/client_table.h"
#include "holder/leasing.h"
#include "holder/pool_table.h"
#include "holder/reconciler.h"
#include "holder/reply.h"
#include "holder/request.h"
#include "model/model.h"

namespace cupool {

// The holder's units that the reports read, and its identity and draining (read when asked).
struct AdminUnits {
  Backend& backend;
  const NodeReport& node;
  const ClientTable& clients;
  PoolTable& pools;
  BufferStore& buffers;
  Leasing& leasing;
  Reconciler& reconciler;
  const BudgetRequests& budgets;
  const model::HolderInfo& identity;
  const bool& draining;
};

class AdminRequests {
 public:
  explicit AdminRequests(const AdminUnits& units);

  Reply status(Request& r);
  Reply stats(Request& r);
  Reply trim(Request& r);
  Reply plan(Request& r) { return plan_or_apply(r, false); }
  Reply apply(Request& r) { return plan_or_apply(r, true); }
  Reply export_config(Request& r);

  // ---- the reports (reports.cpp): Holder's functions of the same names say what they are ----
  model::Status status() const;
  model::Stats stats(bool reset_peaks);
  model::Trim trim(std::uint64_t keep, const std::optional<std::string>& pool, bool graph);
  std::string export_config() const;
  std::optional<model::AppliedConfig> forget_applied();
  void set_account_book(AccountBook book) { accounts_ = std::move(book); }

 private:
  Reply plan_or_apply(Request& r, bool apply);

  AdminUnits units_;
  AccountBook accounts_;
  std::int64_t created_at_;
  std::uint64_t apply_count_ = 0;
  std::optional<model::AppliedConfig> applied_config_;
};

}  // namespace cupool
