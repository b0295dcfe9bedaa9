/* cupool client API: talk to a running `cupool hold` from C, C++, Python (ctypes) or anything
 * that can call C. Stable ABI: only opaque handles, fixed-width integers and C strings cross it;
 * new functions are added, none is changed or removed within ABI version 1 (libcupool-client.so.1).
 *
 * The memory model: the holder owns the pools. cupool_alloc asks the holder to allocate from a
 * pool; the library imports the pool once (its file descriptor arrives over the socket), imports
 * the allocation and waits until it is ready, so the returned pointer can be used at once from
 * the pool's device. cupool_release frees the mapping here first, then the holder frees. When the
 * connection closes (cupool_disconnect, or the process dies) the holder frees every lease left.
 *
 * The cache (holders that speak protocol 2): cupool_release of an allocation keeps its mapping in
 * this process and tells the holder, which keeps the block charged to this connection (quota
 * included; "cached" in `cupool status`). The next cupool_alloc of the same pool, device and size
 * takes it back without waiting for the holder: no export, import or unmap. The holder asks for
 * cached blocks when it needs the memory (trim, apply, an allocation that does not fit); a thread
 * of this library answers while the application makes no call. cupool_set_cache_limit bounds or
 * turns off the cache; so does CUPOOL_CLIENT_CACHE=0 in the environment (at connect).
 *
 * Every function that can fail returns CUPOOL_OK (0) or a negative cupool_status; the message
 * of the last failure on a connection is cupool_last_error(conn). A connection may be used from
 * several threads (calls are serialised); leases belong to the connection that made them. */
#ifndef CUPOOL_CLIENT_H
#define CUPOOL_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CUPOOL_API __attribute__((visibility("default")))
#else
#define CUPOOL_API
#endif

#define CUPOOL_CLIENT_ABI_VERSION 1
#define CUPOOL_PROTOCOL_VERSION 4

typedef enum cupool_status {
  CUPOOL_OK = 0,
  CUPOOL_E_UNREACHABLE = -1,   /* no holder at the socket, or the connection was lost */
  CUPOOL_E_REFUSED = -2,       /* the holder refused: this user is not in the pool's share list */
  CUPOOL_E_NOT_FOUND = -3,     /* no such pool, device, buffer or lease */
  CUPOOL_E_QUOTA = -4,         /* the pool's quota_per_client would be exceeded */
  CUPOOL_E_OUT_OF_MEMORY = -5, /* the pool or the device has no room */
  CUPOOL_E_INVALID = -6,       /* a bad argument (the message says which) */
  CUPOOL_E_PROTOCOL = -7,      /* the holder answered something this library does not understand */
  CUPOOL_E_CUDA = -8,          /* a CUDA driver call in this process failed */
  CUPOOL_E_BUSY = -9,          /* the holder is draining, or the object is in use */
  CUPOOL_E_EXISTS = -10,       /* a buffer of that name exists */
  CUPOOL_E_INTERNAL = -11
} cupool_status;

typedef struct cupool_conn cupool_conn;   /* a connection to the holder */
typedef struct cupool_lease cupool_lease; /* an allocation or an opened buffer */

/* CUPOOL_CLIENT_ABI_VERSION of the loaded library. */
CUPOOL_API int cupool_abi_version(void);
/* A static, readable name for a status ("CUPOOL_E_REFUSED"). */
CUPOOL_API const char* cupool_status_name(int status);

/* Connects and says hello. `socket_path` NULL means $CUPOOL_SOCKET, else /run/cupool/cupool.sock.
 * `client_name` (may be NULL) shows in `cupool status`. On failure *out is NULL and the message
 * is in cupool_last_error(NULL).
 * When the holder goes away (it stopped, restarted or crashed), the call that finds out fails with
 * CUPOOL_E_UNREACHABLE and says so; buffers mapped on the connection stay valid (held buffers
 * outlive the holder) and can still be read, written and released. The next cupool_alloc,
 * cupool_open_buffer* or cupool_request connects to the holder again by itself (a new session:
 * cached blocks of the old one are unmapped). */
