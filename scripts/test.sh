#!/usr/bin/env bash
# Quick start, step 2: the whole test suite: a normal build; a build with AddressSanitizer and
# UndefinedBehaviorSanitizer; the unit and holder tests under ThreadSanitizer; and each fuzzer for a
# bounded time (scripts/fuzz.sh). GPU tests skip themselves without a GPU.
# Usage: scripts/test.sh   (installs what is missing through scripts/setup.sh's package list)
set -euo pipefail
cd "$(dirname "$0")/.."

# Install missing packages (and build the normal tree) without running the main job twice.
SKIP_MAIN_JOB=1 bash scripts/setup.sh build >/dev/null

status=0
echo "== tests: build/ (RelWithDebInfo) [${SECONDS} s so far]"
ctest --test-dir build --output-on-failure || status=1

echo "== tests: build-asan/ (AddressSanitizer + UndefinedBehaviorSanitizer) [${SECONDS} s so far]"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCUPOOL_SANITIZE=ON >/dev/null
cmake --build build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure || status=1

echo "== tests: build-tsan/ (ThreadSanitizer: the unit tests and the holder across processes) [${SECONDS} s so far]"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUPOOL_TSAN=ON >/dev/null
cmake --build build-tsan --target cupool cupool_unit_tests cupool_testclient
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  ctest --test-dir build-tsan --output-on-failure -R '^(unit|holder)$' || status=1

echo "== fuzz: the config, protocol, safetensors and http fuzzers, ${FUZZ_SECONDS:-30} s each (libFuzzer, ASan, UBSan) [${SECONDS} s so far]"
bash scripts/fuzz.sh || status=1

echo "== tests: done in ${SECONDS} s"
exit $status
