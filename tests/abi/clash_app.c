/* An application with its own build of cupool's dependencies (libcupool_standin.so, which aborts
 * when one of its yaml-cpp, spdlog or fmt symbols is called), linked against the (stand-in) CUDA
 * driver library and calling cuInit through its PLT, as a C++ server linked with -lcuda does.
 * Under `cupool exec` the process: section is applied at that cuInit: cupool parses the config
 * inside this process. Prints "cuInit=... standin=1".
 *
 *   clash_app                 the application
 *   clash_app control LIB     first loads LIB and calls cupool_control_parse (the test's control) */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int cuInit(unsigned int flags);
int cupool_standin_loaded(void);

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "control") == 0) {
    void* lib = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
      fprintf(stderr, "dlopen %s: %s\n", argv[2], dlerror());
      return 2;
    }
    int (*parse)(void) = (int (*)(void))dlsym(lib, "cupool_control_parse");
    if (!parse) return 2;
    parse();
  }
  const int rc = cuInit(0);
  printf("cuInit=%d standin=%d\n", rc, cupool_standin_loaded());
  return rc;
}