CUPOOL_API int cupool_connect(const char* socket_path, const char* client_name, cupool_conn** out);
/* Frees every lease of the connection (here first, then in the holder), closes it, frees `conn`.
 * NULL is ignored. In a child of fork() it only closes the child's copies (the parent's
 * connection and the library's thread that answers the holder go on); a child must make no other
 * call on a connection it inherited. */
CUPOOL_API void cupool_disconnect(cupool_conn* conn);
/* The message of this thread's last failed call on `conn` (or, with `conn` NULL, of this thread's
 * last failed cupool_connect, cupool_configure or cupool_stats); "" when none. Valid until this
 * thread's next call on it. */
CUPOOL_API const char* cupool_last_error(const cupool_conn* conn);
/* "cuda" or "simulated": what the holder runs on. */
CUPOOL_API const char* cupool_backend(const cupool_conn* conn);

/* Allocates `size` bytes from pool `pool` on the holder's device `device` (-1: the pool's first
 * device). The lease's pointer is usable from the pool's device in this process on return. */
CUPOOL_API int cupool_alloc(cupool_conn* conn, const char* pool, int device, uint64_t size, cupool_lease** out);
/* Opens the named buffer (created with `cupool buffer create` or the config's buffers:); for a
 * buffer of several parts, its first part. */
CUPOOL_API int cupool_open_buffer(cupool_conn* conn, const char* name, cupool_lease** out);
/* Opens part `part` (from 0) of the named buffer: a tensor set made by `cupool buffer load` is
 * held in parts, one allocation each (the `buffer_tensors` request lists their sizes, and each
 * tensor's part). CUPOOL_E_NOT_FOUND when the buffer has no such part. */
CUPOOL_API int cupool_open_buffer_part(cupool_conn* conn, const char* name, uint32_t part, cupool_lease** out);
/* Opens part `part` of the named buffer for use from this process's device `device` (-1: the
 * device that holds it). A buffer on another device is mapped for `device` over peer access
 * (NVLink or PCIe): the lease's device is then `device`, its memory stays where it is held.
 * CUPOOL_E_REFUSED when the pool's `access` does not list that device, CUPOOL_E_CUDA when the
 * driver can't map it there. Needs a holder of protocol 3 (its buffers are exported allocations). */
CUPOOL_API int cupool_open_buffer_on(cupool_conn* conn, const char* name, uint32_t part, int device,
                                     cupool_lease** out);
/* Frees an allocation (or closes a buffer): unmapped here, then released in the holder. Finish
 * this process's GPU work on the lease first (synchronize the streams that use it): the release
 * does not wait for them. The lease is freed even when the holder can't be told. NULL is ignored
 * (returns CUPOOL_OK). */
CUPOOL_API int cupool_release(cupool_conn* conn, cupool_lease* lease);

/* At most `bytes` of released allocations stay cached on this connection (default: no limit; 0
 * turns the cache off). What is cached beyond it is unmapped and freed in the holder now. */
CUPOOL_API int cupool_set_cache_limit(cupool_conn* conn, uint64_t bytes);
/* Bytes of released allocations this connection keeps cached now. */
CUPOOL_API uint64_t cupool_cached_bytes(const cupool_conn* conn);

/* The lease's address in this process (a CUdeviceptr on a real node; a host address on a
 * simulated node), its size in bytes, its id in the holder, and the CUDA ordinal in this process
 * of the device it lives on (CUDA_VISIBLE_DEVICES is taken into account). */
CUPOOL_API uint64_t cupool_lease_address(const cupool_lease* lease);
CUPOOL_API uint64_t cupool_lease_size(const cupool_lease* lease);
CUPOOL_API uint64_t cupool_lease_id(const cupool_lease* lease);
CUPOOL_API int cupool_lease_device(const cupool_lease* lease);

/* Copies between host memory and a lease (offset and bytes must lie inside it); convenient for
 * callers without their own CUDA code. */
CUPOOL_API int cupool_write(cupool_conn* conn, const cupool_lease* lease, uint64_t offset, const void* source,
                            uint64_t bytes);
CUPOOL_API int cupool_read(cupool_conn* conn, const cupool_lease* lease, uint64_t offset, void* target, uint64_t bytes);

