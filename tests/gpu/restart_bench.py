#!/usr/bin/env python3
"""A holder's restart, to serving, on a GPU (issue 38; scripts/restart-bench.sh runs it).

  restart_bench.py --cupool BIN --file MODEL.safetensors --small SMALL.safetensors --out DIR [--restarts 10]

A keeper and a holder (--keeper) hold one pool of device 0. Two node states, one after the other:
  one set    MODEL loaded once as the set "model" (8 GiB in the bench)
  8 sets     SMALL loaded 8 times as "small-0" .. "small-7" (1 GiB each in the bench)
Each is restarted --restarts times with SIGTERM then start, and --restarts times with SIGKILL then
start. For each start, measured from the spawn of `cupool hold` (a client polls every 0.5 ms):
  hello_ms   the first hello answered
  open_ms    a client's hello + buffer_open of a set answered with its descriptor (serving)
  ready_ms   status says the start is over (every request served; pools made)
and what the holder says of its own start (status's holder.start: listening, node report from
custody or the driver, the driver's time, mapping the adopted sets). The goal of each figure is
printed beside it: serving (open_ms) within 100 ms with the 8 GiB set, 150 ms with 8 sets of 1 GiB.
Writes DIR/restart-bench.json. Exit status: 0 every start adopted every set (goals met or not), 1 not.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "holder"))
import harness as H  # noqa: E402
import custody_test as C  # noqa: E402

GOALS_MS = {"one set": 100, "8 sets": 150}


def status(sock):
    r = subprocess.run([H.ARGS.cupool, "status", "--format", "json", "--socket", sock], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout)


def poll(fn, since, deadline_s=60):
    """Milliseconds from `since` until fn() returns true (tried every 0.5 ms)."""
    end = time.perf_counter() + deadline_s
    while time.perf_counter() < end:
        try:
            if fn():
                return (time.perf_counter() - since) * 1000
        except (OSError, EOFError, H.Failure, KeyError):
            pass
        time.sleep(0.0005)
    raise H.Failure("the holder did not answer")


def hello(sock):
    c = H.RawClient(sock)
    try:
        c.hello(protocol=3)
    finally:
        c.close()
    return True


def opened(sock, name):
    c = H.RawClient(sock)
    try:
        c.hello(protocol=3)
        body, fds = c.request("buffer_open", name=name)
        for fd in fds:
            os.close(fd)
        return body.get("ok") and len(fds) == 1
    finally:
        c.close()


def ready(sock):
    c = H.RawClient(sock)
    try:
        c.hello(protocol=3)
        body, _ = c.request("status")
        return body["holder"]["start"]["state"] == "ready"
    finally:
        c.close()


def start(tmp, config_path, keeper, log):
    node = ["--profile", H.PROFILE] if H.PROFILE else []
    t0 = time.perf_counter()
    proc = subprocess.Popen([H.ARGS.cupool, "hold", config_path, "--keeper", keeper.socket, "--drain-timeout", "5"]
                            + node, stdout=log, stderr=subprocess.STDOUT)
    return proc, t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--small", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--restarts", type=int, default=10)
    ap.add_argument("--profile", help="a simulated node (to try the bench itself; its figures mean nothing)")
    args = ap.parse_args()
    H.ARGS = argparse.Namespace(cupool=os.path.abspath(args.cupool), sanitizer="")
    H.PROFILE = os.path.abspath(args.profile) if args.profile else None
    tmp = tempfile.mkdtemp(prefix="cupool-restart-bench-")
    sock = os.path.join(tmp, "cupool.sock")
    config_path = os.path.join(tmp, "cupool.yaml")
    with open(config_path, "w") as f:
        f.write(f"""version: 1
holder:
  socket: {sock}
  mode: "0666"
pools:
  - name: weights
    devices: [0]
    handle_types: [posix_fd]
