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
 *   testclient SOCKET load POOL DEVICE SIZE N [GO]
 *       one untimed cycle (it imports the pool), then, when GO (a FIFO) is given, open it for reading
 *       (that blocks until the test opens it for writing: every client starts at once), then N
 *       timed cycles as `cycle` does, each with its own pattern; prints
 *       "load ok N START_NS END_NS LAT_NS,LAT_NS,..." (CLOCK_MONOTONIC, shared by all processes)
 *   testclient SOCKET threads POOL DEVICE SIZE THREADS N
 *       one connection used by THREADS threads at once, each doing N cycles (allocate, write, read
 *       back, release) with its own pattern, a status request every fourth cycle and, every fourth,
 *       an allocation from a missing pool whose message (cupool_last_error) must be its own
 *   testclient SOCKET warm POOL DEVICE SIZE N
 *       N cycles as `cycle` does; every cycle after the first must get the first cycle's block back
 *       from the cache (same address and lease id); prints "warm ok N CACHED" (bytes cached at the end)
 *   testclient SOCKET keep POOL DEVICE SIZE COUNT [fork]
 *       allocate COUNT leases, write into each and release them into the cache (with "fork": then
 *       fork, and the child calls cupool_disconnect on the inherited connection and exits); print
 *       "cached BYTES", wait for a line on standard input (meanwhile the library's thread answers the
 *       holder's drop notices), print "cached BYTES" again, then allocate once more and print
 *       "after STATUS: MESSAGE" (a connection the holder closed says so)
 *   testclient SOCKET next POOL DEVICE SIZE
 *       allocate one lease, print "ready", wait for a line on standard input, then make one more
 *       request and release the lease, printing "next STATUS: MESSAGE" and "release STATUS: MESSAGE"
 *       (the holder-restart test kills the holder while it waits)
 *
 * Every line it prints starts with "testclient:" so a driver can find it among other output. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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
      if (rc != CUPOOL_OK) {
        free(buf);
        return fail(conn, "read", rc);
      }
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
      if (rc != CUPOOL_OK) {
        free(buf);
        return fail(conn, "write", rc);
      }
    }
  }
  free(buf);
  return 0;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One cycle: allocate, fill with the pattern of `seed`, read it back, release. */
static int one_cycle(cupool_conn* conn, const char* pool, int device, uint64_t size, uint64_t seed) {
  cupool_lease* lease = NULL;
  int rc = cupool_alloc(conn, pool, device, size, &lease);
  if (rc != CUPOOL_OK) return fail(conn, "alloc", rc);
  int result = fill_or_check(conn, lease, seed, 0);
  if (result == 0) result = fill_or_check(conn, lease, seed, 1);
  rc = cupool_release(conn, lease);
  if (rc != CUPOOL_OK && result == 0) result = fail(conn, "release", rc);
  return result;
}

struct worker {
  pthread_t thread;
  cupool_conn* conn;
  const char* pool;
  int device;
  uint64_t size;
  int index;
  int cycles;
  int result;
};

/* A thread of the `threads` action: cycles on the shared connection; every fourth cycle a status
 * request (cupool_request's reply is the thread's own), and every fourth a failing allocation
 * whose message (cupool_last_error) must be this thread's, not another's. */
