// What this binary is: its version, the commit it was built from and the CUDA headers it was
// built with (`cupool --version`, the cupool_build_info metric). A bug report quotes these.
#pragma once

#include <string>

namespace cupool {

struct BuildInfo {
  std::string version;       // the project's version, "0.1.0"
  std::string commit;        // "1a2b3c4d5e6f", "1a2b3c4d5e6f-dirty", or "unknown" outside a git checkout
  std::string cuda_headers;  // the CUDA Toolkit whose headers it was built with, "13.0.88"
  std::string compiler;      // "gcc 12.2.0"
  std::string build_type;    // CMake's build type, "RelWithDebInfo"
};

// This binary's build information.
const BuildInfo& build_info();

// The text `cupool --version` prints: "cupool 0.1.0 (commit ...)" and a line on what it was built
// with, without a trailing newline.
std::string version_text();

}  // namespace cupool
