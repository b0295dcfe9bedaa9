#!/usr/bin/env python3
"""Per-device memory budgets inside a process (issue 36): the preload library with
CUPOOL_EXEC_BUDGET, in budget_probe reaching a stand-in driver (fake_cuda.c, 2 devices of 16 GiB)
and a stand-in NVML (fake_nvml.c) the ways real programs do; the grant's claim and usage reports
reach a fake holder (the frames of docs/protocol.md).

  budget_test.py --preload build/libcupool-preload.so --probe build/tests/exec/cupool_budget_probe \
                 --fake-cuda build/tests/exec/libcuda.so.1 --fake-nvml build/tests/exec/libnvidia-ml.so.1
"""
import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

GIB = 1 << 30
MIB = 1 << 20
DEV0 = "GPU-e886b279-2f4c-84d2-1f32-11a9c23257b7"  # the bundled H100 profile's
DEV1 = "GPU-8d1c6a3e-0c11-4e4e-9f1e-1c2d3e4f5a6c"
HEADER = struct.Struct("<4sHHII")  # magic, version, kind, length, fds


class FakeHolder:
    """A Unix-socket server that answers hello, budget_claim (with `claim`) and budget_usage (with
    `usage`), recording each request with its time, and when each connection closed."""

    def __init__(self, path, claim=None, usage=None):
        self.claim = claim or {"ok": True, "grant": "g-42"}
        self.usage = usage or {"ok": True}
        self.requests = []
        self.closed = []
        self.lock = threading.Lock()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(8)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self.talk, args=(conn,), daemon=True).start()

    def read(self, conn, n):
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def talk(self, conn):
        with conn:
            while True:
                header = self.read(conn, HEADER.size)
                if header is None:
                    break
                magic, version, kind, length, fds = HEADER.unpack(header)
                message = json.loads(self.read(conn, length))
                with self.lock:
                    self.requests.append((time.monotonic(), message))
                op = message.get("op")
                if op == "hello":
                    reply = {"ok": True, "protocol": message["protocol"], "protocols": [1, 4], "version": "fake holder",
                             "pid": os.getpid(), "backend": "simulated"}
                else:
                    reply = self.claim if op == "budget_claim" else self.usage
                data = json.dumps(dict(reply, id=message.get("id"))).encode()
                conn.sendall(HEADER.pack(b"CUPL", 1, 2, len(data), 0) + data)
        with self.lock:
            self.closed.append(time.monotonic())

    def ops(self, op):
        with self.lock:
            return [(t, m) for t, m in self.requests if m.get("op") == op]

    def stop(self):
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept
        except OSError:
            pass
        self.server.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preload", required=True)
    ap.add_argument("--probe", required=True)
    ap.add_argument("--fake-cuda", required=True)
    ap.add_argument("--fake-nvml", required=True)
    ap.add_argument("--sanitized", action="store_true", help="the build is sanitized: skip (exit 77)")
    args = ap.parse_args()
    for name in ("preload", "probe", "fake_cuda", "fake_nvml"):
        setattr(args, name, os.path.abspath(getattr(args, name)))
    if args.sanitized:
        print("skipped: a sanitized preload library can't be loaded into an unsanitized program")
        return 77
    # As exec_test.py: a directory on LD_LIBRARY_PATH holding the real driver would be searched first.
    os.environ["LD_LIBRARY_PATH"] = ":".join(
        d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":")
        if d and not os.path.exists(os.path.join(d, "libcuda.so.1")))
    for name in ("CUPOOL_EXEC_BUDGET", "CUPOOL_EXEC_GRANT", "CUPOOL_EXEC_CONFIG", "CUPOOL_EXEC_STRICT", "CUPOOL_SOCKET"):
        os.environ.pop(name, None)
    tmp = tempfile.mkdtemp(prefix="cupool-budget-")
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    def probe(budget, *commands, **env):
        """Runs the probe under the preload; returns (exit status, its JSON lines by command, stderr)."""
        e = dict(os.environ, LD_PRELOAD=args.preload, **env)
        if budget is not None:
            e["CUPOOL_EXEC_BUDGET"] = budget
        r = subprocess.run([args.probe, args.fake_cuda, args.fake_nvml] + list(commands), capture_output=True,
                           text=True, env=e, timeout=60)
        lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        return r.returncode, lines, r.stderr

    try:
        budget4 = f"{DEV0}={4 * GIB}"

        # Which library each lookup's answer lies in: with a budget, every wrapped entry point asked
        # for by dlsym, by cuGetProcAddress_v2 (suffix-less names, the _ptsz variant) and by NVML's
        # dlsym is the preload's; the v1 ABI and what isn't wrapped stay the driver's.
        rc, lines, err = probe(budget4, "where")
        w = lines[0] if lines else {}
        wrapped = ["dlsym cuMemAlloc_v2", "dlsym cuMemGetInfo_v2", "dlsym cuDeviceTotalMem_v2", "dlsym cuMemFree_v2",
                   "getproc cuMemAlloc", "getproc cuMemGetInfo", "getproc cuDeviceTotalMem",
                   "getproc cuMemAllocAsync ptds", "getproc cuMemFreeAsync", "dlsym nvmlDeviceGetMemoryInfo",
                   "dlsym nvmlDeviceGetMemoryInfo_v2"]
        check(rc == 0 and all(w.get(k) == "preload" for k in wrapped),
              f"with a budget, the wrapped entry points are the preload's on every path: {w} {err}")
        check(w.get("dlsym cuMemAlloc") == "driver" and w.get("getproc cuMemAlloc 3000") == "driver"
              and w.get("dlsym cuDeviceGet") == "driver" and w.get("getproc cuDeviceGet") == "driver"
              and w.get("dlsym nvmlDeviceGetUUID") == "nvml",
              f"the v1 ABI and what is not wrapped stay the driver's: {w}")
        for unset in (None, ""):
            rc, lines, err = probe(unset, "where")
            w = lines[0] if lines else {}
            check(rc == 0 and w and all(v in ("driver", "nvml") for k, v in w.items() if k != "cmd") and err == "",
                  f"CUPOOL_EXEC_BUDGET {'unset' if unset is None else 'empty'}: nothing is handed out: {w} {err!r}")

        # The view: the budget through every path on device 0; device 1 (no budget) untouched; NVML
        # matched by UUID (it numbers the devices the other way round).
        rc, lines, err = probe(budget4, "view", "device:1", "view")
        v0, v1 = (lines[0], lines[2]) if len(lines) == 3 else ({}, {})
        check(rc == 0 and v0.get("getinfo_dlsym") == [0, 4 * GIB, 4 * GIB]
              and v0.get("getinfo_getproc") == [0, 4 * GIB, 4 * GIB],
              f"cuMemGetInfo_v2 (dlsym, cuGetProcAddress) answers the budget: {v0} {err}")
        check(v0.get("totalmem_dlsym") == [4 * GIB, 16 * GIB] and v0.get("totalmem_getproc") == [4 * GIB, 16 * GIB],
              f"cuDeviceTotalMem_v2: the budget on device 0, the device on device 1: {v0}")
        nv = v0.get("nvml", {})
        check(nv.get(DEV0) == {"v1": [4 * GIB, 4 * GIB, 0], "v2": [4 * GIB, 0, 4 * GIB, 0]},
              f"NVML on the budgeted device: total = budget, free = budget, used 0, reserved 0: {nv}")
        check(nv.get(DEV1) == {"v1": [16 * GIB, 13 * GIB, 3 * GIB], "v2": [16 * GIB, GIB // 2, 12 * GIB + GIB // 2, 3 * GIB]},
              f"NVML on the device without a budget: the device's own figures: {nv}")
        check(v1.get("getinfo_getproc") == [0, 16 * GIB, 16 * GIB],
              f"cuMemGetInfo_v2 with device 1 current passes through: {v1}")

        # Used rises and falls with each way of allocating and freeing; device 1 and the v1 ABI are
        # not charged; a pool made on device 0 charges device 0 while device 1 is current.
        steps = ["alloc:v2:1048576", "alloc:getproc:2097152", "alloc:pitch:1000", "alloc:managed:3145728",
                 "alloc:create0:4194304", "alloc:async:5242880", "alloc:async_ptsz:6291456", "device:1",
                 "alloc:pool0:7340032", "alloc:create1:8388608", "alloc:getproc:9437184", "device:0", "view",
                 "alloc:v1:1048576", "free", "free", "free", "free", "free", "free", "free", "free", "free", "free",
                 "free"]
        rc, lines, err = probe(budget4, *steps)
        used = [line["view_used"] for line in lines if line["cmd"] in ("alloc", "free")]
        charged = [1 * MIB, 2 * MIB, 1024 * 4, 3 * MIB, 4 * MIB, 5 * MIB, 6 * MIB, 7 * MIB]
        running = [sum(charged[:i + 1]) for i in range(len(charged))]
        total = running[-1]
        # On device 1 the view is the device's (16 GiB less what the driver handed out there).
        expected_used = running[:7] + [None, None, None, total] + [total, total, total] + list(reversed(running[:7])) + [0]
        ok = rc == 0 and len(used) == len(expected_used) and all(
            e is None or u == e for u, e in zip(used, expected_used))
        check(ok, f"used follows every allocation and free on device 0 (pitch x height, managed, cuMemCreate, async, "
                  f"_ptsz, a device-0 pool): {used} vs {expected_used} {err}")
        check(all(line.get("rc") == 0 for line in lines if line["cmd"] in ("alloc", "free", "device")),
              f"every allocation and free succeeded: {[line.get('rc') for line in lines]}")
        view = next((line for line in lines if line["cmd"] == "view"), {})
        check(view.get("nvml", {}).get(DEV0, {}).get("v1") == [4 * GIB, 4 * GIB - total, total],
              f"NVML's used is this process's: {view.get('nvml')}")
        v1_step = next((line for line in lines if line["cmd"] == "alloc" and line["view_used"] == total
                        and line["driver_used"][0] > view.get("driver_used", [0])[0]), None)
        check(v1_step is not None, "the v1 cuMemAlloc (unsigned int sizes) is not wrapped: uncharged")

        # Past the budget: CUDA_ERROR_OUT_OF_MEMORY without the driver being asked, in the budgeted
        # process only; a process without a budget still allocates.
        budget1 = f"{DEV0}={GIB}"
        rc, lines, err = probe(budget1, "alloc:getproc:1073741824", "alloc:v2:1", "alloc:async_ptsz:1",
                               "alloc:create0:1", "alloc:pitch:1", "free", "fill:getproc:268435456:10")
        check(rc == 0 and [line["rc"] for line in lines[:5]] == [0, 2, 2, 2, 2]
              and all(line["driver_used"][0] == GIB for line in lines[:5]),
              f"an allocation past the budget fails with 2 and never reaches the driver: {lines[:5]} {err}")
        check(len(lines) == 7 and lines[6] == {"cmd": "fill", "ok": 4, "rc": 2},
              f"1 GiB of budget holds four 256 MiB allocations: {lines[6:]}")
        rc, lines, err = probe(None, "fill:getproc:268435456:10", "alloc:getproc:2147483648")
        check(rc == 0 and lines[0] == {"cmd": "fill", "ok": 10, "rc": 0} and lines[1]["rc"] == 0,
              f"a process without a budget allocates past it: {lines} {err}")

        # Threads allocating at once never take the device past its budget: the driver's own count
        # of what it handed out peaks at the budget.
        rc, lines, err = probe(budget1, "threads:8:67108864:8", FAKE_CUDA_LATENCY_US="200")
        t = lines[0] if lines else {}
        check(rc == 0 and t.get("ok") == 16 and t.get("failed") == 48 and t.get("other_rc") == 0
              and t.get("driver_peak") == GIB and t.get("view_used") == GIB,
              f"8 threads x 8 allocations of 64 MiB against 1 GiB: 16 succeed, the driver never above 1 GiB: {t} {err}")

        # A budget naming device 1 only: device 0 passes through.
        rc, lines, err = probe(f"{DEV1.upper()}={2 * GIB}", "view", "device:1", "view")
        check(rc == 0 and lines[0]["getinfo_getproc"] == [0, 16 * GIB, 16 * GIB]
              and lines[2]["getinfo_getproc"] == [0, 2 * GIB, 2 * GIB] and lines[0]["totalmem_getproc"] == [16 * GIB, 2 * GIB],
              f"a budget on device 1 (its UUID in upper case): device 0 untouched: {lines} {err}")
        rc, lines, err = probe(f"GPU-00000000-0000-0000-0000-000000000000={GIB}", "view")
        check(rc == 0 and lines[0]["getinfo_getproc"] == [0, 16 * GIB, 16 * GIB]
              and "GPU-00000000-0000-0000-0000-000000000000" in err and "budget is unused" in err,
              f"a budget for a device this process doesn't have is said, and changes nothing: {err}")

        # No budget: the figures are the driver's and NVML's.
        rc, lines, err = probe(None, "alloc:getproc:1048576", "view")
        check(rc == 0 and lines[1]["getinfo_getproc"] == [0, 16 * GIB - MIB, 16 * GIB]
              and lines[1]["nvml"].get(DEV0, {}).get("v1") == [16 * GIB, 13 * GIB, 3 * GIB] and err == "",
              f"without CUPOOL_EXEC_BUDGET the figures are the driver's: {lines} {err!r}")

        # A malformed value: a clear message naming the variable and what is valid; no budget, or
        # exit 3 under CUPOOL_EXEC_STRICT=1.
        for bad in ("nonsense", f"{DEV0}=4GiB", "GPU-8d1c6a3e=1", f"{DEV0}=1,{DEV0}=2", f"{DEV0}=1,",
                    f"{DEV0}=99999999999999999999"):
            rc, lines, err = probe(bad, "view")
            check(rc == 0 and "CUPOOL_EXEC_BUDGET=" + bad in err and "UUID=BYTES" in err and "no budget" in err
                  and lines and lines[0]["getinfo_getproc"] == [0, 16 * GIB, 16 * GIB],
                  f"CUPOOL_EXEC_BUDGET={bad!r}: said, no budget: {err.strip()}")
            rc, lines, err = probe(bad, "view", CUPOOL_EXEC_STRICT="1")
            check(rc == 3 and lines == [] and "--strict" in err, f"CUPOOL_EXEC_BUDGET={bad!r} --strict: exit 3: {rc} {err}")

        # The grant: claimed on a connection kept for the process's life, usage reported when it
        # changes (at most every 250 ms).
        # Each fake holder on a socket of its own: a process never reaches the one before.
        sock = os.path.join(tmp, "holder1.sock")
        holder = FakeHolder(sock)
        start = time.monotonic()
        rc, lines, err = probe(budget4, "sleep:600", "alloc:getproc:1048576", "sleep:600", "alloc:getproc:2097152",
                               "sleep:600", "freeall", "sleep:600", CUPOOL_SOCKET=sock, CUPOOL_EXEC_GRANT="g-42")
        deadline = time.monotonic() + 5  # the holder's thread sees the connection close
        while not holder.closed and time.monotonic() < deadline:
            time.sleep(0.05)
        claims = holder.ops("budget_claim")
        usage = holder.ops("budget_usage")
        check(rc == 0 and len(claims) == 1 and claims[0][1].get("grant") == "g-42" and err == "",
              f"the grant is claimed once: {claims} {err}")
        hellos = holder.ops("hello")
        check(len(hellos) == 1 and hellos[0][1].get("client") == "cupool exec budget",
              f"on a connection of its own, named: {hellos}")
        figures = [[(d["uuid"], d["used_bytes"], d["peak_bytes"]) for d in m["devices"]] for _, m in usage]
        check(figures == [[(DEV0, MIB, MIB)], [(DEV0, 3 * MIB, 3 * MIB)], [(DEV0, 0, 3 * MIB)]],
              f"usage is reported when it changes, only then: {figures}")
        times = [t - start for t, _ in usage]
        check(len(times) >= 2 and all(b - a >= 0.24 for a, b in zip(times, times[1:])), f"at most every 250 ms: {times}")
        check(len(holder.closed) == 1, f"the connection lasts until the process ends: {holder.closed}")
        holder.stop()

        # A refused claim: said once; the budget is still enforced; --strict ends the process.
        sock = os.path.join(tmp, "holder2.sock")
        holder = FakeHolder(sock, claim={"ok": False, "error": {"code": "not_found", "message": "no grant g-42"}})
        rc, lines, err = probe(budget4, "fill:getproc:1073741824:10", "sleep:400", CUPOOL_SOCKET=sock,
                               CUPOOL_EXEC_GRANT="g-42")
        check(rc == 0 and "could not claim its budget grant g-42" in err and "CUPOOL_E_NOT_FOUND: no grant g-42" in err
              and err.count("cupool exec:") == 1 and lines and lines[0] == {"cmd": "fill", "ok": 4, "rc": 2}
              and holder.ops("budget_usage") == [],
              f"a refused claim is said once, the budget enforced, nothing reported: {lines} {err}")
        rc, lines, err = probe(budget4, "view", CUPOOL_SOCKET=sock, CUPOOL_EXEC_GRANT="g-42", CUPOOL_EXEC_STRICT="1")
        check(rc == 3 and lines == [] and "--strict" in err, f"a refused claim under --strict: exit 3: {rc} {err}")
        holder.stop()
        sock = os.path.join(tmp, "nobody.sock")
        rc, lines, err = probe(budget4, "fill:getproc:1073741824:10", CUPOOL_SOCKET=sock, CUPOOL_EXEC_GRANT="g-42")
        check(rc == 0 and "could not claim" in err and "no holder is listening" in err and lines[0]["ok"] == 4,
              f"no holder: said, the budget enforced: {err}")

        # A failed usage report: said once, reports stop, the budget stays.
        sock = os.path.join(tmp, "holder3.sock")
        holder = FakeHolder(sock, usage={"ok": False, "error": {"code": "bad_request", "message": "no"}})
        rc, lines, err = probe(budget4, "alloc:getproc:1048576", "sleep:1000", "alloc:getproc:1048576", "sleep:1000",
                               "fill:getproc:1073741824:10", CUPOOL_SOCKET=sock, CUPOOL_EXEC_GRANT="g-42")
        check(rc == 0 and err.count("stopped reporting") == 1 and "CUPOOL_E_INVALID: no" in err
              and len(holder.ops("budget_usage")) == 1 and lines[-1] == {"cmd": "fill", "ok": 3, "rc": 2},
              f"a failed report: said once, no more reports, the budget enforced: {err} {lines[-1:]} "
              f"{[m.get('op') for _, m in holder.requests]}")
        holder.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{'all' if not failures else len(failures)} {'passed' if not failures else 'failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
