# shellcheck shell=bash
# Sourced by load-bench.sh and weights-proof.sh (with BUILD, TMP and say() set): a holder of their
# own for `buffer load`, on a config in $TMP (socket $TMP/cupool.sock, mode 0600; one pool
# "weights" on device 0, posix_fd; on the devices $WEIGHTS_DEVICES names instead, e.g. "0, 1").
#   start_weights_holder LOG   starts `$BUILD/cupool hold`, its output to LOG, waits until it
#                              answers (exit 1 if it exits first) and exports CUPOOL_SOCKET
#   stop_weights_holder        stops it, if it runs (for the script's EXIT trap)
HOLDER_PID=""
SOCK=$TMP/cupool.sock

stop_weights_holder() {
  if [ -n "$HOLDER_PID" ]; then
    kill -TERM "$HOLDER_PID" 2>/dev/null || true
    wait "$HOLDER_PID" 2>/dev/null || true
    HOLDER_PID=""
  fi
}

start_weights_holder() {
  local log=$1
  cat >"$TMP/weights.yaml" <<YAML
version: 1
holder:
  socket: $SOCK
  mode: "0600"
pools:
  - name: weights
    devices: [${WEIGHTS_DEVICES:-0}]
    handle_types: [posix_fd]
YAML
  "$BUILD/cupool" hold "$TMP/weights.yaml" >"$log" 2>&1 &
  HOLDER_PID=$!
  for _ in $(seq 1 100); do
    "$BUILD/cupool" status --socket "$SOCK" >/dev/null 2>&1 && break
    kill -0 "$HOLDER_PID" 2>/dev/null || { say "the holder exited; see $log"; exit 1; }
    sleep 0.2
  done
  export CUPOOL_SOCKET=$SOCK
}
