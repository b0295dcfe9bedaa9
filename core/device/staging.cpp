// Staging slots on huge pages, pinned, with the driver's own pinned memory as the fallback (staging.h).
#include "device/staging.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace cupool {

const char* to_string(Staging staging) {
  switch (staging) {
    case Staging::huge_pages: return "huge_pages";
    case Staging::pinned: return "pinned";
    case Staging::host: return "host";
  }
  return "host";
}

unsigned char* map_huge(std::uint64_t bytes, std::string& why) {
  // A huge page more than asked, so that a 2 MiB boundary lies inside; the ends are given back.
  const std::uint64_t mapped = bytes + kHugePage;
  void* raw =
      ::mmap(nullptr, static_cast<std::size_t>(mapped), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    why = std::string("mmap of ") + std::to_string(bytes) + " bytes failed: " + std::strerror(errno);
    return nullptr;
  }
  const auto at = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (at + kHugePage - 1) & ~static_cast<std::uintptr_t>(kHugePage - 1);
  if (aligned > at) ::munmap(raw, aligned - at);
  const std::uintptr_t end = at + mapped;
  if (end > aligned + bytes) ::munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
  auto* p = reinterpret_cast<unsigned char*>(aligned);
  if (::madvise(p, static_cast<std::size_t>(bytes), MADV_HUGEPAGE) != 0) {
    why = std::string("madvise(MADV_HUGEPAGE) failed: ") + std::strerror(errno);
    unmap_huge(p, bytes);
    return nullptr;
  }
  // Touched now, a huge page at a time where the kernel has them, before the driver pins the pages.
  for (std::uint64_t i = 0; i < bytes; i += 4096) p[i] = 0;
  return p;
}

void unmap_huge(unsigned char* p, std::uint64_t bytes) noexcept {
  if (p) ::munmap(p, static_cast<std::size_t>(bytes));
}

StagingSlots::StagingSlots(HostPinner& pinner, unsigned count, std::uint64_t slot_bytes) : pinner_(pinner) {
  stride_ = (slot_bytes + 4095) & ~std::uint64_t{4095};
  const std::uint64_t need = stride_ * count;
  const std::uint64_t huge = (need + kHugePage - 1) & ~(kHugePage - 1);
  if (unsigned char* p = map_huge(huge, note_)) {
    if (pinner_.pin(p, huge, note_)) {
      base_ = p;
      bytes_ = huge;
      staging_ = Staging::huge_pages;
      return;
    }
    unmap_huge(p, huge);
  }
  base_ = static_cast<unsigned char*>(pinner_.allocate(need));
  bytes_ = need;
  staging_ = Staging::pinned;
}

StagingSlots::~StagingSlots() {
  if (staging_ == Staging::huge_pages) {
    pinner_.unpin(base_);
    unmap_huge(base_, bytes_);
  } else {
    pinner_.release(base_);
  }
}

}  // namespace cupool
