// The simulated node, Transfers: copies into the simulated memory, from host memory and from files.
#include "device/sim/transfers.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <utility>

#include "base/error.h"
#include "base/fd.h"
#include "device/sim/helpers.h"
#include "device/staging.h"

namespace cupool::sim {

std::uint8_t* SimTransfers::host_view(std::uint64_t address, std::uint64_t bytes, const char* api) {
  if (bytes > UINT64_MAX - address) throw invalid_value(api, "the range wraps around");
  // An exported allocation mapped here.
  if (auto m = s_.mappings().upper_bound(address); m != s_.mappings().begin()) {
    --m;
    if (address - m->first <= m->second.size && bytes <= m->second.size - (address - m->first))
      return reinterpret_cast<std::uint8_t*>(static_cast<std::uintptr_t>(address));
  }
  // An imported pointer: a host address inside an imported arena.
  for (auto& [handle, p] : s_.pools()) {
    if (!p.imported) continue;
    auto it = p.imported_pointers.upper_bound(address);
    if (it == p.imported_pointers.begin()) continue;
    --it;
    if (address - it->first <= it->second && bytes <= it->second - (address - it->first))
      return reinterpret_cast<std::uint8_t*>(static_cast<std::uintptr_t>(address));
  }
  // An allocation of an own pool: (pool << kAddressBits) | offset.
  auto found = s_.pools().find(address >> kAddressBits);
  if (found != s_.pools().end() && !found->second.imported) {
    Pool& p = found->second;
    auto it = p.allocations.upper_bound(address);
    if (it != p.allocations.begin()) {
      --it;
      const std::uint64_t bytes_in = it->second.bytes;
      if (address - it->first <= bytes_in && bytes <= bytes_in - (address - it->first)) {
        if (!p.mapping) {
          const auto size = static_cast<std::size_t>(p.arena.size);
          void* base =
              p.memfd >= 0
                  ? ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, p.memfd, 0)
                  : ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
          if (base == MAP_FAILED)
            throw system_error(api, "mmap of the pool's arena", errno, "CUDA_ERROR_OUT_OF_MEMORY");
          p.mapping = base;
        }
        return static_cast<std::uint8_t*>(p.mapping) + (address & (kMaxArena - 1));
      }
    }
  }
  throw invalid_value(api, "the address is not in memory this process can address");
}

void SimTransfers::write(int dev, std::uint64_t address, const void* source, std::uint64_t bytes) {
  s_.enter("write", std::to_string(dev) + "," + std::to_string(bytes));
  std::uint8_t* target = host_view(address, bytes, "cuMemcpyHtoD");
  if (bytes) std::memcpy(target, source, static_cast<std::size_t>(bytes));
}

// The simulated driver's staging memory: "pinning" always works unless the test injected a
// failure of host_register (then its words are the reason, and the slots come from allocate).
class SimPinner : public HostPinner {
 public:
  explicit SimPinner(std::string refusal) : refusal_(std::move(refusal)) {}
  bool pin(void*, std::uint64_t, std::string& why) noexcept override {
    if (refusal_.empty()) return true;
    try {
      why = refusal_;
    } catch (...) {
      why.clear();
    }
    return false;
  }
  void unpin(void*) noexcept override {}
  void* allocate(std::uint64_t bytes) override {
    void* p = nullptr;
    if (::posix_memalign(&p, kDirectAlign, static_cast<std::size_t>(bytes)) != 0) throw std::bad_alloc();
    return p;
  }
  void release(void* p) noexcept override { std::free(p); }

 private:
  std::string refusal_;
};

// The same loader as the real node's (file_load.cpp: threads, chunks, O_DIRECT, slots on huge
// pages or the fallback), with the slots copied straight into the simulated device's memory.
class MemorySink : public LoadSink {
 public:
  MemorySink(const std::string& refusal, std::uint64_t slot_bytes)
      : pinner_(refusal), slots_(pinner_, kSlots, slot_bytes) {}
  unsigned char* slot(unsigned i) override { return slots_.slot(i); }
  void wait(unsigned) override {}
  void send(unsigned, const unsigned char* from, std::uint64_t address, std::uint64_t bytes) override {
    std::memcpy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), from, static_cast<std::size_t>(bytes));
  }
  void finish() override {}
  Staging staging() const override { return slots_.staging(); }
  std::string staging_note() const override { return slots_.note(); }

 private:
  SimPinner pinner_;
  StagingSlots slots_;
};

// GPUDirect Storage as the profile records it: chunks read (pread) straight into the memory.
class PreadPath : public DirectPath {
 public:
  PreadPath(int fd, bool gpudirect) : fd_(fd), gpudirect_(gpudirect) {}
  bool gpudirect() const override { return gpudirect_; }
  bool direct_io() const override { return false; }
  std::unique_ptr<DirectReader> reader() override {
    struct Reader : DirectReader {
      int fd;
      explicit Reader(int f) : fd(f) {}
      void read(std::uint64_t file_offset, std::uint64_t address, std::uint64_t bytes) override {
        read_file_range(fd, reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), bytes, file_offset);
      }
    };
    return std::make_unique<Reader>(fd_);
  }

 private:
  int fd_;
  bool gpudirect_;
};

LoadReport SimTransfers::load_file(int dev, int fd, const std::vector<FileRange>& ranges, const LoadOptions& options,
                                   const std::function<void(std::uint64_t)>& progress) {
  s_.enter("load_file", std::to_string(dev) + "," + std::to_string(ranges.size()));
  // Every target is looked up here, on this thread; the workers only copy.
  std::vector<FileRange> into = ranges;
  for (FileRange& r : into)
    r.address = reinterpret_cast<std::uintptr_t>(host_view(r.address, r.bytes, "cuMemcpyHtoDAsync"));
  // A failure injected for host_register (asked here: the workers only copy) refuses the huge pages.
  std::string refusal;
  try {
    s_.enter("host_register");
  } catch (const CudaError& e) {
    refusal = "cuMemHostRegister failed: " + e.name();
  }
  LoadPaths paths;
  paths.sink = [refusal](std::uint64_t slot_bytes) { return std::make_unique<MemorySink>(refusal, slot_bytes); };
  const GdsReport gds = s_.profile().gds.value_or(GdsReport{});
  paths.nvidia_fs = gds.mode == GdsReport::Mode::gpudirect;
  paths.open_direct = [this, gds](int file, const std::vector<FileRange>&) -> std::unique_ptr<DirectPath> {
    s_.enter("gds_open", to_string(gds.mode));
    if (gds.mode == GdsReport::Mode::unavailable)
      throw GdsError("dlopen", "",
                     "GPUDirect Storage is not available: " +
                         (gds.reason.empty() ? std::string("the simulated node has none") : gds.reason));
    return std::make_unique<PreadPath>(file, gds.mode == GdsReport::Mode::gpudirect);
  };
  return load_file_ranges(fd, into, options, paths, progress);
}

void SimTransfers::read(int dev, std::uint64_t address, void* target, std::uint64_t bytes) {
  s_.enter("read", std::to_string(dev) + "," + std::to_string(bytes));
  const std::uint8_t* source = host_view(address, bytes, "cuMemcpyDtoH");
  if (bytes) std::memcpy(target, source, static_cast<std::size_t>(bytes));
}

}  // namespace cupool::sim