/* A part of a file to copy into a lease: `bytes` bytes from `file_offset` to `lease_offset`. */
typedef struct cupool_file_range {
  uint64_t file_offset;
  uint64_t lease_offset;
  uint64_t bytes;
} cupool_file_range;
/* Called after each chunk with the bytes read so far and the total of the ranges. */
typedef void (*cupool_progress_fn)(uint64_t done, uint64_t total, void* arg);

/* Copies `count` ranges of the file open at `fd` into the lease: several threads read chunks (2 MiB
 * from the page cache, 64 MiB with O_DIRECT) into pinned staging slots of their own (two each, on
 * huge pages where the node allows: 4 MiB of pinned host memory a thread, 128 MiB with O_DIRECT)
 * while the copies of the chunks read before run; returns once the copies are done, so
 * another process may read the memory right after. `progress` may be NULL; it is called on the
 * calling thread about ten times a second. A range outside the lease, or a file that ends first,
 * is CUPOOL_E_INVALID. The same as cupool_load_file_with(..., NULL, NULL, progress, arg). */
CUPOOL_API int cupool_load_file(cupool_conn* conn, const cupool_lease* lease, int fd, const cupool_file_range* ranges,
                                size_t count, cupool_progress_fn progress, void* arg);

/* How a file is read: with O_DIRECT when most of the ranges' pages are not in the page cache
 * (AUTO: no copy through the cache, which a cold file would only fill), always, or never. */
typedef enum cupool_direct_io {
  CUPOOL_DIRECT_IO_AUTO = 0,
  CUPOOL_DIRECT_IO_ALWAYS = 1,
  CUPOOL_DIRECT_IO_NEVER = 2
} cupool_direct_io;
typedef struct cupool_load_options {
  uint32_t threads;           /* reading threads; 0: one per core, 2 to 16 */
  cupool_direct_io direct_io; /* ALWAYS on a file system without O_DIRECT is CUPOOL_E_INVALID */
} cupool_load_options;
/* What a load did. The reads and the copies overlap, so read_seconds and copy_wait_seconds are each
 * thread's busy time averaged over the threads: a load that waits little for its copies is bound
 * by its reads. */
typedef struct cupool_load_report {
  uint64_t bytes;
  double seconds;           /* wall clock */
  double read_seconds;      /* reading the file */
  double copy_wait_seconds; /* waiting for a slot's copy to the GPU to finish */
  uint32_t threads;
  int32_t direct_io;        /* 1: read with O_DIRECT */
  double resident_fraction; /* of the ranges' pages in the page cache before the load (AUTO only; else 1) */
} cupool_load_report;
/* cupool_load_file with options (NULL: the defaults) and a report (may be NULL), filled on success.
 * GPUDirect Storage as CUPOOL_GDS_AUTO (cupool_load_file_gds). */
CUPOOL_API int cupool_load_file_with(cupool_conn* conn, const cupool_lease* lease, int fd,
                                     const cupool_file_range* ranges, size_t count, const cupool_load_options* options,
                                     cupool_load_report* report, cupool_progress_fn progress, void* arg);

/* Whether a load reads through GPUDirect Storage (NVIDIA's cuFile, libcufile.so.0, loaded at run
 * time and only for a load that may use it): AUTO when the nvidia-fs kernel module is loaded and
 * cuFile takes the file (otherwise the staged reads, and the path's gds_note says why); ALWAYS
 * (CUPOOL_E_INVALID where cuFile is missing or refuses the file; without nvidia-fs cuFile reads in
 * its compatibility mode); NEVER (libcufile is never loaded). */
typedef enum cupool_gds { CUPOOL_GDS_AUTO = 0, CUPOOL_GDS_ALWAYS = 1, CUPOOL_GDS_NEVER = 2 } cupool_gds;
/* How a load's bytes travelled: read into pinned host memory and copied (STAGED), by cuFile from
 * storage straight into device memory (GPUDIRECT), or by cuFile without nvidia-fs (its own reads
 * through host memory: GPUDIRECT_COMPATIBILITY, only with CUPOOL_GDS_ALWAYS). */
