#!/usr/bin/env python3
"""Issue 36's proof: budgets granted by a running holder, measured on one GPU.

The script starts its own holder (`cupool hold` of a small config in a temporary folder, with a
device pool `weights` of handle type posix_fd for a held set, its socket in that folder) and runs
unmodified programs under `cupool exec CONFIG --budget 0=SIZE --wait=60 -- ...` next to it. Each
part is a subcommand; `all` runs every part against one holder. One JSON document on stdout (and
in --out), with "goals": [{name, goal, measured, pass}] (pass null: not judged, e.g. a framework
missing). Progress goes to stderr.

  starts          --trials trials (default 10; 2 with --quick) of 3 JAX processes (default
                  preallocation, 20 GiB budgets) and 2 engines of budget_control.py (30 GiB budgets,
                  --utilization 0.9: they size their KV cache from the budget), all started at one
                  instant, while a plain torch process outside cupool (the co-tenant) grows and
                  shrinks by 8 GiB every 0.5 s; before them, the 2 engines one after the other under
                  the same budgets. Goals: no start fails; each engine's cache together is within 1%
                  of its cache alone. (Without budgets: budget_control.py run, tests/gpu/RESULTS.md.)
  offender        a process under a 4 GiB budget allocates 256 MiB chunks until out-of-memory,
                  frees them and empties torch's cache, --cycles times (default 1000), while 2
                  neighbours under 8 GiB budgets allocate and free 256 MiB chunks up to 6 GiB. Goals:
                  the neighbours see 0 out-of-memory errors; the offender sees one per cycle, at its
                  budget.
  agree           one process under an 8 GiB budget samples --samples times (default 10000) torch's
                  mem_get_info and total_memory, NVML's memory info (pynvml, v1 and v2; else ctypes)
                  and cupy's memGetInfo, with no allocation between the reads of one sample and an
                  allocation or a free (torch, cupy) between samples; then one JAX process under an
                  8 GiB budget reads bytes_limit while it allocates. Goals: every total is the budget;
                  every free agrees; bytes_limit is 0.75 x the budget within 4 MiB (JAX's BFC
                  allocator takes 75% of the total it is told and rounds up to a 2 MiB granule: the
                  control's 104.85 GiB was 0.75 x the H200's total plus 1.05 MiB).
  shared          a set of 8 x 1 GiB tensors (a safetensors file the script writes) is loaded with
                  `cupool buffer load` into the pool; 4 engines under 12 GiB budgets map it
                  (cupool.tensors) and check it. Goals: mapping costs no engine budget (free does not
                  drop; each can still allocate budget - 2 GiB); the ledger counts the set once with
                  4 mappers.
  ledger_vs_nvml  `cupool ledger --format json` sampled every 0.5 s beside NVML's device used
                  (nvmlDeviceGetMemoryInfo_v2, else v1) read by this script just before and just
                  after it, while shared and offender run (with `all`: while starts, offender, agree
                  and shared run). Goal: in every sample, |NVML used - accounted_bytes| as the holder
                  read them in one request (the ledger's unexplained_bytes) <= max(1% of total,
                  64 MiB), at least 10 samples. Beside it, the same against this script's own NVML
                  read (before and after the ledger), over the steady samples (NVML's used moved by
                  no more than that across the sample): reported, not judged, since the workloads
                  move gigabytes between the two reads (measured 2026-11-29: 391 of 394).
  overhead        20,000 pairs of 1 MiB cudaMalloc/cudaFree (cupy.cuda.runtime) and 20,000
                  torch.empty of 1-64 MiB with empty_cache every 100, in plain python and under
                  `cupool exec --budget`, alternately, --reps times each. Goal: the budgeted time /
                  the plain time <= 1.05 for each loop (the fastest repetition of each: noise only
                  adds time).
  all             every part, one holder; --quick: few trials and samples (~3 minutes on an H200).

Sizes are for a device of an H200's memory; on a smaller one every size is scaled down by its
share ("scale" in the document). The children are this script's `child ROLE PARAMS` and
budget_control.py's `engine` and `jax`, run with this interpreter; each in its own session, killed
with its group at the end (and by the kernel if this script dies: setpriv --pdeathsig).

Usage (on a GPU machine with torch, jax, cupy and pynvml; a build tree in build/):
  python3 tests/gpu/budget_proof.py all --cupool build/cupool --client-lib build/libcupool-client.so \\
      --preload build/libcupool-preload.so --out budget-proof.json
  ... all --quick ...          (the `budget-gpu` ctest)
  ... all --dry-run            (prints the commands it would run; needs no GPU)

Exit status: 0 every judged goal met, 1 a goal not met or a part failed, 2 bad arguments,
77 no GPU, no NVML or no torch (skipped).
"""
import argparse
import ctypes
import importlib.util
import json
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

GIB = 1 << 30
MIB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CONTROL = os.path.join(HERE, "budget_control.py")
# NVML's total of the H200 the sizes below are chosen for (tests/gpu/RESULTS.md, 2026-11-29).
H200_NVML_TOTAL = 150_754_820_096

# Per mode: what --quick changes (flags override each).
MODES = {
    "full": {"trials": 10, "cycles": 1000, "samples": 10000, "pairs": 20000, "churn": 100000, "reps": 5},
    "quick": {"trials": 2, "cycles": 100, "samples": 1000, "pairs": 5000, "churn": 5000, "reps": 2},
}
PARTS = ("starts", "offender", "agree", "shared", "ledger_vs_nvml", "overhead")
JAX_BYTES_LIMIT_TOLERANCE = 4 * MIB


def log(*words):
    print(time.strftime("%H:%M:%S"), *words, file=sys.stderr, flush=True)


# ---- NVML through ctypes (the parent has no pynvml need; children fall back to it) ----

class Nvml:
    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    class MemoryV2(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                    ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    def __init__(self, index=0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self.check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.device = ctypes.c_void_p()
        self.check(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.device)), "nvmlDeviceGetHandleByIndex_v2")
        try:
            self.v2 = self.lib.nvmlDeviceGetMemoryInfo_v2
        except AttributeError:
            self.v2 = None

    @staticmethod
    def check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: NVML error {rc}")

    def memory(self):
        m = self.Memory()
        self.check(self.lib.nvmlDeviceGetMemoryInfo(self.device, ctypes.byref(m)), "nvmlDeviceGetMemoryInfo")
        return m

    def memory_v2(self):
        """nvmlMemory_v2_t, or None where this NVML has no _v2."""
        if self.v2 is None:
            return None
        m = self.MemoryV2(version=ctypes.sizeof(self.MemoryV2) | (2 << 24))
        return m if self.v2(self.device, ctypes.byref(m)) == 0 else None

    def used(self):
        m = self.memory_v2()
        return m.used if m is not None else self.memory().used

    def text(self, what):
        buf = ctypes.create_string_buffer(96)
        if what == "name":
            self.check(self.lib.nvmlDeviceGetName(self.device, buf, 96), "nvmlDeviceGetName")
        else:
            self.check(self.lib.nvmlSystemGetDriverVersion(buf, 96), "nvmlSystemGetDriverVersion")
        return buf.value.decode()


