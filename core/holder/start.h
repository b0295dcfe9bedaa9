// The steps of `cupool hold`'s start that stand apart from the server's loop (start.cpp): signals
// taken through a descriptor, the open-files limit raised, the held config read, and custody chosen
// and asked what it kept.
#pragma once

#include <memory>
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

}  // namespace cupool
