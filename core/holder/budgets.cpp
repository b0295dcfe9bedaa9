#include "holder/budgets.h"

#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <fstream>

#include "base/error.h"

namespace cupool {

namespace {

// A descriptor that becomes readable when `pid` ends (pidfd_open, Linux 5.3); none where the
// kernel lacks it (then the process is looked for by its pid).
Fd open_pidfd(int pid) {
#ifdef SYS_pidfd_open
  return Fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
#else
  (void)pid;
  return Fd();
#endif
}

bool ended(const Grant& g) {
  if (g.pidfd) {
    pollfd p{g.pidfd.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }
  return ::kill(g.pid, 0) != 0 && errno == ESRCH;
}

// 16 random hex digits: a grant's id can't be guessed (it is also bound to a process tree).
std::string random_hex() {
  unsigned char bytes[8] = {};
  if (::getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes))
    throw Error(Errc::internal, "getrandom failed");
  static const char kHex[] = "0123456789abcdef";
  std::string text;
  for (const unsigned char b : bytes) {
    text += kHex[b >> 4];
    text += kHex[b & 15];
  }
  return text;
}

// The parent of `pid` from PROC/PID/stat (the field after the command's closing parenthesis and
// the state); 0 when it can't be read.
int parent_of(int pid, const std::string& proc) {
  std::ifstream in(proc + "/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  int parent = 0;
  char state = 0;
  if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &parent) != 2) return 0;
  return parent;
}

}  // namespace

bool descends_from(int pid, int ancestor, const std::string& proc) {
  for (int generation = 0; generation < 64 && pid > 1; ++generation) {
    if (pid == ancestor) return true;
    pid = parent_of(pid, proc);
  }
  return pid == ancestor;
}

const Grant& Budgets::add(Grant g) {
  if (grants_.size() >= kMaxGrants)
    throw Error(Errc::limit_exceeded,
                "the holder has " + std::to_string(kMaxGrants) + " budgets granted already; no more");
  g.id = "b" + std::to_string(++next_) + "-" + random_hex();
  g.granted_at = static_cast<std::int64_t>(std::time(nullptr));
  if (!g.pidfd) g.pidfd = open_pidfd(g.pid);
  const std::string id = g.id;
  return grants_.emplace(id, std::move(g)).first->second;
}

Grant& Budgets::claim(const std::string& id, std::uint64_t client, int pid, std::uint32_t uid) {
  const auto it = grants_.find(id);
  if (it == grants_.end())
    throw Error(Errc::not_found, "no budget grant \"" + id +
                                     "\" (it ended with its process, or the holder restarted since it was granted)");
  Grant& g = it->second;
  if (uid != g.uid)
    throw Error(Errc::not_permitted,
                "budget grant " + id + " belongs to user " + (g.user.empty() ? std::to_string(g.uid) : g.user));
  if (!descends_from(pid, g.pid))
    throw Error(Errc::not_permitted, "budget grant " + id + " was made for pid " + std::to_string(g.pid) +
                                         " and its descendants; pid " + std::to_string(pid) + " is neither");
  if (g.claimed_by != 0)
    throw Error(Errc::busy, "budget grant " + id + " is held by pid " + std::to_string(g.claimed_pid) +
                                " already (one process of a command holds its budget: the first that "
                                "initialises CUDA)");
  g.claimed_by = client;
  g.claimed_pid = pid;
  g.pidfd = Fd();  // the connection says when it ends now
  return g;
}

Grant* Budgets::claimed_by(std::uint64_t client) {
  for (auto& [id, g] : grants_)
    if (g.claimed_by == client) return &g;
  return nullptr;
}

std::vector<Grant> Budgets::leave(std::uint64_t client) {
  std::vector<Grant> gone;
  for (auto it = grants_.begin(); it != grants_.end();) {
    if (it->second.claimed_by == client) {
      gone.push_back(std::move(it->second));
      it = grants_.erase(it);
    } else {
      ++it;
    }
  }
  return gone;
}

std::vector<Grant> Budgets::expire() {
  std::vector<Grant> gone;
  for (auto it = grants_.begin(); it != grants_.end();) {
    if (it->second.claimed_by == 0 && ended(it->second)) {
      gone.push_back(std::move(it->second));
      it = grants_.erase(it);
    } else {
      ++it;
    }
  }
  return gone;
}

}  // namespace cupool
