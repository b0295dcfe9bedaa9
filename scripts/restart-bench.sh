#!/usr/bin/env bash
# scripts/restart-bench.sh [BUILD_DIR]: a holder's restart to serving, on a GPU machine (issue 38;
# tests/gpu/restart_bench.py). From the repository root, after a build:
#   OUT=gpu-out bash scripts/restart-bench.sh build-gpu
# Writes a model-shaped safetensors file of $RESTART_GIB (default 8) GiB and one of 1 GiB
# (tests/gpu/weights_proof.py make), then restarts a holder that holds them through a keeper
# $RESTARTS (default 10) times each with SIGTERM and SIGKILL: the one 8 GiB set, then 8 sets of 1
# GiB. Reports hello, buffer_open and ready times from the spawn against the goals (100 ms and
# 150 ms to serving). Files under $OUT: restart-bench.txt (the output), restart-bench.json,
# restart-bench-holder.log. Exit status: the bench's (0 every start adopted every set), 2 no build.
set -euo pipefail
BUILD=${1:-build-gpu}
OUT=${OUT:-./gpu-out}
[ -x "$BUILD/cupool" ] || { echo "restart-bench: no $BUILD/cupool: build first" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export LD_LIBRARY_PATH="/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TMP=$(mktemp -d /tmp/cupool-restart.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
python3 tests/gpu/weights_proof.py make "$TMP/model.safetensors" --gib "${RESTART_GIB:-8}" >/dev/null
python3 tests/gpu/weights_proof.py make "$TMP/small.safetensors" --gib 1 >/dev/null
python3 tests/gpu/restart_bench.py --cupool "$BUILD/cupool" --file "$TMP/model.safetensors" \
  --small "$TMP/small.safetensors" --out "$OUT" --restarts "${RESTARTS:-10}" 2>&1 | tee "$OUT/restart-bench.txt"
