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
# shellcheck source=scripts/weights-holder.sh
. "$ROOT/scripts/weights-holder.sh"
cleanup() {
  stop_weights_holder
  rm -rf "$TMP" "$WORK/model.safetensors"
}
trap cleanup EXIT
start_weights_holder "$OUT/weights-holder.log"

export CUPOOL_CLIENT_LIB=$BUILD/libcupool-client.so.1 PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
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
