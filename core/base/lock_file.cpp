#include "base/lock_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "base/error.h"
#include "base/text.h"

namespace cupool {

namespace {

bool same_file(const struct stat& a, const struct stat& b) { return a.st_ino == b.st_ino && a.st_dev == b.st_dev; }

}  // namespace

LockFile::LockFile(std::string path, const std::string& owner, const std::string& socket, mode_t mode)
    : path_(std::move(path)) {
  for (int attempt = 0;; ++attempt) {
    if (take(owner, socket, mode)) break;
    if (attempt == 8)
      throw Error(Errc::unreachable,
                  "the lock file " + path_ + " keeps being replaced; is another " + owner + " starting?");
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_.get(), 0) != 0 || ::pwrite(fd_.get(), me.data(), me.size(), 0) < 0) pid_error_ = errno_text();
}

LockFile::~LockFile() {
  if (!fd_) return;
  struct stat mine {};
  struct stat at {};
  if (::fstat(fd_.get(), &mine) == 0 && ::lstat(path_.c_str(), &at) == 0 && same_file(mine, at))
    ::unlink(path_.c_str());
}

bool LockFile::take(const std::string& owner, const std::string& socket, mode_t mode) {
  // O_NOFOLLOW: the owner (often root) truncates and writes this file; a symbolic link planted in
  // its place must not point that at another file. O_NONBLOCK: a FIFO planted there must not make
  // the open wait; only a regular file is taken.
  fd_.reset(::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, mode));
  if (!fd_)
    throw Error(Errc::unreachable,
                "can't open the lock file " + path_ + ": " + errno_text() + " (is the socket directory writable?)");
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0 || !S_ISREG(st.st_mode))
    throw Error(Errc::unreachable,
                "the lock file " + path_ + " is not a regular file; remove it, or choose another --socket");
  if (::flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    // The pid its owner wrote: read from the file already open, at most a few bytes, digits only
    // (anyone who can write the directory can write the file).
    char buf[24] = {};
    const ssize_t n = ::pread(fd_.get(), buf, sizeof buf - 1, 0);
    std::string pid;
    for (ssize_t i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; ++i) pid += buf[i];
    throw Error(Errc::unreachable, "another " + owner + (pid.empty() ? std::string() : " (pid " + pid + ")") +
                                       " is serving " + socket + "; stop it first, or use another --socket");
  }
  struct stat at {};
  if (::lstat(path_.c_str(), &at) == 0 && same_file(at, st)) return true;
  fd_.reset();  // removed by the owner that had it, after we opened it
  return false;
}

}  // namespace cupool
