// The handlers of status, stats, trim, plan, apply and export: read, checked against who asks,
// and answered from the reports (reports.cpp) and the reconciler.
#include "holder/admin_requests.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "base/error.h"
#include "base/text.h"
#include "config/load.h"
#include "holder/names.h"
#include "model/fields.h"
#include "protocol/messages.h"

namespace cupool {

AdminRequests::AdminRequests(const AdminUnits& units) : units_(units), created_at_(now_s()) {}

Reply AdminRequests::status(Request& r) {
  proto::read_status(r.args);
  r.args.finish();
  return model::to_json(status());
}

Reply AdminRequests::stats(Request& r) {
  const bool reset = proto::read_stats(r.args).reset_peaks;
  if (reset) require_admin(r.client, "stats with reset_peaks");
  r.args.finish();
  model::Stats out = stats(reset);
  if (!r.client.admin) out.ledger = units_.budgets.ledger(r.client.peer.uid);  // others' command lines left out
  return model::to_json(out);
}

Reply AdminRequests::trim(Request& r) {
  require_admin(r.client, "trim");  // before its arguments are read
  const proto::Trim want = proto::read_trim(r.args);
  r.args.finish();
  const std::uint64_t keep = want.keep_bytes;
  const std::optional<std::string>& pool = want.pool;
  const bool graph = want.graph;
  const bool cached = want.cached;
  if (pool && !units_.pools.holds(*pool)) throw units_.pools.no_such_pool(*pool);
  // Cached blocks are memory nobody uses: asked back first, as far as `keep` needs, and the trim
  // runs once their clients answered.
  std::set<std::uint64_t> asks;
  if (cached)
    for (const auto& [key, p] : units_.pools) {
      const model::LeaseTotals t = units_.leasing.book().of(key);
      if ((pool && key.first != *pool) || !t.cached_bytes) continue;
      const std::uint64_t used = t.leased_bytes;
      if (used <= keep) continue;
      const PoolTable::PoolKey k = key;
      const auto more = units_.leasing.ask_drops(
          [&](const Lease& l) { return l.pool == k.first && l.device == k.second; }, used - keep, "trim");
      asks.insert(more.begin(), more.end());
    }
  const std::uint64_t dropped_before = units_.leasing.dropped_bytes();
  auto run = [this, keep, pool, graph, dropped_before] {
    model::Trim out = trim(keep, pool, graph);
    out.dropped_bytes = units_.leasing.dropped_bytes() - dropped_before;
    return model::to_json(out);
  };
  if (!asks.empty()) return units_.leasing.defer(r, asks, run);
  return run();
}

Reply AdminRequests::export_config(Request& r) {
  proto::read_export(r.args);
  r.args.finish();
  return model::write_json(model::ExportReply{export_config()});
}

Reply AdminRequests::plan_or_apply(Request& r, bool apply) {
  HeldClient& c = r.client;
  // The config at most as long as what `cupool check` reads of a file.
  const proto::Plan want = proto::read_plan(r.args, apply, kMaxConfigBytes);
  r.args.finish();
  const std::string& text = want.config;
  // The name findings use (each finding repeats it): bounded, and shown without control characters.
  const std::string path = safe_for_display(want.path.value_or("<request>"));
  if (apply) {
    require_admin(c, "apply");
    require_not_draining(units_.draining, "apply");
  }
  // A ConfigRejected goes up: the conversation answers invalid_config (or does_not_fit) with the findings.
  // The file's users and groups, looked up within this peer's time (holder/account_book.h).
  CheckOptions accounts;
  accounts.user_exists = [this, &c](const std::string& n) { return accounts_.user_exists(c.peer.uid, c.admin, n); };
  accounts.group_exists = [this, &c](const std::string& n) { return accounts_.group_exists(c.peer.uid, c.admin, n); };
  const Loaded loaded = load_config(SourceFile(path, text), units_.node, Scope::all, accounts);
  std::optional<std::string> user;
  if (!c.peer.user.empty()) user = c.peer.user;
  auto run = [this, apply, path, user, desired = loaded.desired, warnings = loaded.warnings,
              findings = loaded.warning_findings] {
    std::vector<Change> changes =
        apply ? units_.buffers.then_sync_custody([&] { return units_.reconciler.apply(desired); })
              : units_.reconciler.plan(desired);
    if (apply) {
      // Held until the holder reads its own file again (a reload or a restart), and said in status.
      ++apply_count_;
      applied_config_ = model::AppliedConfig{path, iso_now(), user};
      spdlog::info("apply: {} by {}; a reload or a restart goes back to {}", path, user.value_or("an unknown user"),
                   units_.identity.config.empty() ? std::string("the holder's file") : units_.identity.config);
    }
    model::PlanReply out;
    out.applied = apply;
    for (const auto& ch : changes) out.changes.push_back(change_view(ch, units_.node));
    out.warnings = findings;
    out.warnings_rendered = warnings;
    if (!units_.identity.config.empty()) out.config = units_.identity.config;
    return model::to_json(out);
  };
  // Pools that only cached blocks keep from being replaced or removed: asked back first.
  if (apply) {
    const std::set<std::uint64_t> asks = units_.reconciler.ask_drops_for(loaded.desired);
    if (!asks.empty()) return units_.leasing.defer(r, asks, run);
  }
  return run();
}

}  // namespace cupool
