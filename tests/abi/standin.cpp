// A stand-in for another build of cupool's dependencies, as an application might carry its own:
// it exports symbols of yaml-cpp, spdlog and fmt under their real (mangled) names, and each one
// says so and aborts when called. A cupool library that resolved any of them at run time (that
// needed libyaml-cpp.so, libspdlog.so or libfmt.so) would call these inside such an application.
// Return types are not part of a function's mangled name, so these need none of the real headers.
#include <cstdio>
#include <cstdlib>
#include <istream>
#include <string>

#define STANDIN_EXPORT __attribute__((visibility("default")))

namespace {
[[noreturn]] void called(const char* what) {
  std::fprintf(stderr, "stand-in %s was called: a library resolved it from the application\n", what);
  std::fflush(stderr);
  std::abort();
}
}  // namespace

namespace YAML {
STANDIN_EXPORT int Load(const std::string&) { called("YAML::Load(const std::string&)"); }
STANDIN_EXPORT int Load(std::istream&) { called("YAML::Load(std::istream&)"); }
}  // namespace YAML

namespace spdlog {
STANDIN_EXPORT void* default_logger_raw() { called("spdlog::default_logger_raw()"); }
}  // namespace spdlog

namespace fmt {
inline namespace v9 {
namespace detail {
STANDIN_EXPORT void throw_format_error(const char*) { called("fmt::v9::detail::throw_format_error"); }
}  // namespace detail
}  // namespace v9
}  // namespace fmt

// For the application to link against (so the library stays among its NEEDED entries).
extern "C" STANDIN_EXPORT int cupool_standin_loaded(void) { return 1; }
