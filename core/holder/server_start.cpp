// Server (server_loop.h): the holder's start, the config read again on SIGHUP, and what the
// holder says of itself (status's holder).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "base/error.h"
#include "base/text.h"
#include "device/query.h"
#include "holder/names.h"
#include "holder/server_loop.h"
#include "holder/start.h"
#include "protocol/messages.h"

namespace cupool::serving {

void Server::update_identity() {
  model::HolderInfo id;
  id.pid = ::getpid();
  id.version = std::string("cupool ") + CUPOOL_VERSION;
  id.config = options_.config_path;
  id.socket = socket_->path();
  id.started = started_;
  id.reload_count = static_cast<std::uint64_t>(reloads_);
  id.last_reload = last_reload_;
  id.start = start_;
  holder_->set_identity(id);
}

void Server::reload() {
  spdlog::info("SIGHUP: reloading {}", options_.config_path);
  sd_notify_state(
      "RELOADING=1\nMONOTONIC_USEC=" +
      std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count()));
  try {
    const SourceFile file = SourceFile::read_regular(options_.config_path, kMaxConfigBytes);
    const Loaded loaded = load_config(
        file, [this] { return build_report(backend_); }, Scope::all);
    if (!loaded.warnings.empty()) spdlog::warn("{}:\n{}", options_.config_path, loaded.warnings);
    const bool waits = holder_->apply_after_drops(loaded.desired, [this](const std::vector<Change>& changes) {
      ++reloads_;
      std::size_t blocked = 0;
      for (const Change& ch : changes)
        if (!ch.blocked.empty()) ++blocked;
      std::string said = changes.empty()
                             ? "no changes"
                             : std::to_string(changes.size()) + (changes.size() == 1 ? " change" : " changes");
      if (blocked) said += ", " + std::to_string(blocked) + " not done (see 'cupool plan')";
      last_reload_ = model::ReloadOutcome{iso_now(), true, said};
      update_identity();
      // What `cupool apply` made is replaced by the file: said, not silently undone.
      if (auto applied = holder_->forget_applied())
        spdlog::warn("reload: {} replaces what 'cupool apply' made from {} at {}", options_.config_path, applied->path,
                     applied->since);
      if (changes.empty()) spdlog::info("reload: no changes");
      for (const Change& ch : changes)
        spdlog::info("reload: {} {} {}{}{}", model::change_word(ch.action), model::change_word(ch.object), ch.name,
                     ch.field.empty() ? "" : " " + ch.field + ": " + ch.from.text + " -> " + ch.to.text,
                     ch.blocked.empty() ? "" : " (not done: " + ch.blocked + ")");
    });
    if (waits)
      spdlog::info("reload: waiting for clients to give back cached blocks first (at most {} ms)",
                   options_.drop_timeout_ms);
  } catch (const ConfigRejected& e) {
    spdlog::error("reload: {} was not applied; the holder keeps its state.\n{}", options_.config_path, e.rendered());
    last_reload_ =
        model::ReloadOutcome{iso_now(), false, e.what() + std::string(" (the holder's log has each finding)")};
    update_identity();
  } catch (const std::exception& e) {
    spdlog::error("reload: {} was not applied: {}", options_.config_path, e.what());
    last_reload_ = model::ReloadOutcome{iso_now(), false, e.what()};
    update_identity();
  }
  sd_notify_state("READY=1\nSTATUS=holding " + std::to_string(holder_->lease_count()) + " leases");
}

