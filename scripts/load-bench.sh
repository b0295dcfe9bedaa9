#!/usr/bin/env bash
# scripts/load-bench.sh [BUILD_DIR]: `cupool buffer load` against the machine's limits and against
# safetensors' load_file to the GPU, on the same file, in one run. Goals (issues 26 and 38): from the
# page cache at least 2x load_file and at least 70% of pinned host-to-device copies; cold at least
# 90% of the storage's O_DIRECT sequential read.
#
# From the repository root, on a GPU machine with torch and safetensors, after a build:
#   OUT=gpu-out bash scripts/load-bench.sh build-gpu
#
# Starts `BUILD/cupool hold` on a config of its own (one pool "weights" on device 0, posix_fd),
# writes a model-shaped safetensors file of $LOAD_GIB (default 8.5) GiB (tests/gpu/weights_proof.py
# make), reads it once into the page cache, measures the limits with BUILD/tests/gpu/
# cupool_load_limits (pinned host-to-device copies, the file read from the page cache), then
# alternates, $ROUNDS (default 3) times:
#   load_file   python3: torch.cuda.init() first (not timed), then
#               safetensors.torch.load_file(FILE, device="cuda") + torch.cuda.synchronize()
#   cupool      `cupool buffer load` (its elapsed_seconds: header to ready), then `buffer rm`
# then cupool with --read-threads 1, 2, 4, 8, 16 and 32, --direct-io always, and --gds always (cuFile;
# in its compatibility mode where nvidia-fs is not loaded); then cold, $ROUNDS pairs of the storage's
# limit (cupool_load_limits --only direct: O_DIRECT reads of 16 and 64 MiB by 8, 16 and 32 threads,
# $LIMIT_GIB GiB of the file each, default 0: all of it, as the load reads)
# and a cold cupool load (auto: O_DIRECT), interleaved so that the disk's drift shows in each pair
# (odd pairs read the limit first, even pairs the load: a disk whose host caches favours the second);
# then cold cupool --gds always and load_file; with two GPUs or more (the pool then on GPUs 0 and 1),
# $ROUNDS times one file to GPU 0 alone and two files to GPUs 0 and 1 in one command. Cold means the file's pages dropped first (fdatasync
# + posix_fadvise DONTNEED). A --gds always load that cuFile refuses is said, not counted (in a
# container without a udev database cuFile registers no file: tests/gpu/udev-stand-in.sh).
# Files under $OUT: load-bench.jsonl (every cupool reply, every load_file), load-limits.json (the
# bus and the page cache), load-limits-direct-N.json (the storage, pair N), load-bench.txt (the
# table and each figure against its limit and goal), load-bench-file.json, load-bench-holder.log.
# Exit status: 0 every load and measurement ran, 1 one failed, 2 the build is missing.
set -euo pipefail

BUILD=${1:-build-gpu}
OUT=${OUT:-./gpu-out}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-3}
say() { printf 'load-bench: %s\n' "$*" >&2; }

for bin in cupool tests/gpu/cupool_load_limits; do
  [ -x "$BUILD/$bin" ] || { say "no $BUILD/$bin: build first (cmake -B $BUILD -G Ninja && cmake --build $BUILD)"; exit 2; }
done
BUILD=$(cd "$BUILD" && pwd)
LIMITS=$BUILD/tests/gpu/cupool_load_limits
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export LD_LIBRARY_PATH="/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

TMP=$(mktemp -d /tmp/cupool-load.XXXXXX)
# shellcheck source=scripts/weights-holder.sh
. "$ROOT/scripts/weights-holder.sh"
cleanup() {
  stop_weights_holder
  rm -rf "$TMP"
}
trap cleanup EXIT
# Every GPU at once (issue 38): with two or more, the pool spans GPUs 0 and 1.
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${GPUS:-0}" -ge 2 ]; then export WEIGHTS_DEVICES="0, 1"; fi
start_weights_holder "$OUT/load-bench-holder.log"

FILE=$TMP/model.safetensors
say "writing $FILE (${LOAD_GIB:-8.5} GiB)"
python3 "$ROOT/tests/gpu/weights_proof.py" make "$FILE" --gib "${LOAD_GIB:-8.5}" >"$OUT/load-bench-file.json"
cat "$FILE" >/dev/null  # into the page cache

