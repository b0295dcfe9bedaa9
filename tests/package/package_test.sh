#!/usr/bin/env bash
# The packages as a user meets them: `cpack -G DEB` in BUILD makes cupool, cupool-dev and
# cupool-dbgsym; they are unpacked into a scratch root (no root needed, nothing touches the
# system), and the installed pieces are used from there: `cupool --version`, `cupool check` of an
# installed example against an installed node profile, `cupool exec` finding its private preload,
# a holder of the installed binary served to the installed Python package, and a small C program
# built against the installed client library through pkg-config and through CMake's find_package.
# Issue 25 ("the first hour on a fresh node"): stripped binaries with the debug information in
# cupool-dbgsym, a runtime package under 15 MB, a real maintainer, the library in the multiarch
# directory, a .pc file with clean paths, and the Python package in the runtime package.
#
#   tests/package/package_test.sh BUILD_DIR [PYTHON]
set -euo pipefail
build=$(cd "$1" && pwd)
python=${2:-python3}
work=$(mktemp -d -t cupool-package.XXXXXX)  # in $TMPDIR: ctest's folder for this test (tests/hygiene)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
say() { echo "package: $*"; }

(cd "$build" && cpack -G DEB -B "$work/pkg") >"$work/cpack.log" 2>&1 || { cat "$work/cpack.log"; fail "cpack -G DEB failed"; }
runtime=$(ls "$work"/pkg/cupool_*.deb 2>/dev/null | head -1 || true)
dev=$(ls "$work"/pkg/cupool-dev_*.deb 2>/dev/null | head -1 || true)
dbgsym=$(ls "$work"/pkg/cupool-dbgsym_*.ddeb 2>/dev/null | head -1 || true)
[ -n "$runtime" ] && [ -n "$dev" ] && [ -n "$dbgsym" ] ||
  { ls -l "$work/pkg"; fail "expected cupool_*.deb, cupool-dev_*.deb and cupool-dbgsym_*.ddeb"; }
say "built $(basename "$runtime"), $(basename "$dev") and $(basename "$dbgsym")"

# A maintainer one can write to: a name and an address of a real-looking domain, not localhost.
address='^[^<>@]+ <[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[a-z]{2,}>$'
for deb in "$runtime" "$dev" "$dbgsym"; do
  maintainer=$(dpkg-deb -f "$deb" Maintainer)
  [[ $maintainer =~ $address && $maintainer != *localhost* ]] || fail "$(basename "$deb")'s Maintainer: '$maintainer'"
done
say "maintainer: $maintainer"

# The runtime package is small: stripped binaries (their debug information is in cupool-dbgsym).
# 15 MB = 15,000,000 bytes, for the .deb and for what it installs (Installed-Size is in KiB).
limit=15000000
deb_bytes=$(stat -c %s "$runtime")
installed_kib=$(dpkg-deb -f "$runtime" Installed-Size)
[ "$deb_bytes" -lt "$limit" ] || fail "$(basename "$runtime") is $deb_bytes bytes (at most $limit)"
[ $((installed_kib * 1024)) -lt "$limit" ] || fail "cupool's Installed-Size is $installed_kib KiB (at most $limit bytes)"
say "sizes: cupool .deb $deb_bytes bytes, Installed-Size $installed_kib KiB;" \
  "cupool-dev .deb $(stat -c %s "$dev") bytes, Installed-Size $(dpkg-deb -f "$dev" Installed-Size) KiB;" \
  "cupool-dbgsym .ddeb $(stat -c %s "$dbgsym") bytes, Installed-Size $(dpkg-deb -f "$dbgsym" Installed-Size) KiB"
[ "$(dpkg-deb -f "$dbgsym" Package)" = cupool-dbgsym ] || fail "the debug package is $(dpkg-deb -f "$dbgsym" Package)"
[[ $(dpkg-deb -f "$dbgsym" Depends) == *"cupool (= "* ]] || fail "cupool-dbgsym does not depend on cupool of its version"

# Dependencies: computed from the binaries (dpkg-shlibdeps), not written by hand.
depends=$(dpkg-deb -f "$runtime" Depends)
say "cupool depends on: $depends"
for lib in libc6 libstdc++6 libspdlog; do
  [[ $depends == *"$lib"* ]] || fail "cupool's Depends lacks $lib: $depends"
