#!/usr/bin/env python3
"""Held tensor sets on a GPU, against safetensors' own loader (issue 13's proof).

  weights_proof.py make FILE [--gib 8.5]           a model-shaped safetensors file (fp16, ~200 tensors)
  weights_proof.py run --name NAME --file FILE --out DIR   the measurement (scripts/weights-proof.sh)
  weights_proof.py consume ...                     one engine process (started by `run`)

`run` starts fresh engine processes, 1 and then 4 at once, for each framework (torch, cupy) and
each way to get the weights: `cupool` (cupool.tensors(NAME): views into the held buffer) and
`load_file` (torch: safetensors.torch.load_file(FILE, device="cuda"); cupy: safetensors.numpy's
load_file, then cupy.asarray of each tensor), with FILE in the page cache. Each engine initialises
CUDA, starts its clock, gets the weights (t_map), runs a one-token forward pass over all of them and
synchronises (t_first), prints one JSON line, then waits until told to exit, so that the device
memory of N live engines is read (NVML) against the memory before they started. Then an engine is
killed with SIGKILL and a fresh one must map the same weights again (same logits).

Exit status: 0 every check ran (goals met or not: they are reported), 1 an engine failed or cupool's
logits differ from load_file's.
"""
import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

HIDDEN, FFN, VOCAB = 4096, 11008, 32000
LAYER_TENSORS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def shapes(layers):
    """A Llama-like decoder's tensors, in file order."""
    out = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for t in LAYER_TENSORS[:4]:
            out[p + t + ".weight"] = (HIDDEN, HIDDEN)
        out[p + "mlp.gate_proj.weight"] = (FFN, HIDDEN)
        out[p + "mlp.up_proj.weight"] = (FFN, HIDDEN)
        out[p + "mlp.down_proj.weight"] = (HIDDEN, FFN)
        out[p + "input_layernorm.weight"] = (HIDDEN,)
        out[p + "post_attention_layernorm.weight"] = (HIDDEN,)
    out["model.norm.weight"] = (HIDDEN,)
    out["lm_head.weight"] = (VOCAB, HIDDEN)
    return out


def count_layers(tensor_names):
    return len({n.split(".")[2] for n in tensor_names if n.startswith("model.layers.")})


