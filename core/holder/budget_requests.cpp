#include "holder/budget_requests.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "base/error.h"
#include "base/text.h"
#include "base/units.h"
#include "device/dmem.h"
#include "protocol/messages.h"

namespace cupool {

std::string command_of(std::int64_t pid, std::size_t max) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string text;
  char c = 0;
  while (text.size() < max && in.get(c)) text += c == '\0' ? ' ' : c;
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return valid_utf8(text);
}

std::optional<std::uint32_t> owner_of(std::int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Uid:", 0) == 0) {
      try {
        return static_cast<std::uint32_t>(std::stoul(line.substr(4)));
      } catch (const std::exception&) {
        return std::nullopt;
      }
    }
  return std::nullopt;
}

namespace {

std::string plural(std::size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// The device's memory that a budget's refusal quotes: where it went.
std::string accounting_words(const model::LedgerDevice& d) {
  std::vector<std::string> parts;
  if (d.budget_bytes)
    parts.push_back(format_bytes(d.budget_bytes) + " granted to " + plural(d.budgets.size(), "process", "processes"));
  if (d.held_bytes)
    parts.push_back(format_bytes(d.held_bytes) + " held in " + plural(d.buffers.size(), "buffer", "buffers"));
  if (d.pool_reserved_bytes) parts.push_back(format_bytes(d.pool_reserved_bytes) + " reserved by the holder's pools");
  if (d.context_bytes) parts.push_back(format_bytes(d.context_bytes) + " allowed for contexts");
  std::size_t unknown = 0;
  for (const model::LedgerProcess& p : d.processes) unknown += p.role == "unknown";
  if (d.unknown_bytes)
    parts.push_back(format_bytes(d.unknown_bytes) + " used by " +
                    plural(unknown, "process cupool does not know", "processes cupool does not know"));
  return "of its " + format_bytes(d.total_bytes) + ", " + (parts.empty() ? "nothing is committed" : join(parts, ", "));
}

// The budget as the kernel's limit as well, where it has the dmem cgroup controller and a region
// for the device: written to the process's cgroup's dmem.max (docs/budgets.md, "The kernel").
// What happened, in words, for the grant's reply and the log.
std::string kernel_limit(int pid, const GrantDevice& gd, const std::string& pci_bus_id) {
  const char* env = std::getenv("CUPOOL_CGROUP_ROOT");
  const std::string root = env && *env ? env : "/sys/fs/cgroup";
  const DmemSupport dmem = dmem_support(root);
  if (!dmem.available()) return "not set: " + dmem.why;
  for (const DmemRegion& r : dmem.regions) {
    if (!r.pci_bus_id || *r.pci_bus_id != pci_bus_id) continue;
    try {
      write_dmem_max(pid, r.name, gd.budget_bytes, root);
      return "dmem.max " + r.name + " " + std::to_string(gd.budget_bytes);
    } catch (const Error& e) {
      return std::string("not set: ") + e.what();
    }
  }
  return "not set: no dmem region for " + pci_bus_id;
}

}  // namespace

DeviceUse BudgetRequests::device_use(int device) const {
  DeviceUse use;
  DeviceUsageReport r;
  try {
    r = backend_.device_usage(device);
  } catch (const std::exception& e) {
    use.note = e.what();
    return use;
  }
  use.source = r.source;
  use.note = r.note;
  if (r.source == "unavailable") return use;
  use.memory = model::LedgerMemory{r.total_bytes, r.used_bytes, r.reserved_bytes, r.free_bytes};
  use.listed = r.processes_listed;
  for (const GpuProcess& p : r.processes) use.processes[p.pid] = p.used_bytes;
  return use;
}

model::LedgerDevice BudgetRequests::account(int device, std::optional<std::uint32_t> viewer) const {
  model::LedgerDevice v;
  v.id = pools_.device_id(device);
  const DeviceReport* report = node_.device(device);
  v.total_bytes = report ? report->info.total_memory : 0;

  for (const auto& [name, b] : buffers_) {
    if (!b.exported || b.want.device != device) continue;  // host pools' buffers are not device memory
    model::LedgerBuffer row{name, 0, 0};
    for (const HeldBuffer::Part& p : b.parts) row.size_bytes += p.mapped ? p.mapped : p.size;
    for (const auto& [id, c] : clients_)
      if (auto it = c.open_buffers.find(name); it != c.open_buffers.end() && it->second > 0) ++row.mapper_count;
    v.held_bytes += row.size_bytes;
    v.buffers.push_back(std::move(row));
  }
  for (const auto& [key, p] : pools_) {
    if (key.second != device || p.want.props.location != PoolProps::Location::device) continue;
    const std::uint64_t reserved = backend_.pool_usage(p.handle).reserved_bytes;
    v.pool_reserved_bytes += reserved;
    v.pools.push_back({key.first, reserved});
  }

  const DeviceUse use = device_use(device);
  v.usage_source = use.source;
  v.usage_note = use.note;
  v.memory = use.memory;

  // Whose is each process NVML lists. cupool's own: the holder (where it holds memory, it has a
  // context there) and each budget's process; then the holder's clients; the rest it does not know.
  const std::int64_t self = ::getpid();
  const bool holder_here = !v.buffers.empty() || !v.pools.empty();
  std::map<std::int64_t, const char*> roles;
  if (holder_here) roles[self] = "holder";
  for (const auto& [id, g] : budgets_)
    for (const GrantDevice& gd : g.devices)
      if (gd.device == device) roles[g.claimed_by ? g.claimed_pid : g.pid] = "budgeted";
  for (const auto& [id, c] : clients_) roles.emplace(c.peer.pid, "client");
  // NVML names processes by the pids of the host's PID namespace. In a container they are not this
  // holder's: then it can't tell whose a process is, and says so. It can tell when one of its own
  // that must be there (the holder with memory, a budget's process using some) is, or is not.
  bool expected = false, found = false;
  if (use.listed) {
    if (holder_here) {
      expected = true;
      found = use.processes.count(self) > 0;
    }
    for (const auto& [id, g] : budgets_)
      for (const GrantDevice& gd : g.devices)
        if (gd.device == device && g.claimed_by && gd.used_bytes > 0) {
          expected = true;
          found = found || use.processes.count(g.claimed_pid) > 0;
        }
  }
  const bool matched = use.listed && (!expected || found);
  if (use.listed && !matched)
    v.usage_note =
        "NVML's process ids are not this holder's PID namespace's (a container?): cupool can't tell "
        "which processes are its own; unknown is what NVML sees beyond cupool's own";
  auto nvml_figure = [&](std::int64_t pid) -> std::optional<std::uint64_t> {
    if (!matched) return std::nullopt;
    const auto it = use.processes.find(pid);
    return it == use.processes.end() ? std::nullopt : it->second;
  };
  // What a process of cupool's uses on the device: NVML's figure; where NVML lists the processes
  // and not this one, nothing (it has no context there yet); where it can't tell, `estimate`.
  auto on_device = [&](std::int64_t pid, std::uint64_t estimate) -> std::uint64_t {
    if (const auto figure = nvml_figure(pid)) return *figure;
    return matched ? 0 : estimate;
  };

  std::uint64_t ours = 0;  // what cupool's own processes use on the device
  if (holder_here) {
    v.context_bytes += context_bytes_;
    ours += on_device(self, v.held_bytes + v.pool_reserved_bytes + context_bytes_);
  }
  for (const auto& [id, g] : budgets_)
    for (const GrantDevice& gd : g.devices) {
      if (gd.device != device) continue;
      model::LedgerBudget row;
      row.grant = g.id;
      row.pid = g.claimed_by ? g.claimed_pid : g.pid;
      row.user = g.user;
      if (!viewer || *viewer == g.uid) row.command = g.command;
      row.claimed = g.claimed_by != 0;
      row.budget_bytes = gd.budget_bytes;
      row.used_bytes = gd.used_bytes;
      row.peak_bytes = gd.peak_bytes;
      row.device_bytes = nvml_figure(row.pid);
      v.budget_bytes += gd.budget_bytes;
      v.budget_used_bytes += gd.used_bytes;
      v.context_bytes += context_bytes_;
      ours += on_device(row.pid, row.claimed ? gd.used_bytes + context_bytes_ : 0);
      v.budgets.push_back(std::move(row));
    }
  std::uint64_t listed = 0, others = 0;  // every figure NVML gave; those of processes not cupool's own
  for (const auto& [pid, figure] : use.processes) {
    const auto role = roles.find(pid);
    const char* as = matched && role != roles.end() ? role->second : "unknown";
    v.processes.push_back({pid, as, !viewer || owner_of(pid) == viewer ? command_of(pid) : "", figure});
    listed += figure.value_or(0);
    if (std::string(as) == "unknown" || std::string(as) == "client") others += figure.value_or(0);
  }
  // Memory NVML sees that is not cupool's own: by process where pids match, else all of it beyond
  // what cupool's own use (so a budget never fits where that memory is).
  v.unknown_bytes = matched ? others : (listed > ours ? listed - ours : 0);
  if (use.listed && !matched) {
    for (model::LedgerProcess& p : v.processes) p.command.clear();  // another namespace's pid: not ours to read
  }
  v.committed_bytes = v.held_bytes + v.pool_reserved_bytes + v.budget_bytes + v.context_bytes + v.unknown_bytes;
  v.available_bytes = v.total_bytes > v.committed_bytes ? v.total_bytes - v.committed_bytes : 0;
  if (v.memory) {
    // NVML's used (the driver's own reserve outside it): cupool's own processes, and the rest.
    const std::uint64_t accounted = ours + v.unknown_bytes + (matched ? others - v.unknown_bytes : 0);
    v.accounted_bytes = accounted;
    v.unexplained_bytes = static_cast<std::int64_t>(v.memory->used_bytes) - static_cast<std::int64_t>(accounted);
  }
  return v;
}

model::Ledger BudgetRequests::ledger(std::optional<std::uint32_t> viewer) const {
  model::Ledger out;
  out.context_allowance_bytes = context_bytes_;
  for (std::size_t d = 0; d < node_.devices.size(); ++d) out.devices.push_back(account(static_cast<int>(d), viewer));
  return out;
}

Reply BudgetRequests::ledger(Request& r) {
  proto::read_ledger(r.args);
  r.args.finish();
  return model::to_json(ledger(r.client.admin ? std::nullopt : std::optional<std::uint32_t>(r.client.peer.uid)));
}

Reply BudgetRequests::grant(Request& r) {
  require_not_draining(draining_, "budget_grant");
  const proto::BudgetGrant want = proto::read_budget_grant(r.args);
  r.args.finish();
  const Peer& peer = r.client.peer;
  if (!r.client.admin) {
    std::size_t mine = 0;
    for (const auto& [id, other] : budgets_) mine += other.uid == peer.uid;
    if (mine >= kMaxGrantsPerUser)
      throw Error(Errc::limit_exceeded, "user " + (peer.user.empty() ? std::to_string(peer.uid) : peer.user) +
                                            " holds " + std::to_string(mine) + " budgets already, the most one user " +
                                            "who is not an admin may hold");
  }
  Grant g;
  g.pid = peer.pid;
  g.uid = peer.uid;
  g.user = peer.user;
  g.command = want.command.empty() ? command_of(peer.pid) : valid_utf8(want.command);
  for (const proto::BudgetAsk& ask : want.devices) {
    const DeviceReport* report = node_.device(ask.device);
    if (!report)
      throw Error(Errc::not_found, "no device " + std::to_string(ask.device) + " on this node (it has " +
                                       plural(node_.devices.size(), "device", "devices") + ")");
    const std::uint64_t total = report->info.total_memory;
    const std::uint64_t bytes =
        ask.budget_bytes
            ? *ask.budget_bytes
            : static_cast<std::uint64_t>(std::floor(static_cast<double>(total) * *ask.budget_percent / 100));
    const std::string on = "device " + std::to_string(ask.device) + " (" + report->info.uuid + ")";
    if (bytes + context_bytes_ > total)
      throw Error(Errc::bad_request, "a budget of " + format_bytes(bytes) + " is larger than " + on +
                                         " can give: " + format_bytes(total) + " in all, less " +
                                         format_bytes(context_bytes_) + " for the process's context");
    const model::LedgerDevice d = account(ask.device);
    for (const model::LedgerProcess& p : d.processes)
      if (p.pid == peer.pid && p.used_bytes && *p.used_bytes > bytes)
        throw Error(Errc::bad_request, "pid " + std::to_string(peer.pid) + " already uses " +
                                           format_bytes(*p.used_bytes) + " of " + on +
                                           " (NVML); a budget below what the process holds can't be kept");
    if (bytes + context_bytes_ > d.available_bytes)
      throw Error(Errc::out_of_memory, "a budget of " + format_bytes(bytes) + " (and " + format_bytes(context_bytes_) +
                                           " for the context) does not fit " + on + ": " +
                                           format_bytes(d.available_bytes) + " is left for budgets; " +
                                           accounting_words(d) + " (`cupool ledger` shows each)");
    g.devices.push_back({ask.device, report->info.uuid, bytes, 0, 0});
  }
  const Grant& made = budgets_.add(std::move(g));
  model::BudgetGrant reply{made.id, made.pid, context_bytes_, {}};
  std::vector<std::string> words;
  for (const GrantDevice& gd : made.devices) {
    const model::DeviceId id = pools_.device_id(gd.device);
    const std::string kernel = kernel_limit(made.pid, gd, id.pci_bus_id);
    words.push_back(format_bytes(gd.budget_bytes) + " on device " + std::to_string(gd.device) + " (kernel limit " +
                    kernel + ")");
    reply.devices.push_back({id, gd.budget_bytes, kernel});
  }
  spdlog::info("granted budget {} to pid {} ({}): {}", made.id, made.pid, made.user, join(words, ", "));
  return model::to_json(reply);
}

Reply BudgetRequests::claim(Request& r) {
  const proto::BudgetClaim want = proto::read_budget_claim(r.args);
  r.args.finish();
  if (budgets_.claimed_by(r.id))
    throw Error(Errc::busy, "this connection holds a budget grant already; one a connection");
  const Grant& g = budgets_.claim(want.grant, r.id, r.client.peer.pid, r.client.peer.uid);
  spdlog::info("budget {} claimed by pid {}", g.id, g.claimed_pid);
  model::BudgetGrant reply{g.id, g.claimed_pid, context_bytes_, {}};
  for (const GrantDevice& gd : g.devices) reply.devices.push_back({pools_.device_id(gd.device), gd.budget_bytes, ""});
  return model::to_json(reply);
}

Reply BudgetRequests::usage(Request& r) {
  const proto::BudgetUsage report = proto::read_budget_usage(r.args);
  r.args.finish();
  Grant* g = budgets_.claimed_by(r.id);
  if (!g) throw Error(Errc::not_found, "this connection holds no budget grant (send budget_claim first)");
  for (const proto::BudgetUse& use : report.devices) {
    const auto it =
        std::find_if(g->devices.begin(), g->devices.end(), [&](const GrantDevice& gd) { return gd.uuid == use.uuid; });
    if (it == g->devices.end())
      throw Error(Errc::bad_request, "budget " + g->id + " has no device " + valid_utf8(use.uuid));
    it->used_bytes = use.used_bytes;
    it->peak_bytes = std::max({it->peak_bytes, use.peak_bytes, use.used_bytes});
  }
  return Json::object();
}

}  // namespace cupool
