#!/usr/bin/env python3
"""The Grafana dashboard (configs/grafana/cupool-dashboard.json) asks only for series cupool
writes, by labels it writes: every cupool_* name in a query is one the exporter emits (read from
the renderer's and the exporter's sources), every label a query groups or filters by is one of
its samples' (or dcgm-exporter's UUID, for the join), the held buffers and tensor sets have their
panels (per pool and per device), and the file is a dashboard Grafana imports (title, uid, panels
with targets and a numeric place on the grid, a Prometheus datasource variable).

    dashboard_test.py --root REPO
"""
import argparse
import json
import os
import re
import sys

failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    args = ap.parse_args()
    path = os.path.join(args.root, "configs/grafana/cupool-dashboard.json")
    with open(path) as f:
        dash = json.load(f)
    emitted = set()
    for src in ("cli/holder_render.cpp", "cli/exporter.cpp", "cli/holder_client.cpp"):
        with open(os.path.join(args.root, src)) as f:
            emitted |= set(re.findall(r'"(cupool_[a-z_]+)', f.read()))
    check({"cupool_pool_used_bytes", "cupool_build_info", "cupool_holder_up"} <= emitted,
          f"the sources name the metrics ({len(emitted)} found)")
    labels = {"pool", "gpu", "UUID", "pci_bus_id", "modelName", "Hostname", "instance", "job", "version", "commit",
              "cuda_headers"}
    check(bool(dash.get("title")) and bool(dash.get("uid")), "a title and a uid")
    names = [v["name"] for v in dash.get("templating", {}).get("list", [])]
    check("datasource" in names, "a datasource variable, so it imports into any Grafana")
    panels = dash.get("panels", [])
    check(len(panels) >= 6, f"{len(panels)} panels")
    ids = [p["id"] for p in panels]
    check(len(ids) == len(set(ids)), "panel ids are unique")
    asked = set()
    for p in panels:
        grid = p.get("gridPos", {})
        check(all(isinstance(grid.get(k), int) for k in ("x", "y", "w", "h")),
              f"panel '{p['title']}' has a place on the grid: {grid}")
        targets = p.get("targets", [])
        check(bool(targets), f"panel '{p['title']}' has a query")
        for t in targets:
            expr = t["expr"]
            for name in re.findall(r"\b(cupool_[a-z_]+)\b", expr):
                check(name in emitted, f"panel '{p['title']}': {name} is a metric cupool writes")
                asked.add(name)
            used = set(re.findall(r"(?:by|on|without)\s*\(([^)]*)\)", expr))
            for group in used:
                for label in filter(None, (x.strip() for x in group.split(","))):
                    check(label in labels, f"panel '{p['title']}': label {label} is one cupool (or Prometheus) sets")
            for label in re.findall(r"\{\{(\w+)\}\}", t.get("legendFormat", "")):
                check(label in labels, f"panel '{p['title']}': legend label {label} exists")
    # Held buffers and tensor sets are outside every pool's figures: the dashboard shows them.
    held = {"cupool_pool_held_bytes", "cupool_device_held_bytes", "cupool_device_held_buffers"}
    check(held <= asked, f"the dashboard shows held memory ({sorted(held - asked)} missing)")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
