#!/usr/bin/env bash
# The packages as a user meets them: `cpack -G DEB` in BUILD makes cupool and cupool-dev; they are
# unpacked into a scratch root (no root needed, nothing touches the system), and the installed
# pieces are used from there: `cupool --version`, `cupool check` of an installed example against
# an installed node profile, `cupool exec` finding its private preload, and a small C program built
# against the installed client library through pkg-config and through CMake's find_package.
#
#   tests/package/package_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
work=$(mktemp -d /tmp/cupool-package.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
say() { echo "package: $*"; }

(cd "$build" && cpack -G DEB -B "$work/pkg") >"$work/cpack.log" 2>&1 || { cat "$work/cpack.log"; fail "cpack -G DEB failed"; }
runtime=$(ls "$work"/pkg/cupool_*.deb 2>/dev/null | head -1)
dev=$(ls "$work"/pkg/cupool-dev_*.deb 2>/dev/null | head -1)
[ -n "$runtime" ] && [ -n "$dev" ] || { ls -l "$work/pkg"; fail "expected cupool_*.deb and cupool-dev_*.deb"; }
say "built $(basename "$runtime") and $(basename "$dev")"

# Dependencies: computed from the binaries (dpkg-shlibdeps), not written by hand.
depends=$(dpkg-deb -f "$runtime" Depends)
say "cupool depends on: $depends"
for lib in libc6 libstdc++6 libspdlog; do
  [[ $depends == *"$lib"* ]] || fail "cupool's Depends lacks $lib: $depends"
done
[[ $(dpkg-deb -f "$dev" Depends) == *"cupool (= "* ]] || fail "cupool-dev does not depend on cupool of its version"

contents() { dpkg-deb -c "$1" | awk '{print $6}' | sed 's|^\./|/|'; }
contents "$runtime" >"$work/runtime.txt"
contents "$dev" >"$work/dev.txt"
for f in /usr/bin/cupool /usr/lib/libcupool-client.so.1 /usr/lib/libcupool-client.so.1.0.0 \
         /usr/lib/cupool/libcupool-preload.so /usr/share/man/man1/cupool.1 /usr/lib/systemd/system/cupool.service \
         /usr/lib/systemd/system/cupool-exporter.service \
         /usr/share/bash-completion/completions/cupool /usr/share/zsh/site-functions/_cupool \
         /usr/share/fish/vendor_completions.d/cupool.fish /usr/share/cupool/schemas/cupool-config-v1.schema.json \
         /usr/share/cupool/configs/single-gpu-inference.yaml /usr/share/cupool/configs/profiles/h100.yaml \
         /usr/share/doc/cupool/LICENSE; do
  grep -qx "$f" "$work/runtime.txt" || fail "cupool lacks $f"
done
for f in /usr/include/cupool/client.h /usr/lib/libcupool-client.so /usr/lib/pkgconfig/cupool-client.pc \
         /usr/lib/cmake/cupool/cupoolConfig.cmake /usr/lib/cmake/cupool/cupoolTargets.cmake; do
  grep -qx "$f" "$work/dev.txt" || fail "cupool-dev lacks $f"
done
# The preload is private: not in the public library directory.
! grep -qx /usr/lib/libcupool-preload.so "$work/runtime.txt" || fail "the preload is in the public libdir"
say "contents: every expected file, the preload in /usr/lib/cupool"

root=$work/root
dpkg-deb -x "$runtime" "$root"
dpkg-deb -x "$dev" "$root"
bin=$root/usr/bin/cupool

soname=$(readelf -d "$root/usr/lib/libcupool-client.so.1.0.0" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libcupool-client.so.1 ] || fail "the client library's SONAME is '$soname'"
[ "$(readlink "$root/usr/lib/libcupool-client.so.1")" = libcupool-client.so.1.0.0 ] || fail "so.1 does not point at so.1.0.0"

version=$("$bin" --version)
say "installed: $(echo "$version" | head -1)"
[[ $version == "cupool "*"(commit "*")"*"CUDA "*" headers"* ]] || fail "--version: $version"

share=$root/usr/share/cupool
"$bin" check "$share/configs/single-gpu-inference.yaml" --profile "$share/configs/profiles/h100.yaml" >"$work/check.txt" 2>&1 ||
  { cat "$work/check.txt"; fail "cupool check of the installed example against the installed profile"; }
say "cupool check of the installed example: exit 0"

preload=$("$bin" exec "$share/configs/single-gpu-inference.yaml" --profile "$share/configs/profiles/h100.yaml" \
  -- sh -c 'echo "$LD_PRELOAD"')
[ "$preload" = "$root/usr/bin/../lib/cupool/libcupool-preload.so" ] || fail "exec preloads '$preload'"
say "cupool exec preloads $preload"

# The installed unit names the installed binary and passes systemd's own check (with the binary's
# path moved into the scratch root, since verify wants the executable to exist).
unit=$root/usr/lib/systemd/system/cupool.service
grep -q '^ExecStart=/usr/bin/cupool hold ' "$unit" || fail "the unit's ExecStart: $(grep ExecStart "$unit")"
grep -q '^ExecReload=/usr/bin/cupool apply ' "$unit" || fail "the unit's ExecReload: $(grep ExecReload "$unit")"
grep -q '^ExecStart=/usr/bin/cupool exporter --listen 127.0.0.1:9402 ' "$root/usr/lib/systemd/system/cupool-exporter.service" ||
  fail "the exporter unit's ExecStart: $(grep ExecStart "$root/usr/lib/systemd/system/cupool-exporter.service")"
if command -v systemd-analyze >/dev/null; then
  for u in cupool.service cupool-exporter.service; do
    sed "s|/usr/bin/cupool|$bin|g" "$root/usr/lib/systemd/system/$u" >"$work/$u"
    systemd-analyze verify "$work/$u" || fail "systemd-analyze verify of $u"
    # The exposure score systemd gives each unit (README, "Installing"); recorded, not judged here.
    say "systemd-analyze verify: $u passes; security: $(systemd-analyze security --offline=yes "$work/$u" 2>/dev/null | tail -1)"
  done
else
  say "systemd-analyze not installed: the unit was not verified"
fi

cat >"$work/probe.c" <<'C'
#include <cupool/client.h>
#include <stdio.h>
int main(void) {
  cupool_conn* conn = NULL;
  int rc = cupool_connect("/nonexistent/cupool.sock", "package-test", &conn);
  printf("abi %d, connect to nowhere: %s\n", cupool_abi_version(), cupool_status_name(rc));
  return rc == 0;  /* no holder there: connecting must fail */
}
C
# pkg-config: the .pc file is relocatable (its prefix is relative to where it lies).
export PKG_CONFIG_PATH=$root/usr/lib/pkgconfig
flags=$(pkg-config --cflags --libs cupool-client)
[[ $flags == *"-lcupool-client"* ]] || fail "pkg-config --libs: $flags"
[ -f "$(pkg-config --variable=includedir cupool-client)/cupool/client.h" ] ||
  fail "pkg-config's includedir has no cupool/client.h: $(pkg-config --variable=includedir cupool-client)"
cc "$work/probe.c" $flags -o "$work/probe-pc"
LD_LIBRARY_PATH=$root/usr/lib "$work/probe-pc" || fail "the program built through pkg-config"
say "built and ran a C program through pkg-config ($flags)"

mkdir -p "$work/cmake-project"
cp "$work/probe.c" "$work/cmake-project/"
cat >"$work/cmake-project/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(probe C)
find_package(cupool 0.1 REQUIRED)
add_executable(probe probe.c)
target_link_libraries(probe PRIVATE cupool::client)
CM
cmake -S "$work/cmake-project" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$root/usr" >"$work/cmake.log" 2>&1 &&
  cmake --build "$work/cmake-build" >>"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; fail "find_package(cupool)"; }
LD_LIBRARY_PATH=$root/usr/lib "$work/cmake-build/probe" || fail "the program built through find_package"
say "built and ran a C program through find_package(cupool)"
echo "package: all checks passed"
