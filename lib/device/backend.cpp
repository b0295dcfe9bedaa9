#include "device/backend.h"

#include <utility>

namespace cupool {

const char* handle_type_name(HandleType type) {
  switch (type) {
    case HandleType::none:
      return "none";
    case HandleType::posix_fd:
      return "posix_fd";
    case HandleType::fabric:
      return "fabric";
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

}  // namespace cupool