class NvmlReader:
    """In a budgeted child: pynvml where it is installed (what the issue names), else ctypes."""

    def __init__(self):
        self.v2_ok = False
        try:
            import pynvml
            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.via = "pynvml"
            if hasattr(pynvml, "nvmlMemory_v2"):
                try:
                    pynvml.nvmlDeviceGetMemoryInfo(self.handle, version=pynvml.nvmlMemory_v2)
                    self.v2_ok = True
                except Exception:
                    pass
        except ImportError:
            self.pynvml = None
            self.nvml = Nvml()
            self.via = "ctypes"
            self.v2_ok = self.nvml.memory_v2() is not None

    def v1(self):
        m = self.pynvml.nvmlDeviceGetMemoryInfo(self.handle) if self.pynvml else self.nvml.memory()
        return m.total, m.free, m.used

    def v2(self):
        if not self.v2_ok:
            return None
        if self.pynvml:
            m = self.pynvml.nvmlDeviceGetMemoryInfo(self.handle, version=self.pynvml.nvmlMemory_v2)
        else:
            m = self.nvml.memory_v2()
        return m.total, m.free, m.used


# ---- the children: `budget_proof.py child ROLE PARAMS` (PARAMS is JSON); each prints one JSON line ----

def done(out):
    print(json.dumps(out), flush=True)


def touch(path):
    if path:
        open(path, "w").close()


def stopped(p, since):
    return os.path.exists(p["stop"]) or time.time() - since > p["max_s"]


def torch_context():
    import torch
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    return torch


def child_cotenant(p):
    """Outside cupool: grows by p["bytes"] and shrinks back every p["period"] s until told to stop."""
    torch = torch_context()
    touch(p["ready"])
    since, cycles, ooms = time.time(), 0, 0
    while not stopped(p, since):
        try:
            grown = [torch.empty(p["bytes"], dtype=torch.uint8, device="cuda")]
            time.sleep(p["period"])
            grown.clear()
        except torch.OutOfMemoryError:
            ooms += 1
        torch.cuda.empty_cache()
        time.sleep(p["period"])
        cycles += 1
    done({"ok": True, "cycles": cycles, "ooms": ooms})


def child_neighbour(p):
    """Under a budget: allocates and frees p["chunk"]-byte tensors, never more than p["max_bytes"]
    live (equal chunks: torch's cache reuses them whole, so what it reserves stays within that)."""
    torch = torch_context()
    rng = random.Random(p["seed"])
    most = p["max_bytes"] // p["chunk"]
    live, ops, ooms, errors, peak = [], 0, 0, [], 0
    touch(p["ready"])
    since = time.time()
    while not stopped(p, since):
        try:
            if live and (len(live) >= most or rng.random() < 0.45):
                live.pop(rng.randrange(len(live)))
            else:
                live.append(torch.empty(p["chunk"], dtype=torch.uint8, device="cuda"))
            peak = max(peak, len(live) * p["chunk"])
        except torch.OutOfMemoryError as e:
            ooms += 1
            if len(errors) < 3:
                errors.append(str(e).splitlines()[0][:200])
        ops += 1
        if ops % 40 == 0:
            torch.cuda.empty_cache()  # memory really goes back to the device, and comes again
    done({"ok": True, "ops": ops, "ooms": ooms, "errors": errors, "peak_live_bytes": peak})


def child_offender(p):
    """Under a budget: chunks until out-of-memory, then free all and empty the cache; p["cycles"] times."""
    torch = torch_context()
    chunk, budget = p["chunk"], p["budget"]
    ooms, runaway, reached, other, at_budget, bases = 0, 0, [], [], 0, set()
    t0 = time.perf_counter()
    for _ in range(p["cycles"]):
        base = budget - torch.cuda.mem_get_info()[0]  # what it holds already (torch's small blocks)
        bases.add(base)
        held = []
        try:
            while len(held) * chunk <= 2 * budget:  # past twice the budget the budget did not hold
                held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
            runaway += 1
        except torch.OutOfMemoryError:
            ooms += 1
        except RuntimeError as e:
            if len(other) < 3:
                other.append(str(e).splitlines()[0][:200])
        reached.append(len(held) * chunk)
        # Refused exactly where the budget ends: what it held at the refusal (its chunks and what
        # torch kept besides, read then) fits, one chunk more would not.
        used_now = budget - torch.cuda.mem_get_info()[0]
        at_budget += used_now <= budget < used_now + chunk
        del held
        torch.cuda.empty_cache()
    done({"ok": True, "cycles": p["cycles"], "ooms": ooms, "runaway": runaway, "other_errors": other,
          "at_budget": at_budget, "held_before_bytes": sorted(bases)[:10], "reached_min": min(reached),
          "reached_max": max(reached), "seconds": time.perf_counter() - t0})


def child_agree_torch(p):
    """Under a budget: every way of asking, sampled; allocations and frees between samples."""
    torch = torch_context()
    budget, rng = p["budget"], random.Random(p["seed"])
    nv = NvmlReader()
    try:
        import cupy
        cupy.cuda.runtime.memGetInfo()
    except Exception:  # ImportError, or a cupy that can't start here
        cupy = None
    sources = ["torch_mem_get_info", "torch_mem_get_info_again", "torch_total_memory", "nvml_v1"]
    sources += ["nvml_v2"] if nv.v2_ok else []
    sources += ["cupy_memGetInfo"] if cupy else []
    total_off = {s: 0 for s in sources}
    free_off, moved, ooms, ops = 0, 0, 0, 0
    examples, used_seen = [], set()
    gap_min = gap_max = None  # (budget - free) - what torch and cupy say they hold: the preload's view vs theirs
    live_t, live_c, live_bytes = [], [], 0
    for i in range(p["samples"]):
        # One allocation or free between samples (never inside one).
        try:
            if live_bytes < p["max_live"] and (not (live_t or live_c) or rng.random() < 0.55):
                size = rng.randint(1, 256) * MIB
                if cupy and rng.random() < 0.3:
                    live_c.append((cupy.cuda.runtime.malloc(size), size))
                else:
                    live_t.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
                live_bytes += size
            elif live_c and (not live_t or rng.random() < 0.3):
                ptr, size = live_c.pop(rng.randrange(len(live_c)))
                cupy.cuda.runtime.free(ptr)
                live_bytes -= size
            else:
                t = live_t.pop(rng.randrange(len(live_t)))
                live_bytes -= t.numel()
                del t
            ops += 1
            if ops % 20 == 0:
                torch.cuda.empty_cache()
        except (torch.OutOfMemoryError, MemoryError) as e:
            ooms += 1
            if len(examples) < 5:
                examples.append({"sample": i, "oom": str(e).splitlines()[0][:200]})
        except Exception as e:  # cupy's CUDARuntimeError
            ooms += 1
            if len(examples) < 5:
                examples.append({"sample": i, "error": str(e).splitlines()[0][:200]})
        # The sample: no allocation from here to its end.
        f1, t1 = torch.cuda.mem_get_info()
        props_total = torch.cuda.get_device_properties(0).total_memory
        n1 = nv.v1()
        n2 = nv.v2()
        c = cupy.cuda.runtime.memGetInfo() if cupy else None
        f2, t2 = torch.cuda.mem_get_info()
        totals = {"torch_mem_get_info": t1, "torch_mem_get_info_again": t2, "torch_total_memory": props_total,
                  "nvml_v1": n1[0]}
        frees = {"torch_mem_get_info": f1, "torch_mem_get_info_again": f2, "nvml_v1_free": n1[1],
                 "nvml_v1_total_minus_used": n1[0] - n1[2]}
        if n2:
            totals["nvml_v2"] = n2[0]
            frees["nvml_v2_free"] = n2[1]
            frees["nvml_v2_total_minus_used"] = n2[0] - n2[2]
        if c:
            totals["cupy_memGetInfo"] = c[1]
            frees["cupy_memGetInfo"] = c[0]
        bad_total = [s for s, v in totals.items() if v != budget]
        for s in bad_total:
            total_off[s] += 1
        if f1 != f2:
            moved += 1
        if len(set(frees.values())) != 1:
            free_off += 1
        if (bad_total or len(set(frees.values())) != 1) and len(examples) < 5:
            examples.append({"sample": i, "totals": totals, "frees": frees})
        used_seen.add(n1[2])
        gap = (budget - f1) - (torch.cuda.memory_reserved() + sum(s for _, s in live_c))
        gap_min = gap if gap_min is None else min(gap_min, gap)
        gap_max = gap if gap_max is None else max(gap_max, gap)
    done({"ok": True, "budget": budget, "samples": p["samples"], "sources": sources, "nvml_via": nv.via,
          "total_disagreements": total_off, "free_disagreements": free_off, "free_moved_within_a_sample": moved,
          "distinct_used": len(used_seen), "ops": ops, "ooms": ooms, "examples": examples,
          "preload_minus_framework_bytes": [gap_min, gap_max]})


