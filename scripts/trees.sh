# shellcheck shell=bash disable=SC2034  # sourced: the scripts that source it use what it sets
# The build trees of the test suite, configured in one place (sourced by scripts/test.sh and
# scripts/fuzz.sh; run from the repository root).
#
#   build/       gcc, RelWithDebInfo: everything, every test (scripts/setup.sh makes it)
#   build-san/   clang, Debug at -O1: AddressSanitizer + UndefinedBehaviorSanitizer + libFuzzer's
#                coverage (fuzzer-no-link) on everything; the sanitized ctest run and the libFuzzer
#                targets (scripts/fuzz.sh); no GPU programs
#   build-tsan/  gcc, RelWithDebInfo, ThreadSanitizer: what has threads (the binary with the
#                holder, the client library, the test client, the unit tests of those parts)

SAN_TREE=${SAN_TREE:-build-san}
TSAN_TREE=${TSAN_TREE:-build-tsan}
FUZZ_CC=${FUZZ_CC:-clang}
FUZZ_CXX=${FUZZ_CXX:-clang++}
# Unity batches in the scripted trees (CMakeLists.txt says why; a plain `cmake -B DIR` builds
# every file on its own).
TREE_OPTIONS=(-G Ninja -DCUPOOL_UNITY=ON ${CUDA_HOME:+-DCUDAToolkit_ROOT="$CUDA_HOME"})
# In CI (CI set, as .ci/run runs), warnings are errors in build/ (gcc, scripts/setup.sh) and
# build-san/ (clang): one tree of each compiler. Not for a user's quick start (another compiler's
# new warning must not stop a build), and not in build-tsan/: gcc 12 under -fsanitize=thread warns
# falsely (-Warray-bounds in std::vector's insert, peer.cpp), a known false positive of that compiler.
WERROR=()
[ -z "${CI:-}" ] || WERROR=(-DCUPOOL_WERROR=ON)

# Debug information (CMakeLists.txt's CUPOOL_DEBUG_INFO): line tables in build-san/ and
# build-tsan/ (their reports name file and line; nobody steps through them in a debugger) and in
# CI's build/; a user's build/ keeps full information. About a quarter of gcc's time goes.
SAN_DEBUG=(-DCUPOOL_DEBUG_INFO=lines)
BUILD_DEBUG=(-DCUPOOL_DEBUG_INFO=full)
[ -z "${CI:-}" ] || BUILD_DEBUG=(-DCUPOOL_DEBUG_INFO=lines)

# What the sanitized ctest runs need from build-san/ (the GPU programs are left out by the option).
configure_san() {
  cmake -S . -B "$SAN_TREE" "${TREE_OPTIONS[@]}" "${WERROR[@]}" "${SAN_DEBUG[@]}" -DCMAKE_BUILD_TYPE=Debug -DCUPOOL_FUZZ=ON -DCUPOOL_GPU_PROGRAMS=OFF \
    -DCMAKE_C_COMPILER="$FUZZ_CC" -DCMAKE_CXX_COMPILER="$FUZZ_CXX" >/dev/null
}

configure_tsan() {
  cmake -S . -B "$TSAN_TREE" "${TREE_OPTIONS[@]}" "${SAN_DEBUG[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUPOOL_TSAN=ON \
    -DCUPOOL_GPU_PROGRAMS=OFF >/dev/null
}

# The targets build-tsan/ builds: the binary (the holder's threads), the test client (the client
# library's threads) and the unit tests of the parts with threads.
TSAN_TARGETS=(cupool cupool_testclient cupool_unit_tests)
# The tests it runs.
TSAN_TESTS='^(unit|holder)$'
