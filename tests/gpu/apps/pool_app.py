#!/usr/bin/env python3
"""A third-party program's view of its own CUDA memory pool: run as is, and under `cupool exec`.

  pool_app.py cupy|torch|cuda-runtime [--iterations N] [--size BYTES]

The framework allocates through the stream-ordered allocator (CuPy: cupy.cuda.MemoryAsyncPool;
PyTorch: PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; cuda-runtime: plain cudaMallocAsync and
cudaFreeAsync on the default pool through CuPy's runtime bindings, as a C++ program would call them). The program reads its device 0 default
and current pool attributes through the driver (ctypes on libcuda.so.1, cuDeviceGetDefaultMemPool /
cuDeviceGetMemPool / cuMemPoolGetAttribute) before and after an allocation-heavy loop (allocate SIZE,
free, synchronize; N times) and prints one JSON line: the attributes, the loop's median, p99 and
mean microseconds per iteration, and the bytes the framework itself reports reserved (CuPy:
MemoryAsyncPool.total_bytes(); PyTorch: torch.cuda.memory_reserved()). Nothing in it knows about cupool.
"""
import ctypes
import json
import os
import sys
import time

ATTRS = {  # CUmemPool_attribute
    "reuse.follow_event_dependencies": (1, ctypes.c_int),
    "reuse.allow_opportunistic": (2, ctypes.c_int),
    "reuse.allow_internal_dependencies": (3, ctypes.c_int),
    "release_threshold": (4, ctypes.c_uint64),
    "reserved_current": (5, ctypes.c_uint64),
    "used_high": (8, ctypes.c_uint64),
}


def pool_attributes(cuda):
    out = {}
    for which, getter in (("default", cuda.cuDeviceGetDefaultMemPool), ("current", cuda.cuDeviceGetMemPool)):
        pool = ctypes.c_void_p()
        rc = getter(ctypes.byref(pool), 0)
        if rc != 0:
            out[which] = {"error": f"CUresult {rc}"}
            continue
        attrs = {"handle": hex(pool.value or 0)}
        for name, (attr, ctype) in ATTRS.items():
            value = ctype()
            rc = cuda.cuMemPoolGetAttribute(pool, attr, ctypes.byref(value))
            attrs[name] = value.value if rc == 0 else f"CUresult {rc}"
        out[which] = attrs
    return out


def main():
    framework = sys.argv[1] if len(sys.argv) > 1 else "cupy"
    iterations = int(sys.argv[sys.argv.index("--iterations") + 1]) if "--iterations" in sys.argv else 300
    size = int(sys.argv[sys.argv.index("--size") + 1]) if "--size" in sys.argv else 64 << 20
    cuda = ctypes.CDLL("libcuda.so.1")

    reported = lambda: None  # what the framework itself says it has reserved
    if framework == "cupy":
        import cupy
        pool = cupy.cuda.MemoryAsyncPool()
        cupy.cuda.set_allocator(pool.malloc)
        cupy.cuda.Device(0).use()
        reported = pool.total_bytes

        def once():
            cupy.empty(size, dtype=cupy.uint8)  # allocated and dropped at once
            cupy.cuda.Device(0).synchronize()
        version = cupy.__version__
    elif framework == "cuda-runtime":
        # cudaMallocAsync / cudaFreeAsync on the default pool, as a C++ program would call them (through
        # CuPy's thin runtime bindings); nothing sets the pool's attributes.
        import cupy
        rt = cupy.cuda.runtime
        rt.setDevice(0)

        def once():
            ptr = rt.mallocAsync(size, 0)
            rt.freeAsync(ptr, 0)
            rt.deviceSynchronize()
        version = "cupy.cuda.runtime " + cupy.__version__
    elif framework == "torch":
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")
        import torch
        torch.cuda.init()

        def once():
            torch.empty(size, dtype=torch.uint8, device="cuda:0")  # allocated and dropped at once
            torch.cuda.synchronize()
        version = torch.__version__ + " (allocator backend " + torch.cuda.get_allocator_backend() + ")"
        reported = lambda: torch.cuda.memory_reserved(0)
    else:
        sys.exit(f"unknown framework {framework}")

    once()  # the framework's own start-up (context, allocator set-up)
    before = pool_attributes(cuda)
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter_ns()
        once()
        samples.append((time.perf_counter_ns() - t0) / 1000.0)
    after = pool_attributes(cuda)
    samples.sort()
    print(json.dumps({
        "framework": framework, "version": version, "pid": os.getpid(),
        "under_cupool_exec": bool(os.environ.get("CUPOOL_EXEC_CONFIG")),
        "iterations": iterations, "size": size,
        "median_us": samples[len(samples) // 2], "p99_us": samples[min(len(samples) - 1, (99 * len(samples)) // 100)],
        "mean_us": sum(samples) / len(samples),
        "pool_before_loop": before, "pool_after_loop": after, "framework_reports_reserved": reported(),
    }))


if __name__ == "__main__":
    main()
