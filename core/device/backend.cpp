#include "device/backend.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "base/units.h"

namespace cupool {

const char* handle_type_name(HandleType type) {
  switch (type) {
    case HandleType::none: return "none";
    case HandleType::posix_fd: return "posix_fd";
    case HandleType::fabric: return "fabric";
  }
  return "unknown";
}

std::vector<std::string> handle_type_names(std::uint32_t mask) {
  std::vector<std::string> names;
  if (mask & 0x1) names.emplace_back("posix_fd");
  if (mask & 0x2) names.emplace_back("win32");
  if (mask & 0x4) names.emplace_back("win32_kmt");
  if (mask & 0x8) names.emplace_back("fabric");
  return names;
}

CudaError::CudaError(std::string api, int result, std::string name, std::string description)
    : Error(Errc::cuda, api + " failed: " + name + (description.empty() ? "" : " (" + description + ")")),
      api_(std::move(api)),
      result_(result),
      name_(std::move(name)),
      description_(std::move(description)) {}

std::vector<SettingChange> diff_settings(const PoolSettings& from, const PoolSettings& to) {
  std::vector<SettingChange> out;
  auto text = [](bool b) { return std::string(b ? "true" : "false"); };
  if (from.release_threshold != to.release_threshold)
    out.push_back({"release_threshold", from.release_threshold.bytes_text(), to.release_threshold.bytes_text()});
  if (from.follow_event_dependencies != to.follow_event_dependencies)
    out.push_back(
        {"reuse.follow_event_dependencies", text(from.follow_event_dependencies), text(to.follow_event_dependencies)});
  if (from.allow_opportunistic != to.allow_opportunistic)
    out.push_back({"reuse.allow_opportunistic", text(from.allow_opportunistic), text(to.allow_opportunistic)});
  if (from.allow_internal_dependencies != to.allow_internal_dependencies)
    out.push_back({"reuse.allow_internal_dependencies", text(from.allow_internal_dependencies),
                   text(to.allow_internal_dependencies)});
  return out;
}

void read_file_range(int fd, void* into, std::uint64_t bytes, std::uint64_t offset) {
  auto* target = static_cast<char*>(into);
  std::uint64_t done = 0;
  while (done < bytes) {
    // One read is at most 1 GiB (Linux stops at 2 GiB - 4 KiB anyway).
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(bytes - done, 1ULL << 30));
    const ssize_t got = ::pread(fd, target + done, want, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw InputError(std::string("reading the file failed: ") + std::strerror(errno));
    if (got == 0) throw InputError(file_ended(offset + done, offset + bytes));
    done += static_cast<std::uint64_t>(got);
  }
}

}  // namespace cupool
