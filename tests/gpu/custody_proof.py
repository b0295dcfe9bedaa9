#!/usr/bin/env python3
"""Held memory outlives the holder, on a GPU (issue 23's proof; scripts/custody-proof.sh runs it).

  custody_proof.py --cupool BIN --client-lib LIB --file MODEL.safetensors --out DIR [--restarts 20]

One run: a fake systemd (tests/holder/custody_test.py's FakeSystemd: the notify socket and the
file-descriptor store, passed back as $LISTEN_FDS) starts the holder; the set is loaded once with
`cupool buffer load` and the file is deleted; two reader processes map the set (cupool.tensors, torch)
and check its checksum on the GPU in a loop; the holder is SIGKILLed and started again --restarts
times, then stopped with SIGTERM and started again --restarts times (what `systemctl restart` does).
After each start: the time from the new process's start to its first answer (hello), the holder's
own adoption time, and a fresh engine process that maps the set (its time in cupool.tensors). Then,
on a machine with two GPUs: a process on GPU 1 maps the set held on GPU 0 (views over NVLink), and
makes a private replica with copy=True (GB/s). Writes DIR/custody-proof.json and prints a summary.

Exit status: 0 every check passed (goals are reported, met or not), 1 a check failed.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "holder"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import harness as H  # noqa: E402
import custody_test as C  # noqa: E402

# One engine: maps the set and checks it (a checksum on its device); with --loop, until told to
# stop (a line on stdin), counting reads, wrong checksums and errors.
ENGINE = r"""
import json, os, select, sys, time
import torch
import cupool
socket_path, name, device, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
torch.cuda.init()
torch.cuda.set_device(device)
torch.zeros(1, device=f"cuda:{device}")  # the context exists before the clock starts

def checksum(ts):
    total = 0
    for t in ts.values():
        flat = t.reshape(-1).view(torch.int16) if t.element_size() == 2 else t.reshape(-1).view(torch.uint8)
        total += int(flat.sum(dtype=torch.int64).item())
    return total

t0 = time.perf_counter()
ts = cupool.tensors(name, socket=socket_path, device=None if mode == "home" else device, copy=(mode == "copy"))
torch.cuda.synchronize(device)
t1 = time.perf_counter()
first = next(iter(ts.values()))
size = sum(t.numel() * t.element_size() for t in ts.values())
out = {"map_ms": (t1 - t0) * 1000, "device": str(first.device), "bytes": size, "tensors": len(ts),
       "checksum": checksum(ts)}
if mode == "copy":
    out["gb_per_s"] = size / (t1 - t0) / 1e9
    # The copy alone, at steady state: every tensor of a peer mapping into memory allocated first.
    views = cupool.tensors(name, socket=socket_path, device=device)
    dst = torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}")
    flat = [t.reshape(-1).view(torch.uint8) for t in views.values()]
    for rep in range(3):
        torch.cuda.synchronize(device)
        c0 = time.perf_counter()
        at = 0
        for f in flat:
            dst[at:at + f.numel()].copy_(f)
            at += f.numel()
        torch.cuda.synchronize(device)
        out["copy_only_gb_per_s"] = size / (time.perf_counter() - c0) / 1e9
print(json.dumps(out), flush=True)
if mode == "loop":
    reads = wrong = errors = 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        try:
            if checksum(ts) != out["checksum"]:
                wrong += 1
            reads += 1
        except Exception as e:
            errors += 1
            print("error", e, file=sys.stderr, flush=True)
    print(json.dumps({"reads": reads, "wrong": wrong, "errors": errors}), flush=True)
