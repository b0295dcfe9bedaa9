#!/usr/bin/env python3
"""The machine output of the verbs that need no holder, from the real driver, held against the
strict copies of the schemas (tests/schema/output.py): query (plain, --deep, JSON and YAML), check
of every shipped config, bench, and an `exec --report` line from a process that used the GPU
(PyTorch when it is there, else a ctypes cuInit). The holder's verbs are validated by holder-gpu.

usage: output_check.py CUPOOL [OUT_DIR]   (run from the repository root; exit 1 on any problem)
Each document goes to OUT_DIR/NAME.jsonl as well, to read what the driver really said.
"""

import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "schema"))
import output as schemas  # noqa: E402

PROCESS = r"""
import ctypes, sys
try:
    import torch
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("torch", torch.cuda.memory_allocated())
except ImportError:
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    print("ctypes")
"""


def main():
    cupool = sys.argv[1]
    out_dir = sys.argv[2] if len(sys.argv) > 2 else None
    if out_dir:
        os.environ["CUPOOL_OUTPUT_SAMPLES"] = out_dir
    problems, validated = [], 0

    def run(args, expect=(0,)):
        nonlocal validated
        r = subprocess.run([cupool] + args, capture_output=True, text=True, cwd=ROOT)
        if r.returncode not in expect:
            problems.append(f"cupool {' '.join(args)}: exit {r.returncode}: {r.stderr[-500:]}")
            return r
        try:
            validated += schemas.check_command(args, r.stdout)
        except schemas.OutputError as e:
            problems.append(str(e))
        return r

    for fmt in ("json", "yaml"):
        run(["query", "--format", fmt])
        run(["query", "--deep", "--format", fmt])
        run(["bench", "--sizes", "1MiB", "-n", "20", "--format", fmt])
    for config in sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))):
        for fmt in ("json", "yaml"):
            run(["check", os.path.relpath(config, ROOT), "--format", fmt], expect=(0, 1))
    query = json.loads(run(["query", "--format", "json"]).stdout or "{}")
    for d in query.get("devices", []):
        print(f"device {d['device']}: {d['name']} {d['uuid']} {d['pci_bus_id']}, "
              f"{d['memory']['total_bytes']} bytes, handle types {d['pool_handle_types']}")

    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.jsonl")
        config = os.path.join(ROOT, "configs", "pytorch-current-pool.yaml")
        r = subprocess.run([cupool, "exec", config, "--report", report, "--", sys.executable, "-c", PROCESS],
                           capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0 or not os.path.exists(report):
            problems.append(f"cupool exec --report: exit {r.returncode}: {r.stdout[-300:]} {r.stderr[-500:]}")
        else:
            try:
                validated += schemas.check_exec_report(report)
                with open(report, encoding="utf-8") as f:
                    for line in f:
                        doc = json.loads(line)
                        for dev in doc.get("stats", {}).get("devices", []):
                            print(f"exec --report: process_device {dev['process_device']} {dev['uuid']}: " +
                                  ", ".join(f"{p['role']} pool threshold {p['release_threshold']} "
                                            f"({p['release_threshold_bytes']}), reserved {p['reserved_bytes']}"
                                            for p in dev["pools"]))
            except (schemas.OutputError, ValueError, KeyError) as e:
                problems.append(f"exec --report: {e}")

    for p in problems:
        print("FAIL", p)
    print(f"{validated} documents validated against the strict schemas; {len(problems)} problems; "
          f"by schema: {dict(sorted(schemas.counts.items()))}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
