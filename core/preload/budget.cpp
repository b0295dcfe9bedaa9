// The budget read from CUPOOL_EXEC_BUDGET, its account, and the holder's side of it: the grant
// claimed at the start and the usage reported while the process runs (docs in budget.h and
// budget_hooks.cpp).
#include "preload/budget.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "cupool/client.h"

namespace cupool::preload {

namespace {

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// "gpu-" and 8-4-4-4-12 hex digits (`text` in lower case).
bool is_uuid(const std::string& text) {
  if (text.size() != 40 || text.compare(0, 4, "gpu-") != 0) return false;
  for (std::size_t i = 4; i < text.size(); ++i) {
    const bool dash = i == 12 || i == 17 || i == 22 || i == 27;
    if (dash ? text[i] != '-' : !std::isxdigit(static_cast<unsigned char>(text[i]))) return false;
  }
  return true;
}

// A whole number of bytes, decimal digits only, at most 2^64-1.
std::optional<std::uint64_t> parse_bytes(const std::string& text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  std::uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const std::uint64_t digit = static_cast<std::uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

[[noreturn]] void stop_strict() {
  std::fprintf(stderr, "cupool exec: --strict: stopping pid %d\n", static_cast<int>(::getpid()));
  std::_Exit(3);
}

Ledger* read_budget() {
  const char* text = std::getenv("CUPOOL_EXEC_BUDGET");
  if (!text || !*text) return nullptr;
  std::string why;
  auto budgets = parse_budget(text, why);
  if (!budgets) {
    std::fprintf(stderr,
                 "cupool exec: CUPOOL_EXEC_BUDGET=%s is not valid (%s): it is UUID=BYTES[,UUID=BYTES...], each UUID "
                 "as cuDeviceGetUuid gives it (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, hex) and BYTES a whole "
                 "number of bytes, e.g. GPU-8d1c6a3e-0c11-4e4e-9f1e-1c2d3e4f5a6b=21474836480; no budget is in "
                 "force in pid %d\n",
                 text, why.c_str(), static_cast<int>(::getpid()));
    if (env_is("CUPOOL_EXEC_STRICT", "1")) stop_strict();
    return nullptr;
  }
  return new Ledger(std::move(*budgets));  // never freed: hooks may run during the process's exit
}

// What went wrong with a call to the holder, in words ("" when nothing did).
std::string refusal(int rc, cupool_conn* conn) {
  return rc == CUPOOL_OK ? "" : std::string(cupool_status_name(rc)) + ": " + cupool_last_error(conn);
}

// What the process holds on each device of its budget now, as cupool_budget_report takes it.
std::vector<cupool_budget_use> usage(const Ledger& ledger) {
  std::vector<cupool_budget_use> out(static_cast<std::size_t>(ledger.size()));
  for (int slot = 0; slot < ledger.size(); ++slot) {
    cupool_budget_use& u = out[static_cast<std::size_t>(slot)];
    std::snprintf(u.uuid, sizeof u.uuid, "%s", ledger.budget(slot).uuid.c_str());
    u.used_bytes = ledger.used(slot);
    u.peak_bytes = ledger.peak(slot);
  }
  return out;
}

bool same(const std::vector<cupool_budget_use>& a, const std::vector<cupool_budget_use>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](const auto& x, const auto& y) {
           return std::strcmp(x.uuid, y.uuid) == 0 && x.used_bytes == y.used_bytes && x.peak_bytes == y.peak_bytes;
         });
}

// The reporting thread: every 250 ms, the figures when they changed since the last report. A
// failed report is said once and ends the reports (the budget stays enforced here).
void report_usage(Ledger& ledger, cupool_conn* conn, std::vector<cupool_budget_use> last) {
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    std::vector<cupool_budget_use> now = usage(ledger);
    if (same(now, last)) continue;
    const int rc = cupool_budget_report(conn, now.data(), now.size());
    if (const std::string why = refusal(rc, conn); !why.empty()) {
      std::fprintf(stderr,
                   "cupool exec: pid %d stopped reporting its budget's usage to the holder (%s); the budget is still "
                   "enforced in the process\n",
                   static_cast<int>(::getpid()), why.c_str());
      return;
    }
    last = std::move(now);
  }
}

}  // namespace