void Server::start() {
  // How long each step of the start takes (the log and status say it).
  run_started_ = Clock::now();
  auto at = run_started_;
  auto step = [&at] {
    const auto now = Clock::now();
    const double s = std::chrono::duration<double>(now - at).count();
    at = now;
    return s;
  };
  file_ = SourceFile::read_regular(options_.config_path, kMaxConfigBytes);
  custody_ = choose_custody(options_);
  std::vector<custody::Kept> kept;
  if (custody_) kept = withdraw_from_custody(*custody_, options_.keeper_wait_ms);
  start_.custody_seconds = step();
  // The node: as custody kept it, when this node's fingerprint is the one it was kept with (no
  // driver call: cuInit alone takes 184-249 ms on an H200), else asked of the driver now.
  fingerprint_ = backend_.fingerprint();
  std::string why_not;
  std::optional<NodeReport> node = custody_ ? kept_node_report(kept, fingerprint_, why_not) : std::nullopt;
  node_from_custody_ = node.has_value();
  if (node) node->source = backend_.source();  // what answers: the driver (or the profile), as the report it kept says
  if (!node) {
    if (custody_) spdlog::info("node report: asking the driver ({})", why_not);
    node = build_report(backend_);
  }
  start_.node_report = node_from_custody_ ? "custody" : "driver";
  start_.node_report_seconds = step();
  want_ = load_held_config(*file_, *node);
  if (!options_.socket.empty()) want_.holder.socket = options_.socket;

  socket_ = std::make_unique<SocketFile>(want_.holder.socket);
  HolderLimits limits;
  limits.max_clients_per_user = options_.max_clients_per_user;
  holder_ = std::make_unique<Holder>(backend_, std::move(*node), ::geteuid(), limits);
  holder_->adopt_holder_settings(want_.holder);
  if (!options_.socket.empty()) holder_->keep_socket_from_command_line();
  if (custody_) {
    holder_->attach_custody(custody_.get());
    holder_->set_custody_budget_ms(std::max(options_.keeper_wait_ms, Holder::kCustodyBudgetMs));
  }
  take_custody(std::move(kept), want_);
  holder_->declare_pools(want_);
  holder_->set_starting(true);
  start_.config_seconds = step();
  // Serving from here: custody may hold the serving thread up only this long.
  holder_->set_custody_budget_ms(Holder::kCustodyBudgetMs);
  if (auto* keeper = dynamic_cast<custody::KeeperClient*>(custody_.get())) keeper->set_timeout_ms(kKeeperTimeoutMs);
  socket_->listen(holder_->holder_settings());
  holder_->attach_socket(socket_.get());
  wire_holder();
  start_.state = "starting";
  start_.listening_seconds = std::chrono::duration<double>(Clock::now() - run_started_).count();
  update_identity();
  const model::Status held = holder_->status();
  spdlog::info(
      "listening on {} {:.0f} ms after the start of the holder's work (custody {:.0f} ms, node report {:.0f} "
      "ms from {}, config and adoption {:.0f} ms): serving {} buffer{} from custody while the driver "
      "starts",
      socket_->path(), start_.listening_seconds * 1000, start_.custody_seconds * 1000,
      start_.node_report_seconds * 1000, node_from_custody_ ? "custody" : "the driver", start_.config_seconds * 1000,
      held.buffers.size(), held.buffers.size() == 1 ? "" : "s");
  sd_notify_state("READY=1\nSTATUS=listening on " + socket_->path() +
                  "; the driver is starting\nMAINPID=" + std::to_string(::getpid()));
  std::set<int> devices;
  for (const PoolWant& p : want_.pools) devices.insert(p.device);
  driver_start_ = std::make_unique<DriverStart>(backend_, node_from_custody_, holder_->unverified(),
                                                std::vector<int>(devices.begin(), devices.end()));
  start_deadline_ = Clock::now() + std::chrono::milliseconds(options_.start_timeout_ms);
}

