#include "holder/closer.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <system_error>
#include <thread>

namespace cupool {

struct Closer::State {
  std::mutex mu;
  struct Queue {
    std::deque<int> fds;
    bool worker = false;  // a thread serves this queue
    std::condition_variable ready;
  };
  std::map<uid_t, Queue> queues;
  std::size_t total = 0;                  // descriptors queued or being closed, all users
  std::map<uid_t, std::size_t> in_close;  // descriptors a thread is closing now, by user
};

namespace {

// A user's thread: closes its queue, then stays a second for more before it ends.
void serve(const std::shared_ptr<Closer::State>& state, uid_t uid) {
  // The holder takes signals through a signalfd; this thread must not take one instead.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  std::unique_lock<std::mutex> lock(state->mu);
  auto& q = state->queues[uid];
  while (true) {
    if (q.fds.empty() && !q.ready.wait_for(lock, std::chrono::seconds(1), [&] { return !q.fds.empty(); })) break;
    const int fd = q.fds.front();
    q.fds.pop_front();
    ++state->in_close[uid];
    lock.unlock();
    ::close(fd);  // may wait as long as the peer makes it
    lock.lock();
    --state->in_close[uid];
    --state->total;
  }
  q.worker = false;
  if (state->in_close[uid] == 0) state->in_close.erase(uid);
  state->queues.erase(uid);
}

}  // namespace

Closer::Closer() : state_(std::make_shared<State>()) {}

Closer::~Closer() = default;

void Closer::close(uid_t uid, int fd) {
  if (fd < 0) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  auto& q = state_->queues[uid];
  q.fds.push_back(fd);
  ++state_->total;
  if (q.worker) {
    q.ready.notify_one();
    return;
  }
  q.worker = true;
  try {
    std::thread(serve, state_, uid).detach();
  } catch (const std::system_error&) {
    // No thread to be had (the host is out of them): close here rather than keep it forever.
    q.worker = false;
    q.fds.pop_back();
    --state_->total;
    ::close(fd);
  }
}

std::size_t Closer::pending(uid_t uid) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::size_t n = 0;
  if (auto q = state_->queues.find(uid); q != state_->queues.end()) n += q->second.fds.size();
  if (auto c = state_->in_close.find(uid); c != state_->in_close.end()) n += c->second;
  return n;
}

std::size_t Closer::pending() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->total;
}

void Closer::make_close_quick(int fd) noexcept {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return;
  const linger now{1, 0};
  (void)::setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof now);
}

}  // namespace cupool
