#!/usr/bin/env bash
# scripts/load-bench.sh [BUILD_DIR]: `cupool buffer load` against safetensors' load_file to the GPU
# on the same file, in one run (issue 26's goal: at least 2x load_file's throughput from the page
# cache on a file of 8 GiB or more).
#
# From the repository root, on a GPU machine with torch and safetensors, after a build:
#   OUT=gpu-out bash scripts/load-bench.sh build-gpu
#
# Starts `BUILD/cupool hold` on a config of its own (one pool "weights" on device 0, posix_fd),
# writes a model-shaped safetensors file of $LOAD_GIB (default 8.5) GiB (tests/gpu/weights_proof.py
# make), reads it once into the page cache, then alternates, $ROUNDS (default 3) times:
#   load_file   python3: torch.cuda.init() first (not timed), then
#               safetensors.torch.load_file(FILE, device="cuda") + torch.cuda.synchronize()
#   cupool      `cupool buffer load` (its elapsed_seconds: header to ready), then `buffer rm`
# then cupool with --read-threads 1, 2, 4, 8 and 16, --direct-io always, and --gds always (cuFile;
# in its compatibility mode where nvidia-fs is not loaded); and cold (the file's pages dropped
# with posix_fadvise DONTNEED before each): cupool (auto: O_DIRECT), cupool --gds always,
# load_file. A --gds always load that cuFile refuses is said, not counted (in a container without
# a udev database cuFile registers no file: tests/gpu/udev-stand-in.sh).
# Every cupool reply goes to $OUT/load-bench.jsonl, the table to $OUT/load-bench.txt.
# Exit status: 0 every load ran, 1 one failed, 2 the build is missing.
set -euo pipefail

BUILD=${1:-build-gpu}
OUT=${OUT:-./gpu-out}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-3}
say() { printf 'load-bench: %s\n' "$*" >&2; }

[ -x "$BUILD/cupool" ] || { say "no $BUILD/cupool: build first (cmake -B $BUILD -G Ninja && cmake --build $BUILD)"; exit 2; }
BUILD=$(cd "$BUILD" && pwd)
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
for round in $(seq 1 "$ROUNDS"); do
  say "round $round: load_file, cupool"
  load_file "cached" || rc=1
  cupool_load "cached" || rc=1
done
for t in 1 2 4 8 16; do
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
say "cold: cupool (auto), cupool --gds always, load_file"
evict
cupool_load "cold" || rc=1
evict
gds_load "cold, --gds always"
evict
load_file "cold" || rc=1

python3 - "$JSONL" >"$OUT/load-bench.txt" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
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
def med(how, label):
    v = [r["tensor_bytes"] / r["elapsed_seconds"] for r in rows if r["how"] == how and r["label"] == label]
    return statistics.median(v) if v else float("nan")
c, l = med("cupool", "cached"), med("load_file", "cached")
print(f"\nfrom the page cache, medians: cupool {c / 1e9:.2f} GB/s, load_file {l / 1e9:.2f} GB/s: {c / l:.2f}x "
      f"(goal >= 2x: {'met' if c / l >= 2 else 'NOT MET'})")
cc, lc = med("cupool", "cold"), med("load_file", "cold")
print(f"cold (pages dropped first): cupool {cc / 1e9:.2f} GB/s, load_file {lc / 1e9:.2f} GB/s: {cc / lc:.2f}x")
PY
cat "$OUT/load-bench.txt"
exit "$rc"
