#include "device/staging.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

using cupool::Staging;
using cupool::StagingSlots;

// A driver that pins (or refuses to) and allocates from the heap, recording what it was asked.
struct TestPinner : cupool::HostPinner {
  bool refuse = false;
  std::vector<std::string> calls;
  void* pinned = nullptr;
  std::uint64_t pinned_bytes = 0;
  std::vector<unsigned char> own;

  bool pin(void* p, std::uint64_t bytes, std::string& why) noexcept override {
    calls.emplace_back("pin");
    if (refuse) {
      why = "cuMemHostRegister failed: CUDA_ERROR_NOT_SUPPORTED";
      return false;
    }
    pinned = p;
    pinned_bytes = bytes;
    return true;
  }
  void unpin(void* p) noexcept override {
    calls.emplace_back("unpin");
    CHECK(p == pinned);
  }
  void* allocate(std::uint64_t bytes) override {
    calls.emplace_back("allocate " + std::to_string(bytes));
    own.assign(bytes, 0);
    return own.data();
  }
  void release(void* p) noexcept override {
    calls.emplace_back("release");
    CHECK(p == own.data());
  }
};

// Whether this kernel takes MADV_HUGEPAGE (one built without transparent huge pages refuses it:
// the slots then fall back, which the tests below with a refusing pinner cover).
bool huge_pages_here() {
  std::string why;
  unsigned char* p = cupool::map_huge(cupool::kHugePage, why);
  cupool::unmap_huge(p, cupool::kHugePage);
  if (!p) MESSAGE("no huge pages here: " << why);
  return p != nullptr;
}

}  // namespace

TEST_CASE("staging slots lie on 2 MiB huge pages, pinned once, and are unpinned and unmapped when they go") {
  if (!huge_pages_here()) return;
  TestPinner pinner;
  {
    // Two slots of a 2 MiB chunk: exactly two huge pages, the second slot on the second.
    StagingSlots slots(pinner, 2, 2ULL << 20);
    CHECK(slots.staging() == Staging::huge_pages);
    CHECK(slots.note().empty());
    CHECK(reinterpret_cast<std::uintptr_t>(slots.slot(0)) % cupool::kHugePage == 0);
    CHECK(slots.slot(1) == slots.slot(0) + (2ULL << 20));
    CHECK(slots.bytes() == 4ULL << 20);
    CHECK(pinner.pinned == slots.slot(0));
    CHECK(pinner.pinned_bytes == 4ULL << 20);
    std::memset(slots.slot(1), 7, 2ULL << 20);  // every byte of both slots is there
    CHECK(slots.slot(1)[(2ULL << 20) - 1] == 7);
  }
  CHECK(pinner.calls == std::vector<std::string>{"pin", "unpin"});
}

TEST_CASE("staging slots for O_DIRECT keep 4 KiB alignment and round the region up to huge pages") {
  TestPinner pinner;
  StagingSlots slots(pinner, 2, (8ULL << 20) + 2 * 4096);
  if (!huge_pages_here()) return;
  CHECK(slots.staging() == Staging::huge_pages);
  CHECK(reinterpret_cast<std::uintptr_t>(slots.slot(1)) % 4096 == 0);
  CHECK(slots.slot(1) - slots.slot(0) == (8LL << 20) + 2 * 4096);
  CHECK(slots.bytes() == 18ULL << 20);  // 2 x (8 MiB + 8 KiB), rounded up to 2 MiB
}

TEST_CASE("staging slots fall back to the driver's own pinned memory when it will not register pages") {
  TestPinner pinner;
  pinner.refuse = true;
  {
    StagingSlots slots(pinner, 2, 5000);
    CHECK(slots.staging() == Staging::pinned);
    CHECK(slots.note() == "cuMemHostRegister failed: CUDA_ERROR_NOT_SUPPORTED");
    CHECK(slots.slot(0) == pinner.own.data());
    CHECK(slots.slot(1) == pinner.own.data() + 8192);  // each slot rounded up to 4 KiB
  }
  CHECK(pinner.calls == std::vector<std::string>{"pin", "allocate 16384", "release"});
}

TEST_CASE("map_huge says why it cannot map (the slots then come from the driver)") {
  std::string why;
  CHECK(cupool::map_huge(1ULL << 62, why) == nullptr);  // more than any address space
  CHECK(why.find("mmap of") == 0);
}

TEST_CASE("to_string(Staging) gives the words the reports use") {
  CHECK(std::string(to_string(Staging::huge_pages)) == "huge_pages");
  CHECK(std::string(to_string(Staging::pinned)) == "pinned");
  CHECK(std::string(to_string(Staging::host)) == "host");
}
