#!/usr/bin/env bash
# Quick start, step 2: the whole test suite, as CI runs it (.ci/run). The trees: scripts/trees.sh.
#   lint        clang-format over the C and C++ sources, clang-tidy over the changed ones (scripts/lint.sh)
#   build/      gcc: every test (ctest -j2; the suites that time themselves run alone)
#   build-san/  clang, ASan + UBSan: every test that runs our code (not the text-only ones, label text)
#   build-tsan/ ThreadSanitizer: the unit tests of the parts with threads and the holder suite;
#               built at idle priority while build-san/'s tests run
#   fuzz        each libFuzzer target for FUZZ_SECONDS (30), two at a time, from build-san/
# GPU tests skip themselves without a GPU. Each stage's seconds are printed at the end.
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
  summary+=("$(printf '%-58s %6d s  %s' "$stage_name" $((SECONDS - t0)) "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)")")
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

run_stage "lint: clang-format, clang-tidy (changed files)" bash scripts/lint.sh build

run_stage "tests: build/" ctest --test-dir build --output-on-failure -j "$JOBS"

stage "build: build-san/ (clang, ASan, UBSan, libFuzzer)"
rc=0
{ configure_san && cmake --build "$SAN_TREE"; } || rc=$?
done_stage $rc

# build-tsan/ builds while build-san/'s tests run, at idle priority: it gets the CPU only when
# the tests leave it (their time bounds are the tests' own; see the README's CI table).
configure_tsan
idle=(nice -n 19)
command -v chrt >/dev/null && chrt --idle 0 true 2>/dev/null && idle=(chrt --idle 0 nice -n 19)
"${idle[@]}" cmake --build "$TSAN_TREE" --target "${TSAN_TARGETS[@]}" >"$TSAN_TREE/build.log" 2>&1 &
tsan_build=$!

if [ $rc -eq 0 ]; then
  run_stage "tests: build-san/ (build-tsan/ building at idle priority)" \
    env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$SAN_TREE" --output-on-failure -j "$JOBS" -LE text
fi

stage "build: build-tsan/ (what it had left)"
rc=0
wait $tsan_build || rc=$?
[ $rc -eq 0 ] || tail -50 "$TSAN_TREE/build.log"
done_stage $rc
if [ $rc -eq 0 ]; then
  run_stage "tests: build-tsan/" env TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ctest --test-dir "$TSAN_TREE" --output-on-failure -j "$JOBS" -R "$TSAN_TESTS"
fi

run_stage "fuzz: 5 libFuzzer targets, ${FUZZ_SECONDS:-30} s each, 2 at a time" \
  env FUZZ_BUILT=1 bash scripts/fuzz.sh

echo "== tests: done in ${SECONDS} s"
printf '%-58s %8s  %s\n' "stage" "seconds" "result"
printf '%s\n' "${summary[@]}"
exit $status
