#include "cli/exec_budget.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "base/error.h"
#include "base/text.h"
#include "base/units.h"
#include "cli/holder_client.h"
#include "device/node.h"
#include "model/fields.h"
#include "protocol/messages.h"

namespace cupool::cli {

namespace {

[[noreturn]] void bad(const std::string& value, const std::string& why) {
  throw Error(Errc::invalid_input, "--budget " + value + ": " + why +
                                       " (write SIZE or PCT% for every device the command uses, or DEVICE=SIZE "
                                       "for one, e.g. --budget 20GiB, --budget 40%, --budget 0=20GiB,1=10GiB)");
}

BudgetSpec parse_one(const std::string& item) {
  BudgetSpec spec;
  spec.text = item;
  std::string amount = item;
  if (const std::size_t eq = item.find('='); eq != std::string::npos) {
    spec.device = item.substr(0, eq);
    amount = item.substr(eq + 1);
    std::string why;
    if (spec.device->empty() || !parse_device_selector(*spec.device, &why))
      bad(item, "'" + *spec.device + "' is not a device (" + (why.empty() ? "empty" : why) + ")");
  }
  if (!amount.empty() && amount.back() == '%') {
    const auto fraction = parse_percent(amount);
    if (!fraction) bad(item, "'" + amount + "' is not a percentage above 0 and at most 100");
    spec.percent = *fraction * 100;
    return spec;
  }
  std::string why;
  if (!amount.empty() && amount.find_first_not_of("0123456789") == std::string::npos)
    bad(item, "'" + amount + "' has no unit");
  spec.bytes = parse_size(amount, &why);
  if (!spec.bytes) bad(item, "'" + amount + "' is not a size (" + why + ")");
  if (*spec.bytes == 0) bad(item, "a budget of 0 bytes leaves the command nothing");
  return spec;
}

// The devices the command may use, as the holder numbers them: CUDA_VISIBLE_DEVICES's (by ordinal
// or UUID), else all of them.
std::vector<int> visible_devices(const std::vector<model::DeviceId>& node) {
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  std::vector<int> out;
  if (!env) {
    for (const model::DeviceId& d : node) out.push_back(d.device);
    return out;
  }
  std::string list = env;
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    std::string item = list.substr(at, end - at);
    at = end + 1;
    item.erase(0, item.find_first_not_of(' '));
    if (item.empty()) break;  // the driver stops at the first it can't read
    int found = -1;
    if (item.find_first_not_of("0123456789") == std::string::npos) {
      found = std::atoi(item.c_str());
      if (found >= static_cast<int>(node.size())) found = -1;
    } else if (starts_with(to_lower(item), "gpu-")) {
      for (const model::DeviceId& d : node)
        if (starts_with(to_lower(d.uuid), to_lower(item))) found = d.device;
    } else {
      throw Error(Errc::invalid_input, "CUDA_VISIBLE_DEVICES names '" + item +
                                           "', which a budget can't be given for (MIG instances are not covered: "
                                           "docs/budgets.md)");
    }
    if (found < 0) break;
    out.push_back(found);
  }
  return out;
}

// The holder's ordinal of the device `text` names (an ordinal, a UUID or a PCI bus id).
int holder_device(const std::vector<model::DeviceId>& node, const std::string& text) {
  const auto selector = parse_device_selector(text);
  for (const model::DeviceId& d : node) {
    if (!selector) break;
    if ((selector->kind == DeviceSelector::Kind::index && selector->index == d.device) ||
        (selector->kind == DeviceSelector::Kind::uuid && iequals(d.uuid, selector->normalized)) ||
        (selector->kind == DeviceSelector::Kind::pci_bus_id && d.pci_bus_id == selector->normalized))
      return d.device;
  }
  std::vector<std::string> names;
  for (const model::DeviceId& d : node) names.push_back(std::to_string(d.device) + " (" + d.uuid + ")");
  throw Error(Errc::invalid_input,
              "--budget: the holder's node has no device '" + text + "'; it has " + join(names, ", "));
}

std::vector<proto::BudgetAsk> asks_of(const BudgetRequest& req, const std::vector<model::DeviceId>& node) {
  const std::vector<int> visible = visible_devices(node);
  std::vector<proto::BudgetAsk> asks;
  auto add = [&](int device, std::optional<std::uint64_t> bytes, std::optional<double> percent,
                 const std::string& text) {
    if (std::find(visible.begin(), visible.end(), device) == visible.end())
      throw Error(Errc::invalid_input,
                  "--budget " + text + ": the command does not use device " + std::to_string(device) +
                      " (CUDA_VISIBLE_DEVICES=" +
                      (std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "") + ")");
    for (proto::BudgetAsk& a : asks)
      if (a.device == device) {
        a.budget_bytes = bytes;  // a later value for the same device wins
        a.budget_percent = percent;
        return;
      }
    asks.push_back({device, bytes, percent});
  };
  if (!req.specs.empty()) {
    for (const BudgetSpec& s : req.specs) {
      if (s.device) {
        add(holder_device(node, *s.device), s.bytes, s.percent, s.text);
        continue;
      }
      if (visible.empty()) throw Error(Errc::invalid_input, "--budget " + s.text + ": the command may use no device");
      for (int d : visible) add(d, s.bytes, s.percent, s.text);
    }
  } else {
    for (const auto& [uuid, bytes] : req.from_config) add(holder_device(node, uuid), bytes, std::nullopt, "");
  }
  return asks;
}

}  // namespace