JSONL=$OUT/load-bench.jsonl
: >"$JSONL"
evict() { python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$FILE"; }
load_file() {  # $1: label
  python3 - "$FILE" "$1" >>"$JSONL" <<'PY'
import json, os, sys, time
import torch
from safetensors.torch import load_file
torch.cuda.init()
torch.empty(1, device="cuda")  # the context, before the clock
t0 = time.perf_counter()
w = load_file(sys.argv[1], device="cuda")
torch.cuda.synchronize()
s = time.perf_counter() - t0
n = sum(t.numel() * t.element_size() for t in w.values())
print(json.dumps({"how": "load_file", "label": sys.argv[2], "elapsed_seconds": s, "tensor_bytes": n,
                  "bytes_per_second": int(n / s)}))
PY
}
cupool_load() {  # $1: label, then arguments of buffer load
  local label=$1
  shift
  "$BUILD/cupool" buffer load bench "$FILE" --pool weights --format json "$@" |
    python3 -c 'import json,sys; r=json.load(sys.stdin); r["how"]="cupool"; r["label"]=sys.argv[1]; print(json.dumps(r))' "$label" >>"$JSONL"
  "$BUILD/cupool" buffer rm bench >/dev/null
}

rc=0
say "limits: pinned host-to-device copies, the page cache"
"$LIMITS" "$FILE" --only h2d,cached --json "$OUT/load-limits.json" >&2 || rc=1
for round in $(seq 1 "$ROUNDS"); do
  say "round $round: load_file, cupool"
  load_file "cached" || rc=1
  cupool_load "cached" || rc=1
done
for t in 1 2 4 8 16 32; do
  say "cupool --read-threads $t"
  cupool_load "cached, --read-threads $t" --read-threads "$t" || rc=1
done
say "cupool --direct-io always (cached file)"
cupool_load "cached, --direct-io always" --direct-io always || rc=1
gds_load() {  # $1: label
  cupool_load "$1" --gds always ||
    say "--gds always failed here (cuFile said why above)"
}
say "cupool --gds always (cached file)"
gds_load "cached, --gds always"
disk_limit() { # $1: the pair
  "$LIMITS" "$FILE" --only direct --max-gib "${LIMIT_GIB:-0}" --json "$OUT/load-limits-direct-$1.json" >&2 || rc=1
}
for pair in $(seq 1 "$ROUNDS"); do
  # The order alternates: a virtual disk whose host caches what was just read favours the second.
  if [ $((pair % 2)) = 1 ]; then
    say "cold, pair $pair: the storage's O_DIRECT sequential read, then cupool (auto)"
    disk_limit "$pair"
    evict
    cupool_load "cold $pair" || rc=1
  else
    say "cold, pair $pair: cupool (auto), then the storage's O_DIRECT sequential read"
    evict
    cupool_load "cold $pair" || rc=1
    disk_limit "$pair"
  fi
done
say "cold: cupool --gds always, load_file"
evict
gds_load "cold, --gds always"
evict
load_file "cold" || rc=1

if [ "${GPUS:-0}" -ge 2 ]; then
  # One file to GPU 0 alone, then two files to GPUs 0 and 1 at once (one buffer load command).
  FILE2=$TMP/model-1.safetensors
  cp "$FILE" "$FILE2"
  cat "$FILE" "$FILE2" >/dev/null
  tp_load() { # $1: label, then arguments of buffer load after the name
    local label=$1
    shift
    "$BUILD/cupool" buffer load tp "$@" --pool weights --format json |
      python3 -c 'import json,sys; r=json.load(sys.stdin); r["how"]="cupool"; r["label"]=sys.argv[1]; print(json.dumps(r))' "$label" >>"$JSONL"
    "$BUILD/cupool" buffer ls --format json |
      python3 -c 'import json,sys; print("\n".join(b["name"] for b in json.load(sys.stdin)["buffers"] if b["name"].startswith("tp")))' |
      xargs -r -n1 "$BUILD/cupool" buffer rm >/dev/null
  }
  for round in $(seq 1 "$ROUNDS"); do
    say "every GPU at once, round $round: one file to GPU 0, two files to GPUs 0 and 1"
    tp_load "one file to GPU 0" "$FILE" --device 0 || rc=1
    tp_load "two files to GPUs 0, 1" "$FILE" "$FILE2" || rc=1
  done
fi

python3 - "$JSONL" "$OUT" "$ROUNDS" >"$OUT/load-bench.txt" <<'PY'
import json, os, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
out, rounds = sys.argv[2], int(sys.argv[3])
def read(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else {}
def goal(ok):
    return "met" if ok else "NOT MET"
print(f"{'how':10} {'label':28} {'GB/s':>7} {'s':>7}  stages (cupool: index, create, load, reads, copy waits, ready; threads, O_DIRECT, cached, read method)")
for r in rows:
    gbs = r["tensor_bytes"] / r["elapsed_seconds"] / 1e9
    extra = ""
    if r["how"] == "cupool":
        st = r.get("stages", {})
        extra = ("  " + ", ".join(f"{st.get(k, 0):.2f}" for k in ("index_seconds", "create_seconds", "load_seconds",
                 "read_seconds", "copy_wait_seconds", "ready_seconds")) +
                 f"; {r.get('read_thread_count')}, {r.get('direct_io')}, {r.get('page_cache_ratio', 0):.2f}, "
                 f"{r.get('read_method')}")
    print(f"{r['how']:10} {r['label']:28} {gbs:7.2f} {r['elapsed_seconds']:7.3f}{extra}")
def rate(how, label, seconds=lambda r: r["elapsed_seconds"]):
    v = [r["tensor_bytes"] / seconds(r) / 1e9 for r in rows if r["how"] == how and r["label"] == label]
    return statistics.median(v) if v else float("nan")
def load_stage(r):  # cupool's copying alone: without the index, the buffer's creation and ready
    return r.get("stages", {}).get("load_seconds") or float("nan")

limits = read("load-limits.json")
h2d, cache = limits.get("h2d", {}), limits.get("page_cache", {})
pinned = h2d.get("pinned_gbps", float("nan"))
huge = (f"{h2d['huge_pages_gbps']:.2f} GB/s" if "huge_pages_gbps" in h2d
        else f"not had ({h2d.get('huge_pages_note', 'not measured')})")
print(f"\nlimits, measured in this run (cupool_load_limits on {limits.get('device', '?')}):")
print(f"  host to device, 64 MiB copies: pinned {pinned:.2f} GB/s; from huge pages registered (the loader's slots) {huge}")
print(f"  the file from the page cache, 16 threads x 2 MiB pread, no GPU: {cache.get('gbps', float('nan')):.2f} GB/s")

c, l = rate("cupool", "cached"), rate("load_file", "cached")
print(f"\nfrom the page cache, medians of {rounds}: cupool {c:.2f} GB/s, load_file {l:.2f} GB/s")
print(f"  cupool / pinned host-to-device: {c / pinned:.0%} (goal >= 70%: {goal(c / pinned >= 0.7)})")
cl = rate("cupool", "cached", load_stage)
print(f"  cupool's load stage alone (stages.load_seconds): {cl:.2f} GB/s, {cl / pinned:.0%} of pinned host-to-device")
cc_ = rate("cupool", "cached", lambda r: r.get("stages", {}).get("copy_seconds") or float("nan"))
opened = statistics.median([r["stages"].get("open_seconds", float("nan")) for r in rows
                            if r["how"] == "cupool" and r["label"] == "cached"] or [float("nan")])
print(f"  of which the copying (stages.copy_seconds): {cc_:.2f} GB/s, {cc_ / pinned:.0%} of pinned host-to-device "
      f"(goal >= 70%: {goal(cc_ / pinned >= 0.7)}); opening the buffer here (the process's CUDA start, the "
      f"mapping) {opened * 1000:.0f} ms")
print(f"  cupool / load_file: {c / l:.2f}x (goal >= 2x: {goal(c / l >= 2)})")

ratios = []
print("\ncold (pages dropped first), each pair: the storage's limit and cupool, one right after the other "
      "(the limit first in odd pairs, the load first in even ones):")
for pair in range(1, rounds + 1):
    best = read(f"load-limits-direct-{pair}.json").get("direct", {}).get("best", {})
    disk, load = best.get("gbps", float("nan")), rate("cupool", f"cold {pair}")
    if best:
        ratios.append(load / disk)
        where = f"{best['chunk_bytes'] >> 20} MiB x {best['threads']} threads"
    else:
        where = "not measured"
    print(f"  pair {pair}: O_DIRECT read {disk:.2f} GB/s ({where}), cupool {load:.2f} GB/s: {load / disk:.0%}")
if ratios:
    m = statistics.median(ratios)
    print(f"  median of the pairs' ratios: {m:.0%} (goal >= 90%: {goal(m >= 0.9)})")
cc = statistics.median([rate("cupool", f"cold {p}") for p in range(1, rounds + 1)])
lc = rate("load_file", "cold")
print(f"  cupool (median) {cc:.2f} GB/s, load_file {lc:.2f} GB/s: {cc / lc:.2f}x")
one, two = rate("cupool", "one file to GPU 0"), rate("cupool", "two files to GPUs 0, 1")
if one == one:
    print(f"\nevery GPU at once, medians: one file to GPU 0 {one:.2f} GB/s; two files to GPUs 0 and 1 "
          f"{two:.2f} GB/s together: {two / one:.2f}x (goal >= 1.8x: {goal(two / one >= 1.8)})")
else:
    print("\nevery GPU at once: not measured (one GPU)")
PY
cat "$OUT/load-bench.txt"
exit "$rc"