static void* worker_main(void* arg) {
  struct worker* w = arg;
  for (int i = 0; i < w->cycles && w->result == 0; ++i) {
    cupool_lease* lease = NULL;
    int rc = cupool_alloc(w->conn, w->pool, w->device, w->size, &lease);
    if (rc != CUPOOL_OK) {
      fprintf(stderr, "testclient: thread %d: alloc: %s: %s\n", w->index, cupool_status_name(rc),
              cupool_last_error(w->conn));
      w->result = 2;
      break;
    }
    const uint64_t seed = (uint64_t)w->index * 1000u + (uint64_t)i;
    w->result = fill_or_check(w->conn, lease, seed, 0);
    if (w->result == 0) w->result = fill_or_check(w->conn, lease, seed, 1);
    if (w->result == 0 && i % 4 == 1) {
      /* A failure, and its message read back while the other threads go on calling. */
      char missing[32];
      snprintf(missing, sizeof missing, "missing-pool-%d", w->index);
      cupool_lease* none = NULL;
      rc = cupool_alloc(w->conn, missing, w->device, w->size, &none);
      const char* message = cupool_last_error(w->conn);
      if (rc != CUPOOL_E_NOT_FOUND || !strstr(message, missing)) {
        fprintf(stderr,
                "testclient: thread %d: alloc from %s: %s, message \"%s\" (expected CUPOOL_E_NOT_FOUND naming it)\n",
                w->index, missing, cupool_status_name(rc), message);
        w->result = 2;
      }
    }
    if (w->result == 0 && i % 4 == 0) {
      char* reply = NULL;
      rc = cupool_request(w->conn, "{\"op\": \"status\"}", &reply);
      if (rc != CUPOOL_OK || !reply || !strstr(reply, "\"ok\":true")) {
        fprintf(stderr, "testclient: thread %d: status: %s: %s\n", w->index, cupool_status_name(rc),
                reply ? reply : "");
        w->result = 2;
      }
      cupool_free_string(reply);
    }
    rc = cupool_release(w->conn, lease);
    if (rc != CUPOOL_OK && w->result == 0) {
      fprintf(stderr, "testclient: thread %d: release: %s\n", w->index, cupool_status_name(rc));
      w->result = 2;
    }
  }
  return NULL;
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
      if (result == 0)
        printf("testclient: %s ok (%llu bytes, backend %s)\n", action, (unsigned long long)cupool_lease_size(lease),
               cupool_backend(conn));
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
      if (rc != CUPOOL_OK) {
        printf("\n");
        result = fail(conn, "alloc", rc);
        break;
      }
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
      if (rc != CUPOOL_OK) {
        result = fail(conn, "alloc", rc);
        break;
      }
      result = fill_or_check(conn, lease, (uint64_t)i, 0);
      if (result == 0) result = fill_or_check(conn, lease, (uint64_t)i, 1);
      rc = cupool_release(conn, lease);
      if (rc != CUPOOL_OK && result == 0) result = fail(conn, "release", rc);
    }
    if (result == 0) printf("testclient: cycle ok (%d)\n", n);
  } else if (!strcmp(action, "load") && (argc == 7 || argc == 8)) {
    const int device = atoi(argv[4]);
    const uint64_t size = strtoull(argv[5], NULL, 10);
    const int n = atoi(argv[6]);
    const uint64_t seed0 = (uint64_t)getpid() * 1000u;
    uint64_t* lat = calloc((size_t)(n > 0 ? n : 1), sizeof *lat);
    result = lat ? one_cycle(conn, argv[3], device, size, seed0) : 2;
    if (result == 0 && argc == 8) {
      const int go = open(argv[7], O_RDONLY); /* blocks until the driver opens it for writing */
      if (go < 0) {
        perror("testclient: open GO");
        result = 2;
      } else {
        close(go);
      }
    }
    const uint64_t start = now_ns();
    for (int i = 0; i < n && result == 0; ++i) {
      const uint64_t t0 = now_ns();
      result = one_cycle(conn, argv[3], device, size, seed0 + (uint64_t)i + 1u);
      lat[i] = now_ns() - t0;
    }
    const uint64_t end = now_ns();
    if (result == 0) {
      printf("testclient: load ok %d %llu %llu ", n, (unsigned long long)start, (unsigned long long)end);
      for (int i = 0; i < n; ++i) printf("%s%llu", i ? "," : "", (unsigned long long)lat[i]);
      printf("\n");
    }
    free(lat);
  } else if (!strcmp(action, "threads") && argc == 8) {
    const int count = atoi(argv[6]);
    struct worker* workers = calloc((size_t)(count > 0 ? count : 1), sizeof *workers);
    result = workers && count > 0 ? 0 : 2;
    int started = 0;
    for (int i = 0; i < count && result == 0; ++i) {
      workers[i] = (struct worker){.conn = conn,
                                   .pool = argv[3],
                                   .device = atoi(argv[4]),
                                   .size = strtoull(argv[5], NULL, 10),
                                   .index = i,
                                   .cycles = atoi(argv[7])};
      if (pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]) != 0) {
        fprintf(stderr, "testclient: pthread_create failed\n");
        result = 2;
      } else {
        ++started;
      }
    }
    for (int i = 0; i < started; ++i) {
      pthread_join(workers[i].thread, NULL);
      if (workers[i].result && !result) result = workers[i].result;
    }
    if (result == 0) printf("testclient: threads ok (%d x %s)\n", count, argv[7]);
    free(workers);
  } else if (!strcmp(action, "warm") && argc == 7) {
    const int device = atoi(argv[4]);
    const uint64_t size = strtoull(argv[5], NULL, 10);
    const int n = atoi(argv[6]);
    uint64_t first_address = 0, first_id = 0;
    result = 0;
    for (int i = 0; i < n && result == 0; ++i) {
      cupool_lease* lease = NULL;
      rc = cupool_alloc(conn, argv[3], device, size, &lease);
      if (rc != CUPOOL_OK) {
        result = fail(conn, "alloc", rc);
        break;
      }
      if (i == 0) {
        first_address = cupool_lease_address(lease);
        first_id = cupool_lease_id(lease);
      } else if (cupool_lease_address(lease) != first_address || cupool_lease_id(lease) != first_id) {
        printf("testclient: cycle %d got lease %llu at %llx, not the cached lease %llu at %llx\n", i,
               (unsigned long long)cupool_lease_id(lease), (unsigned long long)cupool_lease_address(lease),
               (unsigned long long)first_id, (unsigned long long)first_address);
        result = 1;
      }
      if (result == 0) result = fill_or_check(conn, lease, (uint64_t)i, 0);
      if (result == 0) result = fill_or_check(conn, lease, (uint64_t)i, 1);
      rc = cupool_release(conn, lease);
      if (rc != CUPOOL_OK && result == 0) result = fail(conn, "release", rc);
    }
    if (result == 0) printf("testclient: warm ok %d %llu\n", n, (unsigned long long)cupool_cached_bytes(conn));
  } else if (!strcmp(action, "keep") && (argc == 7 || (argc == 8 && !strcmp(argv[7], "fork")))) {
    const int device = atoi(argv[4]);
    const uint64_t size = strtoull(argv[5], NULL, 10);
    const int count = atoi(argv[6]);
    cupool_lease** leases = calloc((size_t)(count > 0 ? count : 1), sizeof *leases);
    result = leases ? 0 : 2;
    for (int i = 0; i < count && result == 0; ++i) {
      rc = cupool_alloc(conn, argv[3], device, size, &leases[i]);
      if (rc != CUPOOL_OK) {
        result = fail(conn, "alloc", rc);
        break;
      }
      result = fill_or_check(conn, leases[i], (uint64_t)i, 0);
    }
    for (int i = 0; i < count && result == 0; ++i) {
      rc = cupool_release(conn, leases[i]);
      if (rc != CUPOOL_OK) result = fail(conn, "release", rc);
    }
    free(leases);
    if (result == 0 && argc == 8) {
      /* A child that disconnects the connection it inherited must leave the parent's alone (its
         socket, its thread that answers drop notices). */
      fflush(stdout);
      const pid_t child = fork();
      if (child == 0) {
        cupool_disconnect(conn);
        _exit(0);
      }
      int wstatus = 0;
      if (child < 0 || waitpid(child, &wstatus, 0) != child || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
        fprintf(stderr, "testclient: the forked child failed\n");
        result = 2;
      }
    }
    if (result == 0) {
      printf("testclient: cached %llu\n", (unsigned long long)cupool_cached_bytes(conn));
      fflush(stdout);
      char line[16];
      if (!fgets(line, sizeof line, stdin)) line[0] = 0;
      printf("testclient: cached %llu\n", (unsigned long long)cupool_cached_bytes(conn));
      cupool_lease* lease = NULL;
      rc = cupool_alloc(conn, argv[3], device, size, &lease);
      printf("testclient: after %s: %s\n", cupool_status_name(rc), rc == CUPOOL_OK ? "" : cupool_last_error(conn));
      if (lease) cupool_release(conn, lease);
    }
  } else if (!strcmp(action, "next") && argc == 6) {
    cupool_lease* lease = NULL;
    rc = cupool_alloc(conn, argv[3], atoi(argv[4]), strtoull(argv[5], NULL, 10), &lease);
    if (rc != CUPOOL_OK) {
      result = fail(conn, "alloc", rc);
    } else {
      printf("testclient: ready %llu\n", (unsigned long long)cupool_lease_id(lease));
      fflush(stdout);
      char line[16];
      if (!fgets(line, sizeof line, stdin)) line[0] = 0;
      char* reply = NULL;
      rc = cupool_request(conn, "{\"op\": \"status\"}", &reply);
      printf("testclient: next %s: %s\n", cupool_status_name(rc), rc == CUPOOL_OK ? "" : cupool_last_error(conn));
      cupool_free_string(reply);
      rc = cupool_release(conn, lease);
      printf("testclient: release %s: %s\n", cupool_status_name(rc), rc == CUPOOL_OK ? "" : cupool_last_error(conn));
      result = 0;
    }
  } else {
    fprintf(stderr, "testclient: unknown action or wrong arguments: %s\n", action);
  }
  cupool_disconnect(conn);
  return result;
}