""")
    keeper = C.Keeper(tmp)
    log = open(os.path.join(args.out, "restart-bench-holder.log"), "w")
    result = {"restarts": args.restarts, "states": {}}
    failures = []
    proc, t0 = start(tmp, config_path, keeper, log)
    try:
        poll(lambda: ready(sock), t0)
        states = [("one set", [("model", args.file)]), ("8 sets", [(f"small-{i}", args.small) for i in range(8)])]
        for label, sets in states:
            for name, path in sets:
                subprocess.run([H.ARGS.cupool, "buffer", "load", name, path, "--pool", "weights", "--socket", sock],
                               check=True, capture_output=True, text=True)
            held = status(sock)["buffers"]
            size = sum(b["size_bytes"] for b in held)
            names = sorted(n for n, _ in sets)
            rounds = []
            for how in ("SIGTERM", "SIGKILL"):
                for i in range(args.restarts):
                    if how == "SIGKILL":
                        proc.kill()
                    else:
                        proc.send_signal(signal.SIGTERM)
                    proc.wait(60)
                    proc, t0 = start(tmp, config_path, keeper, log)
                    hello_ms = poll(lambda: hello(sock), t0)
                    open_ms = poll(lambda: opened(sock, names[-1]), t0)
                    ready_ms = poll(lambda: ready(sock), t0)
                    st = status(sock)
                    s = st["holder"]["start"]
                    adopted = sorted(b["name"] for b in st["buffers"] if b["adopted"])
                    if adopted != names or st["custody"]["adoption"]["refused"]:
                        failures.append(f"{label}, {how} {i + 1}: adopted {adopted}, refused "
                                        f"{st['custody']['adoption']['refused']}")
                    rounds.append({"how": how, "hello_ms": hello_ms, "open_ms": open_ms, "ready_ms": ready_ms,
                                   "node_report": s["node_report"],
                                   "listening_ms": s["listening_seconds"] * 1000,
                                   "holder_ready_ms": s["ready_seconds"] * 1000,
                                   "driver_ms": s["driver_seconds"] * 1000,
                                   "driver_report_ms": s["driver_report_seconds"] * 1000,
                                   "mapping_ms": s["mapping_seconds"] * 1000,
                                   "devices_ms": s["devices_seconds"] * 1000,
                                   "pools_ms": s["pools_seconds"] * 1000})
                    print(f"{label}, {how} {i + 1}: hello {hello_ms:.1f} ms, buffer_open {open_ms:.1f} ms, ready "
                          f"{ready_ms:.0f} ms (holder: listening {s['listening_seconds'] * 1000:.1f} ms, node report "
                          f"from {s['node_report']}, driver {s['driver_seconds'] * 1000:.0f} ms, mapping "
                          f"{s['mapping_seconds'] * 1000:.0f} ms)", flush=True)
            keys = [k for k in rounds[0] if k.endswith("_ms")]
            summary = {k: {"median": statistics.median(r[k] for r in rounds), "max": max(r[k] for r in rounds)}
                       for k in keys}
            summary["node_report_from_custody"] = sum(r["node_report"] == "custody" for r in rounds)
            goal = GOALS_MS[label]
            serving = summary["open_ms"]["median"]
            result["states"][label] = {"sets": len(sets), "bytes": size, "rounds": rounds, "summary": summary,
                                       "goal": {"serving_ms_median": serving, "limit_ms": goal,
                                                "met": serving <= goal}}
            print(f"{label} ({len(sets)} set{'s' if len(sets) > 1 else ''}, {size / 2**30:.1f} GiB): serving "
                  f"(buffer_open answered) {serving:.1f} ms median against the goal of {goal} ms: "
                  f"{'met' if serving <= goal else 'NOT MET'}; hello {summary['hello_ms']['median']:.1f} ms; "
                  f"every request {summary['ready_ms']['median']:.0f} ms (the driver "
                  f"{summary['driver_ms']['median']:.0f} ms, mapping {summary['mapping_ms']['median']:.0f} ms)",
                  flush=True)
            for name, _ in sets:
                subprocess.run([H.ARGS.cupool, "buffer", "rm", name, "--socket", sock], check=True,
                               capture_output=True, text=True)
    except (H.Failure, subprocess.CalledProcessError) as e:
        failures.append(str(e))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        keeper.stop()
        log.close()
    result["failures"] = failures
    with open(os.path.join(args.out, "restart-bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
