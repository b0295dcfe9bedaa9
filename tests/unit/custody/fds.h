// Descriptors for the custody tests: a memfd to keep, and the inode that says two are one file.
#pragma once

#include <doctest/doctest.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "base/fd.h"

namespace cupool::test {

inline Fd memfd(const char* name) {
  Fd fd(::memfd_create(name, MFD_CLOEXEC));
  REQUIRE(fd);
  return fd;
}

inline ino_t inode(int fd) {
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  return st.st_ino;
}

}  // namespace cupool::test
