#!/usr/bin/env python3
"""`pip install ./python` on an air-gapped node: the package's build backend
(python/backend/cupool_build.py) needs nothing from an index and writes nothing into the source tree.

  - pip install with build isolation (pip's default) against an index that does not answer: pip
    would have to fetch the build requirements there, so this passes only when there are none;
  - the same with --no-index, and from an sdist the backend made;
  - nothing under python/ is new or changed afterwards (bytecode caches included: the test runs
    with PYTHONDONTWRITEBYTECODE unset), and `git status --porcelain --ignored python/` agrees;
  - the installed package imports from where pip put it, loads the client library and carries
    the metadata of pyproject.toml (name, version = cupool.__version__, RECORD hashes).

  pip_test.py --root . --client-lib build/libcupool-client.so.1

Exit status: 0 passed, 1 failed, 77 pip is missing (Debian: python3-pip).
"""
import argparse
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile


class Failure(Exception):
    pass


def check(cond, message):
    if not cond:
        raise Failure(message)


def tree(folder):
    """Every folder under `folder`, and every file with its size and mtime: what a build could
    write (a folder's own mtime is left out: Python's bytecode cache for the backend is made and
    removed again while it runs)."""
    out = {}
    for top, dirs, files in os.walk(folder):
        for name in dirs:
            out[os.path.relpath(os.path.join(top, name), folder) + "/"] = None
        for name in files:
            st = os.lstat(os.path.join(top, name))
            out[os.path.relpath(os.path.join(top, name), folder)] = (st.st_size, st.st_mtime_ns)
    return out


def git_status(root):
    if not shutil.which("git") or not os.path.isdir(os.path.join(root, ".git")):
        return None
    r = subprocess.run(["git", "-C", root, "status", "--porcelain", "--ignored", "python/"],
                       capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def env():
    e = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    e.pop("PYTHONDONTWRITEBYTECODE", None)  # a build that writes bytecode into the tree is caught
    for key in [k for k in e if k.startswith("PIP_") and k not in ("PIP_DISABLE_PIP_VERSION_CHECK", "PIP_NO_INPUT")]:
        del e[key]
    return e


def pip_install(args, cwd):
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=cwd, timeout=240)
    check(r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}{r.stderr}")


def check_installed(target, lib, version):
    """The package in `target` imports from there (not from the tree), loads the library and is
    the version pyproject.toml names; its RECORD matches the files."""
    code = ("import cupool, sys\n"
            "from cupool import _lib\n"
            "lib = _lib.library()\n"
            "print(cupool.__file__)\n"
            "print(cupool.__version__, lib.cupool_abi_version())\n")
    e = dict(env(), PYTHONPATH=target, CUPOOL_CLIENT_LIB=lib, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, cwd=target, timeout=60)
    check(r.returncode == 0, f"importing the installed package: {r.stdout}{r.stderr}")
    where, got = r.stdout.split("\n")[:2]
    check(where == os.path.join(target, "cupool", "__init__.py"), f"imported from {where}, not {target}")
    check(got == f"{version} 1", f"version and ABI: {got!r}, pyproject.toml says {version}")
    info = os.path.join(target, f"cupool-{version}.dist-info")
    with open(os.path.join(info, "METADATA")) as f:
        meta = f.read()
    check("\nName: cupool\n" in meta and f"\nVersion: {version}\n" in meta and "Requires-Python: >=3.9" in meta,
          f"METADATA: {meta[:300]}")
    with open(os.path.join(info, "RECORD")) as f:
        rows = [line.rsplit(",", 2) for line in f.read().splitlines()]
    recorded = 0
    for name, digest, size in rows:
        if not digest:
            continue
        with open(os.path.join(target, name), "rb") as f:
            data = f.read()
        want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        check(digest == want and int(size) == len(data), f"RECORD: {name} {digest} {size}")
        recorded += name.startswith("cupool/")
    shipped = sorted(n for n in os.listdir(os.path.join(target, "cupool")) if n != "__pycache__")
    check(recorded == len(shipped) and "py.typed" in shipped and "tensors.py" in shipped,
          f"RECORD lists {recorded} package files; installed: {shipped}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--client-lib", required=True)
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    lib = os.path.abspath(args.client_lib)
    source = os.path.join(root, "python")
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        print("skipped: pip is missing (Debian: python3-pip)")
        return 77
    with open(os.path.join(source, "pyproject.toml")) as f:
        version = re.search(r'^version = "([^"]+)"$', f.read(), re.M).group(1)

    work = tempfile.mkdtemp(prefix="cupool-pip.")
    before, status = tree(source), git_status(root)
    try:
        # pip's default: build isolation. An index that answers nothing stands for no network.
        dead = ["--index-url", "http://127.0.0.1:9/simple", "--retries", "0", "--timeout", "2"]
        pip_install([*dead, "--target", os.path.join(work, "isolated"), source], cwd=work)
        check_installed(os.path.join(work, "isolated"), lib, version)
        print("pip_test: pip install ./python with build isolation and no index that answers: installed")
        pip_install(["--no-index", "--target", os.path.join(work, "no-index"), source], cwd=root)
        check_installed(os.path.join(work, "no-index"), lib, version)
        print("pip_test: pip install --no-index ./python: installed")
        # An sdist from the backend, installed offline (its own backend builds the wheel).
        code = ("import sys; sys.path.insert(0, 'backend'); import cupool_build\n"
                "print(cupool_build.build_sdist(sys.argv[1]))\n")
        r = subprocess.run([sys.executable, "-c", code, work], capture_output=True, text=True, env=env(), cwd=source,
                           timeout=60)
        check(r.returncode == 0, f"build_sdist: {r.stdout}{r.stderr}")
        sdist = os.path.join(work, r.stdout.strip())
        check(os.path.basename(sdist) == f"cupool-{version}.tar.gz", f"sdist named {sdist}")
        pip_install(["--no-index", "--target", os.path.join(work, "sdist"), sdist], cwd=work)
        check_installed(os.path.join(work, "sdist"), lib, version)
        print(f"pip_test: {os.path.basename(sdist)} from the backend, installed with --no-index")
        after = tree(source)
        changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
        check(not changed, f"the builds wrote into python/: {changed}")
        check(git_status(root) == status, f"git status of python/ changed:\n{status}\n->\n{git_status(root)}")
        print("pip_test: nothing under python/ is new or changed (bytecode caches included)")
    except Failure as e:
        print(f"FAIL: {e}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