done
[[ $(dpkg-deb -f "$dev" Depends) == *"cupool (= "* ]] || fail "cupool-dev does not depend on cupool of its version"

# The public library in Debian's multiarch directory, the preload in a private folder below it.
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || cc -print-multiarch)
lib=/usr/lib/$multiarch
py=/usr/lib/python3/dist-packages/cupool
contents() { dpkg-deb -c "$1" | awk '{print $6}' | sed 's|^\./|/|'; }
contents "$runtime" >"$work/runtime.txt"
contents "$dev" >"$work/dev.txt"
for f in /usr/bin/cupool $lib/libcupool-client.so.1 $lib/libcupool-client.so.1.0.0 \
         $lib/cupool/libcupool-preload.so /usr/share/man/man1/cupool.1.gz /usr/lib/systemd/system/cupool.service \
         $py/__init__.py $py/_lib.py $py/_installed.py $py/connection.py $py/tensors.py $py/py.typed \
         /usr/lib/systemd/system/cupool-exporter.service /usr/lib/systemd/system/cupool-keeper.service \
         /usr/share/bash-completion/completions/cupool /usr/share/zsh/site-functions/_cupool \
         /usr/share/fish/vendor_completions.d/cupool.fish /usr/share/cupool/schemas/cupool-config-v1.schema.json \
         /usr/share/cupool/configs/single-gpu-inference.yaml /usr/share/cupool/configs/profiles/h100.yaml \
         /usr/share/doc/cupool/LICENSE /usr/share/doc/cupool/copyright /etc/cupool/cupool.yaml \
         /usr/share/cupool/configs/systemd/cupool.yaml; do
  grep -qx "$f" "$work/runtime.txt" || fail "cupool lacks $f"
done
for f in /usr/include/cupool/client.h $lib/libcupool-client.so $lib/pkgconfig/cupool-client.pc \
         $lib/cmake/cupool/cupoolConfig.cmake $lib/cmake/cupool/cupoolTargets.cmake; do
  grep -qx "$f" "$work/dev.txt" || fail "cupool-dev lacks $f"
done
# Nothing in /usr/lib itself but the units, the Python package and the multiarch folder; the
# preload is private: not in the public library directory; no bytecode caches.
stray=$(sed -n 's|^/usr/lib/\([^/][^/]*\).*|\1|p' "$work/runtime.txt" "$work/dev.txt" | sort -u |
  grep -vx -e "$multiarch" -e systemd -e python3 || true)
[ -z "$stray" ] || fail "in /usr/lib, outside the multiarch directory: $stray"
! grep -q "^$lib/libcupool-preload.so" "$work/runtime.txt" || fail "the preload is in the public libdir"
! grep -q __pycache__ "$work/runtime.txt" || fail "the Python package ships bytecode caches"
say "contents: every expected file, the library in $lib, the preload in $lib/cupool, the Python package in $py"

# Debian's policy (issue 37): manual pages gzipped (and no page left plain); a copyright file in the
# machine-readable format; the config the unit holds shipped as a conffile, the sample as shipped.
! grep -q '^/usr/share/man/.*[^z]$' <(grep '^/usr/share/man/man' "$work/runtime.txt" | grep -v '/$') ||
  fail "a manual page that is not gzipped: $(grep '^/usr/share/man/man.*[^z]$' "$work/runtime.txt" | grep -v '/$')"
dpkg-deb --fsys-tarfile "$runtime" | tar -xOf - ./usr/share/man/man1/cupool.1.gz | gzip -dc |
  cmp -s - "$(dirname "$0")/../../docs/man/cupool.1" || fail "cupool.1.gz is not docs/man/cupool.1 gzipped"
dpkg-deb --fsys-tarfile "$runtime" | tar -xOf - ./usr/share/doc/cupool/copyright >"$work/copyright"
head -1 "$work/copyright" | grep -qx 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' ||
  fail "copyright's first line is not the machine-readable format's: $(head -1 "$work/copyright")"
grep -A2 -x 'Files: \*' "$work/copyright" | grep -qx 'License: Apache-2.0' || fail "copyright: no 'Files: *' under Apache-2.0"
for l in $(sed -n 's/^License: \([^ ]*\)$/\1/p' "$work/copyright" | sort -u); do
  grep -q "^License: $l\$" <(awk -v RS= '!/^Files:/' "$work/copyright") || fail "copyright: no paragraph with the text of $l"
