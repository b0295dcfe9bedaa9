#!/usr/bin/env bash
# scripts/gpu-run.sh: one run on a GPU machine, from the repository root. It records the machine,
# builds cupool, runs the GPU tests and then the whole suite, runs `query` (plain, json, deep,
# profile) and `check` on the shipped configs, and measures two claims:
#   - start-up cost: `cupool query --format json` against cupool_bare_init (dlopen + cuInit +
#     cuDeviceGetCount, nothing else), 30 alternating runs each, min / median / p90, ratio of medians;
#   - no device memory: while `cupool query` runs in a loop, nvidia-smi's compute-apps list never shows
#     a cupool process. Two controls say what that is worth: the same sampling while
#     `cupool query --deep` (which does create contexts) loops shows whether short-lived processes
#     are caught at all, and python3 holding a context for 3 s (torch, else ctypes) shows whether
#     nvidia-smi sees this machine's processes at all.
#
# Everything goes under $OUT (default ./gpu-out), at most these files:
#   gpu-run.log   everything, each command under a "+ command" heading and followed by its exit status
#   ctest.log     both ctest runs
#   query.json    `cupool query --format json`
#   profile.yaml  `cupool query --deep --profile-out`
#   timing.txt    the start-up figures, `query --deep` once, and the device-memory results
# A failing step is recorded and the run goes on; the exit status is 1 if any step failed, else 0.
#
# Optional: CUPOOL_DEPS (default .deps): a folder of .deb files (yaml-cpp, spdlog, fmt, CLI11,
# nlohmann-json, doctest dev packages) unpacked to /tmp/cupool-deps and put on CMAKE_PREFIX_PATH,
# for machines that lack them and cannot install packages.
set -u -o pipefail

OUT=${OUT:-./gpu-out}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
BUILD=build-gpu
RUNS=30

