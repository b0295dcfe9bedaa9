#!/usr/bin/env python3
"""Budgets end to end on the simulated node (issue 36): a holder of the bundled H100 grants them,
`cupool exec --budget` asks before the command runs, and the preload inside the command (the
budget probe over the stand-in driver, whose device 0 has the profile's UUID) sees its budget,
claims the grant and reports its use, which `cupool ledger` shows; the grant goes back when the
process is killed with SIGKILL; a budget that does not fit is refused before the command runs, or
waits for room with --wait; a shell before the command does not take the grant; the config's
process.budget is used when --budget is not given.

  budget_holder_test.py --cupool build/cupool --root . --probe build/tests/exec/cupool_budget_probe \
                        --fake-cuda build/tests/exec/libcuda.so.1 --fake-nvml build/tests/exec/libnvidia-ml.so.1
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30


def main():
    ap = argparse.ArgumentParser()
    for name in ("--cupool", "--root", "--probe", "--fake-cuda", "--fake-nvml"):
        ap.add_argument(name, required=True)
    ap.add_argument("--sanitized", action="store_true", help="the build is sanitized: skip (exit 77)")
    args = ap.parse_args()
    for name in ("cupool", "root", "probe", "fake_cuda", "fake_nvml"):
        setattr(args, name, os.path.abspath(getattr(args, name)))
    if args.sanitized:
        print("skipped: a sanitized preload library can't be loaded into an unsanitized program")
        return 77
    profile = os.path.join(args.root, "configs/profiles/h100.yaml")
    # As exec_test.py: a directory on LD_LIBRARY_PATH holding the real driver would be searched first.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUPOOL_")}
    env["LD_LIBRARY_PATH"] = ":".join(d for d in env.get("LD_LIBRARY_PATH", "").split(":")
                                      if d and not os.path.exists(os.path.join(d, "libcuda.so.1")))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    tmp = tempfile.mkdtemp(prefix="cupool-budget-holder-", dir=os.environ.get("TMPDIR"))
    failures = []
    started = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        if not ok:
            failures.append(what)

    sock = os.path.join(tmp, "holder.sock")
    env["CUPOOL_SOCKET"] = sock
    config = os.path.join(tmp, "pools.yaml")
    with open(os.path.join(args.root, "configs/single-gpu-inference.yaml"), encoding="utf-8") as f:
        text = f.read().replace("socket: /run/cupool/cupool.sock", f"socket: {sock}")
    with open(config, "w", encoding="utf-8") as f:
        f.write(text)
    # The probe under exec: the stand-in driver and NVML, what it saw as JSON lines.
    probe = [args.probe, args.fake_cuda, args.fake_nvml]

    def exec_(budget_args, commands, wait=True, config_path=config, **more):
        cmd = [args.cupool, "exec", config_path, "--profile", profile, "--quiet"] + budget_args + ["--"] + commands
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(env, **more),
                             start_new_session=True)
        started.append(p)
        if not wait:
            return p
        out, err = p.communicate(timeout=60)
        return p.returncode, [json.loads(line) for line in out.splitlines() if line.startswith("{")], err

    def ledger():
        r = subprocess.run([args.cupool, "ledger", "--format", "json"], capture_output=True, text=True, env=env,
                           timeout=30)
        return json.loads(r.stdout)["devices"][0] if r.returncode == 0 else None

    def wait_for(cond, seconds=10):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            got = ledger()
            if got is not None and cond(got):
                return got
            time.sleep(0.1)
        return ledger()

    holder = subprocess.Popen([args.cupool, "hold", config, "--profile", profile], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(sock) and time.monotonic() < deadline and holder.poll() is None:
            time.sleep(0.05)
        check(os.path.exists(sock), "the holder listens")
        empty = ledger()
        check(empty is not None and empty["budgets"] == [] and empty["available_bytes"] > 40 * GIB,
              f"the ledger before any budget: {empty and empty['available_bytes']}")

        # The budget is what the process sees; its use reaches the ledger; SIGKILL gives it back.
        p = exec_(["--budget", "4GiB"], probe + ["view", "alloc:getproc:1073741824", "sleep:30000"], wait=False)
        seen = wait_for(lambda d: d["budgets"] and d["budgets"][0]["used_bytes"] == GIB)
        b = seen["budgets"][0] if seen and seen["budgets"] else {}
        check(b.get("claimed") and b.get("budget_bytes") == 4 * GIB and b.get("pid") == p.pid and
              b.get("peak_bytes") == GIB and "cupool_budget_probe" in b.get("command", ""),
              f"the ledger shows the claimed budget, its use and peak: {b}")
        check(seen and seen["budget_bytes"] == 4 * GIB and seen["budget_used_bytes"] == GIB and
              seen["committed_bytes"] == empty["committed_bytes"] + 4 * GIB + seen["context_bytes"] -
              empty["context_bytes"],
              f"the ledger's sums: {seen and {k: seen[k] for k in ('budget_bytes', 'committed_bytes')}}")
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate(timeout=30)
        view = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        check(view and view[0]["getinfo_getproc"] == [0, 4 * GIB, 4 * GIB] and view[0]["totalmem_dlsym"][0] == 4 * GIB,
              f"inside the command: total and free are the budget: {view[:1]}")
        gone = wait_for(lambda d: not d["budgets"])
        check(gone and gone["budgets"] == [] and gone["available_bytes"] == empty["available_bytes"],
              f"SIGKILL gives the grant back: {gone and gone['budgets']}")

        # A budget that does not fit is refused before the command runs.
        rc, lines, err = exec_(["--budget", "70GiB"], probe + ["view"])
        check(rc == 1 and lines == [] and "does not fit device 0" in err and "held in 1 buffer" in err,
              f"a budget that does not fit: exit 1, the ledger's figures, the command not run: {rc} {err}")
        rc, lines, err = exec_(["--budget", "90GiB"], probe + ["view"])
        check(rc == 2 and "larger than device 0" in err, f"a budget larger than the device: exit 2: {rc} {err}")
        rc, lines, err = exec_(["--budget", "1=1GiB"], probe + ["view"])
        check(rc == 2 and "no device '1'" in err, f"a device the node lacks: exit 2: {rc} {err}")
        rc, lines, err = exec_(["--budget", "4GiB"], probe + ["view"], CUDA_VISIBLE_DEVICES="")
        check(rc == 2 and "no device" in err, f"a command that may use no device: exit 2: {rc} {err}")

        # --wait: room comes when the first command ends.
        first = exec_(["--budget", "40GiB"], probe + ["view", "sleep:1500"], wait=False)
        wait_for(lambda d: d["budgets"] and d["budgets"][0]["claimed"])
        t = time.monotonic()
        rc, lines, err = exec_(["--budget", "30GiB", "--wait=20"], probe + ["view"])
        waited = time.monotonic() - t
        check(rc == 0 and lines and lines[0]["getinfo_getproc"][2] == 30 * GIB and waited >= 0.5,
              f"--wait: granted once the first command ended ({waited:.1f} s): {rc} {err}")
        first.communicate(timeout=30)
        blocker = exec_(["--budget", "40GiB"], probe + ["sleep:4000"], wait=False)
        wait_for(lambda d: d["budgets"])
        rc, lines, err = exec_(["--budget", "30GiB", "--wait=1"], probe + ["view"])
        check(rc == 1 and "waited" in err and lines == [], f"--wait=1 with no room: exit 1: {rc} {err}")
        os.killpg(blocker.pid, signal.SIGKILL)
        blocker.communicate(timeout=30)
        wait_for(lambda d: not d["budgets"])

        # A shell before the command never asks the driver about a device: the command claims.
        p = exec_(["--budget", "2GiB"], ["sh", "-c", " ".join(probe + ["alloc:v2:1048576", "sleep:30000"])],
                  wait=False)
        seen = wait_for(lambda d: d["budgets"] and d["budgets"][0]["claimed"])
        b = seen["budgets"][0] if seen and seen["budgets"] else {}
        check(b.get("claimed") and b.get("pid") != p.pid and b.get("used_bytes") in (0, 1 << 20),
              f"the probe under sh holds the grant, not sh (pid {p.pid}): {b}")
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate(timeout=30)
        wait_for(lambda d: not d["budgets"])

        # process.budget in the file, when --budget is not given.
        budgeted = os.path.join(tmp, "budgeted.yaml")
        with open(budgeted, "w", encoding="utf-8") as f:
            f.write(text.replace("process:\n  devices: [0]\n", "process:\n  devices: [0]\n  budget: 10%\n"))
        rc, lines, err = exec_([], probe + ["view"], config_path=budgeted)
        want = 8501749350  # 10% of the profile's 85,017,493,504 bytes
        check(rc == 0 and lines and lines[0]["getinfo_getproc"][2] == want,
              f"process.budget: 10% of the device: {rc} {lines[:1]} {err}")
        check(wait_for(lambda d: not d["budgets"])["budgets"] == [], "every grant went back with its process")
    finally:
        for p in started:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=30)
        holder.send_signal(signal.SIGTERM)
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'all' if not failures else len(failures)} {'passed' if not failures else 'failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
