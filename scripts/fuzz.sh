#!/usr/bin/env bash
# Fuzzing: runs each libFuzzer target (tests/fuzz/) for $FUZZ_SECONDS seconds over a scratch copy
# of its seed corpus and its regression inputs, $FUZZ_JOBS targets at a time (default 2, one per
# core of the CI machine). The targets come from build-san/ (clang, libFuzzer, AddressSanitizer
# and UndefinedBehaviorSanitizer: scripts/trees.sh), built here unless FUZZ_BUILT=1 says the tree
# is built already. Fails when a fuzzer finds anything (crash, sanitizer report, leak, timeout,
# out of memory), printing the input; the inputs are kept in build-san/fuzz-findings/. Without
# clang or the libFuzzer runtime it says so and exits 0.
# Usage: [FUZZ_SECONDS=30] [FUZZ_JOBS=2] [FUZZ_TARGETS="config protocol safetensors http manifest"] [FUZZ_CC=clang FUZZ_CXX=clang++] scripts/fuzz.sh
# Debian 12 packages: clang and libclang-rt-14-dev (libFuzzer and the sanitizer runtimes), besides
# what scripts/setup.sh installs (cmake, ninja-build, the libraries). With only clang-14 installed:
# FUZZ_CC=clang-14 FUZZ_CXX=clang++-14.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/trees.sh

FUZZ_SECONDS=${FUZZ_SECONDS:-30}
FUZZ_JOBS=${FUZZ_JOBS:-2}
FUZZ_TARGETS=${FUZZ_TARGETS:-config protocol safetensors http manifest}

scratch=$(mktemp -d "${TMPDIR:-/tmp}/cupool-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

if ! command -v "$FUZZ_CC" >/dev/null || ! command -v "$FUZZ_CXX" >/dev/null; then
  echo "fuzz: skipped: clang/libFuzzer not installed ($FUZZ_CXX not found; install clang and its compiler-rt runtime)"
  exit 0
fi
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$scratch/probe.cpp"
if ! "$FUZZ_CXX" -fsanitize=fuzzer,address,undefined "$scratch/probe.cpp" -o "$scratch/probe" 2>"$scratch/probe.log"; then
  echo "fuzz: skipped: clang/libFuzzer not installed ($FUZZ_CXX -fsanitize=fuzzer does not link:"
  sed 's/^/  /' "$scratch/probe.log" | head -5
  echo "  install the compiler-rt runtime, e.g. libclang-rt-14-dev)"
  exit 0
fi

if [ -z "${FUZZ_BUILT:-}" ]; then
  echo "== fuzz: building $SAN_TREE/ (clang, libFuzzer, ASan, UBSan)"
  configure_san
  targets=()
  for t in $FUZZ_TARGETS; do targets+=("cupool_${t}_fuzz"); done
  cmake --build "$SAN_TREE" --target "${targets[@]}"
fi
findings=$SAN_TREE/fuzz-findings

# Copies the files ending in $2 under the directories $3... into $1, named by content.
collect() {
  local into=$1 ext=$2 dir dirs=()
  shift 2
  mkdir -p "$into"
  for dir in "$@"; do [ -d "$dir" ] && dirs+=("$dir"); done  # a target may have no regressions yet
  [ ${#dirs[@]} -gt 0 ] || return 0
  find "${dirs[@]}" -type f -name "*$ext" -print0 2>/dev/null | while IFS= read -r -d '' f; do
    cp "$f" "$into/$(sha1sum "$f" | cut -c1-40)"
  done
}

mkdir -p "$findings"
# Prepares target $1's corpus and runs it; its report goes to $scratch/$1/report, its exit code
# (1 when it found something) to $scratch/$1/rc.
fuzz_one() {
  local t=$1 work="$scratch/$1" extra=() rc=0
  mkdir -p "$work/artifacts"
  case $t in
    config)
      collect "$work/corpus" .yaml configs tests/bad tests/schema/good tests/fuzz/regressions/config
      extra+=(-dict=tests/fuzz/config.dict) ;;
    protocol)
      collect "$work/corpus" .bin tests/fuzz/protocol-corpus tests/fuzz/regressions/protocol
      extra+=(-dict=tests/fuzz/protocol.dict -max_len=16384) ;;
    safetensors)
      collect "$work/corpus" .safetensors tests/fuzz/safetensors-corpus tests/fuzz/regressions/safetensors
      extra+=(-dict=tests/fuzz/safetensors.dict -max_len=8192) ;;
    http)
      collect "$work/corpus" .http tests/fuzz/http-corpus tests/fuzz/regressions/http
      extra+=(-dict=tests/fuzz/http.dict -max_len=12288) ;;
    manifest)
      collect "$work/corpus" .json tests/fuzz/manifest-corpus tests/fuzz/regressions/manifest
      extra+=(-max_len=16384) ;;
  esac
  {
    echo "== fuzz: cupool_${t}_fuzz for ${FUZZ_SECONDS} s over $(find "$work/corpus" -type f | wc -l) seeds"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "$SAN_TREE/tests/fuzz/cupool_${t}_fuzz" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$work/artifacts/" "${extra[@]}" "$work/corpus" >"$work/log" 2>&1 || rc=$?
    grep -E '^(#[0-9]+[[:space:]]+DONE|Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb)' "$work/log" || true
    if [ "$rc" -ne 0 ] || [ -n "$(ls -A "$work/artifacts")" ]; then
      echo "fuzz: cupool_${t}_fuzz FOUND A BUG (exit $rc); the end of its log:"
      tail -60 "$work/log" | sed 's/^/  /'
      for f in "$work"/artifacts/*; do
        [ -e "$f" ] || continue
        mkdir -p "$findings/$t"
        cp "$f" "$findings/$t/"
        echo "fuzz: input: $findings/$t/$(basename "$f") ($(stat -c %s "$f") bytes, base64 below)"
        base64 -w 76 "$f" | head -40 | sed 's/^/  /'
        echo "  reproduce: $SAN_TREE/tests/fuzz/cupool_${t}_fuzz $findings/$t/$(basename "$f")"
      done
      rc=1
    else
      echo "fuzz: cupool_${t}_fuzz: nothing found"
    fi
  } >"$work/report" 2>&1
  echo "$rc" >"$work/rc"
}

for t in $FUZZ_TARGETS; do
  case $t in
    config|protocol|safetensors|http|manifest) ;;
    *) echo "fuzz: unknown target $t" >&2; exit 2 ;;
  esac
done
# $FUZZ_JOBS at a time; each report is printed whole, in the order of $FUZZ_TARGETS.
status=0
batch=()
flush() {
  wait
  local t
  for t in "${batch[@]}"; do
    cat "$scratch/$t/report"
    [ "$(cat "$scratch/$t/rc" 2>/dev/null || echo 1)" -eq 0 ] || status=1
  done
  batch=()
}
for t in $FUZZ_TARGETS; do
  fuzz_one "$t" &
  batch+=("$t")
  [ ${#batch[@]} -lt "$FUZZ_JOBS" ] || flush
done
flush
exit $status
