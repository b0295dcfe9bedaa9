/* A program linked against the (stand-in) driver library, calling cuInit through its PLT as a
 * driver-API program linked with -lcuda does. Prints "pid=... cuInit=... driver_calls=...". */
#include <stdio.h>
#include <unistd.h>

int cuInit(unsigned int flags);
int fake_cuda_init_calls(void);

int main(void) {
  const int rc = cuInit(0);
  printf("pid=%d cuInit=%d driver_calls=%d\n", (int)getpid(), rc, fake_cuda_init_calls());
  return rc;
}
