#!/usr/bin/env python3
"""The direction rule of docs/architecture.md, tested against the build itself.

For every ordered pair of parts (A, B) there is a probe target that links part A and includes a
header of part B (tests/architecture/CMakeLists.txt writes the list). The probe must compile
exactly when A uses B, directly or through another part, and otherwise fail because the header
can't be found. A second check reads the sources: our own headers are included only as
"PART/x.h" (or "cupool/client.h", the public API), never by a relative path or from the
repository root, which would go around the include roots that enforce the rule.
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys


def closure(uses, part):
    seen, todo = set(), list(uses.get(part, []))
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(uses.get(p, []))
    return seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--probes", required=True)
    ap.add_argument("--root", required=True)
    args = ap.parse_args()
    spec = json.loads(pathlib.Path(args.probes).read_text())
    uses, probes = spec["uses"], spec["probes"]
    parts = set(uses)
    failures = []

    # The rule must forbid something, or the probes prove nothing.
    allowed = sum(1 for p in probes if p["header"].split("/")[0] in closure(uses, p["part"]))
    if allowed == 0 or allowed == len(probes):
        failures.append(f"{allowed} of {len(probes)} probes are allowed: the parts are all or nothing")

    for p in probes:
        other = p["header"].split("/")[0]
        expect = other in closure(uses, p["part"])
        r = subprocess.run(["cmake", "--build", args.build, "--target", p["target"]],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        built = r.returncode == 0
        verdict = "may use" if expect else "may not use"
        if built != expect:
            failures.append(f"{p['part']} {verdict} {other}, but the probe {'built' if built else 'failed'}:\n{r.stdout[-2000:]}")
        elif not built and not re.search(re.escape(p["header"]) + r".*(No such file|not found)", r.stdout):
            failures.append(f"the probe of {p['part']} including {p['header']} failed for another reason:\n{r.stdout[-2000:]}")
        else:
            print(f"ok  {p['part']:9} {verdict:12} {other}")

    root = pathlib.Path(args.root)
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    for folder in ("lib", "cli"):
        for f in sorted((root / folder).rglob("*")):
            if f.suffix not in (".cpp", ".h", ".c"):
                continue
            # The shared objects' own files (lib/client) include each other too.
            own = {f.relative_to(root).parts[1]} if folder == "lib" else set()
            for name in include.findall(f.read_text(errors="replace")):
                top = name.split("/")[0]
                if ".." in name.split("/") or "/" not in name or (top not in parts | own and name != "cupool/client.h"):
                    failures.append(f"{f.relative_to(root)}: #include \"{name}\": include our headers as \"PART/x.h\" "
                                    f"(parts: {', '.join(sorted(parts))}) or \"cupool/client.h\"")

    for f in failures:
        print("FAIL", f)
    print(f"{len(probes)} probes, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
