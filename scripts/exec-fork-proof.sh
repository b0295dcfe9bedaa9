#!/usr/bin/env bash
# scripts/exec-fork-proof.sh BUILD_DIR: on a GPU machine, whether a program that forks before it
# uses CUDA still works in its children, plain and under `cupool exec` (--at cuinit, the default,
# and --at start); and which of the driver's entry points each framework takes (CUPOOL_EXEC_DEBUG).
# Results: $OUT/exec-fork-proof.txt.
set -uo pipefail
# shellcheck source=scripts/gpu-common.sh
source "$(dirname "$0")/gpu-common.sh"
printf 'version: 1\nprocess:\n  devices: [0]\n  default_pool: {release_threshold: max}\n' > "$tmp/default.yaml"
printf 'version: 1\nprocess:\n  devices: [0]\n  current_pool: {release_threshold: max}\n' > "$tmp/current.yaml"
torch_fork='import os, torch
pid = os.fork()
if pid == 0:
    x = torch.ones(1 << 20, device="cuda:0"); torch.cuda.synchronize()
    print("torch child", os.getpid(), "ok", float(x.sum())); os._exit(0)
_, status = os.waitpid(pid, 0); print("torch parent: child exit status", status)'
{
  date -u +"date (UTC): %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
  for run in plain "exec default.yaml" "exec current.yaml" "exec default.yaml --at start"; do
    echo "== fork_app.py none, $run"
    set -- $run
    if [[ $1 == plain ]]; then
      python3 "$here/tests/gpu/apps/fork_app.py" none 2>&1 | grep -v DeprecationWarning | grep -v 'pid = os.fork'
    else
      "$BUILD/cupool" exec "$tmp/$2" "${@:3}" -- python3 "$here/tests/gpu/apps/fork_app.py" none 2>&1 \
        | grep -v DeprecationWarning | grep -v 'pid = os.fork'
    fi
    echo "== torch, fork then CUDA in the child, $run"
    if [[ $1 == plain ]]; then
      python3 -c "$torch_fork" 2>&1 | tail -3
    else
      "$BUILD/cupool" exec "$tmp/$2" "${@:3}" -- python3 -c "$torch_fork" 2>&1 | tail -4
    fi
  done
  for fw in cupy torch cuda-runtime; do
    echo "== which entry points $fw takes (CUPOOL_EXEC_DEBUG=1)"
    CUPOOL_EXEC_DEBUG=1 "$BUILD/cupool" exec "$tmp/default.yaml" -- \
      python3 "$here/tests/gpu/apps/pool_app.py" "$fw" --iterations 20 2>&1 >/dev/null | grep 'cupool exec' | cut -c1-200
  done
} 2>&1 | tee "$OUT/exec-fork-proof.txt"