std::optional<std::vector<DeviceBudget>> parse_budget(const std::string& text, std::string& why) {
  std::vector<DeviceBudget> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) {
      why = item.empty() ? "an empty entry" : "'" + item + "' has no '='";
      return std::nullopt;
    }
    const std::string uuid = lower(item.substr(0, eq));
    if (!is_uuid(uuid)) {
      why = "'" + item.substr(0, eq) + "' is not a device UUID";
      return std::nullopt;
    }
    const auto bytes = parse_bytes(item.substr(eq + 1));
    if (!bytes) {
      why = "'" + item.substr(eq + 1) + "' is not a whole number of bytes";
      return std::nullopt;
    }
    DeviceBudget budget{"GPU-" + uuid.substr(4), *bytes};
    for (const DeviceBudget& b : out)
      if (b.uuid == budget.uuid) {
        why = budget.uuid + " is given twice";
        return std::nullopt;
      }
    out.push_back(std::move(budget));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::string uuid_text(const unsigned char (&bytes)[16]) {
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", bytes[i]);
    out += hex;
  }
  return out;
}

Ledger::Ledger(std::vector<DeviceBudget> budgets) {
  for (DeviceBudget& b : budgets) {
    devices_.push_back(std::make_unique<Device>());
    devices_.back()->budget = std::move(b);
  }
}

int Ledger::slot_of(const std::string& uuid) const {
  const std::string key = lower(uuid);
  for (int slot = 0; slot < size(); ++slot)
    if (lower(at(slot).budget.uuid) == key) return slot;
  return -1;
}

bool Ledger::reserve(int slot, std::uint64_t bytes) {
  Device& d = at(slot);
  std::uint64_t used = d.used.load();
  do {
    if (bytes > d.budget.bytes || used > d.budget.bytes - bytes) return false;
  } while (!d.used.compare_exchange_weak(used, used + bytes));
  const std::uint64_t now = used + bytes;
  std::uint64_t peak = d.peak.load();
  while (now > peak && !d.peak.compare_exchange_weak(peak, now)) {
  }
  return true;
}

void Ledger::give_back(int slot, std::uint64_t bytes) { at(slot).used.fetch_sub(bytes); }

void Ledger::record(Kind kind, std::uint64_t key, Charge charge) {
  std::lock_guard<std::mutex> lock(mu_);
  (kind == Kind::address ? addresses_ : handles_)[key] = charge;
}

std::optional<Ledger::Charge> Ledger::take(Kind kind, std::uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& map = kind == Kind::address ? addresses_ : handles_;
  auto it = map.find(key);
  if (it == map.end()) return std::nullopt;
  const Charge charge = it->second;
  map.erase(it);
  return charge;
}

std::uint64_t Ledger::left(int slot) const {
  const std::uint64_t used = this->used(slot);
  const std::uint64_t total = budget(slot).bytes;
  return used >= total ? 0 : total - used;
}

Ledger* budget() {
  static Ledger* const ledger = read_budget();
  return ledger;
}

void start_budget() {
  Ledger* ledger = budget();
  const char* grant = std::getenv("CUPOOL_EXEC_GRANT");
  if (!ledger || !grant || !*grant) return;
  const bool strict = env_is("CUPOOL_EXEC_STRICT", "1");
  // The grant lives as long as this connection: it is kept (never disconnected) for the process's life.
  cupool_conn* conn = nullptr;
  int rc = cupool_connect(nullptr, "cupool exec budget", &conn);
  if (rc == CUPOOL_OK) rc = cupool_budget_claim(conn, grant);
  const std::string why = refusal(rc, conn);
  if (why.empty()) {
    std::thread(report_usage, std::ref(*ledger), conn, usage(*ledger)).detach();
    return;
  }
  std::fprintf(stderr,
               "cupool exec: pid %d could not claim its budget grant %s from the holder (%s); the budget is enforced "
               "in the process, unreported\n",
               static_cast<int>(::getpid()), grant, why.c_str());
  cupool_disconnect(conn);
  if (strict) stop_strict();
}

}  // namespace cupool::preload
