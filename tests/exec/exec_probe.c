/* The program the exec test runs under `cupool exec`: it reaches a driver library the ways real
 * programs do and prints what it did, one "key=value" per line.
 *
 *   exec_probe none LIB       never calls cuInit
 *   exec_probe direct LIB     dlopen(LIB), dlsym("cuInit"), call it
 *   exec_probe getproc LIB    dlopen(LIB), dlsym("cuGetProcAddress_v2"), get cuInit through it, call it
 *   exec_probe getproc2 LIB   the same, but cuGetProcAddress_v2 asked for itself first (13000)
 *   exec_probe fork LIB       fork; the child does `direct`, the parent never calls cuInit
 *   exec_probe rtld LIB       RTLD_NEXT and RTLD_DEFAULT lookups still mean what they mean
 *   exec_probe hidden LIB     the library initialises the driver without a cuInit anyone sees
 *   exec_probe load LIB       dlopen(LIB) and nothing else
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int (*init_fn)(unsigned int);
typedef int (*getproc_fn)(const char*, void**, int, uint64_t, void*);
typedef int (*count_fn)(void);

static void* open_lib(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    printf("error=%s\n", dlerror());
    fflush(stdout);
    _exit(1);
  }
  return lib;
}

static int direct(const char* path) {
  void* lib = open_lib(path);
  init_fn init = (init_fn)dlsym(lib, "cuInit");
  const int rc = init(0);
  count_fn count = (count_fn)dlsym(lib, "fake_cuda_init_calls");
  printf("pid=%d cuInit=%d driver_calls=%d\n", (int)getpid(), rc, count ? count() : -1);
  return rc;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: exec_probe none|load|direct|getproc|getproc2|fork|rtld|hidden LIB\n");
    return 2;
  }
  const char* mode = argv[1];
  const char* path = argv[2];
  printf("main_pid=%d\n", (int)getpid());
  fflush(stdout);
  if (strcmp(mode, "none") == 0) return 0;
  if (strcmp(mode, "direct") == 0) return direct(path);
  if (strcmp(mode, "getproc") == 0 || strcmp(mode, "getproc2") == 0) {
    void* lib = open_lib(path);
    getproc_fn getproc = (getproc_fn)dlsym(lib, "cuGetProcAddress_v2");
    void* pfn = NULL;
    int status = 0;
    if (strcmp(mode, "getproc2") == 0) {
      void* again = NULL;
      if (getproc("cuGetProcAddress", &again, 13000, 0, &status) != 0) return 1;
      getproc = (getproc_fn)again;
    }
    const int got = getproc("cuInit", &pfn, 13000, 0, &status);
    const int rc = ((init_fn)pfn)(0);
    count_fn count = (count_fn)dlsym(lib, "fake_cuda_init_calls");
    printf("pid=%d cuGetProcAddress=%d cuInit=%d driver_calls=%d\n", (int)getpid(), got, rc, count ? count() : -1);
    return rc;
  }
  if (strcmp(mode, "fork") == 0) {
    fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
      direct(path);
      fflush(stdout);
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("parent_pid=%d child=%d\n", (int)getpid(), (int)child);
    return 0;
  }
  if (strcmp(mode, "load") == 0) {
    open_lib(path);
    return 0;
  }
  if (strcmp(mode, "hidden") == 0) {
    void* lib = open_lib(path);
    count_fn init = (count_fn)dlsym(lib, "fake_cuda_init_hidden");
    printf("hidden_init=%d\n", init());
    return 0;
  }
  if (strcmp(mode, "rtld") == 0) {
    /* RTLD_NEXT from the program is the next object in the search order after it; RTLD_DEFAULT
     * the first. Both must match what the program's own reference to the symbol resolves to. */
    void* next = dlsym(RTLD_NEXT, "dlsym");
    void* first = dlsym(RTLD_DEFAULT, "dlsym");
    void* mine = (void*)&dlsym;
    printf("rtld_next_same=%d rtld_default_same=%d\n", next == mine, first == mine);
    void* lib = open_lib(path);
    void* missing = dlsym(lib, "no_such_symbol");
    const char* err = dlerror();
    printf("missing_null=%d dlerror_set=%d\n", missing == NULL, err != NULL);
    return 0;
  }
  fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}
