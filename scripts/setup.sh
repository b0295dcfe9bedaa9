#!/usr/bin/env bash
# Quick start, step 1: install what is missing, build cupool, and run the main job: `query` and
# `check` of a shipped example on this node, or on the bundled simulated node when no GPU is here.
# Usage: scripts/setup.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}

# Debian/Ubuntu packages the build and the tests need.
# (yaml-cpp is built from source by scripts/deps.sh: it goes statically into the client library.)
PACKAGES=(cmake g++ ninja-build pkg-config curl xz-utils libcli11-dev libspdlog-dev doctest-dev
          nlohmann-json3-dev python3 python3-jsonschema python3-yaml python3-numpy zsh fish clang
          libclang-rt-dev groff-base python3-prometheus-client clang-format clang-tidy python3-pip
          shellcheck flake8)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: packages installed in ${SECONDS} s"
fi

# The CUDA toolkit provides the headers; the driver is loaded at run time.
if [ ! -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda.h" ] && ! command -v nvcc >/dev/null; then
  echo "setup: the CUDA Toolkit (12.6 or newer; headers only are needed) was not found at /usr/local/cuda." >&2
  echo "       Install it from NVIDIA's repository, or set CUDA_HOME / CUDAToolkit_ROOT to where it is." >&2
  exit 1
fi

# yaml-cpp as a static, position-independent library (.deps/yaml-cpp), for the client library.
t=$SECONDS
bash scripts/deps.sh
[ $((SECONDS - t)) -lt 2 ] || echo "setup: yaml-cpp built in $((SECONDS - t)) s"

# The trees' shared options (unity batches among them): scripts/trees.sh.
. scripts/trees.sh
t=$SECONDS
cmake -S . -B "$BUILD" "${TREE_OPTIONS[@]}" "${WERROR[@]}" "${BUILD_DEBUG[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
cmake --build "$BUILD"
echo "setup: $BUILD/ built in $((SECONDS - t)) s"

# Which Python the examples and tests have: setup's packages (python3-numpy, ...) serve Debian's
# /usr/bin/python3 only; a python3 first on PATH (pyenv, a venv) has its own modules.
python_report() {
  local sys=/usr/bin/python3 own version numpy
  version=$("$sys" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo "?")
  if numpy=$("$sys" -c 'import numpy; print(numpy.__version__)' 2>/dev/null); then
    echo "setup: Python: $sys (Python $version) has numpy $numpy (python3-numpy): the README's Python examples and the tests run with it"
  else
    echo "setup: Python: $sys (Python $version) has no numpy, though python3-numpy was installed: check 'dpkg -s python3-numpy'"
  fi
  own=$(command -v python3 || true)
  if [ -n "$own" ] && [ "$(readlink -f "$own")" != "$(readlink -f "$sys")" ]; then
    version=$("$own" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo "?")
    if numpy=$("$own" -c 'import numpy; print(numpy.__version__)' 2>/dev/null); then
      echo "setup: your python3 ($own, Python $version, first on PATH) has numpy $numpy too"
    else
      echo "setup: your python3 ($own, Python $version, first on PATH) is another python, without numpy:"
      echo "       run the examples with $sys, or give yours numpy: python3 -m pip install numpy"
      echo "       (and, to import cupool without PYTHONPATH=python, its package: python3 -m pip install ./python)"
    fi
  fi
}
python_report

[ -z "${SKIP_MAIN_JOB:-}" ] || exit 0

# The main job.
CUPOOL="$BUILD/cupool"
EXAMPLE=configs/single-gpu-inference.yaml
echo
echo "\$ cupool query"
set +e
"$CUPOOL" query
rc=$?
set -e
if [ "$rc" -eq 3 ]; then
  PROFILE=configs/profiles/h100.yaml
  echo
  echo "No usable NVIDIA driver or GPU here (above). Running against the bundled simulated node"
  echo "$PROFILE, recorded on a real H100 with 'cupool query --deep --profile-out'."
  echo
  echo "\$ cupool query --profile $PROFILE"
  "$CUPOOL" query --profile "$PROFILE"
  echo
  echo "\$ cupool check $EXAMPLE --profile $PROFILE"
  "$CUPOOL" check "$EXAMPLE" --profile "$PROFILE"
elif [ "$rc" -eq 0 ]; then
  echo
  echo "\$ cupool check $EXAMPLE"
  set +e
  "$CUPOOL" check "$EXAMPLE"
  rc=$?
  set -e
  [ "$rc" -le 1 ] || exit "$rc"
  [ "$rc" -eq 0 ] || echo "(the example was written for one H100; findings above say what differs on this node)"
else
  exit "$rc"
fi
echo
echo "setup: done. The binary is $CUPOOL; run the tests with scripts/test.sh"