done
dpkg-deb --ctrl-tarfile "$runtime" | tar -xOf - ./conffiles >"$work/conffiles" 2>/dev/null || fail "cupool has no conffiles"
grep -qx /etc/cupool/cupool.yaml "$work/conffiles" || fail "/etc/cupool/cupool.yaml is not a conffile: $(cat "$work/conffiles")"
while read -r f; do grep -qx "$f" "$work/runtime.txt" || fail "conffile $f is not in the package"; done <"$work/conffiles"
say "policy: cupool.1.gz, a machine-readable copyright ($(sed -n 's/^License: \([^ ]*\)$/\1/p' "$work/copyright" | sort -u | xargs)), conffiles: $(xargs <"$work/conffiles")"

root=$work/root
dpkg-deb -x "$runtime" "$root"
# What the runtime package installs, measured (apparent sizes, as Installed-Size counts them).
installed_bytes=$(du -s --apparent-size -B1 "$root" | cut -f1)
[ "$installed_bytes" -lt "$limit" ] || fail "cupool installs $installed_bytes bytes (at most $limit)"
say "cupool installs $installed_bytes bytes"
dpkg-deb -x "$dev" "$root"
bin=$root/usr/bin/cupool
# No installed binary searches the working directory for libraries (issue 34).
"$python" "$(dirname "$0")/runpath_check.py" "$root" >"$work/runpath.log" || { cat "$work/runpath.log"; fail "unsafe RUNPATH"; }
say "search paths: $(tail -1 "$work/runpath.log")"
dbg=$work/dbgsym
dpkg-deb -x "$dbgsym" "$dbg"

# Stripped, and the debug information of each is in cupool-dbgsym, under its build id.
for f in "$bin" "$root$lib/libcupool-client.so.1.0.0" "$root$lib/cupool/libcupool-preload.so"; do
  ! readelf -S "$f" | grep -q '\.debug_info' || fail "$f is not stripped (it has .debug_info)"
  id=$(readelf -n "$f" | sed -n 's/.*Build ID: \([0-9a-f]*\).*/\1/p')
  debug=$dbg/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug
  [ -n "$id" ] && [ -f "$debug" ] || fail "no debug file for ${f#"$root"} (build id '$id') in cupool-dbgsym"
  readelf -S "$debug" 2>/dev/null | grep -q '\.debug_info' || fail "$debug has no .debug_info"
done
say "stripped: cupool, the client library and the preload; their debug information is in cupool-dbgsym"

soname=$(readelf -d "$root$lib/libcupool-client.so.1.0.0" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libcupool-client.so.1 ] || fail "the client library's SONAME is '$soname'"
[ "$(readlink "$root$lib/libcupool-client.so.1")" = libcupool-client.so.1.0.0 ] || fail "so.1 does not point at so.1.0.0"
# The binary and the preload find the library through their RPATHs, wherever the tree lies (and
# beside themselves, as in a build tree: CMakeLists.txt, cupool_runpath).
runpath() { readelf -d "$1" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p'; }
[ "$(runpath "$bin")" = "\$ORIGIN/../lib/$multiarch:\$ORIGIN" ] || fail "cupool's RUNPATH is '$(runpath "$bin")'"
[ "$(runpath "$root$lib/cupool/libcupool-preload.so")" = '$ORIGIN/..:$ORIGIN' ] ||
  fail "the preload's RUNPATH is '$(runpath "$root$lib/cupool/libcupool-preload.so")'"
found=$(env -u LD_LIBRARY_PATH ldd "$root$lib/cupool/libcupool-preload.so" | awk '/libcupool-client/ {print $3}')
[ "$found" = "$root$lib/cupool/../libcupool-client.so.1" ] || fail "the preload loads the client library from '$found'"

version=$("$bin" --version)
say "installed: $(echo "$version" | head -1)"
[[ $version == "cupool "*"(commit "*")"*"CUDA "*" headers"* ]] || fail "--version: $version"

share=$root/usr/share/cupool
"$bin" check "$share/configs/single-gpu-inference.yaml" --profile "$share/configs/profiles/h100.yaml" >"$work/check.txt" 2>&1 ||
  { cat "$work/check.txt"; fail "cupool check of the installed example against the installed profile"; }
say "cupool check of the installed example: exit 0"

# The sample the unit holds is a config as shipped (no pool: the holder starts and holds nothing),
# on every installed node profile; and so is what it shows commented out (blocks that start with
# "#key:"), once uncommented. It is the file under /usr/share as installed into /etc.
sample=$root/etc/cupool/cupool.yaml
cmp -s "$sample" "$share/configs/systemd/cupool.yaml" || fail "/etc/cupool/cupool.yaml is not the shipped sample"
awk '/^#[a-z_]+:/ {on=1} !/^#/ || /^# [^ ]/ {on=0} on {sub(/^#/, "")} {print}' "$sample" >"$work/uncommented.yaml"
grep -q '^pools:' "$work/uncommented.yaml" || fail "the sample shows no pools to uncomment"
for profile in "$share"/configs/profiles/*.yaml; do
  for config in "$sample" "$work/uncommented.yaml"; do
    "$bin" check "$config" --profile "$profile" >"$work/check.txt" 2>&1 ||
      { cat "$work/check.txt"; fail "cupool check ${config#"$root"} --profile ${profile##*/}"; }
  done
