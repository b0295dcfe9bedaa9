#!/usr/bin/env python3
"""The control of issue 36's proof: engines that share one GPU with no budget, measured.

Engines that size themselves from the device (vLLM, JAX) starve each other when they start
together. This script measures how, on a lent GPU, so that the budgets of issue 36 have a figure
to be held against (tests/gpu/RESULTS.md). Nothing of cupool runs here: it is the "without".

  engine   one engine that sizes its KV cache as vLLM does: NVML's total times a utilization
           fraction, minus what it used itself as torch.cuda.mem_get_info's free memory fell from
           its start to the peak of its profiling run (its weights and a peak of activations).
           A neighbour that allocates in that window is counted as its own use. Prints one JSON
           line: the cache it sized, and whether allocating it worked.
  jax      one JAX process with the default preallocation (75% of what it sees): prints its
           bytes_limit and whether an allocation of --alloc-gib returned within --timeout.
  run      the control: engines one after the other, then together (each start at one instant),
           --trials times, and JAX processes together; one JSON document on stdout.

Usage (on a GPU machine with torch, pynvml and jax):
  python3 tests/gpu/budget_control.py run --trials 5 > budget-control.json
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30


def engine(a):
    import pynvml
    import torch

    pynvml.nvmlInit()
    nvml_total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the context
    if a.start_at:
        time.sleep(max(0.0, a.start_at - time.time()))
    free_start, total = torch.cuda.mem_get_info()
    weights = torch.empty(int(a.weights_gib * GIB), dtype=torch.uint8, device="cuda")
    time.sleep(a.step)  # loading takes time: a neighbour's start falls into it
    peak = torch.empty(int(a.peak_gib * GIB), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    free_peak, _ = torch.cuda.mem_get_info()
    del peak
    used = free_start - free_peak
    cache_bytes = int(nvml_total * a.utilization) - used
    kept = [weights]
    out = {"pid": os.getpid(), "nvml_total": nvml_total, "cuda_total": total, "used_as_seen": used,
           "cache_bytes": cache_bytes, "ok": False, "error": None}
    if cache_bytes <= 0:
        out["error"] = "no memory left for the cache"
    else:
        try:
            kept.append(torch.empty(cache_bytes, dtype=torch.uint8, device="cuda"))
            out["ok"] = True
        except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError
            out["error"] = str(e).splitlines()[0][:200]
    print(json.dumps(out), flush=True)
    if a.ready:
        open(a.ready, "w").close()
    time.sleep(a.hold)  # holding its weights and cache, as a serving engine does
    kept.clear()


def jax_engine(a):
    if a.start_at:
        time.sleep(max(0.0, a.start_at - time.time()))
    import jax
    import jax.numpy as jnp

    d = jax.devices()[0]
    limit = d.memory_stats().get("bytes_limit")
    out = {"pid": os.getpid(), "bytes_limit": limit, "ok": False, "error": None}
    try:
        x = jnp.zeros((int(a.alloc_gib * GIB) // 4,), dtype=jnp.float32)
        x.block_until_ready()
        out["ok"] = True
    except Exception as e:  # XlaRuntimeError: RESOURCE_EXHAUSTED
        out["error"] = str(e).splitlines()[0][:200]
    print(json.dumps(out), flush=True)
    time.sleep(a.hold)


def spawn(args, env=None):
    return subprocess.Popen([sys.executable, os.path.abspath(__file__)] + args, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def collect(p, timeout):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return {"ok": False, "error": f"no answer within {timeout} s (killed)"}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        # Why it ended: the first line of its error output that says (an abort's stack trace follows).
        said = [line.strip() for line in err.splitlines()
                if re.search(r"check failed|resource_exhausted|out of memory|error", line, re.I)]
        return {"ok": False, "error": f"exit {p.returncode}: " + (said[0][:300] if said else "(no message)")}
    return json.loads(lines[-1])


def run(a):
    common = ["--weights-gib", str(a.weights_gib), "--peak-gib", str(a.peak_gib), "--utilization",
              str(a.utilization)]
    result = {"weights_gib": a.weights_gib, "peak_gib": a.peak_gib, "utilization": a.utilization,
              "one_after_the_other": [], "together": [], "jax_together": []}
    with tempfile.TemporaryDirectory(prefix="cupool-budget-control.") as tmp:
        for t in range(0 if a.only_jax else a.trials):
            ready = os.path.join(tmp, f"ready-{t}")
            first = spawn(["engine", "--ready", ready, "--hold", "20"] + common)
            deadline = time.time() + 60
            while not os.path.exists(ready) and time.time() < deadline and first.poll() is None:
                time.sleep(0.05)
            second = spawn(["engine", "--hold", "0"] + common)
            b = collect(second, 90)
            first.kill()
            result["one_after_the_other"].append([collect(first, 30), b])
        for t in range(0 if a.only_jax else a.trials):
            start_at = time.time() + 8  # both have imported torch and made their context by then
            ps = [spawn(["engine", "--start-at", str(start_at), "--hold", "2"] + common) for _ in range(2)]
            result["together"].append([collect(p, 90) for p in ps])
        if a.jax or a.only_jax:  # last: JAX keeps what it preallocated until it exits
            start_at = time.time() + 10
            ps = [spawn(["jax", "--start-at", str(start_at), "--alloc-gib", "40", "--hold", "5"]) for _ in range(2)]
            result["jax_together"].append([collect(p, a.timeout) for p in ps])

    def gib(x):
        return round(x["cache_bytes"] / GIB, 2) if x.get("ok") else None

    result["summary"] = {
        "one_after_the_other_cache_gib": [[gib(x) for x in pair] for pair in result["one_after_the_other"]],
        "together_cache_gib": [[gib(x) for x in pair] for pair in result["together"]],
        "together_failed": sum(1 for pair in result["together"] for x in pair if not x.get("ok")),
    }
    print(json.dumps(result, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    e = sub.add_parser("engine")
    j = sub.add_parser("jax")
    r = sub.add_parser("run")
    for p in (e, r):
        p.add_argument("--weights-gib", type=float, default=20)
        p.add_argument("--peak-gib", type=float, default=5)
        p.add_argument("--utilization", type=float, default=0.45)
    for p in (e, j):
        p.add_argument("--start-at", type=float, default=0)
        p.add_argument("--hold", type=float, default=0)
    e.add_argument("--ready", default="")
    e.add_argument("--step", type=float, default=1.0)
    j.add_argument("--alloc-gib", type=float, default=40)
    r.add_argument("--trials", type=int, default=5)
    r.add_argument("--jax", action="store_true")
    r.add_argument("--only-jax", action="store_true", help="leave the engines out")
    r.add_argument("--timeout", type=float, default=60)
    a = ap.parse_args()
    {"engine": engine, "jax": jax_engine, "run": run}[a.what](a)


if __name__ == "__main__":
    main()
