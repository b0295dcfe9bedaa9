#!/usr/bin/env bash
# Builds what cupool links statically into the libraries it puts into other processes
# (libcupool-client.so.1 and libcupool-preload.so must bring nothing of ours but themselves):
# yaml-cpp, from Debian's source tarball (pinned by its SHA-256), as a static library compiled
# position-independent with hidden visibility, installed under .deps/yaml-cpp. CMake finds it there
# (CUPOOL_YAML_CPP_ROOT). Distributions ship yaml-cpp as a shared library, or (Debian) as a static
# one that is not position-independent and so can't go into a shared object.
#
# Usage: scripts/deps.sh   (idempotent: does nothing when .deps/yaml-cpp is already built)
#        scripts/deps.sh --check   (configures yaml-cpp in a scratch folder only, and fails when
#                                   CMake prints anything on stderr: the deps test)
# Offline: put the tarball at .deps/yaml-cpp_0.8.0+dfsg.orig.tar.xz first (the GPU machines have
# no network: carry .deps there).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.8.0
TARBALL=yaml-cpp_${VERSION}+dfsg.orig.tar.xz
SHA256=32c85a5f36633a9005b20261b35fccb0d8ec69e9ef16c67de7d5d007944e3709
URL=http://deb.debian.org/debian/pool/main/y/yaml-cpp/$TARBALL
DEPS=.deps
PREFIX=$DEPS/yaml-cpp
STAMP=$PREFIX/.built-$VERSION-$SHA256

check=0
[ "${1:-}" != --check ] || check=1
[ "$check" = 1 ] || [ ! -f "$STAMP" ] || exit 0
mkdir -p "$DEPS"
if [ "$check" = 1 ] && [ ! -f "$DEPS/$TARBALL" ]; then
  echo "deps: skipped: no $DEPS/$TARBALL (scripts/deps.sh downloads it)"
  exit 77
fi
if [ ! -f "$DEPS/$TARBALL" ]; then
  echo "deps: downloading yaml-cpp $VERSION source from $URL"
  if ! curl -fsSL --retry 3 -o "$DEPS/$TARBALL.part" "$URL"; then
    echo "deps: could not download $URL; put $TARBALL into $DEPS/ by hand and run again" >&2
    exit 1
  fi
  mv "$DEPS/$TARBALL.part" "$DEPS/$TARBALL"
fi
if ! echo "$SHA256  $DEPS/$TARBALL" | sha256sum -c --quiet -; then
  echo "deps: $DEPS/$TARBALL does not have the expected SHA-256 ($SHA256); delete it and run again" >&2
  exit 1
fi

# yaml-cpp 0.8.0 asks for CMake 3.4 (cmake_minimum_required(VERSION 3.4)): CMake 4 refuses a
# policy version under 3.5, CMake 3.27 and newer warn about it. The range 3.4...3.10 (CMake 3.12's
# syntax) asks for 3.10's policies where the running CMake has them, which every supported CMake
# takes without a word. (CMAKE_POLICY_VERSION_MINIMUM does the same from outside, but only CMake 4
# knows the variable; older ones warn that it was not used.)
configure() {  # configure SRC: unpacks the tarball into SRC and configures SRC/build; CMake's stderr on stderr
  local src=$1
  tar -xJf "$DEPS/$TARBALL" -C "$src" --strip-components=1
  grep -qx 'cmake_minimum_required(VERSION 3.4)' "$src/CMakeLists.txt" ||
    { echo "deps: yaml-cpp's CMakeLists.txt no longer asks for CMake 3.4: look at scripts/deps.sh's configure" >&2; return 1; }
  sed -i 's/^cmake_minimum_required(VERSION 3\.4)$/cmake_minimum_required(VERSION 3.4...3.10)/' "$src/CMakeLists.txt"
  local generator=()
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  cmake -S "$src" -B "$src/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX="$PWD/$PREFIX" \
    -DYAML_CPP_BUILD_TESTS=OFF -DYAML_CPP_BUILD_TOOLS=OFF -DYAML_CPP_BUILD_CONTRIB=OFF -DYAML_BUILD_SHARED_LIBS=OFF \
    -DYAML_CPP_INSTALL=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_CXX_VISIBILITY_PRESET=hidden \
    -DCMAKE_VISIBILITY_INLINES_HIDDEN=ON >/dev/null
}

src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
if [ "$check" = 1 ]; then
  # The configure step alone (the deps test): it must say nothing on stderr, where setup shows it.
  configure "$src" 2>"$src/stderr" || { cat "$src/stderr"; echo "deps: configuring yaml-cpp failed" >&2; exit 1; }
  if [ -s "$src/stderr" ]; then
    cat "$src/stderr"
    echo "deps: configuring yaml-cpp printed the above on stderr (scripts/setup.sh shows it to every user)" >&2
    exit 1
  fi
  echo "deps: yaml-cpp $VERSION configures with $(cmake --version | head -1), nothing on stderr"
  exit 0
fi
echo "deps: building yaml-cpp $VERSION (static, PIC, hidden visibility) into $PREFIX"
rm -rf "$PREFIX"
configure "$src"
cmake --build "$src/build" -j "$(nproc)" >/dev/null
cmake --install "$src/build" >/dev/null
touch "$STAMP"