std::vector<BudgetSpec> parse_budget_specs(const std::vector<std::string>& values) {
  std::vector<BudgetSpec> out;
  for (const std::string& value : values) {
    std::size_t at = 0;
    while (at <= value.size()) {
      const std::size_t end = std::min(value.find(',', at), value.size());
      const std::string item = value.substr(at, end - at);
      if (item.empty()) bad(value, "an empty item");
      out.push_back(parse_one(item));
      at = end + 1;
    }
  }
  return out;
}

void ask_for_budget(const BudgetRequest& req) {
  HolderClient holder = HolderClient::connect(req.socket, "cupool exec");
  const model::Ledger before = model::read_json<model::Ledger>(holder.request(proto::to_json(proto::LedgerAsk{})));
  std::vector<model::DeviceId> node;
  for (const model::LedgerDevice& d : before.devices) node.push_back(d.id);
  proto::BudgetGrant ask;
  ask.devices = asks_of(req, node);
  ask.command = utf8_prefix(req.command, proto::kMaxCommand);  // what the ledger shows of a long one
  if (ask.devices.empty()) throw Error(Errc::invalid_input, "--budget: no device to give a budget on");

  using clock = std::chrono::steady_clock;
  const auto started = clock::now();
  bool said = false;
  nlohmann::ordered_json reply;
  while (true) {
    reply = holder.request_raw(proto::to_json(ask));
    if (proto::ok_of(reply).value_or(false)) break;
    const model::ErrorInfo error = proto::error_of_reply(reply).value_or(model::ErrorInfo{});
    const double waited = std::chrono::duration<double>(clock::now() - started).count();
    if (error.code != "out_of_memory" || !req.wait || (*req.wait > 0 && waited >= *req.wait)) {
      if (said && error.code == "out_of_memory")
        std::cerr << "cupool exec: waited " << static_cast<long>(waited) << " s for room; none came\n";
      throw_reply_error(reply, "budget_grant", "cupool exec --budget");
    }
    if (!said && !req.quiet)
      std::cerr << "cupool exec: waiting for room"
                << (*req.wait > 0 ? " (at most " + std::to_string(static_cast<long>(*req.wait)) + " s)" : "") << ": "
                << error.message << "\n";
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  const model::BudgetGrant granted = model::read_json<model::BudgetGrant>(reply);
  std::string env, words;
  for (const model::BudgetDevice& d : granted.devices) {
    env += (env.empty() ? "" : ",") + d.id.uuid + "=" + std::to_string(d.budget_bytes);
    words += (words.empty() ? "" : ", ") + format_bytes(d.budget_bytes) + " on device " + std::to_string(d.id.device);
    // Where the kernel enforces it too (the dmem cgroup controller), say so.
    if (starts_with(d.kernel_limit, "dmem.max")) words += " (and the kernel's " + d.kernel_limit + ")";
  }
  ::setenv("CUPOOL_EXEC_BUDGET", env.c_str(), 1);
  ::setenv("CUPOOL_EXEC_GRANT", granted.grant.c_str(), 1);
  ::setenv("CUPOOL_SOCKET", holder.socket().c_str(), 1);
  if (!req.quiet)
    std::cerr << "cupool exec: budget " << granted.grant << " for pid " << ::getpid() << ": " << words << "\n";
}

}  // namespace cupool::cli
