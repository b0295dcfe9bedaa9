#!/usr/bin/env python3
"""The direction rule of docs/architecture.md, tested against the sources and the build.

1. Every `#include "PART/x.h"` in core/PART/ and cli/ names a part that the including part uses,
   directly or through another part (the table CMakeLists.txt writes into probes.json), or the
   including part itself; `cupool/client.h` (the public C API) is open to all.
2. Our headers are included only as "PART/x.h" (or "cupool/client.h"), never by a relative path
   or from the repository root, which would go around the include roots that enforce the rule.
3. Two compile probes prove that the build itself still enforces it: a part including a header of
   a part it uses compiles; a part including a header of a part above it fails because the header
   can't be found (each probe is an object library that links the first part and includes one
   header of the second: tests/architecture/CMakeLists.txt).
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def closure(uses, part):
    seen, todo = set(), list(uses.get(part, []))
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(uses.get(p, []))
    return seen


def part_files(root, dirs):
    """(part, file) for every C/C++ source of each part's folder."""
    for part, folder in sorted(dirs.items()):
        for f in sorted((root / folder).rglob("*")):
            if f.suffix in (".cpp", ".h", ".c"):
                yield part, f


def check_includes(root, uses, dirs):
    """Findings of rules 1 and 2; also the number of includes read."""
    failures, seen = [], 0
    parts = set(uses)
    for part, f in part_files(root, dirs):
        allowed = closure(uses, part) | {part}
        for line_no, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            seen += 1
            name = m.group(1)
            where = f"{f.relative_to(root)}:{line_no}"
            top = name.split("/")[0]
            if name == "cupool/client.h":
                continue
            if ".." in name.split("/") or "/" not in name or top not in parts:
                failures.append(f"{where}: #include \"{name}\": include our headers as \"PART/x.h\" "
                                f"(parts: {', '.join(sorted(parts))}) or \"cupool/client.h\"")
            elif top not in allowed:
                failures.append(f"{where}: #include \"{name}\": {part} may use only "
                                f"{', '.join(sorted(allowed - {part})) or 'no other part'} (docs/architecture.md)")
    return failures, seen


def check_probe(build, probe):
    """Builds one probe; a finding when it compiled against expectation, or failed for another reason."""
    r = subprocess.run(["cmake", "--build", build, "--target", probe["target"]],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    built = r.returncode == 0
    if built != probe["allowed"]:
        verdict = "may use" if probe["allowed"] else "may not use"
        return [f"probe {probe['target']}: {probe['part']} {verdict} {probe['header']}, but it "
                f"{'built' if built else 'failed'}:\n{r.stdout[-2000:]}"]
    if not built and not re.search(re.escape(probe["header"]) + r".*(No such file|not found)", r.stdout):
        return [f"probe {probe['target']} failed for another reason than the missing header:\n{r.stdout[-2000:]}"]
    print(f"ok  probe: {probe['part']} {'including' if probe['allowed'] else 'may not include'} {probe['header']}"
          f" {'compiles' if built else 'does not compile'}")
    return []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--probes", required=True)
    ap.add_argument("--root", required=True)
    args = ap.parse_args()
    spec = json.loads(pathlib.Path(args.probes).read_text())
    uses, dirs, probes = spec["uses"], spec["dirs"], spec["probes"]
    root = pathlib.Path(args.root)

    failures, seen = check_includes(root, uses, {p: pathlib.Path(d).relative_to(root) for p, d in dirs.items()})
    if seen == 0:
        failures.append("no #include of ours was read: the part folders in probes.json are wrong")
    # The rule must forbid something, or it proves nothing.
    if all(closure(uses, p) | {p} >= set(uses) for p in uses):
        failures.append("every part may use every other: the table forbids nothing")
    if sorted(p["allowed"] for p in probes) != [False, True]:
        failures.append("expected two probes, one allowed and one forbidden")
    for p in probes:
        failures += check_probe(args.build, p)

    for f in failures:
        print("FAIL", f)
    print(f"{seen} includes of {len(dirs)} parts read, {len(probes)} probes built, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