"""


def engine(socket_path, name, device, mode):
    p = subprocess.Popen([sys.executable, "-c", ENGINE, socket_path, name, str(device), mode],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line:
        p.wait()
        raise H.Failure(f"engine {mode} on device {device} failed (exit {p.returncode})")
    return p, json.loads(line)


def first_answer(sock_path, since, proc, deadline_s=60):
    """Seconds from `since` until a hello on `sock_path` is answered (polled every 1 ms)."""
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            c = H.RawClient(sock_path)
            c.hello(protocol=3)
            c.close()
            return time.perf_counter() - since
        except (OSError, EOFError, H.Failure):
            if proc.poll() is not None:
                raise H.Failure(f"the holder exited with {proc.returncode}")
            time.sleep(0.001)
    raise H.Failure("the holder did not answer")


def start_timed(systemd, tmp, config):
    """FakeSystemd.start, timed from the spawn to the first answer; the holder's adoption time."""
    t0 = time.perf_counter()
    h = systemd.start(tmp, config, wait=False)
    ready = first_answer(h.socket, t0, h.proc)
    status = json.loads(subprocess.run([H.ARGS.cupool, "status", "--format", "json", "--socket", h.socket],
                                       capture_output=True, text=True, check=True).stdout)
    # The holder's own account of its start (status's holder.start, issue 38).
    st = status["holder"].get("start") or {}
    status["_start"] = {k[:-len("_seconds")] + "_ms": v * 1000 for k, v in st.items()
                        if k.endswith("_seconds") and v is not None}
    return h, ready, status


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--client-lib", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--restarts", type=int, default=20)
    args = ap.parse_args()
    os.environ["CUPOOL_CLIENT_LIB"] = os.path.abspath(args.client_lib)
    package = os.path.abspath(os.path.join(HERE, "..", "..", "python"))  # the engines import cupool from here
    os.environ["PYTHONPATH"] = package + (":" + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    H.ARGS = argparse.Namespace(cupool=os.path.abspath(args.cupool), sanitizer="",
                                client_lib_copy=os.path.abspath(args.client_lib))
    H.PROFILE = None
    import torch
    gpus = torch.cuda.device_count()
    tmp = tempfile.mkdtemp(prefix="cupool-custody-proof-")
    sock = os.path.join(tmp, "cupool.sock")
    access = "\n    access: [1]" if gpus > 1 else ""
    config = f"""version: 1
holder:
  socket: {sock}
  mode: "0666"
pools:
  - name: weights
    devices: [0]
    handle_types: [posix_fd]{access}
"""
    result = {"gpus": gpus, "restarts": args.restarts, "file_bytes": os.path.getsize(args.file)}
    failures = []
    systemd = C.FakeSystemd(tmp)
    h = systemd.start(tmp, config)
    readers = []
    try:
        t0 = time.perf_counter()
        load = subprocess.run([H.ARGS.cupool, "buffer", "load", "model", args.file, "--pool", "weights", "--format",
                               "json", "--socket", sock], capture_output=True, text=True)
        result["load_s"] = time.perf_counter() - t0
        if load.returncode != 0:
            raise H.Failure(f"buffer load: {load.stdout}{load.stderr}")
        os.unlink(args.file)  # nothing can be read from storage after this
        result["file_deleted"] = True
        status = json.loads(subprocess.run([H.ARGS.cupool, "status", "--format", "json", "--socket", sock],
                                           capture_output=True, text=True, check=True).stdout)
        model = [b for b in status["buffers"] if b["name"] == "model"][0]
        result["held"] = {"bytes": model["size_bytes"], "parts": model["part_count"], "memory": model["allocation"]}
        if model["part_count"] != 1 or model["allocation"] != "exported":
            failures.append(f"the set is not one exported allocation: {model}")
        p, home = engine(sock, "model", 0, "home")
        p.communicate("", timeout=60)
        expected = home["checksum"]
        result["first_engine"] = home
        readers = [engine(sock, "model", 0, "loop") for _ in range(2)]
        for _, r in readers:
            if r["checksum"] != expected:
                failures.append("a reader's checksum differs at the start")
        rounds = []
        for how in ("SIGKILL", "SIGTERM"):
            for i in range(args.restarts):
                if how == "SIGKILL":
                    h.proc.kill()
                    h.proc.wait()
                    h.log.close()
                else:
                    rc = h.stop()
                    if rc != 0:
                        failures.append(f"{how} restart {i + 1}: the holder exited {rc}")
                h, ready, status = start_timed(systemd, tmp, config)
                adopted = status["custody"]["adoption"]
                ok = [b["name"] for b in status["buffers"] if b["adopted"]] == ["model"] and not adopted["refused"]
                if not ok:
                    failures.append(f"{how} restart {i + 1}: {status['custody']}")
                e, fresh = engine(sock, "model", 0, "home")
                e.communicate("", timeout=60)
                if fresh["checksum"] != expected:
                    failures.append(f"{how} restart {i + 1}: a fresh engine's checksum differs")
                rounds.append({"how": how, "ready_ms": ready * 1000, "adopt_ms": adopted["elapsed_seconds"] * 1000,
                               "fresh_map_ms": fresh["map_ms"], **status["_start"]})
                print(f"{how} restart {i + 1}: first answer {ready * 1000:.0f} ms (adoption "
                      f"{adopted['elapsed_seconds'] * 1000:.1f} ms), a fresh engine mapped "
                      f"{fresh['bytes'] / 2**30:.2f} GiB in {fresh['map_ms']:.1f} ms", flush=True)
        result["rounds"] = rounds
        for how in ("SIGKILL", "SIGTERM"):
            rs = [r for r in rounds if r["how"] == how]
            result[how] = {k: {"median": statistics.median(r[k] for r in rs), "max": max(r[k] for r in rs)}
                           for k in ("ready_ms", "adopt_ms", "fresh_map_ms", "listening_ms", "custody_ms",
                                     "node_report_ms", "driver_ms", "mapping_ms", "pools_ms")
                           if all(k in r for r in rs)}
        totals = []
        for p, _ in readers:
            out, _ = p.communicate("stop\n", timeout=120)
            totals.append(json.loads(out.strip().splitlines()[-1]))
        readers = []
        result["readers"] = totals
        for t in totals:
            if t["reads"] == 0 or t["wrong"] or t["errors"]:
                failures.append(f"a reader: {t}")
        if gpus > 1:
            p, peer = engine(sock, "model", 1, "peer")
            p.communicate("", timeout=60)
            result["peer"] = peer
            if peer["checksum"] != expected or peer["device"] != "cuda:1":
                failures.append(f"the peer mapping: {peer}")
            p, copy = engine(sock, "model", 1, "copy")
            p.communicate("", timeout=120)
            result["replica"] = copy
            if copy["checksum"] != expected or copy["device"] != "cuda:1":
                failures.append(f"the replica: {copy}")
            print(f"GPU 1 maps the set held on GPU 0 in {peer['map_ms']:.1f} ms; replica on GPU 1 in "
                  f"{copy['map_ms']:.0f} ms ({copy['gb_per_s']:.0f} GB/s)", flush=True)
        else:
            result["peer"] = "skipped: one GPU"
    except H.Failure as e:
        failures.append(str(e))
    finally:
        for p, _ in readers:
            p.kill()
        try:
            h.stop()
        except H.Failure as e:
            failures.append(str(e))
        systemd.close()
    result["failures"] = failures
    goals = {}
    if "SIGKILL" in result:
        worst_ready = max(result[k]["ready_ms"]["median"] for k in ("SIGKILL", "SIGTERM"))
        worst_map = max(result[k]["fresh_map_ms"]["median"] for k in ("SIGKILL", "SIGTERM"))
        goals["restart_to_serving_ms_median"] = [worst_ready, 100, worst_ready <= 100]
        goals["fresh_engine_map_ms_median"] = [worst_map, 50, worst_map <= 50]
    if isinstance(result.get("peer"), dict):
        goals["peer_map_ms"] = [result["peer"]["map_ms"], 50, result["peer"]["map_ms"] <= 50]
    if isinstance(result.get("replica"), dict):
        goals["replica_gb_per_s"] = [result["replica"]["gb_per_s"], 300, result["replica"]["gb_per_s"] >= 300]
        goals["replica_copy_only_gb_per_s"] = [result["replica"]["copy_only_gb_per_s"], 300,
                                               result["replica"]["copy_only_gb_per_s"] >= 300]
    result["goals"] = goals
    with open(os.path.join(args.out, "custody-proof.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
