// The users and groups a config names, as the holder looks them up for `plan` and `apply`. A
// lookup may ask a directory service (nsswitch.conf: LDAP, SSSD) and take tens of milliseconds on
// the serving thread, and any peer may send a plan: so each answer is kept a minute, and the time
// a peer that is not an admin spends on lookups is bounded (a bucket of milliseconds, refilled as
// time passes). A name not looked up for want of time counts as existing, as check's own bound
// on the count does (config/check.h): check must not call a name unknown that it did not ask.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace cupool {

class AccountBook {
 public:
  using Clock = std::chrono::steady_clock;
  using Lookup = std::function<bool(const std::string&)>;
  struct Limits {
    std::chrono::milliseconds burst{100};      // a peer's bucket: lookups it may make at once
    std::chrono::milliseconds per_second{10};  // refilled each second (1% of the serving thread)
    std::chrono::seconds keep{60};             // how long an answer is kept
    std::size_t max_kept = 4096;               // answers kept (the oldest go first)
  };

  // `users` and `groups`: the name service's answers (base/accounts.h by default; tests give their own).
  AccountBook(Lookup users, Lookup groups, Limits limits);
  AccountBook();

  // Whether a user / group of that name exists, for a request of `uid` (`admin`: not bounded).
  bool user_exists(std::uint32_t uid, bool admin, const std::string& name);
  bool group_exists(std::uint32_t uid, bool admin, const std::string& name);
  // Lookups that were not made for want of a peer's time, ever (for tests and the log).
  std::uint64_t skipped() const { return skipped_; }

 private:
  bool exists(std::uint32_t uid, bool admin, char kind, const std::string& name);
  // The milliseconds `uid` has left now (its bucket refilled for the time since it was last used).
  double& budget(std::uint32_t uid, Clock::time_point now);

  Lookup users_;
  Lookup groups_;
  Limits limits_;
  struct Answer {
    bool exists = false;
    Clock::time_point at;
  };
  std::map<std::pair<char, std::string>, Answer> answers_;
  struct Bucket {
    double ms = 0;
    Clock::time_point at;
  };
  std::map<std::uint32_t, Bucket> buckets_;
  std::uint64_t skipped_ = 0;
};

}  // namespace cupool
