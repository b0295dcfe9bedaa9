// The staging slots of one loader thread (file_load.h), in host memory the GPU can copy from.
// Measured on an H200 (issue 38): slots on 2 MiB transparent huge pages, registered with the
// driver, took 2 MiB chunks from the page cache to the GPU at 45.9 GB/s with 16 threads, slots of
// cuMemHostAlloc at 38-41: the kernel hands the copy 2 MiB pages, not 512 of 4 KiB. So the slots are
// an anonymous mapping on 2 MiB boundaries, advised to huge pages, touched and then pinned
// (registered); where any of that fails, pinned memory of the driver's own is used instead.
#pragma once

#include <cstdint>
#include <string>

namespace cupool {

// What a load's staging slots were: huge pages pinned by registration (huge_pages), pinned memory
// allocated by the driver (pinned: the fallback), or ordinary memory nothing pinned (host: the
// simulated node's and the tests' slots).
enum class Staging { huge_pages, pinned, host };
const char* to_string(Staging staging);

constexpr std::uint64_t kHugePage = 2ULL << 20;

// The driver's side of staging memory: pinning memory the loader mapped, or allocating its own.
class HostPinner {
 public:
  virtual ~HostPinner() = default;
  // Pins [p, p + bytes) for the GPU's copies; false (nothing pinned, `why` says why) when refused.
  virtual bool pin(void* p, std::uint64_t bytes, std::string& why) noexcept = 0;
  virtual void unpin(void* p) noexcept = 0;
  // Pinned memory of `bytes` bytes, at least 4 KiB-aligned; throws (CudaError) when there is none.
  virtual void* allocate(std::uint64_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
};

// `count` slots of `slot_bytes` each, in one region: on huge pages pinned by `pinner` where that
// works, else one allocation of `pinner`'s. The region is count * slot_bytes (each slot rounded up
// to 4 KiB), rounded up to 2 MiB on huge pages. Unpinned and freed when this goes.
class StagingSlots {
 public:
  StagingSlots(HostPinner& pinner, unsigned count, std::uint64_t slot_bytes);
  StagingSlots(const StagingSlots&) = delete;
  StagingSlots& operator=(const StagingSlots&) = delete;
  ~StagingSlots();
  unsigned char* slot(unsigned i) const { return base_ + i * stride_; }
  Staging staging() const { return staging_; }
  // Why the slots are not on huge pages (mmap, madvise or the pinner's refusal); empty when they are.
  const std::string& note() const { return note_; }
  std::uint64_t bytes() const { return bytes_; }  // the region's size

 private:
  HostPinner& pinner_;
  unsigned char* base_ = nullptr;
  std::uint64_t stride_ = 0;
  std::uint64_t bytes_ = 0;
  Staging staging_ = Staging::pinned;
  std::string note_;
};

// Anonymous memory of `bytes` (a multiple of kHugePage) on a 2 MiB boundary, advised to
// transparent huge pages (MADV_HUGEPAGE) and touched; nullptr (`why` says why) when it cannot be.
// Free it with unmap_huge.
unsigned char* map_huge(std::uint64_t bytes, std::string& why);
void unmap_huge(unsigned char* p, std::uint64_t bytes) noexcept;

}  // namespace cupool
