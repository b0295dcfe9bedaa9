#!/usr/bin/env bash
# Quick start, step 2: the whole test suite, as CI runs it (.ci/run). The trees: scripts/trees.sh.
#   lint        clang-format over the C and C++ sources, clang-tidy over the changed ones (scripts/lint.sh)
#   build/      gcc: every test (ctest -j2; the suites that time themselves run alone)
#   build-san/  clang, ASan + UBSan: every test that runs our code (not the text-only ones, label text);
#               built at idle priority while build/'s tests run
#   build-tsan/ ThreadSanitizer: the unit tests of the parts with threads and the holder suite;
#               built at idle priority while build-san/'s tests run
#   fuzz        each libFuzzer target for FUZZ_SECONDS (30), two at a time, from build-san/
# GPU tests skip themselves without a GPU. Each stage's seconds are printed at the end. Every ctest
# run gives each test a TMPDIR of its own and fails when a test leaves anything there (tests/hygiene);
# in CI (CI set) also when something appears in /tmp itself while the tests run.
# Usage: scripts/test.sh   (installs what is missing through scripts/setup.sh's package list)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/trees.sh

JOBS=${JOBS:-$(nproc)}
status=0
summary=()
t0=0
stage() {  # stage NAME: a stage begins
  t0=$SECONDS
  stage_name=$1
  echo "== $1 [${SECONDS} s so far]"
}
done_stage() {  # done_stage RC: the stage ends with RC
  local rc=$1
  summary+=("$(printf '%-66s %6d s  %s' "$stage_name" $((SECONDS - t0)) "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)")")
  [ "$rc" -eq 0 ] || status=1
}
run_stage() {  # run_stage NAME CMD...: a stage that is one command
  stage "$1"
  shift
  local rc=0
  "$@" || rc=$?
  done_stage $rc
}

# Installs missing packages and builds build/ (the main job is not run: setup.sh's own step).
stage "setup: packages, yaml-cpp, build/ (gcc)"
rc=0
SKIP_MAIN_JOB=1 bash scripts/setup.sh build || rc=$?
done_stage $rc
[ $rc -eq 0 ] || { printf '%s\n' "${summary[@]}"; exit 1; }

# The sanitizer trees build in the background at idle priority (SCHED_IDLE where chrt allows it):
# they get the CPU that the tests in front leave, and the suites that time themselves leave much
# (hostile waits on sockets that linger and on a stopped keeper). build-san/ builds from here,
# build-tsan/ once build-san/ is built; each tree's tests begin when it is built.
idle=(nice -n 19)
command -v chrt >/dev/null && chrt --idle 0 true 2>/dev/null && idle=(chrt --idle 0 nice -n 19)
background_build() {  # background_build TREE [TARGET...]: builds TREE at idle priority; sets built
  local tree=$1
  shift
  local targets=()
  [ $# -eq 0 ] || targets=(--target "$@")
  "${idle[@]}" cmake --build "$tree" "${targets[@]}" >"$tree/build.log" 2>&1 &
  built=$!
}
finish_build() {  # finish_build NAME TREE PID: a stage that waits for TREE's background build
  stage "$1"
  local rc=0
  wait "$3" || rc=$?
  [ $rc -eq 0 ] || tail -50 "$2/build.log"
  done_stage $rc
  return $rc
}

san_rc=0
configure_san || san_rc=$?
[ $san_rc -ne 0 ] || background_build "$SAN_TREE"
san_build=${built:-}

run_stage "lint: clang-format, clang-tidy (changed files)" bash scripts/lint.sh build

run_stage "tests: build/ (build-san/ building at idle priority)" ctest --test-dir build --output-on-failure -j "$JOBS"

if [ $san_rc -eq 0 ]; then
  finish_build "build: build-san/ (clang, ASan, UBSan, libFuzzer; what it had left)" "$SAN_TREE" "$san_build" || san_rc=$?
else
  stage "build: build-san/ (configure)"
  done_stage $san_rc
fi

tsan_rc=0
configure_tsan || tsan_rc=$?
[ $tsan_rc -ne 0 ] || background_build "$TSAN_TREE" "${TSAN_TARGETS[@]}"
tsan_build=$built

if [ $san_rc -eq 0 ]; then
  run_stage "tests: build-san/ (build-tsan/ building at idle priority)" \
    env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$SAN_TREE" --output-on-failure -j "$JOBS" -LE text
fi

if [ $tsan_rc -eq 0 ]; then
  finish_build "build: build-tsan/ (what it had left)" "$TSAN_TREE" "$tsan_build" || tsan_rc=$?
else
  stage "build: build-tsan/ (configure)"
  done_stage $tsan_rc
fi
[ $tsan_rc -ne 0 ] || run_stage "tests: build-tsan/" env TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  ctest --test-dir "$TSAN_TREE" --output-on-failure -j "$JOBS" -R "$TSAN_TESTS"

run_stage "fuzz: 5 libFuzzer targets, ${FUZZ_SECONDS:-30} s each, 2 at a time" \
  env FUZZ_BUILT=1 bash scripts/fuzz.sh

echo "== tests: done in ${SECONDS} s"
printf '%-66s %8s  %s\n' "stage" "seconds" "result"
printf '%s\n' "${summary[@]}"
exit $status
