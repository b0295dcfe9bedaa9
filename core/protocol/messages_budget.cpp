// The budget requests (messages.h, "budgets"): written by exec and the ledger verb, read by the
// holder. The preload, which may use only the client library's C API, writes its two by hand in
// the same shape (core/preload/).
#include <cmath>

#include "protocol/messages.h"

namespace cupool::proto {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(Errc::bad_request, what); }

// The array `key` of at most `max` objects; each read by `read` with its index.
template <class Read>
void each_object(Args& a, const char* key, std::size_t max, Read read) {
  const Json* list = a.value(key);
  if (!list) bad(std::string("missing \"") + key + "\"");
  if (!list->is_array() || list->empty() || list->size() > max)
    bad(std::string("\"") + key + "\" must be an array of 1 to " + std::to_string(max) + " objects");
  for (std::size_t i = 0; i < list->size(); ++i) {
    const Json& item = (*list)[i];
    const std::string where = std::string(key) + "[" + std::to_string(i) + "]";
    if (!item.is_object()) bad("\"" + where + "\" must be an object");
    Args inner(item);
    read(inner, where);
    try {
      inner.finish();
    } catch (const Error& e) {
      bad("in \"" + where + "\": " + e.what());
    }
  }
}

}  // namespace

Json to_json(const BudgetGrant& v) {
  Json out = {{"op", "budget_grant"}};
  Json devices = Json::array();
  for (const BudgetAsk& d : v.devices) {
    Json one = {{"device", d.device}};
    if (d.budget_bytes) one["budget_bytes"] = *d.budget_bytes;
    if (d.budget_percent) one["budget_percent"] = *d.budget_percent;
    devices.push_back(std::move(one));
  }
  out["devices"] = std::move(devices);
  out["command"] = v.command;
  return out;
}

Json to_json(const BudgetClaim& v) { return {{"op", "budget_claim"}, {"grant", v.grant}}; }

Json to_json(const BudgetUsage& v) {
  Json devices = Json::array();
  for (const BudgetUse& d : v.devices)
    devices.push_back({{"uuid", d.uuid}, {"used_bytes", d.used_bytes}, {"peak_bytes", d.peak_bytes}});
  return {{"op", "budget_usage"}, {"devices", std::move(devices)}};
}

Json to_json(const LedgerAsk&) { return {{"op", "ledger"}}; }

BudgetGrant read_budget_grant(Args& a) {
  BudgetGrant v;
  each_object(a, "devices", kMaxBudgetDevices, [&](Args& d, const std::string& where) {
    BudgetAsk ask;
    ask.device = d.device("device", -1);
    if (ask.device < 0) bad("\"" + where + "\" needs \"device\", an ordinal");
    ask.budget_bytes = d.optional_u64("budget_bytes", 1, kMaxAllocation);
    if (const Json* percent = d.value("budget_percent")) {
      if (!percent->is_number() || !std::isfinite(percent->get<double>()) || percent->get<double>() <= 0 ||
          percent->get<double>() > 100)
        bad("\"" + where + ".budget_percent\" must be a number above 0 and at most 100");
      ask.budget_percent = percent->get<double>();
    }
    if (ask.budget_bytes.has_value() == ask.budget_percent.has_value())
      bad("\"" + where + "\" needs one of \"budget_bytes\" and \"budget_percent\"");
    for (const BudgetAsk& other : v.devices)
      if (other.device == ask.device) bad("device " + std::to_string(ask.device) + " is named twice");
    v.devices.push_back(ask);
  });
  v.command = a.optional_string("command", kMaxCommand).value_or("");
  return v;
}

BudgetClaim read_budget_claim(Args& a) { return {a.string("grant", kMaxName)}; }

BudgetUsage read_budget_usage(Args& a) {
  BudgetUsage v;
  each_object(a, "devices", kMaxBudgetDevices, [&](Args& d, const std::string&) {
    BudgetUse use;
    use.uuid = d.string("uuid", kMaxName);
    use.used_bytes = d.u64("used_bytes", 0, kMaxAllocation);
    use.peak_bytes = d.u64("peak_bytes", 0, kMaxAllocation);
    v.devices.push_back(use);
  });
  return v;
}

LedgerAsk read_ledger(Args&) { return {}; }

}  // namespace cupool::proto
