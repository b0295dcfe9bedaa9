#!/usr/bin/env bash
# How big one held allocation may be, on this GPU and driver (issue 37: one answer everywhere).
# Usage, on a GPU machine after a build: scripts/held-size-probe.sh [BUILD_DIR] [PYTHON]
# For each size, a held buffer of one exported allocation (a device pool with posix_fd) is made,
# written by one process and read back by two others that import it (the C test client, and
# PyTorch through the Python package when PYTHON has torch); then leases of the same IPC pool, which
# a client imports with cuMemPoolImportPointer (that import crashed over ~5 GiB on driver 580).
# Prints one line per size: the exit codes (139: the importing process crashed).
set -u
BUILD=${1:-build-gpu}
PY=${2:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
S=$tmp/probe.sock
TC=$BUILD/tests/holder/testclient
cat > "$tmp/probe.yaml" <<YAML
version: 1
holder: {socket: $S, mode: "0600"}
pools:
  - {name: big, devices: [0], handle_types: [posix_fd], max_size: 130GiB, release_threshold: max}
YAML
"$BUILD/cupool" --log-level info hold "$tmp/probe.yaml" > "$tmp/holder.log" 2>&1 &
holder=$!
for _ in $(seq 100); do [ -S "$S" ] && break; sleep 0.2; done
torch_read() {
  CUPOOL_CLIENT_LIB=$PWD/$BUILD/libcupool-client.so.1 PYTHONPATH=$PWD/python timeout 300 "$PY" - "$S" "$1" <<'PY'
import sys
import torch
import cupool
conn = cupool.connect(sys.argv[1])
x = torch.from_dlpack(conn.open_buffer(sys.argv[2])).view(torch.uint8)
total = int(x[: 1 << 20].sum()) + int(x[-(1 << 20):].sum())  # the first and last MiB, written by C
x[-1] = 42
torch.cuda.synchronize()
print("torch ok", x.numel(), total)
PY
}
for g in 4 5 6 8 16 32 64 100; do
  "$BUILD/cupool" buffer create "b$g" --pool big --size "${g}GiB" --socket "$S" > /dev/null 2> "$tmp/err"; made=$?
  timeout 120 "$TC" "$S" write "b$g" 7 > /dev/null 2>&1; wrote=$?
  timeout 120 "$TC" "$S" read "b$g" 7 > /dev/null 2>&1; read=$?
  torch_read "b$g" > "$tmp/torch" 2>&1; torch=$?
  echo "held ${g} GiB in one allocation: create $made, C write $wrote, C read $read, torch $torch ($(tail -1 "$tmp/torch"))"
  "$BUILD/cupool" buffer rm "b$g" --socket "$S" > /dev/null 2>&1
done
for g in 4 5 6 8 16; do
  timeout 120 "$TC" "$S" cycle big 0 $((g << 30)) 1 > "$tmp/cycle" 2>&1; rc=$?
  echo "lease of ${g} GiB imported from the pool: exit $rc $(tail -1 "$tmp/cycle")"
done
kill "$holder"; wait "$holder"
