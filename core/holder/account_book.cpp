#include "holder/account_book.h"

#include <algorithm>
#include <utility>

#include "base/accounts.h"

namespace cupool {

AccountBook::AccountBook(Lookup users, Lookup groups, Limits limits)
    : users_(std::move(users)), groups_(std::move(groups)), limits_(limits) {}

AccountBook::AccountBook() : AccountBook(cupool::user_exists, cupool::group_exists, Limits{}) {}

bool AccountBook::user_exists(std::uint32_t uid, bool admin, const std::string& name) {
  return exists(uid, admin, 'u', name);
}

bool AccountBook::group_exists(std::uint32_t uid, bool admin, const std::string& name) {
  return exists(uid, admin, 'g', name);
}

double& AccountBook::budget(std::uint32_t uid, Clock::time_point now) {
  const double burst = static_cast<double>(limits_.burst.count());
  auto [it, made] = buckets_.try_emplace(uid, Bucket{burst, now});
  Bucket& b = it->second;
  if (!made) {
    const double seconds = std::chrono::duration<double>(now - b.at).count();
    b.ms = std::min(burst, b.ms + seconds * static_cast<double>(limits_.per_second.count()));
    b.at = now;
  }
  // Users whose buckets are full again need no entry: the map stays as small as the busy peers.
  if (buckets_.size() > limits_.max_kept)
    for (auto i = buckets_.begin(); i != buckets_.end();)
      i = i->first != uid && i->second.ms >= burst ? buckets_.erase(i) : std::next(i);
  return b.ms;
}

bool AccountBook::exists(std::uint32_t uid, bool admin, char kind, const std::string& name) {
  const auto now = Clock::now();
  const auto key = std::make_pair(kind, name);
  if (const auto it = answers_.find(key); it != answers_.end()) {
    if (now - it->second.at < limits_.keep) return it->second.exists;
    answers_.erase(it);
  }
  double* left = admin ? nullptr : &budget(uid, now);
  if (left && *left <= 0) {
    ++skipped_;
    return true;
  }
  const bool found = kind == 'u' ? users_(name) : groups_(name);
  const auto after = Clock::now();
  if (left) *left -= std::chrono::duration<double, std::milli>(after - now).count();
  if (answers_.size() >= limits_.max_kept) {
    auto oldest = answers_.begin();
    for (auto i = answers_.begin(); i != answers_.end(); ++i)
      if (i->second.at < oldest->second.at) oldest = i;
    answers_.erase(oldest);
  }
  answers_[key] = Answer{found, after};
  return found;
}

}  // namespace cupool
