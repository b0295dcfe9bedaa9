#!/usr/bin/env bash
# scripts/weights-proof.sh [BUILD_DIR]: held tensor sets on a GPU (issue 13's proof).
#
# From the repository root, on a GPU machine with torch, cupy and safetensors, after a build:
#   OUT=gpu-out bash scripts/weights-proof.sh build-gpu
#
# Starts `BUILD/cupool hold` on a config of its own (socket in a temporary folder, mode 0600; one
# pool "weights" on device 0, posix_fd), writes a model-shaped safetensors file of $WEIGHTS_GIB
# (default 8.5) GiB with tests/gpu/weights_proof.py make, loads it once with `cupool buffer load
# model FILE --pool weights`, runs `weights_proof.py run` (fresh torch and cupy engines, 1 and 4
# at once, cupool.tensors against safetensors' load_file; a SIGKILLed engine restarted), then
# removes the buffer and stops the holder.
#
# Files under $OUT (default ./gpu-out): weights-proof.txt and .json (weights_proof.py's results),
# weights-load.json (`cupool buffer load`'s reply), weights-holder.log (the holder's output).
# $WORK (default a temporary folder) holds the model file, removed at the end.
# Exit status: weights_proof.py's (0 every check ran, 1 a check failed), 1 when the holder or the
# load failed, 2 when the build is missing.
set -euo pipefail

BUILD=${1:-build-gpu}
OUT=${OUT:-./gpu-out}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
say() { printf 'weights-proof: %s\n' "$*" >&2; }

[ -x "$BUILD/cupool" ] || { say "no $BUILD/cupool: build first (cmake -B $BUILD -G Ninja && cmake --build $BUILD)"; exit 2; }
BUILD=$(cd "$BUILD" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export LD_LIBRARY_PATH="/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

TMP=$(mktemp -d /tmp/cupool-weights.XXXXXX)
WORK=${WORK:-$TMP}
SOCK=$TMP/cupool.sock
HOLDER_PID=""
cleanup() {
  if [ -n "$HOLDER_PID" ]; then
    kill -TERM "$HOLDER_PID" 2>/dev/null || true
    wait "$HOLDER_PID" 2>/dev/null || true
  fi
  rm -rf "$TMP" "$WORK/model.safetensors"
}
trap cleanup EXIT

cat >"$TMP/weights.yaml" <<EOF
version: 1
holder:
  socket: $SOCK
  mode: "0600"
pools:
  - name: weights
    devices: [0]
    handle_types: [posix_fd]
EOF
"$BUILD/cupool" hold "$TMP/weights.yaml" >"$OUT/weights-holder.log" 2>&1 &
HOLDER_PID=$!
for _ in $(seq 1 100); do
  "$BUILD/cupool" status --socket "$SOCK" >/dev/null 2>&1 && break
  kill -0 "$HOLDER_PID" 2>/dev/null || { say "the holder exited; see $OUT/weights-holder.log"; exit 1; }
  sleep 0.2
done

export CUPOOL_SOCKET=$SOCK CUPOOL_CLIENT_LIB=$BUILD/libcupool-client.so.1 PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
FILE=$WORK/model.safetensors
say "writing $FILE"
python3 "$ROOT/tests/gpu/weights_proof.py" make "$FILE" --gib "${WEIGHTS_GIB:-8.5}"
say "cupool buffer load model $FILE --pool weights"
"$BUILD/cupool" buffer load model "$FILE" --pool weights --format json | tee "$OUT/weights-load.json"
"$BUILD/cupool" buffer ls

rc=0
python3 "$ROOT/tests/gpu/weights_proof.py" run --name model --file "$FILE" --out "$OUT" || rc=$?
"$BUILD/cupool" buffer rm model || rc=1
exit "$rc"