void Server::finish_start() {
  DriverStarted done = driver_start_->take();
  driver_start_.reset();
  if (done.failure) {
    spdlog::error("the driver did not start; the holder stops (custody keeps the held buffers)");
    std::rethrow_exception(done.failure);
  }
  start_.driver_seconds = done.init_ms / 1000;
  start_.driver_report_seconds = done.node_ms / 1000;
  start_.mapping_seconds = done.adopt_ms / 1000;
  start_.devices_seconds = done.devices_ms / 1000;
  // Custody gets this node's report for the next start: one asked before listening, or the driver's
  // where it differs from what custody kept (--fresh dropped custody's).
  bool keep = !node_from_custody_ || options_.fresh;
  if (done.node) {
    keep = keep || node_identity(holder_->node()) != node_identity(*done.node);
    want_ = recheck_held_config(*file_, want_, holder_->node(), *done.node);
    if (!options_.socket.empty()) want_.holder.socket = options_.socket;
    holder_->update_node(std::move(*done.node));
  }
  holder_->settle_adoption(done.checks);
  const auto at = Clock::now();
  if (!draining_) holder_->apply(want_);
  start_.pools_seconds = std::chrono::duration<double>(Clock::now() - at).count();
  if (custody_ && keep && !fingerprint_.empty()) holder_->keep_node({fingerprint_, to_json(holder_->node()), ""});
  holder_->set_starting(false);
  start_.state = "ready";
  start_.ready_seconds = std::chrono::duration<double>(Clock::now() - run_started_).count();
  update_identity();
  const model::Status held = holder_->status();
  spdlog::info(
      "holding {} pool{} and {} buffer{} from {}; ready {:.0f} ms after the start of the holder's work "
      "(listening at {:.0f} ms; then the driver {:.0f} ms, its node report {:.0f} ms, adopted buffers "
      "mapped {:.0f} ms, devices opened {:.0f} ms, pools and buffers {:.0f} ms)",
      held.pools.size(), held.pools.size() == 1 ? "" : "s", held.buffers.size(), held.buffers.size() == 1 ? "" : "s",
      options_.config_path, *start_.ready_seconds * 1000, start_.listening_seconds * 1000, start_.driver_seconds * 1000,
      start_.driver_report_seconds * 1000, start_.mapping_seconds * 1000, start_.devices_seconds * 1000,
      start_.pools_seconds * 1000);
  sd_notify_state("STATUS=listening on " + socket_->path());
  if (reload_pending_ && !draining_) {
    reload_pending_ = false;
    reload();
  }
}

void Server::take_custody(std::vector<custody::Kept> kept, const Desired& want) {
  if (!custody_) return;
  if (options_.fresh) {
    const std::size_t dropped = holder_->forget_custody(std::move(kept));
    spdlog::warn("--fresh: dropped {} descriptor{} that {} kept; their memory is freed", dropped,
                 dropped == 1 ? "" : "s", custody_->where());
  } else if (!kept.empty()) {
    const model::Adoption report = holder_->adopt(std::move(kept), want);
    spdlog::info("custody: adopted {} buffer{} from {} (manifest {}); {} refused, {} descriptor{} released",
                 report.buffers.size(), report.buffers.size() == 1 ? "" : "s", custody_->where(),
                 report.manifest_sequence ? std::to_string(*report.manifest_sequence) : std::string("none"),
                 report.refused.size(), report.released_count, report.released_count == 1 ? "" : "s");
  } else {
    holder_->adopt({}, want);
  }
}

void Server::wire_holder() {
  // Notices come from inside a request (apply, reload): they are only queued here, never sent or
  // dropped on the spot, which could disconnect a client while the holder walks its clients.
  holder_->on_notice([this](std::uint64_t client, const Json& notice) {
    for (auto& [fd, c] : connections_)
      if (c.talk.client() == client && !c.dead) {
        c.talk.queue(notice, proto::Kind::notice);
        if (!c.sending) c.last_progress = Clock::now();
        c.sending = true;
      }
  });
  // The reply of a request that waited for cached blocks: queued the same way (sent by the loop).
  holder_->set_drop_timeout_ms(options_.drop_timeout_ms);
  holder_->on_deferred([this](std::uint64_t client, const Json& reply) {
    for (auto& [fd, c] : connections_)
      if (c.talk.client() == client && !c.dead) {
        c.talk.answer(reply);
        if (!c.sending) c.last_progress = Clock::now();
        c.sending = true;
      }
  });
}

}  // namespace cupool::serving