done
say "cupool check of /etc/cupool/cupool.yaml, as shipped and uncommented, on $(ls "$share"/configs/profiles/*.yaml | wc -l) profiles: exit 0"
# With no config there, the holder says so in its words and names the sample to copy.
out=$("$bin" hold "$work/none/cupool.yaml" --profile "$share/configs/profiles/h100.yaml" 2>&1) && fail "hold of a missing file: exit 0"
[[ $out == *"no config file at '$work/none/cupool.yaml'"*"cp $share/configs/systemd/cupool.yaml $work/none/cupool.yaml"* ]] ||
  fail "hold of a missing file: $out"
say "hold of a missing config names the sample: $share/configs/systemd/cupool.yaml"

preload=$("$bin" exec "$share/configs/single-gpu-inference.yaml" --profile "$share/configs/profiles/h100.yaml" \
  -- sh -c 'echo "$LD_PRELOAD"')
[ "$preload" = "$root/usr/bin/../lib/$multiarch/cupool/libcupool-preload.so" ] || fail "exec preloads '$preload'"
say "cupool exec preloads $preload"

# The installed units name the installed binary, the holder's uses the keeper's (tests/deploy/
# systemd_test.py checks the relations), and together they pass systemd's own check without a word
# (with the binary's path moved into the scratch root, since verify wants the executable to exist).
units=$root/usr/lib/systemd/system
unit=$units/cupool.service
grep -q '^ExecStart=/usr/bin/cupool hold .* --keeper /run/cupool/keeper.sock$' "$unit" ||
  fail "the unit's ExecStart: $(grep ExecStart "$unit")"
grep -q '^ExecReload=/usr/bin/cupool apply ' "$unit" || fail "the unit's ExecReload: $(grep ExecReload "$unit")"
grep -q '^Wants=.*cupool-keeper.service' "$unit" || fail "cupool.service does not start cupool-keeper.service"
grep -q '^ExecStart=/usr/bin/cupool keeper --socket /run/cupool/keeper.sock$' "$units/cupool-keeper.service" ||
  fail "the keeper unit's ExecStart: $(grep ExecStart "$units/cupool-keeper.service")"
grep -q '^ExecStart=/usr/bin/cupool exporter --listen 127.0.0.1:9402 ' "$units/cupool-exporter.service" ||
  fail "the exporter unit's ExecStart: $(grep ExecStart "$units/cupool-exporter.service")"
if command -v systemd-analyze >/dev/null; then
  for u in cupool.service cupool-keeper.service cupool-exporter.service; do
    sed "s|/usr/bin/cupool|$bin|g" "$units/$u" >"$work/$u"
  done
  # verify exits 0 on an unknown setting (it only warns): what it says is the verdict.
  said=$(systemd-analyze verify "$work/cupool.service" "$work/cupool-keeper.service" "$work/cupool-exporter.service" 2>&1) ||
    fail "systemd-analyze verify of the units: $said"
  [ -z "$said" ] || fail "systemd-analyze verify of the units says: $said"
  for u in cupool.service cupool-keeper.service cupool-exporter.service; do
    # The exposure score systemd gives each unit (README, "Installing"); recorded, not judged here.
    say "systemd-analyze verify: $u passes; security: $(systemd-analyze security --offline=yes "$work/$u" 2>/dev/null | tail -1)"
  done
