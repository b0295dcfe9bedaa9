#include "base/build_info.h"

#include "base/build_info_commit.h"  // CUPOOL_COMMIT, written at build time by scripts/build-info.cmake

#ifndef CUPOOL_CUDA_HEADERS
#define CUPOOL_CUDA_HEADERS "unknown"
#endif
#ifndef CUPOOL_BUILD_TYPE
#define CUPOOL_BUILD_TYPE "unknown"
#endif

namespace cupool {
namespace {

std::string compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "unknown";
#endif
}

}  // namespace

const BuildInfo& build_info() {
  static const BuildInfo info{CUPOOL_VERSION, CUPOOL_COMMIT, CUPOOL_CUDA_HEADERS, compiler(),
                              CUPOOL_BUILD_TYPE[0] ? CUPOOL_BUILD_TYPE : "unknown"};
  return info;
}

std::string version_text() {
  const BuildInfo& b = build_info();
  return "cupool " + b.version + " (commit " + b.commit + ")\n" + "built with the CUDA " + b.cuda_headers +
         " headers (the driver is loaded at run time), " + b.compiler + ", " + b.build_type;
}

}  // namespace cupool
