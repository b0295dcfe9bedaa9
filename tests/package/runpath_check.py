#!/usr/bin/env python3
"""Every ELF file under the given directories searches only absolute directories or $ORIGIN for
its libraries: no RUNPATH or RPATH with an empty element (glibc reads "" as the working directory,
so `build/cupool` run in a directory where another user left a libcuda.so.1 would load it) or a
relative one (the same, below the working directory). Issue 34.

  runpath_check.py DIR [DIR ...]     exit 0 when all hold; prints each file's search path
"""
import os
import subprocess
import sys


def elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def search_paths(path):
    out = subprocess.run(["readelf", "-d", "-W", path], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        for tag in ("(RUNPATH)", "(RPATH)"):
            if tag in line and "[" in line:
                found.append((tag.strip("()"), line[line.index("[") + 1:line.rindex("]")]))
    return found


def main():
    failures, checked = [], 0
    for top in sys.argv[1:]:
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d not in ("CMakeFiles", "_CPack_Packages")]
            for name in files:
                path = os.path.join(folder, name)
                if os.path.islink(path) or not elf(path):
                    continue
                checked += 1
                for tag, value in search_paths(path):
                    bad = [e for e in value.split(":") if e == "" or not (e.startswith("/") or e.startswith("$ORIGIN"))]
                    if bad:
                        failures.append(f"{path}: {tag} [{value}] has "
                                        + ("an empty element (the working directory)" if "" in bad
                                           else f"a relative element {bad[0]!r}"))
    for f in failures:
        print("FAIL", f)
    print(f"{checked} ELF files checked, {len(failures)} with an unsafe search path")
    return 1 if failures or not checked else 0


if __name__ == "__main__":
    sys.exit(main())
