// Budgets: the device memory the holder grants a process that `cupool exec --budget` starts
// (docs/budgets.md). A grant is asked for by exec, before it runs the command in its own process
// (same pid), and claimed by the preload inside that process (or the first of its descendants to
// initialise CUDA) over a connection it keeps: the grant lives as long as that connection, so a
// process killed with SIGKILL gives it back when the kernel closes the socket. A grant nobody has
// claimed lives as long as the process it was made for.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/fd.h"

namespace cupool {

// A grant's share of one device.
struct GrantDevice {
  int device = 0;  // the holder's ordinal
  std::string uuid;
  std::uint64_t budget_bytes = 0;
  std::uint64_t used_bytes = 0;  // what the process says it holds (budget_usage), counted by its preload
  std::uint64_t peak_bytes = 0;
};

struct Grant {
  std::string id;
  int pid = 0;  // the process exec ran the command in
  std::uint32_t uid = 0;
  std::string user;
  std::string command;
  std::vector<GrantDevice> devices;
  std::uint64_t claimed_by = 0;  // the connection that claimed it (0: not yet)
  int claimed_pid = 0;
  std::int64_t granted_at = 0;  // wall clock, seconds since the epoch
  Fd pidfd;                     // the process, to notice its end while nobody has claimed the grant
};

class Budgets {
 public:
  using Map = std::map<std::string, Grant>;
  // At most this many grants at once (each is a descriptor of the holder's while unclaimed).
  static constexpr std::size_t kMaxGrants = 4096;

  // Records `g` under a new id (returned in it). Throws limit_exceeded past kMaxGrants.
  const Grant& add(Grant g);
  // The grant `id` for connection `client`, peer `pid` of user `uid`: the process it was made for
  // or a descendant of it, of the same user, while nobody else has claimed it. Throws not_found,
  // not_permitted or busy, each saying why.
  Grant& claim(const std::string& id, std::uint64_t client, int pid, std::uint32_t uid);
  // The grant that connection `client` claimed, or null.
  Grant* claimed_by(std::uint64_t client);
  // Frees the grants that connection `client` claimed; returns them (for the log).
  std::vector<Grant> leave(std::uint64_t client);
  // Frees the unclaimed grants whose process has ended; returns them.
  std::vector<Grant> expire();

  std::size_t size() const { return grants_.size(); }
  Map::const_iterator begin() const { return grants_.begin(); }
  Map::const_iterator end() const { return grants_.end(); }

 private:
  Map grants_;
  std::uint64_t next_ = 0;
};

// Whether `pid` is `ancestor` or one of its descendants, by the parents /proc names (at most 64
// generations up). `proc` is the proc file system's root (tests give another).
bool descends_from(int pid, int ancestor, const std::string& proc = "/proc");

}  // namespace cupool
