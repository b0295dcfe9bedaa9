#!/usr/bin/env bash
# scripts/holder-bench.sh [BUILD_DIR]: runs cupool_holder_bench against a holder started for it.
#
# From the repository root, on a GPU machine, after a build (cmake -B build-gpu -G Ninja &&
# cmake --build build-gpu):
#   OUT=gpu-out bash scripts/holder-bench.sh build-gpu
#
# It writes a bench config to a temporary folder (socket there, mode 0600; one pool "bench" on
# device 0, posix_fd, release_threshold max, max_size 8GiB), starts `BUILD/cupool hold` on it in the
# background, waits up to 20 s until the socket answers `cupool status`, runs
# `BUILD/tests/gpu/cupool_holder_bench --socket ... --json OUT/holder-bench.json`, records the
# holder's status and stats afterwards, then stops the holder with SIGTERM and waits for it.
#
# Nothing may leak: before the bench (after one warm-up round trip through the holder, so the
# driver has opened whatever it opens on first use) and after it, the script records the holder's
# open descriptors (/proc/PID/fd) and the pool's used bytes (`cupool stats --format json`,
# used_bytes). They must be the same afterwards (the descriptors within 10 s, as the holder
# notices the clients leave); the lists of descriptors go into holder-bench.txt.
#
# Files under $OUT (default ./gpu-out):
#   holder-bench.txt         the date, the GPU, the bench's whole output (stdout and stderr), and the
#                            holder's status and stats after the run
#   holder-bench.json        the bench's results as JSON
#   holder-bench-holder.log  the holder's own output
# Exit status: the bench's (0 all paths ran, 1 a path failed, 77 no driver or device), or 1 when the
# holder could not be started or stopped or when its descriptors or the pool's used bytes differ
# before and after the run, 2 when the build is missing.
#
# Optional, for testing the script itself: HOLDER_ARGS (extra arguments of `cupool hold`, e.g.
# "--profile configs/profiles/h100.yaml") and HOLDER_BENCH_ARGS (extra arguments of the bench, e.g.
# "--allow-simulated --paths holder,throughput").
set -euo pipefail

BUILD=${1:-build-gpu}
OUT=${OUT:-./gpu-out}

say() { printf 'holder-bench: %s\n' "$*" >&2; }

if [ ! -d "$BUILD" ]; then
  say "no build folder '$BUILD'; build first: cmake -B $BUILD -G Ninja && cmake --build $BUILD"
  exit 2
fi
BUILD=$(cd "$BUILD" && pwd)
CUPOOL=$BUILD/cupool
BENCH=$BUILD/tests/gpu/cupool_holder_bench
for bin in "$CUPOOL" "$BENCH"; do
  if [ ! -x "$bin" ]; then
    say "$bin is missing or not executable; build it: cmake --build $BUILD --target cupool cupool_holder_bench"
    exit 2
  fi
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TXT=$OUT/holder-bench.txt
JSON=$OUT/holder-bench.json
HOLDER_LOG=$OUT/holder-bench-holder.log

# The driver's libraries and nvidia-smi live here on the GPU machines (as in scripts/gpu-run.sh).
export LD_LIBRARY_PATH="/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -d /usr/local/nvidia/bin ]; then export PATH="$PATH:/usr/local/nvidia/bin"; fi

read -r -a HOLD_EXTRA <<<"${HOLDER_ARGS:-}"
read -r -a BENCH_EXTRA <<<"${HOLDER_BENCH_ARGS:-}"

TMP=$(mktemp -d /tmp/cupool-bench.XXXXXX)
SOCK=$TMP/cupool.sock
CONFIG=$TMP/bench.yaml
HOLDER_PID=""
HOLDER_RC=""

stop_holder() {
  # Stops the holder (SIGTERM, then SIGKILL after 40 s); sets HOLDER_RC to its exit status. Not in a
  # subshell: only this shell can wait for the holder.
  [ -n "$HOLDER_PID" ] || return 0
  local pid=$HOLDER_PID rc=0 i
  HOLDER_PID=""
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 200); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
      say "the holder (pid $pid) still runs 40 s after SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" || rc=$?
  HOLDER_RC=$rc
}

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  if [ -n "$HOLDER_PID" ]; then stop_holder; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

