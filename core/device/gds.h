// GPUDirect Storage: NVIDIA's cuFile library (libcufile.so.0), loaded at run time and only when
// asked (`query --deep`, `buffer load --gds`): a process that never asks maps nothing of it. With
// the nvidia-fs kernel module, cuFile reads a file straight into device memory (DMA from the
// storage to the GPU, no bounce through host memory); without it cuFile only runs in its
// "compatibility mode" (POSIX reads through its own pinned buffers), which cupool's own staged
// reads (file_load.h) beat.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"

namespace cupool {

// What the node has, as `query --deep` reports it.
struct GdsReport {
  enum class Mode {
    unavailable,    // no libcufile, or its driver does not open
    compatibility,  // cuFile opens, but without nvidia-fs: it would read through host memory
    gpudirect,      // nvidia-fs is loaded: reads go from storage to the GPU
  };
  Mode mode = Mode::unavailable;
  std::optional<std::string> library_version;    // "1.15.0" (cuFileGetVersion)
  std::optional<std::string> nvidia_fs_version;  // "2.26" (the kernel module); none: not loaded
  std::vector<std::string> file_systems;         // where nvidia-fs reads directly: nvme, lustre, ...
  std::string reason;                            // why not gpudirect, in plain words; empty when it is
  // The cuFile call that failed, when one did.
  std::string error_api;      // "cuFileDriverOpen"
  std::string error_result;   // "CU_FILE_DRIVER_NOT_INITIALIZED"
  std::string error_message;  // cuFile's words
};

const char* to_string(GdsReport::Mode mode);
// Reads "unavailable", "compatibility" or "gpudirect"; nullopt otherwise.
std::optional<GdsReport::Mode> gds_mode_from_string(const std::string& text);

// True when the nvidia-fs kernel module is loaded (/proc/driver/nvidia-fs): the only case in which
// `buffer load --gds auto` loads libcufile at all.
bool nvidia_fs_loaded();

// A cuFile call failed: what was asked of GPUDirect Storage cannot be done here (exit 2, like
// --direct-io always on a file system without O_DIRECT).
class GdsError : public InputError {
 public:
  GdsError(std::string api, std::string result, const std::string& message)
      : InputError(message), api_(std::move(api)), result_(std::move(result)) {}
  const std::string& api() const noexcept { return api_; }
  const std::string& result() const noexcept { return result_; }

 private:
  std::string api_, result_;
};

// An open cuFile driver (cuFileDriverOpen .. cuFileDriverClose_v2). Its calls need the CUDA
// context of the memory they touch current on the calling thread.
class CuFile {
 public:
  // Loads libcufile.so.0 and opens its driver. Throws GdsError when either fails; `report` (may be
  // null) is filled either way.
  static std::unique_ptr<CuFile> open(GdsReport* report = nullptr);
  ~CuFile();
  CuFile(const CuFile&) = delete;
  CuFile& operator=(const CuFile&) = delete;

  bool gpudirect() const noexcept { return gpudirect_; }

  // A registered file; deregistered when destroyed (before its fd is closed).
  class File {
   public:
    File(const File&) = delete;
    File& operator=(const File&) = delete;
    ~File();

   private:
    friend class CuFile;
    File(const CuFile& owner, void* handle) : owner_(owner), handle_(handle) {}
    const CuFile& owner_;
    void* handle_;
  };
  // Registers the file open at `fd` (nvidia-fs wants it opened with O_DIRECT; the compatibility
  // mode reads either). Throws GdsError (cuFileHandleRegister) when cuFile will not read it: in a
  // container without a udev database, for one, cuFile cannot read the volume's attributes.
  std::unique_ptr<File> register_file(int fd) const;

  // Reads `bytes` at `file_offset` into device memory at `base` + `offset` (its context current).
  // For memory registered with register_buffer, `base` is the address it was registered at (cuFile
  // finds the registration by it). Throws InputError when the file ends first, GdsError when cuFile
  // fails.
  void read(const File& file, std::uint64_t base, std::uint64_t offset, std::uint64_t bytes,
            std::uint64_t file_offset) const;

  // Registers device memory for direct reads (cuFileBufRegister; unregistered memory is read
  // through cuFile's own GPU bounce buffers). False, with cuFile's words in `why`, when it cannot.
  bool register_buffer(std::uint64_t address, std::uint64_t bytes, std::string* why) const;
  void deregister_buffer(std::uint64_t address) const;

  struct Api;  // the entry points (gds.cpp)

 private:
  CuFile() = default;
  void* library_ = nullptr;
  std::unique_ptr<Api> api_;
  bool gpudirect_ = false;
  bool opened_ = false;  // counted in the driver's users
};

// Loads libcufile, opens its driver, reads its properties and closes it again: what the node has.
// Never throws for what the node lacks (that is the report).
GdsReport probe_gds();

}  // namespace cupool
