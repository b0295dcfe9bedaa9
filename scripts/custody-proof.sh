#!/usr/bin/env bash
# Issue 23's proof on a GPU machine (tests/gpu/custody_proof.py), after a build and `ctest -L gpu`
# (holder-gpu and custody-gpu run the holder's and custody's scenarios on the driver). Logs under
# $OUT: build.log, ctest-gpu.log, custody-proof.log and custody-proof.json. From the repository root:
#   OUT=/tmp/out bash scripts/custody-proof.sh [GIB]      (GIB: the model's size, default 8.5)
set -u -o pipefail
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
GIB=${1:-8.5}
BUILD=${BUILD:-build-gpu}
export LD_LIBRARY_PATH="/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
[ -d /usr/local/nvidia/bin ] && export PATH="$PATH:/usr/local/nvidia/bin"
if compgen -G ".deps/*.deb" >/dev/null; then
  mkdir -p /tmp/cupool-deps
  for deb in .deps/*.deb; do dpkg -x "$deb" /tmp/cupool-deps; done
  export CMAKE_PREFIX_PATH="/tmp/cupool-deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/tmp/cupool-deps/usr/lib/x86_64-linux-gnu"
  export PYTHONPATH="/tmp/cupool-deps/usr/lib/python3/dist-packages${PYTHONPATH:+:$PYTHONPATH}"
fi
rc=0
# STEP=build: the build and `ctest -L gpu` only; STEP=proof: the proof only (on a kept build);
# STEP=quick: the build and the proof, no ctest.
STEP=${STEP:-all}
if [ "$STEP" != proof ]; then
{
  date -u '+%Y-%m-%dT%H:%M:%SZ'
  nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version --format=csv
  nvidia-smi topo -m
  generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
  bash scripts/deps.sh && cmake -S . -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
    cmake --build "$BUILD" -j "$(nproc)"
} >"$OUT/build.log" 2>&1 || { echo "build failed: $OUT/build.log"; tail -30 "$OUT/build.log"; exit 1; }
if [ "$STEP" != quick ]; then
  ctest --test-dir "$BUILD" -L gpu --output-on-failure -V >"$OUT/ctest-gpu.log" 2>&1 || rc=1
  grep -E "^(ok|FAIL|skip)|scenarios passed|tests passed|Test +#" "$OUT/ctest-gpu.log" | tail -120
fi
fi
[ "$STEP" = build ] && { echo "custody-proof (build): exit $rc"; exit $rc; }
model=$(mktemp -d /tmp/cupool-model.XXXXXX)/model.safetensors
python3 tests/gpu/weights_proof.py make "$model" --gib "$GIB" >"$OUT/custody-proof.log" 2>&1 || rc=1
python3 tests/gpu/custody_proof.py --cupool "$BUILD/cupool" --client-lib "$BUILD/libcupool-client.so.1" \
  --file "$model" --out "$OUT" --restarts "${RESTARTS:-20}" 2>&1 | tee -a "$OUT/custody-proof.log" | tail -80
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
rm -rf "$(dirname "$model")"
echo "custody-proof: exit $rc"
exit $rc