{
  echo "holder-bench: $(basename "$BENCH") against a holder started for it"
  echo "date (UTC): $(date -u '+%Y-%m-%dT%H:%M:%SZ')"
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu: $(timeout 60 nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | tr '\n' ';')"
  else
    echo "gpu: nvidia-smi is not on PATH"
  fi
  echo "host: $(hostname 2>/dev/null || cat /etc/hostname 2>/dev/null || echo unknown)"
  if git rev-parse --git-dir >/dev/null 2>&1; then
    echo "commit: $(git rev-parse HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' (uncommitted changes)')"
  fi
  echo "build: $BUILD"
} | tee "$TXT"

cat >"$CONFIG" <<EOF
version: 1
holder:
  socket: $SOCK
  mode: "0600"
pools:
  - name: bench
    devices: [0]
    handle_types: [posix_fd]
    release_threshold: max
    max_size: 8GiB
EOF
{
  echo "config ($CONFIG):"
  sed 's/^/  /' "$CONFIG"
} | tee -a "$TXT"

"$CUPOOL" hold "$CONFIG" --drain-timeout 5 ${HOLD_EXTRA[@]+"${HOLD_EXTRA[@]}"} >"$HOLDER_LOG" 2>&1 &
HOLDER_PID=$!
say "holder started (pid $HOLDER_PID), log $HOLDER_LOG; waiting for $SOCK"

ready=0
for i in $(seq 1 100); do # 100 x 0.2 s = 20 s
  if ! kill -0 "$HOLDER_PID" 2>/dev/null; then
    rc=0
    wait "$HOLDER_PID" || rc=$?
    HOLDER_PID=""
    say "the holder exited with status $rc before its socket answered (3: no driver or device, 1/2: the config, 4: the socket); its log:"
    sed 's/^/  | /' "$HOLDER_LOG" >&2
    echo "RESULT: the holder did not start (exit $rc); see $HOLDER_LOG" >>"$TXT"
    exit 1
  fi
  if "$CUPOOL" status --socket "$SOCK" >/dev/null 2>&1; then
    ready=1
    break
  fi
  sleep 0.2
done
if [ "$ready" != 1 ]; then
  say "the holder's socket $SOCK did not answer 'cupool status' within 20 s; its log so far:"
  sed 's/^/  | /' "$HOLDER_LOG" >&2
  echo "RESULT: the holder's socket never answered; see $HOLDER_LOG" >>"$TXT"
  exit 1
fi
say "holder ready after ~$((i * 2 / 10)) s"

# What the holder holds: its open descriptors and the bench pool's used bytes.
holder_fds() { find "/proc/$HOLDER_PID/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
holder_fd_list() {
  local f
  for f in "/proc/$HOLDER_PID/fd"/*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    echo "  ${f##*/} -> $(readlink "$f" 2>/dev/null || echo '?')"
  done
}
pool_used() {
  # The config has one pool, so the first used_bytes (pools come before devices' graph) is the bench pool's.
  "$CUPOOL" stats --socket "$SOCK" --format json 2>/dev/null | sed -n 's/.*"used_bytes": *\([0-9][0-9]*\).*/\1/p' | head -n 1
}
# Waits (up to 10 s) until the holder has $1 descriptors open, or until the count stays the same
# for 1 s when $1 is empty; prints the count.
settled_fds() {
  local want=${1:-} n last="" same=0 _
  for _ in $(seq 1 50); do
    n=$(holder_fds)
    if [ -n "$want" ] && [ "$n" = "$want" ]; then break; fi
    if [ -z "$want" ]; then
      if [ "$n" = "$last" ]; then same=$((same + 1)); else same=0; fi
      [ "$same" -ge 5 ] && break
    fi
    last=$n
    sleep 0.2
  done
  echo "$n"
}

TIMEOUT_WARM=()
if command -v timeout >/dev/null 2>&1; then TIMEOUT_WARM=(timeout --signal=TERM 300); fi
# Warm-up: one round trip through the holder, so what the driver opens on first use (in the
# holder's process) is open before the baseline is taken.
WARM_EXTRA=()
for a in ${BENCH_EXTRA[@]+"${BENCH_EXTRA[@]}"}; do
  if [ "$a" = "--allow-simulated" ]; then WARM_EXTRA+=("$a"); fi
