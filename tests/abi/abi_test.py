#!/usr/bin/env python3
"""The libraries cupool puts into other processes bring nothing of cupool's but themselves.

libcupool-client.so.1 (linked by applications) and libcupool-preload.so (injected by `cupool
exec`) may need only the C and C++ runtime (the preload also the client library), and may export
only the C API (cupool_*) and, for the preload, the functions it interposes (dlsym, cuInit, and the
entry points a budget wraps, as core/preload/preload.map names them).
This reads each library's dynamic section and dynamic symbol table (readelf) and fails on anything
else. Then it runs an application that carries its own, different build of yaml-cpp, spdlog and
fmt (a stand-in library whose every symbol aborts) under `cupool exec`: the config must be applied
inside it without any of those being called. A control shows the stand-in does catch a library
that resolves those symbols at run time.

  abi_test.py --client LIB --preload LIB --cupool BIN --root DIR --app BIN --control LIB [--sanitized]
"""
import argparse
import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile

RUNTIME = {"libc.so.6", "libm.so.6", "libgcc_s.so.1", "libstdc++.so.6", "libdl.so.2", "libpthread.so.0",
           "librt.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
SANITIZER = re.compile(r"^lib(asan|ubsan|tsan)\.so(\.\d+)*$")
# Names of our dependencies' code in an undefined (imported) symbol, demangled.
THEIRS = re.compile(r"\b(YAML|fmt|spdlog|nlohmann|CLI)::")


def readelf(*args):
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


def demangle(names):
    if not names:
        return []
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


def dynamic_symbols(lib):
    """(name, defined, bind, ndx) of every dynamic symbol, versions stripped."""
    out = []
    for line in readelf("--dyn-syms", lib).splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].rstrip(":").isdigit():
            continue
        name = f[7].split("@")[0]
        if not name:
            continue
        out.append((name, f[6] != "UND", f[4], f[6]))
    return out


def check_library(lib, allowed_needed, exported_ok, sanitized, failures):
    dyn = readelf("-d", lib)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    for n in needed:
        if n in RUNTIME or n in allowed_needed or (sanitized and SANITIZER.match(n)):
            continue
        failures.append(f"{os.path.basename(lib)} needs {n}: only the C/C++ runtime"
                        f"{' and ' + ', '.join(sorted(allowed_needed)) if allowed_needed else ''} may be needed")
    symbols = dynamic_symbols(lib)
    exported = [s for s in symbols if s[1] and s[2] in ("GLOBAL", "WEAK", "UNIQUE")]
    for name, _, bind, ndx in exported:
        if not exported_ok(name, ndx):
            failures.append(f"{os.path.basename(lib)} exports {name} ({bind})")
    imported = [s[0] for s in symbols if not s[1]]
    for mangled, plain in zip(imported, demangle(imported)):
        if THEIRS.search(plain):
            failures.append(f"{os.path.basename(lib)} imports {plain} ({mangled}) from another library")
    print(f"{os.path.basename(lib)}: needs {', '.join(needed)}; exports {len(exported)} symbols")
    return needed, exported


def main():
    ap = argparse.ArgumentParser()
    for a in ("--client", "--preload", "--cupool", "--root", "--app", "--control"):
        ap.add_argument(a, required=True)
    ap.add_argument("--sanitized", action="store_true")
    args = ap.parse_args()
    # The test programs find the stand-in driver (libcuda.so.1) through their RUNPATH; a directory on
    # LD_LIBRARY_PATH that holds the real driver (as on the GPU machines) would be searched first.
    os.environ["LD_LIBRARY_PATH"] = ":".join(
        d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d and not os.path.exists(os.path.join(d, "libcuda.so.1")))
    failures = []

    soname = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", readelf("-d", args.client))
    if not soname or soname.group(1) != "libcupool-client.so.1":
        failures.append(f"the client library's SONAME is {soname.group(1) if soname else 'missing'}, not libcupool-client.so.1")

    _, exported = check_library(args.client, set(),
                                lambda n, ndx: n.startswith("cupool_") or (ndx == "ABS" and re.match(r"^CUPOOL_CLIENT_\d+$", n)),
                                args.sanitized, failures)
    for must in ("cupool_connect", "cupool_alloc", "cupool_release", "cupool_configure", "cupool_stats"):
        if must not in {e[0] for e in exported}:
            failures.append(f"the client library does not export {must}")
    # The preload exports what its version script names: dlsym, cuInit and, for a budget, the driver's
    # and NVML's entry points it wraps (core/preload/budget_hooks.cpp); nothing else.
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../core/preload/preload.map")) as f:
        script = f.read()
    interposed = set(re.findall(r"^\s*(\w+);", script.split("global:")[1].split("local:")[0], re.M))
    if not {"dlsym", "cuInit", "cuMemAlloc_v2", "cuMemGetInfo_v2", "nvmlDeviceGetMemoryInfo"} <= interposed:
        failures.append(f"core/preload/preload.map's global names are not what this test expects: {sorted(interposed)}")
    _, exported = check_library(args.preload, {"libcupool-client.so.1"}, lambda n, ndx: n in interposed,
                                args.sanitized, failures)
    if {e[0] for e in exported} != interposed:
        failures.append(f"the preload library exports {sorted(e[0] for e in exported)}, not {sorted(interposed)}")

    if args.sanitized:
        print("(the stand-in application is not run in a sanitized build: the sanitizer runtime must come first, "
              "and a preloaded library comes before it)")
    else:
        profile = os.path.join(args.root, "configs", "profiles", "h100.yaml")
        tmp = tempfile.mkdtemp(prefix="cupool-abi-")
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # also when a check fails
        config = os.path.join(tmp, "p.yaml")
        with open(config, "w") as f:
            f.write("version: 1\nprocess:\n  default_pool: {release_threshold: max, reuse: {allow_opportunistic: false}}\n")
        r = subprocess.run([args.cupool, "exec", config, "--profile", profile, "--", args.app],
                           capture_output=True, text=True, timeout=60)
        applied = [l for l in r.stderr.splitlines() if l.startswith("cupool exec: applied")]
        ok = r.returncode == 0 and "cuInit=0 standin=1" in r.stdout and len(applied) == 1 and "stand-in" not in r.stderr
        print(("ok    " if ok else "FAIL  ") + "an application with its own yaml-cpp, spdlog and fmt runs under cupool exec, "
              "the config applied inside it")
        if not ok:
            failures.append(f"under cupool exec: exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}")
        r = subprocess.run([args.app, "control", args.control], capture_output=True, text=True, timeout=60)
        ok = r.returncode != 0 and "stand-in YAML::Load(const std::string&) was called" in r.stderr
        print(("ok    " if ok else "FAIL  ") + "control: a library that resolves YAML::Load at run time gets the stand-in")
        if not ok:
            failures.append(f"the control did not reach the stand-in: exit {r.returncode}\n{r.stderr}")

    for f in failures:
        print("FAIL", f)
    print("all passed" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
