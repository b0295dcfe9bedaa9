// cuFile, loaded at run time (gds.h). Its types are declared here by hand, from the layout of
// cufile.h 1.x (checked by the static_asserts below and by tests/gpu against the library), so
// building cupool needs no cuFile headers.
#include "device/gds.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "device/file_load.h"

namespace cupool {

// ---- the C ABI of libcufile.so.0 (a named namespace: CuFile::Api's members use these types) ----
namespace cufile_abi {

struct CuFileStatus {  // CUfileError_t
  int err;             // CUfileOpError: 0, or 5000 + n
  int cu_err;          // CUresult, when err is CU_FILE_CUDA_DRIVER_ERROR
};
struct CuFileProps {  // CUfileDrvProps_t
  struct {
    unsigned major_version;
    unsigned minor_version;
    std::size_t poll_thresh_size;
    std::size_t max_direct_io_size;
    unsigned dstatusflags;  // bit n: nvidia-fs reads file system n directly (kFileSystems)
    unsigned dcontrolflags;
  } nvfs;
  unsigned fflags;
  unsigned max_device_cache_size;
  unsigned per_buffer_cache_size;
  unsigned max_device_pinned_mem_size;
  unsigned max_batch_io_size;
  unsigned max_batch_io_timeout_msecs;
};
struct CuFileDescr {  // CUfileDescr_t
  int type;           // 1: a Linux fd
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;  // a userspace file system's operations (CUfileFSOps_t); null for an fd
};
constexpr int kHandleFd = 1;
constexpr int kErrBase = 5000;
constexpr int kErrCudaDriver = kErrBase + 11;

static_assert(sizeof(CuFileStatus) == 8, "CUfileError_t is two ints");
static_assert(sizeof(CuFileProps) == 56 && offsetof(CuFileProps, nvfs.dstatusflags) == 24 &&
                  offsetof(CuFileProps, fflags) == 32,
              "CUfileDrvProps_t as cufile.h 1.x lays it out");
static_assert(sizeof(CuFileDescr) == 24 && offsetof(CuFileDescr, handle) == 8 && offsetof(CuFileDescr, fs_ops) == 16,
              "CUfileDescr_t as cufile.h 1.x lays it out");

// CUfileOpError names, by code - 5000 (cufile.h); the gaps are codes it does not define.
constexpr const char* kErrorNames[] = {
    "CU_FILE_SUCCESS",
    "CU_FILE_DRIVER_NOT_INITIALIZED",
    "CU_FILE_DRIVER_INVALID_PROPS",
    "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
    "CU_FILE_DRIVER_VERSION_MISMATCH",
    "CU_FILE_DRIVER_VERSION_READ_ERROR",
    "CU_FILE_DRIVER_CLOSING",
    "CU_FILE_PLATFORM_NOT_SUPPORTED",
    "CU_FILE_IO_NOT_SUPPORTED",
    "CU_FILE_DEVICE_NOT_SUPPORTED",
    "CU_FILE_NVFS_DRIVER_ERROR",
    "CU_FILE_CUDA_DRIVER_ERROR",
    "CU_FILE_CUDA_POINTER_INVALID",
    "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
    "CU_FILE_CUDA_POINTER_RANGE_ERROR",
    "CU_FILE_CUDA_CONTEXT_MISMATCH",
    "CU_FILE_INVALID_MAPPING_SIZE",
    "CU_FILE_INVALID_MAPPING_RANGE",
    "CU_FILE_INVALID_FILE_TYPE",
    "CU_FILE_INVALID_FILE_OPEN_FLAG",
    "CU_FILE_DIO_NOT_SET",
    nullptr,
    "CU_FILE_INVALID_VALUE",
    "CU_FILE_MEMORY_ALREADY_REGISTERED",
    "CU_FILE_MEMORY_NOT_REGISTERED",
    "CU_FILE_PERMISSION_DENIED",
    "CU_FILE_DRIVER_ALREADY_OPEN",
    "CU_FILE_HANDLE_NOT_REGISTERED",
    "CU_FILE_HANDLE_ALREADY_REGISTERED",
    "CU_FILE_DEVICE_NOT_FOUND",
    "CU_FILE_INTERNAL_ERROR",
    "CU_FILE_GETNEWFD_FAILED",
    nullptr,
    "CU_FILE_NVFS_SETUP_ERROR",
    "CU_FILE_IO_DISABLED",
};
// What each bit of the driver's dstatusflags means (CUfileDriverStatusFlags); bit 10 is reserved.
constexpr const char* kFileSystems[] = {"lustre",        "wekafs", "nfs",    "gpfs",  "nvme",     "nvmeof", "scsi",
                                        "scaleflux_csd", "nvmesh", "beegfs", nullptr, "nvme_p2p", "scatefs"};

inline std::string error_name(int err) {
  const int code = std::abs(err);
  const int index = code == 0 ? 0 : code - kErrBase;
  constexpr int count = static_cast<int>(sizeof kErrorNames / sizeof kErrorNames[0]);
  if (index >= 0 && index < count && kErrorNames[index]) return kErrorNames[index];
  return "cuFile error " + std::to_string(code);
}

inline std::string describe(const CuFileStatus& s) {
  std::string text = error_name(s.err);
  if (std::abs(s.err) == kErrCudaDriver) text += " (CUDA result " + std::to_string(s.cu_err) + ")";
  return text;
}

}  // namespace cufile_abi

namespace {

// Where cuFile writes its log: CUFILE_LOGFILE_PATH, else cufile.log in the working directory.
std::string log_place() {
  const char* path = std::getenv("CUFILE_LOGFILE_PATH");
  if (path && *path) return path;
  return "cufile.log in the working directory, or where CUFILE_LOGFILE_PATH says";
}

}  // namespace

struct CuFile::Api {
  cufile_abi::CuFileStatus (*get_version)(int*) = nullptr;
  cufile_abi::CuFileStatus (*driver_open)() = nullptr;
  cufile_abi::CuFileStatus (*driver_close)() = nullptr;
  cufile_abi::CuFileStatus (*driver_properties)(cufile_abi::CuFileProps*) = nullptr;
  cufile_abi::CuFileStatus (*handle_register)(void**, cufile_abi::CuFileDescr*) = nullptr;
  void (*handle_deregister)(void*) = nullptr;
  cufile_abi::CuFileStatus (*buf_register)(const void*, std::size_t, int) = nullptr;
  cufile_abi::CuFileStatus (*buf_deregister)(const void*) = nullptr;
  ssize_t (*read)(void*, void*, std::size_t, off_t, off_t) = nullptr;
};

namespace {

// The library is loaded once and never unloaded (its threads and exit handlers stay with it); the
// driver is opened while any CuFile is alive.
std::mutex g_mutex;
void* g_library = nullptr;
unsigned g_open = 0;

// Loads libcufile.so.0 and resolves every entry point; "" or why not.
std::string load_library(CuFile::Api& api) {
  if (!g_library) {
    g_library = ::dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!g_library) {
      const char* why = ::dlerror();
      return std::string("libcufile.so.0 could not be loaded (") + (why ? why : "not found") +
             "); GPUDirect Storage comes with the CUDA toolkit's libcufile package";
    }
  }
  struct Entry {
    const char* name;
    void** slot;
  };
  const Entry entries[] = {
      {"cuFileGetVersion", reinterpret_cast<void**>(&api.get_version)},
      {"cuFileDriverOpen", reinterpret_cast<void**>(&api.driver_open)},
      {"cuFileDriverClose_v2", reinterpret_cast<void**>(&api.driver_close)},
      {"cuFileDriverGetProperties", reinterpret_cast<void**>(&api.driver_properties)},
      {"cuFileHandleRegister", reinterpret_cast<void**>(&api.handle_register)},
      {"cuFileHandleDeregister", reinterpret_cast<void**>(&api.handle_deregister)},
      {"cuFileBufRegister", reinterpret_cast<void**>(&api.buf_register)},
      {"cuFileBufDeregister", reinterpret_cast<void**>(&api.buf_deregister)},
      {"cuFileRead", reinterpret_cast<void**>(&api.read)},
  };
  for (const Entry& e : entries) {
    *e.slot = ::dlsym(g_library, e.name);
    if (!*e.slot) return std::string("libcufile.so.0 lacks ") + e.name + " (cupool needs cuFile 1.7 or newer)";
  }
  return "";
}

}  // namespace

