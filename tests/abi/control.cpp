// The control of the stand-in test: a library that resolves YAML::Load at run time, as a library
// needing libyaml-cpp.so does. Loaded into the stand-in application, its call reaches the
// application's stand-in, which proves the test would catch such a library.
#include <string>

namespace YAML {
int Load(const std::string&);  // resolved from the process at run time (no definition here)
}  // namespace YAML

extern "C" __attribute__((visibility("default"))) int cupool_control_parse(void) { return YAML::Load("a: 1"); }