def make(path, gib, seed):
    import torch
    from safetensors.torch import save_file
    per_layer = 2 * (4 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN + 2 * HIDDEN)
    fixed = 2 * (2 * VOCAB * HIDDEN + HIDDEN)
    layers = max(1, -(-(int(gib * (1 << 30)) - fixed) // per_layer))
    g = torch.Generator(device="cuda").manual_seed(seed)
    tensors = {}
    for name, shape in shapes(layers).items():
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.float16, device="cuda")
        else:
            t = torch.randn(shape, generator=g, dtype=torch.float16, device="cuda") * 0.02
        tensors[name] = t.cpu()
    save_file(tensors, path, metadata={"format": "pt"})
    print(json.dumps({"file": path, "bytes": os.path.getsize(path), "tensors": len(tensors), "layers": layers}))


# ---- one engine ----

def forward(w, xp, layers):
    """One token through every layer (attention reduced to o_proj(v_proj(h)): one token attends to
    itself only), every weight read once. `xp` is torch or cupy; returns the logits."""
    torch_like = hasattr(xp, "rsqrt")

    def mv(m, v):
        return m @ v

    def rmsnorm(h, weight):
        h32 = h.float() if torch_like else h.astype(xp.float32)
        scale = 1.0 / xp.sqrt((h32 * h32).mean() + 1e-6)
        out = h32 * scale
        return (out.half() if torch_like else out.astype(xp.float16)) * weight

    def silu(x):
        return x / (1 + xp.exp(-x))

    h = w["model.embed_tokens.weight"][1234]
    for i in range(layers):
        p = f"model.layers.{i}."
        a = rmsnorm(h, w[p + "input_layernorm.weight"])
        # q and k are computed (and so read) though one token's attention needs neither.
        q, k = mv(w[p + "self_attn.q_proj.weight"], a), mv(w[p + "self_attn.k_proj.weight"], a)
        h = h + mv(w[p + "self_attn.o_proj.weight"], mv(w[p + "self_attn.v_proj.weight"], a)) + 0 * (q[0] + k[0])
        m = rmsnorm(h, w[p + "post_attention_layernorm.weight"])
        h = h + mv(w[p + "mlp.down_proj.weight"], silu(mv(w[p + "mlp.gate_proj.weight"], m)) * mv(w[p + "mlp.up_proj.weight"], m))
    return mv(w["lm_head.weight"], rmsnorm(h, w["model.norm.weight"]))


def consume(args):
    born = time.perf_counter()
    if args.framework == "torch":
        import torch as xp
        xp.cuda.init()
        xp.zeros(1, device="cuda")
        sync = xp.cuda.synchronize
    else:
        import cupy as xp
        xp.zeros(1)
        sync = xp.cuda.runtime.deviceSynchronize
    sync()
    start = time.perf_counter()  # the clock starts once CUDA is initialised
    if args.how == "cupool":
        import cupool
        w = cupool.tensors(args.name, framework=args.framework)
    elif args.framework == "torch":
        from safetensors.torch import load_file
        w = load_file(args.file, device="cuda")
    else:
        from safetensors.numpy import load_file
        w = {k: xp.asarray(v) for k, v in load_file(args.file).items()}
    sync()
    t_map = time.perf_counter() - start
    logits = forward(w, xp, count_layers(w))
    top = int(logits.argmax())
    total = float(logits.float().sum()) if args.framework == "torch" else float(logits.astype(xp.float32).sum())
    sync()
    t_first = time.perf_counter() - start
    print(json.dumps({"pid": os.getpid(), "framework": args.framework, "how": args.how, "tensors": len(w),
                      "cuda_init_ms": (start - born) * 1e3, "t_map_ms": t_map * 1e3, "t_first_ms": t_first * 1e3,
                      "argmax": top, "sum": total}), flush=True)
    sys.stdin.readline()  # held until the parent has read the device memory


# ---- NVML (ctypes; no pynvml on the machine) ----

class Nvml:
    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self.check(self.lib.nvmlInit_v2())
        self.device = ctypes.c_void_p()
        self.check(self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.device)))

    @staticmethod
    def check(rc):
        if rc != 0:
            raise RuntimeError(f"NVML call failed: {rc}")

    def used(self):
        m = self.Memory()
        self.check(self.lib.nvmlDeviceGetMemoryInfo(self.device, ctypes.byref(m)))
        return m.used

    def text(self, fn, size=96):
        buf = ctypes.create_string_buffer(size)
        if fn == "name":
            self.check(self.lib.nvmlDeviceGetName(self.device, buf, size))
        else:
            self.check(self.lib.nvmlSystemGetDriverVersion(buf, size))
        return buf.value.decode()


# ---- the measurement ----

def engines(args, framework, how, n, nvml):
    """Starts n engines at once; returns their reports and the device memory they added."""
    before = nvml.used()
    cmd = [sys.executable, os.path.abspath(__file__), "consume", "--framework", framework, "--how", how,
           "--name", args.name, "--file", args.file]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    reports, failed = [], []
    for p in procs:
        line = p.stdout.readline()
        try:
            reports.append(json.loads(line))
        except ValueError:
            failed.append(p.pid)
    added = nvml.used() - before
    for p in procs:
        try:
            p.stdin.write("\n")
            p.stdin.close()
        except BrokenPipeError:
            pass
    for p in procs:
        p.wait(timeout=120)
        if p.returncode != 0:
            failed.append(p.pid)
    return reports, added, failed