FAILURES=()
fail() {
  FAILURES+=("$1")
  printf '!!! FAILED: %s\n' "$1"
}
step() { printf '\n======== [%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
# Prints the command set -x style, runs it, prints its exit status, returns it.
# Headings go to stderr, so `run CMD >FILE` captures CMD's output alone (both end up in the log).
run() {
  {
    printf '+'
    printf ' %q' "$@"
    printf '\n'
  } >&2
  "$@"
  local rc=$?
  printf '[exit %d]\n' "$rc" >&2
  return "$rc"
}
now_ns() { date +%s%N; }
ms_between() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b - a) / 1e6 }'; }
# Numbers (one a line) on stdin -> "n=.. min=.. median=.. p90=.. max=..". p90 is nearest-rank.
stats() {
  sort -g | awk '{ a[NR] = $1 }
    END {
      n = NR
      if (n == 0) { print "n=0"; exit }
      med = (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
      p = int((9 * n + 9) / 10); if (p < 1) p = 1; if (p > n) p = n
      printf "n=%d min=%.2f median=%.2f p90=%.2f max=%.2f", n, a[1], med, a[p], a[n]
    }'
}
median() { stats | sed -n 's/.*median=\([0-9.]*\).*/\1/p'; }

# shellcheck disable=SC2054  # the commas belong to nvidia-smi's arguments
SMI_APPS=(timeout 10 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader)
# sample_apps PID FILE: appends nvidia-smi's compute apps to FILE every 0.2 s while PID lives, each
# sample under a "# sample N" line; prints the number of samples.
sample_apps() {
  local n=0
  while kill -0 "$1" 2>/dev/null; do
    n=$((n + 1))
    echo "# sample $n" >>"$2"
    "${SMI_APPS[@]}" >>"$2" 2>&1
    sleep 0.2
  done
  echo "$n"
}
# loop_for SECONDS COUNTFILE CMD...: runs CMD (output dropped) over and over for SECONDS, then writes
# how many times it ran to COUNTFILE.
loop_for() {
  local secs=$1 countfile=$2 n=0 end
  shift 2
  end=$(($(now_ns) + secs * 1000000000))
  while [ "$(now_ns)" -lt "$end" ]; do
    "$@" >/dev/null 2>&1
    n=$((n + 1))
  done
  echo "$n" >"$countfile"
}

main() {
  local tmp
  tmp=$(mktemp -d /tmp/cupool-gpu-run.XXXXXX) || return 2

  step "cupool gpu-run"
  echo "date (UTC): $(date -u '+%Y-%m-%dT%H:%M:%SZ')"
  echo "host: $(hostname 2>/dev/null || cat /etc/hostname 2>/dev/null)"
  echo "kernel: $(uname -a)"
  echo "repo: $(pwd)"
  echo "OUT: $OUT"
  local commit="unknown"
  if git rev-parse --git-dir >/dev/null 2>&1; then
    commit="$(git rev-parse HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' (uncommitted changes)')"
    git status --short 2>/dev/null | head -20
  elif [ -f .gpu-commit ]; then
    commit="$(head -c 200 .gpu-commit | tr '\n' ' ') (from .gpu-commit)"
  fi
  echo "commit: $commit"

  # The driver's libraries (libcuda, libnvidia-ml) live here on the GPU machines.
  export LIBRARY_PATH="/usr/local/nvidia/lib64${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  [ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
  [ -d /usr/local/nvidia/bin ] && export PATH="$PATH:/usr/local/nvidia/bin"
  local deps=${CUPOOL_DEPS:-.deps}
  if compgen -G "$deps/*.deb" >/dev/null; then
    step "unpacking build dependencies from $deps"
    mkdir -p /tmp/cupool-deps
    local deb
    for deb in "$deps"/*.deb; do run dpkg -x "$deb" /tmp/cupool-deps || fail "dpkg -x $deb"; done
    export CMAKE_PREFIX_PATH="/tmp/cupool-deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/tmp/cupool-deps/usr/lib/x86_64-linux-gnu"
    export LIBRARY_PATH="$LIBRARY_PATH:/tmp/cupool-deps/usr/lib/x86_64-linux-gnu"
  fi
  echo "PATH=$PATH"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "LIBRARY_PATH=$LIBRARY_PATH"
  echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-(unset)}"

  # ------------------------------------------------------------------ the machine
  local have_smi=1
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    have_smi=0
    fail "nvidia-smi is not on PATH"
  fi
  step "the machine"
  if [ "$have_smi" = 1 ]; then
    run timeout 60 nvidia-smi || fail "nvidia-smi"
    run timeout 60 nvidia-smi topo -m || fail "nvidia-smi topo -m"
    run timeout 60 nvidia-smi topo -p2p r || fail "nvidia-smi topo -p2p r"
    run timeout 60 nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,driver_version \
      --format=csv
  fi
  run cat /proc/driver/nvidia/version
  run grep -i nvidia /proc/devices
  run ls -l /dev/nvidia-caps-imex-channels
  run ls -l /usr/local/nvidia/lib64/libcuda.so.1 /usr/local/nvidia/lib64/libnvidia-ml.so.1
  step "tools"
  run gcc --version
  run g++ --version
  run cmake --version
  run ninja --version
  run nvcc --version
  run python3 --version

  # ------------------------------------------------------------------ build
  step "configure and build"
  # yaml-cpp, static and position-independent, from the source tarball carried in .deps/.
  run bash scripts/deps.sh || fail "scripts/deps.sh (the static yaml-cpp of the client and preload libraries)"
  local generator=(-G Ninja)
  command -v ninja >/dev/null 2>&1 || { echo "ninja not found: default generator"; generator=(); }
  local built=0
  if run cmake -S . -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo; then
    if run cmake --build "$BUILD" -j "$(nproc)" 2>&1 | tee "$tmp/build.log"; then
      built=1
    else
      fail "build"
    fi
    local warnings
    warnings=$(grep -c 'warning:' "$tmp/build.log")
    echo "compiler warnings in the build: $warnings"
    [ "$warnings" -gt 0 ] && grep 'warning:' "$tmp/build.log" | sort -u | head -40
  else
    fail "cmake configure"
  fi

  local bin="$BUILD/cupool" bare=""
  if [ "$built" = 1 ]; then
    bare=$(find "$BUILD" -type f -name cupool_bare_init -perm -u+x 2>/dev/null | head -1)
    echo "cupool: $bin"
    echo "cupool_bare_init: ${bare:-(not found)}"
    [ -x "$bin" ] || { fail "no $bin after the build"; built=0; }
    [ -n "$bare" ] || fail "cupool_bare_init not found under $BUILD"
  fi

  if [ "$built" = 1 ]; then
    # ---------------------------------------------------------------- tests
    step "ctest -L gpu"
    : >"$OUT/ctest.log"
    run ctest --test-dir "$BUILD" -L gpu --output-on-failure -V 2>&1 | tee -a "$OUT/ctest.log"
    [ "${PIPESTATUS[0]}" = 0 ] || fail "ctest -L gpu"
    # A skipped GPU test passes in ctest's eyes; on a GPU machine it is a failure.
    if grep -Eq '[0-9]+ - gpu \(Skipped\)|Test +#[0-9]+: gpu .*Skipped' "$OUT/ctest.log"; then
      fail "the gpu test was skipped (no driver or device seen)"
    fi
    step "ctest (all)"
    run ctest --test-dir "$BUILD" --output-on-failure 2>&1 | tee -a "$OUT/ctest.log"
    [ "${PIPESTATUS[0]}" = 0 ] || fail "ctest (all)"

    # ---------------------------------------------------------------- query and check
    step "cupool query"
    run timeout 120 "$bin" query || fail "cupool query"
    step "cupool query --format json > query.json"
    run timeout 120 "$bin" query --format json >"$OUT/query.json" || fail "cupool query --format json"
    cat "$OUT/query.json"
    if command -v python3 >/dev/null 2>&1; then
      if python3 -m json.tool "$OUT/query.json" >/dev/null; then
        echo "query.json: valid JSON"
      else
        fail "query.json is not valid JSON"
      fi
    fi
    step "cupool query --deep (timed)"
    local t0 t1 deep_ms deep_rc
    t0=$(now_ns)
    run timeout 300 "$bin" query --deep
    deep_rc=$?
    t1=$(now_ns)
    deep_ms=$(ms_between "$t0" "$t1")
    echo "query --deep: ${deep_ms} ms, exit $deep_rc"
    [ "$deep_rc" = 0 ] || fail "cupool query --deep"
    step "cupool query --deep --profile-out profile.yaml"
    run timeout 300 "$bin" query --deep --profile-out "$OUT/profile.yaml" >/dev/null ||
      fail "cupool query --deep --profile-out"
    [ -s "$OUT/profile.yaml" ] && cat "$OUT/profile.yaml"
    step "the recorded profile loads back"
    run timeout 60 "$bin" query --profile "$OUT/profile.yaml" || fail "cupool query --profile profile.yaml"

    step "cupool check on configs/*.yaml (exit codes logged, not judged)"
    local cfg n_cfg=0 rc
    for cfg in configs/*.yaml; do
      [ -e "$cfg" ] || continue
      n_cfg=$((n_cfg + 1))
      run timeout 120 "$bin" check "$cfg"
      rc=$?
      echo "check $cfg: exit $rc" >>"$tmp/check.txt"
    done
    [ "$n_cfg" = 0 ] && echo "no configs/*.yaml" >>"$tmp/check.txt"
    cat "$tmp/check.txt"

    # ---------------------------------------------------------------- start-up timing
    step "timing: $RUNS alternating runs of 'cupool query --format json' and cupool_bare_init"
    local i q_rc_bad=0 b_rc_bad=0 qms bms
    : >"$tmp/q.ms"
    : >"$tmp/b.ms"
    if [ -n "$bare" ]; then
      # One untimed run of each first, so both start with warm page caches.
      "$bin" query --format json >/dev/null 2>&1
      "$bare" >/dev/null 2>&1
      for i in $(seq 1 "$RUNS"); do
        t0=$(now_ns)
        "$bin" query --format json >/dev/null
        rc=$?
        t1=$(now_ns)
        [ "$rc" = 0 ] || q_rc_bad=$((q_rc_bad + 1))
        qms=$(ms_between "$t0" "$t1")
        echo "$qms" >>"$tmp/q.ms"
        t0=$(now_ns)
        "$bare" >/dev/null
        rc=$?
        t1=$(now_ns)
        [ "$rc" = 0 ] || b_rc_bad=$((b_rc_bad + 1))
        bms=$(ms_between "$t0" "$t1")
        echo "$bms" >>"$tmp/b.ms"
        printf 'run %2d: query %8s ms   bare_init %8s ms\n' "$i" "$qms" "$bms"
      done
    fi
    local q_stats b_stats q_med b_med ratio
    q_stats=$(stats <"$tmp/q.ms")
    b_stats=$(stats <"$tmp/b.ms")
    q_med=$(median <"$tmp/q.ms")
    b_med=$(median <"$tmp/b.ms")
    ratio=$(awk -v q="${q_med:-0}" -v b="${b_med:-0}" 'BEGIN { if (b > 0) printf "%.2f", q / b; else print "n/a" }')
    if [ "$q_rc_bad" != 0 ] || [ "$b_rc_bad" != 0 ]; then ratio="$ratio (INVALID: some runs failed)"; fi
    [ "$q_rc_bad" = 0 ] || fail "timing: cupool query failed in $q_rc_bad of $RUNS runs"
    [ "$b_rc_bad" = 0 ] || fail "timing: cupool_bare_init failed in $b_rc_bad of $RUNS runs"

    # ---------------------------------------------------------------- device memory
    local mem_result="not measured (no nvidia-smi)" control_result="not run" deep_control_result="not run"
    if [ "$have_smi" = 1 ]; then
      step "device memory: nvidia-smi compute apps while 'cupool query' runs in a loop (~3 s)"
      echo "+ ${SMI_APPS[*]}   (before: the baseline)"
      "${SMI_APPS[@]}" | tee "$tmp/baseline.csv"
      loop_for 3 "$tmp/loop.count" "$bin" query &
      local loop_pid=$! samples loops
      samples=$(sample_apps "$loop_pid" "$tmp/during.csv")
      wait "$loop_pid"
      loops=$(cat "$tmp/loop.count" 2>/dev/null || echo "?")
      echo "cupool query ran $loops times; nvidia-smi sampled $samples times; every line seen:"
      grep -v '^#' "$tmp/during.csv" 2>/dev/null | sort -u | sed 's/^/  /'
      # New entries: lines whose PID (first field) was not listed before the loop.
      local cupool_lines new_lines
      cupool_lines=$(grep -v '^#' "$tmp/during.csv" 2>/dev/null | grep -i 'cupool' | sort -u)
      new_lines=$(awk -F, 'FILENAME == ARGV[1] { seen[$1] = 1; next } !/^#/ && !($1 in seen)' "$tmp/baseline.csv" \
        "$tmp/during.csv" 2>/dev/null | sort -u)
      if [ -n "$cupool_lines" ]; then
        mem_result="a cupool process APPEARED among compute apps ($loops queries, $samples samples): $cupool_lines"
        fail "device memory: cupool query appeared in nvidia-smi's compute apps"
      elif [ -n "$new_lines" ]; then
        mem_result="no process named cupool, but new compute apps appeared ($loops queries, $samples samples): $new_lines"
        fail "device memory: unexplained compute apps appeared during the cupool loop"
      else
        mem_result="no cupool process ever appeared ($loops queries, $samples samples)"
      fi
      echo "RESULT: $mem_result"

      # Control for the sampling itself: `query --deep` does create a context, in processes as
      # short-lived as plain queries. If these show up, short cupool processes are caught by it.
      step "device memory, sampling control: the same while 'cupool query --deep' (which creates contexts) loops"
      loop_for 3 "$tmp/deep.count" "$bin" query --deep &
      loop_pid=$!
      samples=$(sample_apps "$loop_pid" "$tmp/deep.csv")
      wait "$loop_pid"
      loops=$(cat "$tmp/deep.count" 2>/dev/null || echo "?")
      echo "cupool query --deep ran $loops times; nvidia-smi sampled $samples times; every line seen:"
      grep -v '^#' "$tmp/deep.csv" 2>/dev/null | sort -u | sed 's/^/  /'
      local hits
      hits=$(awk '/^#/ { s = $0; next } tolower($0) ~ /cupool/ { hit[s] = 1 } END { print length(hit) }' \
        "$tmp/deep.csv" 2>/dev/null)
      if [ "${hits:-0}" -gt 0 ]; then
        deep_control_result="cupool query --deep WAS seen in $hits of $samples samples ($loops runs): the sampling catches short-lived cupool processes that hold a context"
      else
        deep_control_result="cupool query --deep was NOT seen in any of $samples samples ($loops runs): short-lived processes slip between samples, so the 'no cupool process' result only rules out contexts that outlive a sampling interval"
      fi
      echo "RESULT: $deep_control_result"

      step "device memory, positive control: python3 holding a CUDA context for 3 s"
      cat >"$tmp/control.py" <<'PY'
import time
try:
    import torch
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    print(f"control: torch {torch.__version__} holds a context on cuda:0", flush=True)
except Exception as e:  # no torch: the driver through ctypes
    print(f"control: torch unusable ({e!r}); using ctypes and libcuda.so.1", flush=True)
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    assert cu.cuInit(0) == 0, "cuInit"
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0, "cuDeviceGet"
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0, "cuDevicePrimaryCtxRetain"
    assert cu.cuCtxSetCurrent(ctx) == 0, "cuCtxSetCurrent"
    assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 << 20)) == 0, "cuMemAlloc"
    print("control: ctypes holds a context and 64 MiB on device 0", flush=True)
time.sleep(3)
PY
      echo "+ python3 control.py &   (torch.zeros(1, device='cuda'); time.sleep(3))"
      python3 "$tmp/control.py" &
      local control_pid=$! csamples
      csamples=$(sample_apps "$control_pid" "$tmp/control.csv")
      wait "$control_pid"
      local control_rc=$?
      echo "control exited $control_rc (PID $control_pid); nvidia-smi sampled $csamples times; every line seen:"
      grep -v '^#' "$tmp/control.csv" 2>/dev/null | sort -u | sed 's/^/  /'
      local control_lines
      control_lines=$(grep -v '^#' "$tmp/control.csv" 2>/dev/null | grep -E "^ *$control_pid,|python" | sort -u)
      if [ -n "$control_lines" ]; then
        control_result="the control DID appear: $(echo "$control_lines" | tr '\n' ';')"
      else
        control_result="INCONCLUSIVE: the control did NOT appear (exit $control_rc), so nvidia-smi cannot see processes here and the cupool result proves nothing"
      fi
      echo "RESULT: $control_result"
    fi

    {
      echo "cupool gpu-run timing and device memory"
      echo "date (UTC): $(date -u '+%Y-%m-%dT%H:%M:%SZ')"
      echo "host: $(hostname 2>/dev/null)"
      echo "commit: $commit"
      if [ "$have_smi" = 1 ]; then
        echo "devices: $(timeout 60 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tr '\n' ';')"
      fi
      echo
      echo "start-up, $RUNS alternating runs each, wall time per process in ms (date +%s%N around it):"
      echo "  cupool query --format json : $q_stats (failed runs: $q_rc_bad)"
      echo "  cupool_bare_init           : $b_stats (failed runs: $b_rc_bad)"
      echo "  ratio of medians (query / bare_init): $ratio"
      echo "  query ms: $(tr '\n' ' ' <"$tmp/q.ms")"
      echo "  bare ms:  $(tr '\n' ' ' <"$tmp/b.ms")"
      echo
      echo "cupool query --deep, once: ${deep_ms} ms (exit $deep_rc)"
      echo
      echo "device memory while 'cupool query' loops: $mem_result"
      echo "sampling control (query --deep loop): $deep_control_result"
      echo "positive control (python3 with a context): $control_result"
    } >"$OUT/timing.txt"
  else
    echo "no build: tests and measurements skipped" | tee "$OUT/timing.txt"
  fi

  # ------------------------------------------------------------------ summary
  step "SUMMARY"
  echo "commit: $commit"
  [ -f "$OUT/timing.txt" ] && cat "$OUT/timing.txt"
  [ -f "$tmp/check.txt" ] && { echo; echo "cupool check:"; cat "$tmp/check.txt"; }
  echo
  if [ "${#FAILURES[@]}" -eq 0 ]; then
    echo "ALL STEPS PASSED"
    rm -rf "$tmp"
    return 0
  fi
  echo "FAILED STEPS (${#FAILURES[@]}):"
  printf '  - %s\n' "${FAILURES[@]}"
  rm -rf "$tmp"
  return 1
}

main "$@" 2>&1 | tee "$OUT/gpu-run.log"
exit "${PIPESTATUS[0]}"
