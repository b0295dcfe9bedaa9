#!/usr/bin/env python3
"""The documentation test's own checks, each on a small document made for it (ctest `docs-checks`,
label `text`):

  - a snippet that is not run (C, or marked skip) and takes memory from a pool that has no IPC
    handle type in the config its document's holder serves fails, naming the pool and the pools
    that could serve it; the same snippet with such a pool passes; one after the block that
    stopped its holder is judged against that holder's config; one with no holder before it fails;
  - a block that needs a python module the first python3 on the user's PATH lacks fails, naming
    that python3 and saying setup.sh provides the module only to Debian's /usr/bin/python3 (here
    a venv without numpy stands in for a user's pyenv or venv python, first on PATH);
  - the README as it is passes with that python3 first on PATH (its Python examples say which
    python they run).

  doc_test_checks.py --cupool build/cupool --client-lib build/libcupool-client.so.1 --root .

Exit status: 0 every check held, 1 otherwise, 77 when there is no /usr/bin/python3 with numpy to
compare with (setup.sh installs it).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LINKED = ("configs", "python", "scripts", "schemas", "tests")

HOLDER_BLOCK = """```sh
export CUPOOL_SOCKET=$XDG_RUNTIME_DIR/checks.sock
cupool hold configs/single-gpu-inference.yaml --profile configs/profiles/h100.yaml & sleep 1
```
"""
STOPPED_HOLDER_BLOCK = """```sh
export CUPOOL_SOCKET=$XDG_RUNTIME_DIR/checks.sock
cupool hold configs/single-gpu-inference.yaml --profile configs/profiles/h100.yaml & sleep 1
cupool status >/dev/null
kill $!; wait $!
```
"""


def c_snippet(pool):
    return f"""```c
cupool_lease* l;
cupool_alloc(conn, "{pool}", 0, 1 << 20, &l);
cupool_open_buffer(conn, "llama-8b-bf16", &l);
```
"""


SKIPPED_PYTHON = """<!-- doc-test: skip needs a GPU -->
```python
import cupool, torch
with cupool.connect() as conn, conn.alloc("kv-cache", 1 << 20) as lease:
    t = torch.from_dlpack(lease)
```
"""

CASES = [
    # (name, README text, expect failure, texts the output must have)
    ("a C snippet allocating from kv-cache", HOLDER_BLOCK + "\n" + c_snippet("kv-cache"), True,
     ['cupool_alloc takes memory from pool "kv-cache", which has no IPC handle type',
      "configs/single-gpu-inference.yaml", "that can serve it: weights", "README.md:8"]),
    ("a C snippet allocating from weights", HOLDER_BLOCK + "\n" + c_snippet("weights"), False,
     ["its pools and buffers checked"]),
    ("a C snippet opening a buffer nobody makes", HOLDER_BLOCK + "\n" + c_snippet("weights").replace(
        "llama-8b-bf16", "nosuch"), True, ['opens buffer "nosuch"', "no block of the document makes"]),
    ("a skipped python snippet after its holder stopped", STOPPED_HOLDER_BLOCK + "\n" + SKIPPED_PYTHON, True,
     ['alloc takes memory from pool "kv-cache", which has no IPC handle type', "started last (at README.md:1)"]),
    ("a C snippet with no holder before it", c_snippet("weights"), True, ["no holder serves the document"]),
    ("python3 -c 'import numpy' with a python3 without numpy first on PATH",
     "```sh\npython3 -c 'import numpy'\n```\n", True,
     ["needs the python module numpy, which python3 ({venv}/bin/python3", "first on PATH",
      "setup.sh did not provide it to that python", "python3-numpy for /usr/bin/python3 only"]),
    ("a python block importing numpy with a python3 without numpy first on PATH",
     "```python\nimport numpy\n```\n", True, ["needs the python module numpy", "{venv}/bin/python3"]),
    ("a block that names setup.sh's python", "```sh\n/usr/bin/python3 -c 'import numpy'\n```\n", False, []),
]


def run_doc_test(args, root, path, k="README.md"):
    env = dict(os.environ, PATH=path)
    p = subprocess.run([sys.executable, os.path.join(HERE, "doc_test.py"), "--cupool", args.cupool,
                        "--client-lib", args.client_lib, "--root", root, "-k", k],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=600)
    return p.returncode, p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--client-lib", required=True)
    ap.add_argument("--root", required=True)
    args = ap.parse_args()
    args.cupool, args.client_lib, args.root = (os.path.abspath(a) for a in (args.cupool, args.client_lib, args.root))
    if subprocess.run(["/usr/bin/python3", "-c", "import numpy"], stderr=subprocess.DEVNULL).returncode != 0:
        print("skip: /usr/bin/python3 has no numpy (scripts/setup.sh installs python3-numpy)")
        return 77
    scratch = tempfile.mkdtemp(prefix="cupool-doc-checks-")
    failed = []
    try:
        # A user's python3 without numpy (pyenv, a venv), first on PATH.
        venv = os.path.join(scratch, "venv")
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", venv], check=True)
        path = os.path.join(venv, "bin") + ":" + os.environ.get("PATH", "/usr/bin:/bin")
        root = os.path.join(scratch, "root")
        os.makedirs(os.path.join(root, "docs"))
        for entry in LINKED:
            os.symlink(os.path.join(args.root, entry), os.path.join(root, entry))
        for name, text, fails, wanted in CASES:
            with open(os.path.join(root, "README.md"), "w") as f:
                f.write(text)
            rc, out = run_doc_test(args, root, path)
            wanted = [w.format(venv=venv) for w in wanted]
            missing = [w for w in wanted if w not in out]
            if (rc != 0) != fails or missing:
                failed.append(name)
                print(f"FAIL  {name}: doc_test.py exited {rc} (expected {'a failure' if fails else '0'})" +
                      "".join(f"\n  missing from its output: {w!r}" for w in missing) +
                      "\n  its output:\n" + "".join(f"    {line}\n" for line in out.rstrip().split("\n")), flush=True)
            else:
                print(f"ok    {name}", flush=True)
        # The README itself, with that python3 first on PATH.
        rc, out = run_doc_test(args, args.root, path)
        if rc != 0:
            failed.append("README.md with a python3 without numpy first on PATH")
            print("FAIL  README.md with a python3 without numpy first on PATH:\n" +
                  "".join(f"    {line}\n" for line in out.rstrip().split("\n")), flush=True)
        else:
            print("ok    README.md with a python3 without numpy first on PATH", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n{len(CASES) + 1 - len(failed)} of {len(CASES) + 1} checks held", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