typedef enum cupool_read_method {
  CUPOOL_READ_STAGED = 0,
  CUPOOL_READ_GPUDIRECT = 1,
  CUPOOL_READ_GPUDIRECT_COMPATIBILITY = 2
} cupool_read_method;
typedef struct cupool_load_path {
  int32_t read_method; /* a cupool_read_method */
  char gds_note[256];  /* why GPUDirect Storage was not used (CUPOOL_GDS_AUTO); "" when it was, or NEVER */
} cupool_load_path;
/* cupool_load_file_with, choosing GPUDirect Storage (`gds`) and telling how the bytes travelled
 * (`path`, may be NULL; filled on success). */
CUPOOL_API int cupool_load_file_gds(cupool_conn* conn, const cupool_lease* lease, int fd,
                                    const cupool_file_range* ranges, size_t count, const cupool_load_options* options,
                                    cupool_gds gds, cupool_load_report* report, cupool_load_path* path,
                                    cupool_progress_fn progress, void* arg);

/* Sends one protocol request (a JSON object without "id"; see docs/protocol.md) and returns the
 * holder's JSON reply in *reply (free it with cupool_free_string). A reply with "ok": false is
 * still CUPOOL_OK here; the caller reads its "error". This is how `cupool status`, `stats`,
 * `trim`, `plan`, `apply`, `export` and `buffer` talk to the holder. */
CUPOOL_API int cupool_request(cupool_conn* conn, const char* request_json, char** reply);
CUPOOL_API void cupool_free_string(char* text);

/* ---- budgets (docs/budgets.md): what the preload of `cupool exec --budget` says to the holder ---- */

/* Claims the budget grant `grant` (CUPOOL_EXEC_GRANT) for this process: the grant then lives as
 * long as `conn`. CUPOOL_E_NOT_FOUND (no such grant), CUPOOL_E_REFUSED (another user's, or made for
 * a process this one does not descend from), CUPOOL_E_BUSY (another process holds it). */
CUPOOL_API int cupool_budget_claim(cupool_conn* conn, const char* grant);
/* What this process holds on one device of its budget (by UUID, "GPU-..."), and its peak. */
typedef struct cupool_budget_use {
  char uuid[48];
  uint64_t used_bytes;
  uint64_t peak_bytes;
} cupool_budget_use;
/* Reports `count` devices' use of the grant `conn` claimed (the ledger shows it). */
CUPOOL_API int cupool_budget_report(cupool_conn* conn, const cupool_budget_use* uses, size_t count);

/* ---- in this process (no holder involved) ---- */

/* Applies the config file's `process:` section to the calling process: on each selected device,
 * the default pool's release threshold, reuse policies and peer access, and with `current_pool` a
 * pool created in this process and made the device's current pool (cudaMallocAsync allocates from
 * it). Changes only what differs (a second call changes nothing), touches no device that is not
 * selected, and creates no CUDA context unless `current_pool` asks for a pool (that retains the
 * device's primary context). Safe to call before the application's first CUDA call. All or nothing,
 * and it never aborts the caller: a bad file or a driver refusal is a status and a message
 * (cupool_last_error(NULL)), with what was changed put back. `report` (may be NULL) receives
 * JSON (schemas/cupool-configure-v1.schema.json): {"schema_version", "devices": [...], "changes":
 * [{"process_device", "uuid", "pci_bus_id", "field", "from", "to"}], "findings": [...],
 * "warnings_rendered"}, with each change's "device" and the top-level "warnings" (text) written
 * under their old names too until cupool 0.2 (free it with cupool_free_string).
 * $CUPOOL_PROFILE selects a simulated node instead of the driver. */
CUPOOL_API int cupool_configure(const char* path, char** report);
/* This process's pool figures as JSON (free with cupool_free_string): per device with an active
 * context, the default pool (and the current pool when it is another one) with release threshold,
 * reuse policies, reserved and used bytes (current and high), and the device's graph memory.
 * Pool statistics die with the process: call it before exit (cupool exec --report does). */
CUPOOL_API int cupool_stats(char** json);

#ifdef __cplusplus
}
#endif

#endif /* CUPOOL_CLIENT_H */