def child_agree_jax(p):
    """Under a budget, unmodified JAX (default preallocation): bytes_limit against the budget."""
    import jax
    import jax.numpy as jnp
    budget, rng = p["budget"], random.Random(p["seed"])
    d = jax.devices()[0]
    stats = d.memory_stats() or {}
    limit = stats.get("bytes_limit")
    expected = 0.75 * budget
    changed, in_use, live, ooms = 0, set(), [], 0
    for _ in range(p["samples"]):
        try:
            if live and (len(live) >= 8 or rng.random() < 0.45):
                live.pop(rng.randrange(len(live)))
            else:
                x = jnp.zeros((rng.randint(1, 256) * MIB,), dtype=jnp.uint8)
                x.block_until_ready()
                live.append(x)
        except Exception:  # XlaRuntimeError: RESOURCE_EXHAUSTED
            ooms += 1
        s = d.memory_stats() or {}
        changed += s.get("bytes_limit") != limit
        in_use.add(s.get("bytes_in_use"))
    nv = NvmlReader()
    nvml_total = nv.v1()[0]
    done({"ok": limit is not None, "budget": budget, "bytes_limit": limit, "expected": expected,
          "difference_bytes": None if limit is None else limit - expected, "fraction": None if limit is None else limit / budget,
          "samples": p["samples"], "bytes_limit_changed": changed, "distinct_bytes_in_use": len(in_use), "ooms": ooms,
          "nvml_total": nvml_total, "nvml_via": nv.via})


def child_shared_engine(p):
    """Under a budget: maps the held set (cupool.tensors), checks it, then allocates budget - 2 GiB."""
    torch = torch_context()
    import cupool
    free0, total0 = torch.cuda.mem_get_info()
    t0 = time.perf_counter()
    ts = cupool.tensors(p["name"], framework="torch")
    torch.cuda.synchronize()
    map_ms = (time.perf_counter() - t0) * 1e3
    free1, _ = torch.cuda.mem_get_info()
    set_bytes = sum(t.numel() * t.element_size() for t in ts.values())
    wrong = [k for k, v in p["expect"].items()
             if k not in ts or int(ts[k][:MIB].sum(dtype=torch.int64)) != v * MIB]
    torch.cuda.synchronize()
    out = {"pid": os.getpid(), "total": total0, "free_before_map": free0, "free_after_map": free1,
           "drop_bytes": free0 - free1, "map_ms": map_ms, "tensors": len(ts), "set_bytes": set_bytes,
           "wrong_tensors": wrong, "work_ok": False}
    try:
        work = torch.empty(p["work_bytes"], dtype=torch.uint8, device="cuda")
        out["work_ok"] = True
    except torch.OutOfMemoryError as e:
        work = None
        out["work_error"] = str(e).splitlines()[0][:200]
    out["free_after_work"] = torch.cuda.mem_get_info()[0]
    out["ok"] = not wrong and out["work_ok"]
    done(out)
    touch(p["ready"])
    since = time.time()
    while not stopped(p, since):
        time.sleep(0.05)
    del work, ts


def child_overhead(p):
    """1 MiB cudaMalloc/cudaFree pairs (cupy's runtime calls; else libcudart by ctypes) and torch's
    caching allocator under churn; seconds of each loop (not the start)."""
    torch = torch_context()
    out = {"ok": True}
    malloc = free = None
    try:
        import cupy
        rt = cupy.cuda.runtime
        malloc, free, out["malloc_via"] = rt.malloc, rt.free, "cupy.cuda.runtime"
    except ImportError:
        for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                continue
            lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
            lib.cudaFree.argtypes = [ctypes.c_void_p]

            def malloc(size, lib=lib):
                ptr = ctypes.c_void_p()
                if lib.cudaMalloc(ctypes.byref(ptr), size) != 0:
                    raise MemoryError("cudaMalloc failed")
                return ptr.value

            def free(ptr, lib=lib):
                lib.cudaFree(ctypes.c_void_p(ptr))
            out["malloc_via"] = name
            break
    if malloc:
        for _ in range(100):
            free(malloc(MIB))
        t0 = time.perf_counter()
        for _ in range(p["pairs"]):
            free(malloc(MIB))
        out["malloc_free_s"] = time.perf_counter() - t0
    rng = random.Random(p["seed"])
    sizes = [rng.randint(1, 64) * MIB for _ in range(p["churn"])]
    live = []
    for s in sizes[:100]:  # warm
        live.append(torch.empty(s, dtype=torch.uint8, device="cuda"))
        if len(live) > 8:
            live.pop(0)
    live.clear()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i, s in enumerate(sizes):
        live.append(torch.empty(s, dtype=torch.uint8, device="cuda"))
        if len(live) > 8:
            live.pop(0)
        if i % 100 == 99:
            torch.cuda.empty_cache()
    live.clear()
    torch.cuda.synchronize()
    out["churn_s"] = time.perf_counter() - t0
    out["budgeted"] = bool(os.environ.get("CUPOOL_EXEC_BUDGET"))
    done(out)


CHILDREN = {"cotenant": child_cotenant, "neighbour": child_neighbour, "offender": child_offender,
            "agree_torch": child_agree_torch, "agree_jax": child_agree_jax, "shared_engine": child_shared_engine,
            "overhead": child_overhead}


# ---- the parent: what it starts, and cleaning up after it ----

class Proc:
    def __init__(self, name, argv, popen, out_path, err_path):
        self.name, self.argv, self.popen = name, argv, popen
        self.out_path, self.err_path = out_path, err_path


