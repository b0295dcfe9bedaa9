#include "holder/names.h"

#include <algorithm>
#include <chrono>

#include "base/text.h"
#include "base/units.h"

namespace cupool {

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > kMaxName) return false;
  auto lower_digit = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!lower_digit(s[0])) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return lower_digit(c) || c == '.' || c == '_' || c == '-'; });
}

std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string location_text(const PoolProps& p) {
  switch (p.location) {
    case PoolProps::Location::device: return "device";
    case PoolProps::Location::host: return "host";
    case PoolProps::Location::host_numa: return "host_numa:" + std::to_string(p.location_id);
  }
  return "device";
}

std::string list_text(const std::vector<int>& v) {
  std::vector<std::string> parts;
  for (int i : v) parts.push_back(std::to_string(i));
  return "[" + join(parts, ", ") + "]";
}

}  // namespace cupool
