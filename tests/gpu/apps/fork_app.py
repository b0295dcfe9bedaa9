#!/usr/bin/env python3
"""Does CUDA work in a child forked (not exec'd) after the parent initialised the driver?

  fork_app.py [init|context|none]

The parent does what `cupool exec` may do before main: `init` calls cuInit, `context` also retains
device 0's primary context (what process.current_pool does), `none` touches nothing. Then it
forks; the child calls cuInit, retains the primary context, allocates 1 MiB and frees it, and
reports each CUresult. The parent prints one JSON line. Nothing in it knows about cupool: run it
plain and under `cupool exec` to see what the preload library's start-up does to such programs.
"""
import ctypes
import json
import os
import sys


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "none"
    cuda = ctypes.CDLL("libcuda.so.1")
    parent = {}
    if mode in ("init", "context"):
        parent["cuInit"] = cuda.cuInit(0)
    if mode == "context":
        dev = ctypes.c_int()
        ctx = ctypes.c_void_p()
        parent["cuDeviceGet"] = cuda.cuDeviceGet(ctypes.byref(dev), 0)
        parent["cuDevicePrimaryCtxRetain"] = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        child = {"cuInit": cuda.cuInit(0)}
        dev = ctypes.c_int()
        ctx = ctypes.c_void_p()
        ptr = ctypes.c_uint64()
        child["cuDeviceGet"] = cuda.cuDeviceGet(ctypes.byref(dev), 0)
        child["cuDevicePrimaryCtxRetain"] = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        child["cuCtxSetCurrent"] = cuda.cuCtxSetCurrent(ctx)
        child["cuMemAlloc"] = cuda.cuMemAlloc_v2(ctypes.byref(ptr), 1 << 20)
        child["cuMemFree"] = cuda.cuMemFree_v2(ptr) if child["cuMemAlloc"] == 0 else None
        os.write(w, json.dumps(child).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.waitpid(pid, 0)
    child = json.loads(data) if data else {"error": "the child wrote nothing"}
    ok = all(v == 0 for v in child.values() if v is not None) and "error" not in child
    print(json.dumps({"mode": mode, "under_cupool_exec": bool(os.environ.get("CUPOOL_EXEC_CONFIG")),
                      "parent": parent, "child": child, "child_cuda_works": ok}))


if __name__ == "__main__":
    main()
