// The real backend, Transfers: copies from host memory and from files (pinned slots, or cuFile).
#include "device/cuda/transfers.h"

#include <string>
#include <utility>

#include "device/staging.h"

namespace cupool::cuda {

void CudaTransfers::write(int ordinal, std::uint64_t address, const void* source, std::uint64_t bytes) {
  ContextScope scope(api_, d_.context(ordinal));
  d_.after_shared_allocations(ordinal);
  check(api_.cuMemcpyHtoD(static_cast<CUdeviceptr>(address), source, static_cast<size_t>(bytes)), "cuMemcpyHtoD");
  // From pageable memory the copy may return before its DMA has finished; another process may
  // read right after this returns.
  check(api_.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
}

// Staging memory through the driver: huge pages registered (cuMemHostRegister), or cuMemHostAlloc.
// In the sink's context, current while the slots are made and freed.
class DriverPinner : public HostPinner {
 public:
  explicit DriverPinner(const Driver& b) : b_(b) {}
  bool pin(void* p, std::uint64_t bytes, std::string& why) noexcept override {
    const CUresult r = b_.api().cuMemHostRegister(p, static_cast<size_t>(bytes), 0);
    if (r == CUDA_SUCCESS) return true;
    try {
      why = "cuMemHostRegister failed: " + b_.error_name(r);
    } catch (...) {
      why.clear();  // no memory for the words: the fallback still works
    }
    return false;
  }
  void unpin(void* p) noexcept override { b_.api().cuMemHostUnregister(p); }
  void* allocate(std::uint64_t bytes) override {
    void* p = nullptr;
    b_.check(b_.api().cuMemHostAlloc(&p, static_cast<size_t>(bytes), 0), "cuMemHostAlloc");
    return p;
  }
  void release(void* p) noexcept override {
    if (p) b_.api().cuMemFreeHost(p);
  }

 private:
  const Driver& b_;
};

// One per worker thread, made on it: its context current, a blocking stream (it waits for the
// legacy stream, which after_shared_allocations ordered), two pinned slots (a copy
// from pageable memory would be staged by the driver, one synchronous chunk at a time; on huge
// pages where it can: staging.h) and an event per slot. Frees what it made on every path (a
// constructor that fails too); the copies are waited for before the slots go.
class PinnedSink : public LoadSink {
 public:
  PinnedSink(const Driver& b, CUcontext c, std::uint64_t slot_bytes)
      : b_(b), scope_(b.api(), c), pinner_(b), slots_(pinner_, kSlots, slot_bytes) {
    try {
      b_.check(b_.api().cuStreamCreate(&stream_, CU_STREAM_DEFAULT), "cuStreamCreate");
      for (CUevent& e : done_) b_.check(b_.api().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    } catch (...) {
      close();
      throw;
    }
  }
  PinnedSink(const PinnedSink&) = delete;
  PinnedSink& operator=(const PinnedSink&) = delete;
  ~PinnedSink() override { close(); }  // then slots_ goes, in the context (scope_ goes last)
  unsigned char* slot(unsigned i) override { return slots_.slot(i); }
  void wait(unsigned i) override { b_.check(b_.api().cuEventSynchronize(done_[i]), "cuEventSynchronize"); }
  void send(unsigned i, const unsigned char* from, std::uint64_t address, std::uint64_t bytes) override {
    b_.check(b_.api().cuMemcpyHtoDAsync(static_cast<CUdeviceptr>(address), from, static_cast<size_t>(bytes), stream_),
             "cuMemcpyHtoDAsync");
    b_.check(b_.api().cuEventRecord(done_[i], stream_), "cuEventRecord");
  }
  void finish() override { b_.check(b_.api().cuStreamSynchronize(stream_), "cuStreamSynchronize"); }
  Staging staging() const override { return slots_.staging(); }
  std::string staging_note() const override { return slots_.note(); }

 private:
  // The stream synchronized (no copy reads a slot any more), then the events and the stream freed.
  void close() noexcept {
    if (stream_) b_.api().cuStreamSynchronize(stream_);
    for (CUevent& e : done_)
      if (e) b_.api().cuEventDestroy(std::exchange(e, nullptr));
    if (stream_) b_.api().cuStreamDestroy(std::exchange(stream_, nullptr));
  }

  const Driver& b_;
  ContextScope scope_;
  DriverPinner pinner_;
  StagingSlots slots_;
  CUstream stream_ = nullptr;
  CUevent done_[kSlots] = {};
};

// GPUDirect Storage: cuFile with the file registered (with nvidia-fs opened again with
// O_DIRECT, which it wants; in the compatibility mode as it is, so its reads use the page
// cache) and, with nvidia-fs, the ranges' memory registered (unregistered memory goes through
// cuFile's own GPU bounce buffers).
// Everything in the device's context, made current on each reader's thread.
class CuFilePath : public DirectPath {
 public:
  CuFilePath(const Driver& b, CUcontext c, int fd, const std::vector<FileRange>& ranges) : b_(b), ctx_(c) {
    ContextScope scope(b_.api(), ctx_);
    cufile_ = CuFile::open();
    if (cufile_->gpudirect()) direct_ = reopen_direct(fd);  // nvidia-fs reads what was opened with O_DIRECT
    file_ = cufile_->register_file(direct_ ? direct_.get() : fd);
    // One registration for the span of the ranges (they lie in one lease; one per tensor
    // would pin BAR1 space a thousand times). Where cuFile will not, its bounce buffers serve.
    if (cufile_->gpudirect() && !ranges.empty()) {
      std::uint64_t lo = ranges.front().address, hi = lo;
      for (const FileRange& r : ranges) {
        lo = std::min(lo, r.address);
        hi = std::max(hi, r.address + r.bytes);
      }
      if (cufile_->register_buffer(lo, hi - lo, nullptr)) registered_ = {lo, hi};
    }
  }
  CuFilePath(const CuFilePath&) = delete;
  CuFilePath& operator=(const CuFilePath&) = delete;
  ~CuFilePath() override {
    ContextScope scope(b_.api(), ctx_);
    if (registered_.second) cufile_->deregister_buffer(registered_.first);
    file_.reset();
    cufile_.reset();
  }
  bool gpudirect() const override { return cufile_->gpudirect(); }
  bool direct_io() const override { return static_cast<bool>(direct_); }
  std::unique_ptr<DirectReader> reader() override { return std::make_unique<Reader>(*this); }

 private:
  class Reader : public DirectReader {
   public:
    explicit Reader(const CuFilePath& p) : p_(p), scope_(p.b_.api(), p.ctx_) {}
    void read(std::uint64_t file_offset, std::uint64_t address, std::uint64_t bytes) override {
      // Registered memory is named by its registered base (cuFile finds the registration by it).
      const auto [lo, hi] = p_.registered_;
      const bool inside = hi && address >= lo && address + bytes <= hi;
      const std::uint64_t base = inside ? lo : address;
      p_.cufile_->read(*p_.file_, base, address - base, bytes, file_offset);
    }

   private:
    const CuFilePath& p_;
    ContextScope scope_;
  };
  const Driver& b_;
  CUcontext ctx_;
  std::unique_ptr<CuFile> cufile_;
  Fd direct_;
  std::unique_ptr<CuFile::File> file_;
  std::pair<std::uint64_t, std::uint64_t> registered_{0, 0};  // [lo, hi) registered with cuFile
};

LoadReport CudaTransfers::load_file(int ordinal, int fd, const std::vector<FileRange>& ranges,
                                    const LoadOptions& options, const std::function<void(std::uint64_t)>& progress) {
  CUcontext ctx = d_.context(ordinal);
  {
    ContextScope scope(api_, ctx);
    d_.after_shared_allocations(ordinal);
  }
  LoadPaths paths;
  paths.sink = [this, ctx](std::uint64_t slot_bytes) { return std::make_unique<PinnedSink>(d_, ctx, slot_bytes); };
  paths.nvidia_fs = nvidia_fs_loaded();
  paths.open_direct = [this, ctx](int file, const std::vector<FileRange>& rs) -> std::unique_ptr<DirectPath> {
    return std::make_unique<CuFilePath>(d_, ctx, file, rs);
  };
  return load_file_ranges(fd, ranges, options, paths, progress);
}

void CudaTransfers::read(int ordinal, std::uint64_t address, void* target, std::uint64_t bytes) {
  ContextScope scope(api_, d_.context(ordinal));
  d_.after_shared_allocations(ordinal);
  check(api_.cuMemcpyDtoH(target, static_cast<CUdeviceptr>(address), static_cast<size_t>(bytes)), "cuMemcpyDtoH");
}

}  // namespace cupool::cuda
