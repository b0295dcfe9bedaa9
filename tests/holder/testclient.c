/* A client of the holder written in plain C against include/cupool/client.h, used by the
 * cross-process tests (holder_test.py, and on a GPU by the gpu tests). One action per run:
 *
 *   testclient SOCKET write BUFFER SEED        fill the named buffer with a pattern
 *   testclient SOCKET read BUFFER SEED         check the named buffer holds the pattern (exit 1 if not)
 *   testclient SOCKET alloc POOL DEVICE SIZE COUNT
 *       allocate COUNT leases, write into each, print "ready <lease ids>", then wait for a line on
 *       standard input (or EOF), release them and exit (the crash test kills it while it waits)
 *   testclient SOCKET expect POOL DEVICE SIZE STATUS
 *       try one allocation; exit 0 when the result is STATUS (e.g. CUPOOL_E_REFUSED)
 *   testclient SOCKET cycle POOL DEVICE SIZE N  allocate, write, read back and release N times
 *
 * Every line it prints starts with "testclient:" so a driver can find it among other output. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cupool/client.h"

static unsigned char pattern(uint64_t seed, uint64_t i) {
  return (unsigned char)((seed * 131u + i * 7u + (i >> 12)) & 0xffu);
}

static int fail(cupool_conn* conn, const char* what, int status) {
  fprintf(stderr, "testclient: %s: %s: %s\n", what, cupool_status_name(status), cupool_last_error(conn));
  return 2;
}

/* Checks or fills `lease` in chunks of 1 MiB: the whole lease when small, else its first and
 * last MiB (a real node copies through the driver). */
static int fill_or_check(cupool_conn* conn, cupool_lease* lease, uint64_t seed, int check) {
  const uint64_t size = cupool_lease_size(lease);
  const uint64_t chunk = size < (1u << 20) ? size : (1u << 20);
  unsigned char* buf = malloc(chunk);
  if (!buf) return 2;
  const uint64_t offsets[2] = {0, size - chunk};
  for (int k = 0; k < 2; ++k) {
    const uint64_t off = offsets[k];
    if (check) {
      int rc = cupool_read(conn, lease, off, buf, chunk);
      if (rc != CUPOOL_OK) { free(buf); return fail(conn, "read", rc); }
      for (uint64_t i = 0; i < chunk; ++i)
        if (buf[i] != pattern(seed, off + i)) {
          printf("testclient: mismatch at byte %llu: %u, expected %u\n", (unsigned long long)(off + i), buf[i],
                 pattern(seed, off + i));
          free(buf);
          return 1;
        }
    } else {
      for (uint64_t i = 0; i < chunk; ++i) buf[i] = pattern(seed, off + i);
      int rc = cupool_write(conn, lease, off, buf, chunk);
      if (rc != CUPOOL_OK) { free(buf); return fail(conn, "write", rc); }
    }
  }
  free(buf);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: testclient SOCKET ACTION ARGS... (see the comment at the top of testclient.c)\n");
    return 2;
  }
  if (cupool_abi_version() != CUPOOL_CLIENT_ABI_VERSION) {
    fprintf(stderr, "testclient: ABI %d, built for %d\n", cupool_abi_version(), CUPOOL_CLIENT_ABI_VERSION);
    return 2;
  }
  const char* action = argv[2];
  cupool_conn* conn = NULL;
  int rc = cupool_connect(argv[1], "testclient", &conn);
  if (rc != CUPOOL_OK) {
    printf("testclient: connect: %s\n", cupool_status_name(rc));
    return fail(NULL, "connect", rc);
  }
  int result = 2;
  if ((!strcmp(action, "write") || !strcmp(action, "read")) && argc == 5) {
    cupool_lease* lease = NULL;
    rc = cupool_open_buffer(conn, argv[3], &lease);
    if (rc != CUPOOL_OK) {
      printf("testclient: open: %s\n", cupool_status_name(rc));
      result = fail(conn, "open", rc);
    } else {
      result = fill_or_check(conn, lease, strtoull(argv[4], NULL, 10), !strcmp(action, "read"));
      if (result == 0) printf("testclient: %s ok (%llu bytes, backend %s)\n", action, (unsigned long long)cupool_lease_size(lease), cupool_backend(conn));
      rc = cupool_release(conn, lease);
      if (rc != CUPOOL_OK && result == 0) result = fail(conn, "release", rc);
    }
  } else if (!strcmp(action, "alloc") && argc == 7) {
    const int device = atoi(argv[4]);
    const uint64_t size = strtoull(argv[5], NULL, 10);
    const int count = atoi(argv[6]);
    cupool_lease** leases = calloc((size_t)count, sizeof *leases);
    result = 0;
    printf("testclient: ready");
    for (int i = 0; i < count && result == 0; ++i) {
      rc = cupool_alloc(conn, argv[3], device, size, &leases[i]);
      if (rc != CUPOOL_OK) { printf("\n"); result = fail(conn, "alloc", rc); break; }
      result = fill_or_check(conn, leases[i], (uint64_t)i, 0);
      printf(" %llu", (unsigned long long)cupool_lease_id(leases[i]));
    }
    printf("\n");
    fflush(stdout);
    if (result == 0) {
      char line[16];
      if (!fgets(line, sizeof line, stdin)) line[0] = 0; /* EOF: release too */
      for (int i = 0; i < count; ++i) {
        rc = cupool_release(conn, leases[i]);
        if (rc != CUPOOL_OK) result = fail(conn, "release", rc);
      }
    }
    free(leases);
  } else if (!strcmp(action, "expect") && argc == 7) {
    cupool_lease* lease = NULL;
    rc = cupool_alloc(conn, argv[3], atoi(argv[4]), strtoull(argv[5], NULL, 10), &lease);
    printf("testclient: alloc: %s: %s\n", cupool_status_name(rc), cupool_last_error(conn));
    result = strcmp(cupool_status_name(rc), argv[6]) == 0 ? 0 : 1;
    if (lease) cupool_release(conn, lease);
  } else if (!strcmp(action, "cycle") && argc == 7) {
    const uint64_t size = strtoull(argv[5], NULL, 10);
    const int n = atoi(argv[6]);
    result = 0;
    for (int i = 0; i < n && result == 0; ++i) {
      cupool_lease* lease = NULL;
      rc = cupool_alloc(conn, argv[3], atoi(argv[4]), size, &lease);
      if (rc != CUPOOL_OK) { result = fail(conn, "alloc", rc); break; }
      result = fill_or_check(conn, lease, (uint64_t)i, 0);
      if (result == 0) result = fill_or_check(conn, lease, (uint64_t)i, 1);
      rc = cupool_release(conn, lease);
      if (rc != CUPOOL_OK && result == 0) result = fail(conn, "release", rc);
    }
    if (result == 0) printf("testclient: cycle ok (%d)\n", n);
  } else {
    fprintf(stderr, "testclient: unknown action or wrong arguments: %s\n", action);
  }
  cupool_disconnect(conn);
  return result;
}
