#!/usr/bin/env bash
# scripts/exec-proof.sh BUILD_DIR: on a GPU machine, runs tests/gpu/apps/pool_app.py with CuPy and
# with PyTorch (cudaMallocAsync backend), each plain and under `cupool exec`, and prints what each
# program saw of its own default/current pool and how long its allocate/free/synchronize loop took.
# Results: $OUT/exec-proof.jsonl (one line per run) and $OUT/exec-proof.txt.
set -uo pipefail
# shellcheck source=scripts/gpu-common.sh
source "$(dirname "$0")/gpu-common.sh"
cat > "$tmp/process.yaml" <<'YAML'
version: 1
process:
  devices: [0]
  default_pool:
    release_threshold: max
    reuse: {allow_internal_dependencies: false}
YAML
# Every attribute away from what the frameworks choose, to see which of them each one forces back.
cat > "$tmp/process-all.yaml" <<'YAML'
version: 1
process:
  devices: [0]
  default_pool:
    release_threshold: 1GiB
    reuse: {follow_event_dependencies: false, allow_opportunistic: false, allow_internal_dependencies: false}
YAML
# A pool of cupool's made current: cudaMallocAsync allocates from it, whatever the framework sets on
# the default pool.
cat > "$tmp/process-current.yaml" <<'YAML'
version: 1
process:
  devices: [0]
  current_pool:
    release_threshold: 1GiB
    reuse: {follow_event_dependencies: false, allow_opportunistic: false, allow_internal_dependencies: false}
YAML
: > "$OUT/exec-proof.jsonl"
{
  date -u +"date (UTC): %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
  echo "config:"; sed 's/^/  /' "$tmp/process.yaml"
  for fw in cupy torch cuda-runtime; do
    for mode in plain exec exec-all exec-current; do
      echo "== $fw, $mode"
      if [[ $mode == plain ]]; then
        python3 "$here/tests/gpu/apps/pool_app.py" "$fw" > "$tmp/line" 2> "$tmp/err"
      else
        cfg="$tmp/process.yaml"
        [[ $mode == exec-all ]] && cfg="$tmp/process-all.yaml"
        [[ $mode == exec-current ]] && cfg="$tmp/process-current.yaml"
        "$BUILD/cupool" exec "$cfg" --report="$OUT/exec-proof-report.jsonl" -- \
          python3 "$here/tests/gpu/apps/pool_app.py" "$fw" > "$tmp/line" 2> "$tmp/err"
      fi
      rc=$?
      echo "exit $rc"; tail -5 "$tmp/err"
      python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r['mode']='$mode'; print(json.dumps(r))" < "$tmp/line" \
        | tee -a "$OUT/exec-proof.jsonl"
    done
  done
} 2>&1 | tee "$OUT/exec-proof.txt"
python3 - "$OUT/exec-proof.jsonl" <<'PY' | tee -a "$OUT/exec-proof.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
def settings(p):
    flags = "/".join(str(p.get(k)) for k in ("reuse.follow_event_dependencies", "reuse.allow_opportunistic",
                                             "reuse.allow_internal_dependencies"))
    t = p.get("release_threshold")
    t = "max" if t == 2**64 - 1 else f"{t / 2**20:.0f}MiB" if isinstance(t, int) else str(t)
    return f"{t}; {flags}; used high {p.get('used_high', 0) / 2**20:.0f}MiB"
print(f"{'framework':12} {'run':12} {'default pool':>34} {'current pool (when another)':>34} {'median us':>10} {'p99 us':>9} {'fw reports':>10}")
for r in rows:
    a = r["pool_after_loop"]
    d, c = a["default"], a["current"]
    cur = settings(c) if c.get("handle") != d.get("handle") else "(the default pool)"
    rep = r.get("framework_reports_reserved")
    rep = "-" if rep is None else f"{rep / 2**20:.0f}MiB"
    print(f"{r['framework']:12} {r.get('mode', 'exec' if r['under_cupool_exec'] else 'plain'):12} "
          f"{settings(d):>34} {cur:>34} {r['median_us']:10.1f} {r['p99_us']:9.1f} {rep:>10}")
by = {}
for r in rows:
    by.setdefault((r["framework"], r["under_cupool_exec"]), r)
for fw in ("cupy", "torch", "cuda-runtime"):
    if (fw, False) in by and (fw, True) in by:
        print(f"{fw}: loop median plain / under cupool exec = {by[(fw, False)]['median_us'] / by[(fw, True)]['median_us']:.1f}x")
PY