class Run:
    """The temporary folder, the holder, every process started (each in its own session, so its
    whole group is killed), and the settings of this run."""

    def __init__(self, a):
        self.a = a
        self.dry = a.dry_run
        self.mode = dict(MODES["quick" if a.quick else "full"])
        for k in self.mode:
            if getattr(a, k, None) is not None:
                self.mode[k] = getattr(a, k)
        self.tmp = tempfile.mkdtemp(prefix="cupool-budget-proof.")
        self.sock = os.path.join(self.tmp, "cupool.sock")
        self.config = os.path.join(self.tmp, "cupool.yaml")
        self.procs = []
        self.holder = None
        self.count = 0
        self.nvml = None
        self.total = H200_NVML_TOTAL
        self.scale = 1.0
        self.cupool = os.path.abspath(a.cupool)
        self.python = sys.executable
        self.setpriv = shutil.which("setpriv")

    # sizes, scaled to the device
    def size(self, gib):
        return max(MIB, int(gib * self.scale * GIB) // MIB * MIB)

    def env(self):
        e = dict(os.environ)
        for k in list(e):
            if (k.startswith(("XLA_PYTHON_CLIENT_", "CUPOOL_EXEC_", "TF_GPU_")) or
                    k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "LD_PRELOAD", "NOTIFY_SOCKET", "CUPOOL_KEEPER")):
                del e[k]
        e["CUDA_VISIBLE_DEVICES"] = "0"  # the holder's device 0 (budgets say 0=SIZE)
        e["CUPOOL_SOCKET"] = self.sock
        e["PYTHONPATH"] = os.path.join(ROOT, "python") + (":" + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
        if self.a.client_lib:
            e["CUPOOL_CLIENT_LIB"] = os.path.abspath(self.a.client_lib)
        if self.a.preload:
            e["CUPOOL_PRELOAD"] = os.path.abspath(self.a.preload)
        e["PYTHONUNBUFFERED"] = "1"
        return e

    def has(self, module):
        """Whether the children can import `module` (a dry run shows every command)."""
        return self.dry or have(module)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def child(self, role, **params):
        return [self.python, os.path.abspath(__file__), "child", role, json.dumps(params)]

    def control(self, *args):
        return [self.python, CONTROL] + [str(x) for x in args]

    def budgeted(self, budget, argv):
        node = ["--profile", self.a.profile] if self.a.profile else []
        return ([self.cupool, "exec", self.config, "--budget", f"0={budget // MIB}MiB", "--wait=60", "--socket", self.sock]
                + node + ["--"] + argv)

    def spawn(self, name, argv, env=None):
        self.count += 1
        name = f"{self.count:03d}-{name}"
        if self.dry:
            print("$ " + " ".join(shlex.quote(x) for x in argv), flush=True)
            return Proc(name, argv, None, None, None)
        out, err = self.path(name + ".out"), self.path(name + ".err")
        # Killed by the kernel when this script dies (ctest's timeout), though in a session of its own.
        run = ([self.setpriv, "--pdeathsig", "KILL", "--"] if self.setpriv else []) + argv
        with open(out, "w") as o, open(err, "w") as e:
            popen = subprocess.Popen(run, stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=env or self.env(),
                                     start_new_session=True)
        p = Proc(name, argv, popen, out, err)
        self.procs.append(p)
        return p

    def kill(self, p):
        if p.popen is None:
            return
        try:
            os.killpg(p.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def finish(self, p, timeout, killed_ok=False):
        """Waits for p (killing its group past `timeout` s); its last JSON line, with ok, exit, error."""
        if p.popen is None:
            return {"ok": None, "dry_run": True}
        timed_out = False
        try:
            rc = p.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill(p)
            rc = p.popen.returncode
        try:
            os.killpg(p.popen.pid, signal.SIGKILL)  # what it left behind in its group
        except (ProcessLookupError, PermissionError):
            pass
        with open(p.out_path, errors="replace") as f:
            out = f.read()
        with open(p.err_path, errors="replace") as f:
            err = f.read()
        result = None
        for line in reversed(out.splitlines()):
            if line.startswith("{"):
                try:
                    result = json.loads(line)
                    break
                except ValueError:
                    continue
        if result is None:
            result = {"ok": False}
        result["exit"] = rc
        if timed_out:
            result["ok"] = False
            result["error"] = f"no answer within {timeout} s (killed)"
        elif rc != 0 and not (killed_ok and rc == -signal.SIGKILL):
            result["ok"] = False
            result.setdefault("error", f"exit {rc}: {why(err)}")
        if result.get("ok") is False and "error" not in result:
            result["error"] = f"exit {rc}: {why(err)}"
        if result.get("ok") is False:
            result["stderr_tail"] = err[-1500:]
        return result

    def wait_files(self, paths, procs, timeout):
        """True once every path exists; False at `timeout` or when one of procs has ended."""
        if self.dry:
            return True
        end = time.time() + timeout
        while time.time() < end:
            if all(os.path.exists(x) for x in paths):
                return True
            if any(p.popen.poll() is not None for p in procs):
                return False
            time.sleep(0.05)
        return False

    def sleep(self, s):
        if not self.dry:
            time.sleep(s)

    def cli(self, args, timeout=60):
        argv = [self.cupool] + args + ["--socket", self.sock]
        if self.dry:
            print("$ " + " ".join(shlex.quote(x) for x in argv), flush=True)
            return subprocess.CompletedProcess(argv, 0, "{}", "")
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env(),
                              stdin=subprocess.DEVNULL)

    def ledger(self):
        """Device 0 of `cupool ledger --format json`, or None."""
        r = self.cli(["ledger", "--format", "json"], timeout=10)
        if r.returncode != 0:
            return None
        try:
            devices = json.loads(r.stdout).get("devices") or []
        except ValueError:
            return None
        for d in devices:
            if d.get("device") == 0:
                return d
        return devices[0] if devices else None

    # the holder
    def start_holder(self):
        text = f"""version: 1
holder:
  socket: {self.sock}
  mode: "0600"
pools:
  - name: weights
    devices: [0]
    handle_types: [posix_fd]
"""
        with open(self.config, "w") as f:
            f.write(text)
        env = self.env()
        for k in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "CUDA_VISIBLE_DEVICES"):
            env.pop(k, None)
        node = ["--profile", self.a.profile] if self.a.profile else []
        argv = [self.cupool, "--log-level", "info", "hold", self.config, "--socket", self.sock, "--drain-timeout", "3"] + node
        if self.dry:
            print("# " + self.config + ":\n" + "".join("#   " + line + "\n" for line in text.splitlines()), end="")
        self.holder = self.spawn("holder", argv, env=env)
        if self.dry:
            return
        end = time.time() + 60
        while time.time() < end:
            if self.holder.popen.poll() is not None:
                raise RuntimeError(f"the holder exited with {self.holder.popen.returncode}: {tail(self.holder.err_path)}")
            if os.path.exists(self.sock) and self.cli(["status", "--format", "json"], timeout=10).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("the holder did not answer within 60 s: " + tail(self.holder.err_path))

    def stop_holder(self):
        h, self.holder = self.holder, None
        if h is None or h.popen is None:
            return
        if h.popen.poll() is None:
            h.popen.send_signal(signal.SIGTERM)
            try:
                h.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        self.kill(h)

    def reap(self):
        """Kills what a part left running (the holder stays); returns their names."""
        left = [p for p in self.procs if p is not self.holder and p.popen is not None and p.popen.poll() is None]
        for p in left:
            self.kill(p)
        self.procs = [p for p in self.procs if p is self.holder or p.popen is None or p.popen.poll() is None]
        return [p.name for p in left]

    def close(self):
        self.reap()
        self.stop_holder()
        for p in self.procs:
            if p.popen is not None and p.popen.poll() is None:
                self.kill(p)
        if self.a.keep_tmp:
            log("kept", self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def why(err):
    """The line of a child's error output that says why it ended."""
    lines = [x.strip() for x in err.splitlines() if x.strip()]
    said = [x for x in lines if re.search(r"Error\b|error:|out of memory|RESOURCE_EXHAUSTED|Check failed|none came", x)]
    return (said or lines or ["(no message)"])[-1][:300]


def tail(path, n=2000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except (OSError, TypeError):
        return ""


def goal(name, text, measured, ok):
    return {"name": name, "goal": text, "measured": measured, "pass": ok}


def have(module):
    return importlib.util.find_spec(module) is not None


def versions():
    from importlib import metadata
    out = {}
    for dist in ("torch", "jax", "jaxlib", "cupy-cuda13x", "cupy-cuda12x", "cupy", "nvidia-ml-py", "pynvml"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


# ---- the ledger beside NVML ----

class LedgerSampler:
    def __init__(self, run, period=0.5):
        self.run, self.period = run, period
        self.samples, self.failed = [], 0
        self.stop_flag = threading.Event()
        self.thread = None

    def start(self):
        if self.run.dry:
            print("# every 0.5 s: " + shlex.quote(self.run.cupool) + " ledger --format json --socket "
                  + shlex.quote(self.run.sock) + ", then NVML's used (nvmlDeviceGetMemoryInfo_v2)", flush=True)
            return
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        t0 = time.time()
        while not self.stop_flag.wait(self.period):
            try:
                before = self.run.nvml.used()
                d = self.run.ledger()
                used = self.run.nvml.used()
            except Exception:
                self.failed += 1
                continue
            usage = (d or {}).get("usage") or {}
            if d is None or usage.get("accounted_bytes") is None:
                self.failed += 1
                continue
            self.samples.append({"t": round(time.time() - t0, 2), "accounted": usage["accounted_bytes"],
                                 "nvml_used": used, "moved": abs(used - before),
                                 "ledger_nvml_used": (usage.get("memory") or {}).get("used_bytes"),
                                 "unexplained": usage.get("unexplained_bytes"), "budgets": len(d.get("budgets") or []),
                                 "processes": len(d.get("processes") or [])})

    def stop(self):
        self.stop_flag.set()
        if self.thread:
            self.thread.join(timeout=30)

    def report(self):
        """Judged on the steady samples: those where NVML's used, read by this script just before and
        just after the ledger, moved by no more than the tolerance (the co-tenant swings 8 GiB every
        0.5 s; a swing between the holder's read and this script's is not the ledger's error)."""
        tol = max(self.run.total // 100, 64 * MIB)
        diffs = [abs(s["accounted"] - s["nvml_used"]) for s in self.samples]
        steady = [d for d, s in zip(diffs, self.samples) if s["moved"] <= tol]
        within = sum(d <= tol for d in steady)
        unexplained = [s["unexplained"] for s in self.samples if s["unexplained"] is not None]
        section = {"period_s": self.period, "tolerance_bytes": tol, "samples": len(self.samples),
                   "failed_samples": self.failed, "steady_samples": len(steady), "steady_within": within,
                   "all_within": sum(d <= tol for d in diffs),
                   "max_diff_bytes": max(diffs) if diffs else None,
                   "max_steady_diff_bytes": max(steady) if steady else None,
                   "median_diff_bytes": statistics.median(diffs) if diffs else None,
                   "unexplained_bytes": {"min": min(unexplained), "median": statistics.median(unexplained),
                                         "max": max(unexplained)} if unexplained else None,
                   # per sample: seconds, |accounted - NVML used|, how far NVML's used moved during the
                   # sample, unexplained_bytes, budgets granted, NVML's processes
                   "per_sample": [[s["t"], abs(s["accounted"] - s["nvml_used"]), s["moved"], s["unexplained"],
                                   s["budgets"], s["processes"]] for s in self.samples]}
        n = len(steady)
        share = within / n if n else 0.0
        # The goal: in every sample, the ledger's account against NVML's used as the holder read it
        # in the same request (unexplained_bytes): the one comparison of two figures of one instant.
        same_instant = sum(abs(u) <= tol for u in unexplained)
        g = goal("ledger_vs_nvml", f"|NVML used - accounted_bytes| (unexplained_bytes, NVML read by the holder in the "
                 f"same request) <= max(1% of total, 64 MiB) = {tol / MIB:.0f} MiB in every sample (0.5 s apart; "
                 f"at least 10)",
                 f"{same_instant} of {len(unexplained)} samples within (unexplained {section['unexplained_bytes']}); "
                 f"against this script's own NVML read, {within} of {n} steady samples within ({share:.1%}; "
                 f"{len(self.samples)} in all, {section['all_within']} within; max {section['max_steady_diff_bytes']} "
                 f"B when steady); {self.failed} failed samples",
                 None if self.run.dry else (len(unexplained) >= 10 and same_instant == len(unexplained) and
                                            len(unexplained) == len(self.samples)))
        return section, [g]


# ---- the parts ----

def part_starts(run):
    m, out, goals = run.mode, {}, []
    if not run.has("jax") or not run.has("pynvml"):
        missing = [x for x in ("jax", "pynvml") if not run.has(x)]
        return {"skipped": f"no {', '.join(missing)} for {run.python}"}, [
            goal("starts", "0 failed starts; caches together within 1% of alone", f"skipped: no {', '.join(missing)}", None)]
    jax_budget, engine_budget = run.size(20), run.size(30)
    engine_args = ["--weights-gib", f"{10 * run.scale:.3f}", "--peak-gib", f"{4 * run.scale:.3f}", "--utilization", "0.9"]
    jax_alloc = f"{10 * run.scale:.3f}"
    out.update({"jax_budget_bytes": jax_budget, "engine_budget_bytes": engine_budget, "engine_args": engine_args,
                "jax_alloc_gib": float(jax_alloc), "cotenant": "plain torch (no cupool), +-8 GiB every 0.5 s"})
    ready, stop = run.path("cotenant.ready"), run.path("cotenant.stop")
    cot = run.spawn("cotenant", run.child("cotenant", bytes=run.size(8), period=0.5, ready=ready, stop=stop,
                                          max_s=1800))
    if not run.wait_files([ready], [cot], 120):
        r = run.finish(cot, 5)
        return {"error": "the co-tenant did not start: " + str(r.get("error"))}, [
            goal("starts", "the co-tenant starts", r.get("error"), False)]
    try:
        # The engines one after the other: the first holds its cache while the second sizes its own.
        log("starts: the engines one after the other")
        first_ready = run.path("alone.ready")
        first = run.spawn("alone-1", run.budgeted(engine_budget, run.control("engine", "--ready", first_ready,
                                                                              "--hold", 120, *engine_args)))
        run.wait_files([first_ready], [first], 180)
        second = run.spawn("alone-2", run.budgeted(engine_budget, run.control("engine", "--hold", 0, *engine_args)))
        b = run.finish(second, 180)
        run.kill(first)
        a_ = run.finish(first, 30, killed_ok=True)
        out["alone"] = [a_, b]
        trials = []
        for t in range(m["trials"]):
            log(f"starts: trial {t + 1} of {m['trials']}: 3 JAX + 2 engines at one instant")
            start_at = f"{time.time() + 10:.3f}"
            procs = [run.spawn(f"t{t}-jax{i}", run.budgeted(jax_budget, run.control(
                "jax", "--start-at", start_at, "--alloc-gib", jax_alloc, "--hold", 2))) for i in range(3)]
            procs += [run.spawn(f"t{t}-engine{i}", run.budgeted(engine_budget, run.control(
                "engine", "--start-at", start_at, "--hold", 2, *engine_args))) for i in range(2)]
            results = [run.finish(p, 240) for p in procs]
            trials.append({"jax": results[:3], "engines": results[3:],
                           "failed": [p.name for p, r in zip(procs, results) if r.get("ok") is False]})
        out["trials"] = trials
    finally:
        touch(stop)
        out["cotenant_result"] = run.finish(cot, 30)
    starts = 5 * len(out["trials"])
    failed = sum(len(t["failed"]) for t in out["trials"])
    alone = [x.get("cache_bytes") if x.get("ok") else None for x in out["alone"]]
    deviations, missing = [], 0
    for t in out["trials"]:
        for slot, e in enumerate(t["engines"]):
            if e.get("ok") and alone[slot]:
                deviations.append(abs(e["cache_bytes"] - alone[slot]) / alone[slot])
            else:
                missing += 1
    out["summary"] = {
        "starts": starts, "failed": failed, "alone_cache_gib": [None if x is None else round(x / GIB, 3) for x in alone],
        "together_cache_gib": [[round(e["cache_bytes"] / GIB, 3) if e.get("ok") else None for e in t["engines"]]
                               for t in out["trials"]],
        "jax_bytes_limit_gib": [[round(j["bytes_limit"] / GIB, 3) if j.get("bytes_limit") else None for j in t["jax"]]
                                for t in out["trials"]],
        "cotenant_cycles": out["cotenant_result"].get("cycles"),
        "control_without_budgets": "budget_control.py run (RESULTS.md 2026-11-29): 3 of 10 engines got no cache; "
                                   "the second JAX process aborted at start"}
    judged = not run.dry
    goals.append(goal("starts_no_failure", f"0 of {starts} budgeted starts fail (per trial 3 JAX at {jax_budget / GIB:.1f} "
                      f"GiB, 2 engines at {engine_budget / GIB:.1f} GiB, at one instant, beside a co-tenant)",
                      f"{failed} of {starts} failed", (starts > 0 and failed == 0) if judged else None))
    worst = max(deviations) if deviations else None
    goals.append(goal("starts_cache_together_vs_alone", "each engine's KV cache started together within 1% of its "
                      "cache started alone (the two engines one after the other)",
                      (f"max deviation {worst:.3%}" if worst is not None else "no engine pair to compare")
                      + (f"; {missing} engine results missing" if missing else ""),
                      (worst is not None and worst <= 0.01 and missing == 0 and all(alone)) if judged else None))
    return out, goals


def part_offender(run):
    m = run.mode
    budget, nb = run.size(4), run.size(8)
    chunk = max(MIB, run.size(0.25))
    out = {"offender_budget_bytes": budget, "neighbour_budget_bytes": nb, "chunk_bytes": chunk, "cycles": m["cycles"]}
    stop = run.path("offender.stop")
    readies = [run.path(f"neighbour{i}.ready") for i in range(2)]
    ns = [run.spawn(f"neighbour{i}", run.budgeted(nb, run.child(
        "neighbour", chunk=chunk, max_bytes=run.size(6), seed=i, ready=readies[i], stop=stop, max_s=1800)))
          for i in range(2)]
    try:
        started = run.wait_files(readies, ns, 120)
        log(f"offender: {m['cycles']} cycles past a {budget / GIB:.1f} GiB budget beside 2 neighbours")
        off = run.spawn("offender", run.budgeted(budget, run.child("offender", budget=budget, chunk=chunk,
                                                                    cycles=m["cycles"])))
        out["offender"] = run.finish(off, 120 + 0.5 * m["cycles"])
    finally:
        touch(stop)
        out["neighbours"] = [run.finish(p, 60) for p in ns]
    off, nbs = out["offender"], out["neighbours"]
    judged = not run.dry
    n_ooms = sum(x.get("ooms", 0) for x in nbs)
    n_ok = started and all(x.get("ok") and x.get("ops", 0) > 0 for x in nbs)
    goals = [goal("offender_neighbours_unharmed", "0 out-of-memory errors in the 2 neighbours (8 GiB budgets, up to "
                  "6 GiB live) while the offender overshoots its budget",
                  f"{n_ooms} out-of-memory errors in {sum(x.get('ops', 0) for x in nbs)} neighbour operations"
                  + ("" if n_ok else "; a neighbour failed: " + "; ".join(str(x.get("error")) for x in nbs)),
                  (n_ok and n_ooms == 0) if judged else None)]
    ooms, cycles, at_budget = off.get("ooms", 0), m["cycles"], off.get("at_budget", 0)
    goals.append(goal("offender_overshoots_refused", f"every overshoot of the offender's {budget / GIB:.1f} GiB budget fails "
                      f"with out-of-memory in the offender ({cycles} of {cycles}), where the budget ends (what it "
                      f"held fits, one {chunk // MIB} MiB chunk more would not)",
                      f"{ooms} of {cycles} overshoots refused, {at_budget} of them where the budget ends; chunks held at "
                      f"the refusal {off.get('reached_min')}..{off.get('reached_max')} B; runaway {off.get('runaway')}"
                      + ("" if off.get("ok") else f"; {off.get('error')}"),
                      (bool(off.get("ok")) and ooms == cycles and at_budget == cycles) if judged else None))
    return out, goals


def part_agree(run):
    m = run.mode
    judged = not run.dry
    budget = run.size(8)
    out, goals = {"budget_bytes": budget}, []
    log(f"agree: {m['samples']} samples in one budgeted torch process")
    p = run.spawn("agree-torch", run.budgeted(budget, run.child("agree_torch", budget=budget, samples=m["samples"],
                                                               seed=36, max_live=run.size(4))))
    t = out["torch"] = run.finish(p, 120 + 0.02 * m["samples"])
    off_total = sum((t.get("total_disagreements") or {}).values())
    goals.append(goal("agree_total", "total = the budget in every sample: torch mem_get_info (twice), total_memory, NVML "
                      "v1/v2, cupy memGetInfo", f"{off_total} disagreements in {t.get('samples')} samples over "
                      f"{t.get('sources')}" + ("" if t.get("ok") else f"; {t.get('error')}"),
                      (bool(t.get("ok")) and off_total == 0) if judged else None))
    goals.append(goal("agree_free", "free the same from every source in every sample (torch, cupy, NVML free and "
                      "total - used), with used changing between samples",
                      f"{t.get('free_disagreements')} disagreements in {t.get('samples')} samples; "
                      f"{t.get('distinct_used')} distinct used values; {t.get('ooms')} allocation failures",
                      (bool(t.get("ok")) and t.get("free_disagreements") == 0 and (t.get("distinct_used") or 0) >= 2
                       and t.get("ooms") == 0) if judged else None))
    if run.has("jax"):
        log("agree: a budgeted JAX process")
        j = run.spawn("agree-jax", run.budgeted(budget, run.child("agree_jax", budget=budget,
                                                                 samples=max(50, m["samples"] // 10), seed=36)))
        r = out["jax"] = run.finish(j, 240)
        diff = r.get("difference_bytes")
        ok = (bool(r.get("ok")) and diff is not None and abs(diff) <= JAX_BYTES_LIMIT_TOLERANCE
              and r.get("bytes_limit_changed") == 0 and r.get("nvml_total") == budget)
        goals.append(goal("agree_jax_bytes_limit", f"JAX's bytes_limit = 0.75 x the budget within "
                          f"{JAX_BYTES_LIMIT_TOLERANCE // MIB} MiB (its 2 MiB rounding, twice), unchanged while it "
                          "allocates; NVML's total in it = the budget",
                          f"bytes_limit {r.get('bytes_limit')} B, 0.75 x budget {0.75 * budget:.0f} B, difference "
                          f"{diff} B; changed in {r.get('bytes_limit_changed')} of {r.get('samples')} samples; NVML total "
                          f"{r.get('nvml_total')}" + ("" if r.get("ok") else f"; {r.get('error')}"),
                          ok if judged else None))
    else:
        goals.append(goal("agree_jax_bytes_limit", "JAX's bytes_limit = 0.75 x the budget", "skipped: no jax", None))
    return out, goals


def write_set(path, tensors, each):
    """A safetensors file of `tensors` U8 tensors of `each` bytes; tensor i is all (i + 1)."""
    header = {f"layer.{i}.weight": {"dtype": "U8", "shape": [each], "data_offsets": [i * each, (i + 1) * each]}
              for i in range(tensors)}
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    block = 64 * MIB
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for i in range(tensors):
            chunk = bytes([i + 1]) * min(block, each)
            left = each
            while left:
                f.write(chunk[:min(left, len(chunk))])
                left -= min(left, len(chunk))
    return {f"layer.{i}.weight": i + 1 for i in range(tensors)}


def part_shared(run):
    judged = not run.dry
    tensors = run.a.set_gib
    each = max(64 * MIB, run.size(1) // (64 * MIB) * 64 * MIB)
    set_bytes, budget, name = tensors * each, run.size(12), "budget-proof-set"
    out = {"set_bytes": set_bytes, "tensors": tensors, "budget_bytes": budget, "engines": 4}
    file = run.path("set.safetensors")
    if run.dry:
        print(f"# write {file}: {tensors} U8 tensors of {each} B", flush=True)
        expect = {f"layer.{i}.weight": i + 1 for i in range(tensors)}
    else:
        log(f"shared: writing {set_bytes / GIB:.1f} GiB")
        expect = write_set(file, tensors, each)
    t0 = time.time()
    load = run.cli(["buffer", "load", name, file, "--pool", "weights", "--format", "json"], timeout=600)
    out["load_s"] = round(time.time() - t0, 2)
    if not run.dry:
        os.unlink(file)
    if load.returncode != 0:
        out["error"] = f"buffer load failed: {load.stdout}{load.stderr}"[-2000:]
        return out, [goal("shared", "the set loads", out["error"][:300], False)]
    stop = run.path("shared.stop")
    readies = [run.path(f"shared{i}.ready") for i in range(4)]
    log("shared: 4 budgeted engines map the set")
    ps = [run.spawn(f"shared{i}", run.budgeted(budget, run.child(
        "shared_engine", name=name, expect=expect, work_bytes=budget - run.size(2), ready=readies[i], stop=stop,
        max_s=600))) for i in range(4)]
    try:
        run.wait_files(readies, ps, 240)
        d = run.ledger() or {}
        out["ledger"] = {k: d.get(k) for k in ("total_bytes", "held_bytes", "buffers", "pool_reserved_bytes", "budget_bytes",
                                                "budget_used_bytes", "budgets", "context_bytes", "unknown_bytes",
                                                "processes", "committed_bytes", "available_bytes", "usage")}
    finally:
        touch(stop)
        out["engine_results"] = [run.finish(p, 60) for p in ps]
        rm = run.cli(["buffer", "rm", name, "--force"], timeout=60)
        out["removed"] = rm.returncode == 0
    rs = out["engine_results"]
    drops = [r.get("drop_bytes") for r in rs if r.get("drop_bytes") is not None]
    ok_all = len(drops) == 4 and all(r.get("ok") for r in rs)
    worst = max(drops) if drops else None
    goals = [goal("shared_no_budget_lost", f"mapping the {set_bytes / GIB:.1f} GiB set costs none of a {budget / GIB:.0f} "
                  "GiB budget: torch's free does not drop by it (< 1% of it), every tensor reads right, and each engine "
                  "still allocates budget - 2 GiB",
                  f"largest drop {worst} B; {sum(bool(r.get('work_ok')) for r in rs)} of 4 allocated budget - 2 GiB; "
                  f"{sum(r.get('wrong_tensors') == [] for r in rs)} of 4 read the set right"
                  + ("" if ok_all else "; " + "; ".join(str(r.get("error") or r.get("work_error")) for r in rs if not r.get("ok"))),
                  (ok_all and worst is not None and worst < set_bytes / 100) if judged else None)]
    led = out.get("ledger") or {}
    row = [b for b in (led.get("buffers") or []) if b.get("name") == name]
    held = led.get("held_bytes")
    mappers = row[0].get("mapper_count") if row else None
    near = held is not None and abs(held - set_bytes) <= max(set_bytes // 100, 64 * MIB)
    goals.append(goal("shared_counted_once", "the ledger counts the set once (held_bytes = its size, within 1% or 64 MiB) "
                      "with 4 mappers", f"held_bytes {held} (set {set_bytes}); mappers {mappers}; "
                      f"{len(led.get('budgets') or [])} budgets, used {led.get('budget_used_bytes')} B",
                      (near and mappers == 4) if judged else None))
    return out, goals


def part_overhead(run):
    m = run.mode
    judged = not run.dry
    budget = run.size(16)
    params = {"pairs": m["pairs"], "churn": m["churn"], "seed": 7}
    runs = {"plain": [], "budgeted": []}
    for rep in range(m["reps"]):
        for how in ("plain", "budgeted") if rep % 2 == 0 else ("budgeted", "plain"):
            log(f"overhead: {how}, repetition {rep + 1} of {m['reps']}")
            argv = run.child("overhead", **params)
            p = run.spawn(f"overhead-{how}{rep}", run.budgeted(budget, argv) if how == "budgeted" else argv)
            runs[how].append(run.finish(p, 300))
    out = {"budget_bytes": budget, "params": params, "runs": runs}
    goals = []
    for key, words in (("malloc_free_s", f"{m['pairs']} pairs of 1 MiB cudaMalloc/cudaFree"),
                       ("churn_s", f"{m['churn']} torch.empty of 1-64 MiB, empty_cache every 100")):
        plain = [r[key] for r in runs["plain"] if r.get(key)]
        budg = [r[key] for r in runs["budgeted"] if r.get(key)]
        ratio = min(budg) / min(plain) if plain and budg else None
        median = statistics.median(budg) / statistics.median(plain) if plain and budg else None
        out[key.replace("_s", "_ratio")] = {"fastest": ratio, "median": median}
        goals.append(goal(f"overhead_{key[:-2]}", f"{words}: budgeted / plain <= 1.05 (fastest of {m['reps']} each)",
                          f"{ratio:.3f} (medians {median:.3f}); plain {min(plain):.3f} s, budgeted {min(budg):.3f} s"
                          if ratio else "not measured: " + "; ".join(str(r.get("error")) for r in runs["plain"] + runs["budgeted"]
                                                                    if not r.get("ok")),
                          (ratio is not None and ratio <= 1.05) if judged else None))
    return out, goals


# ---- the measurement ----

def measure(a):
    run = Run(a)
    doc = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(shlex.quote(x) for x in sys.argv),
           "mode": "quick" if a.quick else "full", "settings": run.mode, "parts": {}, "goals": []}
    sampler = None

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    try:
        if not run.dry and not a.profile:
            run.nvml = Nvml()
            run.total = run.nvml.memory().total
            run.scale = min(1.0, run.total / H200_NVML_TOTAL)
            doc["gpu"] = {"name": run.nvml.text("name"), "driver": run.nvml.text("driver"), "nvml_total": run.total,
                          "nvml_used_at_start": run.nvml.used()}
            if doc["gpu"]["nvml_used_at_start"] > run.total // 10:
                doc["warning"] = "the device was not idle at the start: budgets may not fit"
        doc["scale"] = run.scale
        doc["python"] = run.python
        doc["frameworks_versions"] = versions()
        doc["frameworks"] = {m: have(m) for m in ("torch", "jax", "cupy", "pynvml", "safetensors")}
        run.start_holder()
        parts = PARTS if a.part == "all" else (("shared", "offender") if a.part == "ledger_vs_nvml" else (a.part,))
        wants_ledger = a.part in ("all", "ledger_vs_nvml")
        if wants_ledger and (run.nvml is not None or run.dry):
            sampler = LedgerSampler(run)
            sampler.start()
        for part in parts:
            if part == "ledger_vs_nvml":
                continue
            if part == "overhead" and sampler:  # the sampler's own processes would be timed too
                sampler.stop()
                doc["parts"]["ledger_vs_nvml"], g = sampler.report()
                doc["goals"] += g
                sampler = None
            log(f"part {part}")
            t0 = time.time()
            try:
                section, goals = globals()["part_" + part](run)
            except Exception:
                section = {"error": traceback.format_exc()[-3000:]}
                goals = [goal(part, "the part runs", "it raised: " + section["error"].strip().splitlines()[-1], False)]
            section["seconds"] = round(time.time() - t0, 1)
            left = run.reap()
            if left:
                section["killed_when_it_ended"] = left
            doc["parts"][part] = section
            doc["goals"] += goals
        if sampler:
            sampler.stop()
            doc["parts"]["ledger_vs_nvml"], g = sampler.report()
            doc["goals"] += g
            sampler = None
    except KeyboardInterrupt as e:
        doc["interrupted"] = str(e) or "interrupted"
        doc["goals"].append(goal("run", "the run completes", doc["interrupted"], False))
    except Exception:
        doc["error"] = traceback.format_exc()[-3000:]
        doc["goals"].append(goal("run", "the run completes", doc["error"].strip().splitlines()[-1], False))
    finally:
        if sampler:
            sampler.stop()
        if run.holder and run.holder.err_path:
            doc["holder_log_tail"] = tail(run.holder.err_path, 3000)
        run.close()
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="part", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cupool", default=os.path.join(ROOT, "build", "cupool"), help="the cupool binary")
    common.add_argument("--client-lib", default="", help="libcupool-client.so for the python package (CUPOOL_CLIENT_LIB)")
    common.add_argument("--preload", default="", help="libcupool-preload.so (CUPOOL_PRELOAD; default: beside the binary)")
    common.add_argument("--out", default="", help="also write the JSON document here")
    common.add_argument("--quick", action="store_true", help="few trials and samples (the ctest)")
    common.add_argument("--dry-run", action="store_true", help="print the commands it would run; run nothing")
    common.add_argument("--keep-tmp", action="store_true", help="keep the temporary folder (children's output)")
    common.add_argument("--profile", default="", help=argparse.SUPPRESS)  # the holder on a simulated node: plumbing only
    common.add_argument("--trials", type=int, help="starts: trials (default 10; quick 2)")
    common.add_argument("--cycles", type=int, help="offender: overshoot cycles (default 1000; quick 100)")
    common.add_argument("--samples", type=int, help="agree: samples (default 10000; quick 1000)")
    common.add_argument("--pairs", type=int, help="overhead: cudaMalloc/cudaFree pairs (default 20000; quick 5000)")
    common.add_argument("--churn", type=int, help="overhead: torch.empty calls (default 100000; quick 5000)")
    common.add_argument("--reps", type=int, help="overhead: repetitions of each (default 5; quick 2)")
    common.add_argument("--set-gib", type=int, default=8, help="shared: the set's tensors of 1 GiB (default 8)")
    helps = {"starts": "JAX and engines started together under budgets, beside a co-tenant",
             "offender": "a process past its budget beside two neighbours",
             "agree": "every way of asking for memory, against the budget",
             "shared": "a held set mapped by 4 budgeted engines, counted once",
             "ledger_vs_nvml": "the ledger's accounted bytes against NVML's used (over shared and offender)",
             "overhead": "cudaMalloc/cudaFree and torch's allocator, plain and budgeted",
             "all": "every part against one holder"}
    for name in PARTS + ("all",):
        sub.add_parser(name, parents=[common], help=helps[name])
    c = sub.add_parser("child", help="(one process of a part, started by the script)")
    c.add_argument("role", choices=sorted(CHILDREN))
    c.add_argument("params", help="JSON")
    a = ap.parse_args()
    if a.part == "child":
        CHILDREN[a.role](json.loads(a.params))
        return 0
    for k in ("trials", "cycles", "samples", "pairs", "churn", "reps", "set_gib"):
        v = getattr(a, k)
        if v is not None and v < 1:
            ap.error(f"--{k.replace('_', '-')} must be at least 1")
    if not a.dry_run:
        if not a.profile:
            try:
                nv = Nvml()
                nv.memory()
            except (OSError, RuntimeError) as e:
                print(f"budget_proof: skipped: no NVML or no GPU ({e})", file=sys.stderr)
                return 77
        if not have("torch") and not a.profile:
            print(f"budget_proof: skipped: no torch for {sys.executable}", file=sys.stderr)
            return 77
        if not os.access(a.cupool, os.X_OK):
            ap.error(f"--cupool {a.cupool}: not an executable (build first, or give the path)")
    doc = measure(a)
    text = json.dumps(doc, indent=1)
    if a.out and not a.dry_run:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    if not a.dry_run:
        print(text)
    for g in doc["goals"]:
        verdict = {True: "met", False: "NOT MET", None: "not judged"}[g["pass"]]
        print(f"{verdict:10} {g['name']}: {g['measured']}", file=sys.stderr)
    return 1 if any(g["pass"] is False for g in doc["goals"]) and not a.dry_run else 0


if __name__ == "__main__":
    sys.exit(main())