def run(args):
    nvml = Nvml()
    GiB = 1 << 30
    with open(args.file, "rb") as f:  # into the page cache, for load_file's sake
        while f.read(64 << 20):
            pass
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": nvml.text("name"), "driver": nvml.text("driver"),
              "file": args.file, "file_bytes": os.path.getsize(args.file), "page_cache": "read once fully before",
              "runs": [], "failures": []}
    lines = [f"{result['date']}  {result['gpu']}  driver {result['driver']}",
             f"file {args.file}: {result['file_bytes'] / GiB:.2f} GiB, in the page cache"]
    frameworks = args.frameworks.split(",")
    for framework in frameworks:
        for how in ("cupool", "load_file"):
            for n in (1, 4):
                reports, added, failed = engines(args, framework, how, n, nvml)
                entry = {"framework": framework, "how": how, "processes": n, "device_bytes_added": added,
                         "reports": reports}
                result["runs"].append(entry)
                if failed:
                    result["failures"].append(f"{framework}/{how}/{n}: engines {failed} failed")
                if reports:
                    lines.append(f"{framework:5} {how:9} x{n}: map {max(r['t_map_ms'] for r in reports):9.1f} ms "
                                 f"first result {max(r['t_first_ms'] for r in reports):9.1f} ms (max of {n}); "
                                 f"device memory +{added / GiB:.2f} GiB; {reports[0]['tensors']} tensors")

    def one(framework, how, n, key):
        for e in result["runs"]:
            if (e["framework"], e["how"], e["processes"]) == (framework, how, n) and e["reports"]:
                return max(r[key] for r in e["reports"])
        return None

    # Same weights, same math: cupool's logits are load_file's.
    for framework in frameworks:
        sums = {}
        for e in result["runs"]:
            if e["framework"] == framework:
                for r in e["reports"]:
                    sums.setdefault(e["how"], []).append((r["argmax"], r["sum"]))
        ref = sums.get("load_file", [None])[0]
        for how, values in sums.items():
            for argmax, total in values:
                if ref and (argmax != ref[0] or abs(total - ref[1]) > 1e-2 * max(1.0, abs(ref[1]))):
                    result["failures"].append(f"{framework}/{how}: logits {argmax} {total} differ from load_file's {ref}")

    # SIGKILL an engine; a fresh one maps the same weights again.
    cmd = [sys.executable, os.path.abspath(__file__), "consume", "--framework", "torch", "--how", "cupool",
           "--name", args.name, "--file", args.file]
    first = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    a = json.loads(first.stdout.readline())
    first.send_signal(signal.SIGKILL)
    first.wait()
    again, _, failed = engines(args, "torch", "cupool", 1, nvml)
    same = bool(again) and again[0]["argmax"] == a["argmax"] and again[0]["sum"] == a["sum"] and not failed
    result["kill"] = {"killed": a, "restarted": again, "same_logits": same}
    if not same:
        result["failures"].append("after SIGKILL the restarted engine did not map the same weights")
    lines.append(f"SIGKILL of an engine (map {a['t_map_ms']:.1f} ms), restarted: "
                 f"{'mapped the same weights again' if same else 'FAILED'}"
                 + (f" in {again[0]['t_map_ms']:.1f} ms" if again else ""))

    goals = {}
    t_c, t_l = one("torch", "cupool", 1, "t_map_ms"), one("torch", "load_file", 1, "t_map_ms")
    if t_c is not None and t_l is not None:
        goals["map_ms"] = {"value": t_c, "goal": "<= 50", "met": t_c <= 50}
        goals["map_speedup"] = {"value": t_l / t_c, "goal": ">= 20", "met": t_l / t_c >= 20}
        f_c, f_l = one("torch", "cupool", 1, "t_first_ms"), one("torch", "load_file", 1, "t_first_ms")
        goals["first_result_speedup"] = {"value": f_l / f_c, "goal": "(reported)", "met": None}
    mem = {}
    for framework in frameworks:
        for how in ("cupool", "load_file"):
            for e in result["runs"]:
                if (e["framework"], e["how"], e["processes"]) == (framework, how, 4):
                    mem[f"{framework}/{how}"] = e["device_bytes_added"]
    weights = result["file_bytes"]
    if "torch/cupool" in mem:
        goals["memory_4_processes"] = {"value": mem["torch/cupool"] / weights,
                                       "goal": "< 1 weights' size (one held copy)", "met": mem["torch/cupool"] < weights}
    result["goals"] = goals
    lines.append("goals (torch, 1 process unless said):")
    for k, g in goals.items():
        lines.append(f"  {k}: {g['value']:.2f} (goal {g['goal']}): "
                     f"{'met' if g['met'] else 'not met' if g['met'] is False else 'reported'}")
    for k, v in mem.items():
        lines.append(f"  4 processes {k}: +{v / GiB:.2f} GiB of device memory ({v / weights:.2f}x the weights)")
    for f in result["failures"]:
        lines.append("FAILURE: " + f)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "weights-proof.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "weights-proof.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if result["failures"] else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("file")
    m.add_argument("--gib", type=float, default=8.5)
    m.add_argument("--seed", type=int, default=13)
    r = sub.add_parser("run")
    c = sub.add_parser("consume")
    for p in (r, c):
        p.add_argument("--name", required=True)
        p.add_argument("--file", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--frameworks", default="torch,cupy")
    c.add_argument("--framework", choices=("torch", "cupy"), required=True)
    c.add_argument("--how", choices=("cupool", "load_file"), required=True)
    args = ap.parse_args()
    if args.cmd == "make":
        make(args.file, args.gib, args.seed)
        return 0
    if args.cmd == "consume":
        consume(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