const char* to_string(GdsReport::Mode mode) {
  switch (mode) {
    case GdsReport::Mode::unavailable: return "unavailable";
    case GdsReport::Mode::compatibility: return "compatibility";
    case GdsReport::Mode::gpudirect: return "gpudirect";
  }
  return "unavailable";
}

std::optional<GdsReport::Mode> gds_mode_from_string(const std::string& text) {
  for (GdsReport::Mode m : {GdsReport::Mode::unavailable, GdsReport::Mode::compatibility, GdsReport::Mode::gpudirect})
    if (text == to_string(m)) return m;
  return std::nullopt;
}

bool nvidia_fs_loaded() {
  struct stat st {};
  return ::stat("/proc/driver/nvidia-fs", &st) == 0;
}

std::unique_ptr<CuFile> CuFile::open(GdsReport* report) {
  GdsReport scratch;
  GdsReport& r = report ? *report : scratch;
  r = GdsReport{};
  std::unique_ptr<CuFile> self(new CuFile());
  self->api_ = std::make_unique<Api>();
  Api& api = *self->api_;
  std::lock_guard<std::mutex> lock(g_mutex);
  const std::string missing = load_library(api);
  if (!missing.empty()) {
    r.reason = missing;
    throw GdsError("dlopen", "", "GPUDirect Storage is not available: " + missing);
  }
  self->library_ = g_library;
  int version = 0;
  if (api.get_version(&version).err == 0 && version > 0)
    r.library_version = std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
  if (g_open == 0) {
    const cufile_abi::CuFileStatus s = api.driver_open();
    if (s.err != 0) {
      r.error_api = "cuFileDriverOpen";
      r.error_result = cufile_abi::error_name(s.err);
      r.error_message = cufile_abi::describe(s);
      r.reason = "cuFile's driver did not open (" + cufile_abi::describe(s) + "); cuFile's log says why (" +
                 log_place() +
                 "; allow_compat_mode in /etc/cufile.json "
                 "allows it without nvidia-fs)";
      throw GdsError(r.error_api, r.error_result, "GPUDirect Storage is not available: " + r.reason);
    }
  }
  ++g_open;
  self->opened_ = true;
  cufile_abi::CuFileProps props{};
  const cufile_abi::CuFileStatus p = api.driver_properties(&props);
  const bool module = nvidia_fs_loaded();
  if (p.err == 0 && props.nvfs.major_version > 0)
    r.nvidia_fs_version = std::to_string(props.nvfs.major_version) + "." + std::to_string(props.nvfs.minor_version);
  if (p.err == 0) {
    constexpr unsigned count = sizeof cufile_abi::kFileSystems / sizeof cufile_abi::kFileSystems[0];
    for (unsigned bit = 0; bit < count; ++bit)
      if (cufile_abi::kFileSystems[bit] && (props.nvfs.dstatusflags & (1u << bit)))
        r.file_systems.emplace_back(cufile_abi::kFileSystems[bit]);
  }
  if (module && r.nvidia_fs_version) {
    r.mode = GdsReport::Mode::gpudirect;
    self->gpudirect_ = true;
  } else {
    r.mode = GdsReport::Mode::compatibility;
    r.reason =
        module ? "nvidia-fs is loaded but cuFile's driver does not use it (cuFile's log says why: " + log_place() + ")"
               : "the nvidia-fs kernel module is not loaded (/proc/driver/nvidia-fs is missing), so cuFile "
                 "would read through host memory (its compatibility mode), which cupool's own reads beat";
  }
  return self;
}