else
  say "systemd-analyze not installed: the units were not verified"
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
# pkg-config: the .pc file names the package's prefix, /usr, and clean paths under it. On the
# node itself those are the compiler's own directories, so pkg-config prints only the library;
# in the scratch root (PKG_CONFIG_SYSROOT_DIR) the same paths under the root.
pc=$root$lib/pkgconfig/cupool-client.pc
for line in 'prefix=/usr' 'libdir=${prefix}/lib/'"$multiarch" 'includedir=${prefix}/include'; do
  grep -qxF "$line" "$pc" || fail "cupool-client.pc lacks the line '$line':$(echo; cat "$pc")"
done
# shellcheck disable=SC2048,SC2086  # split on purpose: pkg-config ends its output with a space
words() { echo $*; }
flags=$(words "$(env -u PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH=$root$lib/pkgconfig pkg-config --cflags --libs cupool-client)")
[ "$flags" = "-lcupool-client" ] || fail "pkg-config --cflags --libs, as on the node: '$flags'"
export PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_PATH=$root$lib/pkgconfig PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
flags=$(words "$(pkg-config --cflags --libs cupool-client)")
[ "$flags" = "-I$root/usr/include -L$root$lib -lcupool-client" ] || fail "pkg-config --cflags --libs in the root: '$flags'"
cc "$work/probe.c" $flags -o "$work/probe-pc"
LD_LIBRARY_PATH=$root$lib "$work/probe-pc" || fail "the program built through pkg-config"
unset PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH PKG_CONFIG_ALLOW_SYSTEM_CFLAGS PKG_CONFIG_ALLOW_SYSTEM_LIBS
say "built and ran a C program through pkg-config ($flags)"
# Another prefix gets its own paths: cmake --install writes the prefix it installs into.
cmake --install "$build" --component dev --prefix "$work/opt" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "cmake --install --component dev"; }
flags=$(words "$(PKG_CONFIG_PATH=$work/opt/lib/$multiarch/pkgconfig pkg-config --cflags --libs cupool-client)")
[ "$flags" = "-I$work/opt/include -L$work/opt/lib/$multiarch -lcupool-client" ] || fail "pkg-config of a --prefix install: '$flags'"
say "a --prefix install's .pc: $flags"

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
LD_LIBRARY_PATH=$root$lib "$work/cmake-build/probe" || fail "the program built through find_package"
say "built and ran a C program through find_package(cupool)"

# The Python package of the runtime package, from the scratch root, finds the library installed
# with it (no CUPOOL_CLIENT_LIB, no LD_LIBRARY_PATH) and talks to a holder of the installed binary
# on the installed simulated node.
cat >"$work/cupool.yaml" <<YAML
version: 1
holder:
  socket: $work/cupool.sock
pools:
  - name: kv
    devices: [0]
    handle_types: [posix_fd]
    max_size: 256MiB
YAML
"$bin" hold "$work/cupool.yaml" --profile "$share/configs/profiles/h100.yaml" >"$work/hold.log" 2>&1 &
holder=$!
trap 'kill $holder 2>/dev/null; wait $holder 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -S "$work/cupool.sock" ] && break; sleep 0.1; done
out=$(env -u CUPOOL_CLIENT_LIB -u LD_LIBRARY_PATH PYTHONPATH=$root/usr/lib/python3/dist-packages PYTHONDONTWRITEBYTECODE=1 \
  "$python" - "$work/cupool.sock" <<'PY' 2>&1
import ctypes, os, sys
import cupool
from cupool import _lib
lib = _lib.library()
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libcupool-client" in line})
print("package", os.path.dirname(cupool.__file__))
print("library", " ".join(mapped))
with cupool.connect(sys.argv[1], "package-test") as conn:
    with conn.alloc("kv", 1 << 20) as lease:
        ctypes.memset(lease.address, 7, lease.size)
        print("lease", lease.size, conn.backend, ctypes.string_at(lease.address, 2) == b"\x07\x07")
PY
) || { cat "$work/hold.log"; fail "the installed Python package: $out"; }
[[ $out == *"package $root$py"* ]] || fail "cupool imported from elsewhere: $out"
[[ $out == *"library $root$lib/libcupool-client.so.1.0.0"* ]] || fail "the package loaded another library: $out"
[[ $out == *"lease 1048576 simulated True"* ]] || fail "the installed package's lease: $out"
say "the Python package in $py loads $lib/libcupool-client.so.1 beside it and allocates from the installed holder"
echo "package: all checks passed"