done
echo "+ warm-up: $BENCH --socket $SOCK --paths holder --sizes 1MiB --iterations 1 --warmup 1 ${WARM_EXTRA[*]+${WARM_EXTRA[*]}}" | tee -a "$TXT"
set +e
${TIMEOUT_WARM[@]+"${TIMEOUT_WARM[@]}"} "$BENCH" --socket "$SOCK" --paths holder --sizes 1MiB --iterations 1 --warmup 1 \
  ${WARM_EXTRA[@]+"${WARM_EXTRA[@]}"} >"$TMP/warm-up.txt" 2>&1
warm_rc=$?
set -e
echo "[warm-up exit status $warm_rc]" | tee -a "$TXT"
if [ "$warm_rc" != 0 ]; then sed 's/^/  | /' "$TMP/warm-up.txt" | tee -a "$TXT"; fi

FDS_BEFORE=$(settled_fds)
USED_BEFORE=$(pool_used)
{
  echo "before the run: holder (pid $HOLDER_PID) has $FDS_BEFORE descriptors open; pool bench used_bytes ${USED_BEFORE:-?} B"
  holder_fd_list
} | tee -a "$TXT"

TIMEOUT=()
if command -v timeout >/dev/null 2>&1; then TIMEOUT=(timeout --signal=TERM 1800); fi
echo "+ $BENCH --socket $SOCK --json $JSON ${BENCH_EXTRA[*]+${BENCH_EXTRA[*]}}" | tee -a "$TXT"
set +e
${TIMEOUT[@]+"${TIMEOUT[@]}"} "$BENCH" --socket "$SOCK" --json "$JSON" ${BENCH_EXTRA[@]+"${BENCH_EXTRA[@]}"} 2>&1 | tee -a "$TXT"
bench_rc=${PIPESTATUS[0]}
set -e
echo "[bench exit status $bench_rc]" | tee -a "$TXT"
[ "$bench_rc" = 124 ] && echo "the bench ran past 30 minutes and was stopped" | tee -a "$TXT"

FDS_AFTER=$(settled_fds "$FDS_BEFORE")
USED_AFTER=$(pool_used)
leak=""
if [ "$FDS_AFTER" != "$FDS_BEFORE" ]; then
  leak="the holder has $FDS_AFTER descriptors open after the run, $FDS_BEFORE before"
fi
if [ -z "$USED_BEFORE" ] || [ "$USED_AFTER" != "$USED_BEFORE" ]; then
  leak="${leak:+$leak; }pool bench used_bytes is ${USED_AFTER:-?} B after the run, ${USED_BEFORE:-?} B before"
fi
{
  echo
  echo "after the run: holder has $FDS_AFTER descriptors open ($FDS_BEFORE before); pool bench used_bytes ${USED_AFTER:-?} B (${USED_BEFORE:-?} B before)"
  if [ -n "$leak" ]; then
    echo "descriptors after the run:"
    holder_fd_list
  fi
} | tee -a "$TXT"

{
  echo
  echo "holder status after the run (leases should be 0):"
  "$CUPOOL" status --socket "$SOCK" 2>&1 || echo "(cupool status failed)"
  echo
  echo "holder stats after the run:"
  "$CUPOOL" stats --socket "$SOCK" 2>&1 || echo "(cupool stats failed)"
} | tee -a "$TXT"

stop_holder
holder_rc=$HOLDER_RC
echo "holder stopped with SIGTERM: exit status $holder_rc (0 expected)" | tee -a "$TXT"
say "results: $TXT, $JSON; holder log: $HOLDER_LOG"
if [ -n "$leak" ]; then
  echo "RESULT: LEAK: $leak" | tee -a "$TXT"
  if [ "$bench_rc" = 0 ] || [ "$bench_rc" = 77 ]; then exit 1; fi
  exit "$bench_rc"
fi
echo "RESULT: no leak: $FDS_AFTER descriptors and ${USED_AFTER} B used, as before the run" | tee -a "$TXT"
if [ "$bench_rc" = 0 ] && [ "$holder_rc" != 0 ]; then
  say "the bench passed but the holder exited with $holder_rc"
  exit 1
fi
exit "$bench_rc"