CuFile::~CuFile() {
  if (!opened_) return;  // (open() may still hold the lock when it throws)
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_open == 0) api_->driver_close();
}

CuFile::File::~File() {
  if (handle_) owner_.api_->handle_deregister(handle_);
}

std::unique_ptr<CuFile::File> CuFile::register_file(int fd) const {
  cufile_abi::CuFileDescr descr{};
  descr.type = cufile_abi::kHandleFd;
  descr.handle.fd = fd;
  void* handle = nullptr;
  const cufile_abi::CuFileStatus s = api_->handle_register(&handle, &descr);
  if (s.err != 0)
    throw GdsError("cuFileHandleRegister", cufile_abi::error_name(s.err),
                   "cuFile will not read this file (cuFileHandleRegister: " + cufile_abi::describe(s) +
                       "); cuFile's log says why (" + log_place() + ")");
  return std::unique_ptr<File>(new File(*this, handle));
}

void CuFile::read(const File& file, std::uint64_t base, std::uint64_t offset, std::uint64_t bytes,
                  std::uint64_t file_offset) const {
  std::uint64_t done = 0;
  // NOLINTNEXTLINE(performance-no-int-to-ptr): a device address, as cuFile takes it
  void* at = reinterpret_cast<void*>(static_cast<std::uintptr_t>(base));
  while (done < bytes) {
    const ssize_t got = api_->read(file.handle_, at, static_cast<std::size_t>(bytes - done),
                                   static_cast<off_t>(file_offset + done), static_cast<off_t>(offset + done));
    if (got == -1) {
      if (errno == EINTR) continue;
      throw InputError(std::string("reading the file through cuFile failed: ") + std::strerror(errno));
    }
    if (got < 0) {
      const cufile_abi::CuFileStatus s{static_cast<int>(-got), 0};
      throw GdsError("cuFileRead", cufile_abi::error_name(s.err), "cuFileRead failed: " + cufile_abi::describe(s));
    }
    if (got == 0) throw InputError(file_ended(file_offset + done, file_offset + bytes));
    done += static_cast<std::uint64_t>(got);
  }
}

bool CuFile::register_buffer(std::uint64_t address, std::uint64_t bytes, std::string* why) const {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): a device address, as cuFile takes it
  const cufile_abi::CuFileStatus s = api_->buf_register(
      reinterpret_cast<const void*>(static_cast<std::uintptr_t>(address)), static_cast<std::size_t>(bytes), 0);
  if (s.err == 0) return true;
  if (why) *why = "cuFileBufRegister: " + cufile_abi::describe(s);
  return false;
}

void CuFile::deregister_buffer(std::uint64_t address) const {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): a device address, as cuFile takes it
  api_->buf_deregister(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(address)));
}

GdsReport probe_gds() {
  GdsReport report;
  try {
    CuFile::open(&report);
  } catch (const GdsError&) {
    // The report says why.
  }
  return report;
}

}  // namespace cupool
