// The steps of `cupool hold`'s start that stand apart from the server's loop (start.cpp): signals
// taken through a descriptor, the open-files limit raised, the held config read, and custody chosen
// and asked what it kept.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/fd.h"
#include "config/load.h"
#include "config/resolve.h"
#include "custody/custody.h"
#include "device/node.h"
#include "holder/server.h"

namespace cupool {

// How long the holder waits for its keeper in one request once it serves (it asks from the serving
// thread; Holder::kCustodyBudgetMs bounds all of a request's custody work), and at its start, when
// it serves nobody yet (--keeper-wait bounds the start's custody work).
constexpr int kKeeperTimeoutMs = 500;
constexpr int kKeeperStartTimeoutMs = 5000;

// Blocks SIGTERM, SIGINT and SIGHUP and returns a descriptor that reads them; ignores SIGPIPE.
// Throws std::runtime_error when the kernel refuses.
Fd take_signals();
// Raises the soft limit of open files towards 4096, as far as the hard limit allows (a warning
// when it can't).
void raise_file_limit();
// The desired state of `file` on `node`, its warnings printed; throws cupool::Error (the findings
// printed) when it can't be held.
Desired load_held_config(const SourceFile& file, const NodeReport& node);
// Where the held buffers' descriptors are kept (ServerOptions::keeper, else systemd's store when
// $NOTIFY_SOCKET is set); null for none.
std::unique_ptr<custody::Custody> choose_custody(const ServerOptions& options);
// What `custody` kept, waiting up to `keeper_wait_ms` for a keeper that is not there yet; nothing
// from a keeper that can't be trusted. Throws cupool::Error when it does not answer in time.
std::vector<custody::Kept> withdraw_from_custody(custody::Custody& custody, int keeper_wait_ms);

// The node report that `kept` holds (custody::kNodeFdName, left in `kept`) when it was written on
// a node of `fingerprint` (NodeQuery::fingerprint; "" never matches): the holder checks its config
// against it instead of loading the driver first. nullopt otherwise, with the reason in `why`.
std::optional<NodeReport> kept_node_report(const std::vector<custody::Kept>& kept, const std::string& fingerprint,
                                           std::string& why);
// The config checked again against the driver's report of the node, when it differs from the one
// the start used (`used`; what differs is logged). Throws as load_held_config does: a config that
// fit the kept report but not the node as the driver sees it is not held.
Desired recheck_held_config(const SourceFile& file, const Desired& want, const NodeReport& used,
                            const NodeReport& driver);

}  // namespace cupool
