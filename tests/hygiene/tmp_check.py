#!/usr/bin/env python3
"""The test suite's temporary folders (tests/hygiene/CMakeLists.txt): each test runs with TMPDIR set
to ROOT/TEST, ROOT being /tmp/cupool-test.HASH of this build tree.

  tmp_check.py setup ROOT TEST...   makes ROOT/TEST for each test, after removing what an
                                    interrupted run of this tree left in ROOT
  tmp_check.py check ROOT TEST...   fails naming each test whose folder is not empty (what it left:
                                    tests clean up after themselves, also when they fail), then
                                    removes ROOT; and looks for what bypassed TMPDIR: entries of
                                    /tmp made since setup, owned by this user, named as the suite
                                    names its files (cupool*, tmp*). Others may make such names in
                                    /tmp at the same time (another checkout's suite), so that part
                                    fails only in CI (CI set: a machine of its own), else it warns.
"""
import os
import shutil
import stat
import sys

STAMP = ".started"
# Python's tempfile and mktemp name what they make tmp*; the suite names its own cupool-*.
PREFIXES = ("cupool", "tmp")


def remove(path):
    """Removes a folder whatever its modes (a test may leave a folder it made unreadable)."""
    def unlock(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
        except OSError:
            pass
        func(p)
    if os.path.lexists(path):
        shutil.rmtree(path, onerror=unlock)


def setup(root, tests):
    remove(root)
    os.mkdir(root, 0o755)  # tests that run a part as another user reach in (0755, as /tmp's own folders)
    for t in tests:
        os.mkdir(os.path.join(root, t), 0o1777)  # sticky and open, as /tmp: a test's other user makes files too
        os.chmod(os.path.join(root, t), 0o1777)
    open(os.path.join(root, STAMP), "w").close()
    print(f"tmp-setup: {len(tests)} folders under {root}")
    return 0


def listing(folder):
    """What is in folder, a line each, folders first level only with a count of what they hold."""
    out = []
    for name in sorted(os.listdir(folder)):
        p = os.path.join(folder, name)
        st = os.lstat(p)
        what = "folder" if stat.S_ISDIR(st.st_mode) else "file"
        setuid = [p] if st.st_mode & stat.S_ISUID else []
        if stat.S_ISDIR(st.st_mode):
            n = 0
            for top, dirs, files in os.walk(p):
                n += len(dirs) + len(files)
                setuid += [os.path.join(top, f) for f in files if os.lstat(os.path.join(top, f)).st_mode & stat.S_ISUID]
            what += f" with {n} entries"
        if setuid:
            what += ", SET-USER-ID: " + ", ".join(os.path.relpath(x, folder) for x in setuid)
        out.append(f"    {name} ({what})")
    return out


def check(root, tests):
    if not os.path.isdir(root):
        print(f"tmp-check: {root} is missing: tmp-setup did not run, or a test removed it")
        return 1
    started = os.lstat(os.path.join(root, STAMP)).st_mtime if os.path.exists(os.path.join(root, STAMP)) else 0
    failed = False
    for t in tests:
        folder = os.path.join(root, t)
        if not os.path.isdir(folder):
            continue
        left = listing(folder)
        if left:
            failed = True
            print(f"FAIL  test '{t}' left {len(left)} entries in its TMPDIR ({folder}):")
            print("\n".join(left))
    strangers = sorted(set(os.listdir(root)) - set(tests) - {STAMP})
    if strangers:
        failed = True
        print(f"FAIL  {root} holds what no test's TMPDIR is: {', '.join(strangers)}")

    # What bypassed TMPDIR: made in /tmp itself while the tests ran.
    bypassed = []
    me = os.geteuid()
    for name in sorted(os.listdir("/tmp")):
        p = os.path.join("/tmp", name)
        if p == root or not name.startswith(PREFIXES) or name.startswith("cupool-test."):
            continue
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if st.st_uid == me and st.st_ctime >= started:
            bypassed.append(name)
    if bypassed:
        strict = bool(os.environ.get("CI"))
        print(("FAIL  " if strict else "note  ") + "made in /tmp while the tests ran, not in a test's TMPDIR"
              + ("" if strict else " (maybe by something else of this user's; CI fails on it)") + ":")
        print("\n".join(f"    /tmp/{n}" for n in bypassed))
        failed = failed or strict

    remove(root)
    if not failed:
        print(f"tmp-check: the {len(tests)} tests left nothing in their TMPDIRs; {root} removed")
    return 1 if failed else 0


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("setup", "check"):
        print(__doc__)
        return 2
    root, tests = sys.argv[2], sys.argv[3:]
    return setup(root, tests) if sys.argv[1] == "setup" else check(root, tests)


if __name__ == "__main__":
    sys.exit(main())
