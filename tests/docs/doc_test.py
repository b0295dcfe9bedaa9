#!/usr/bin/env python3
"""The documentation, run as written, against a simulated node (ctest `docs`, label `text`).

What runs:
  - every fenced ```sh, ```bash and ```console block (console: the lines after `$ `) and every
    ```python block of README.md and docs/*.md (docs/man/ is the man page, not read here);
  - every example line under "Examples:" in the --help of every verb and sub-verb that
    `cupool --help` lists.

A block whose fence has `<!-- doc-test: skip REASON -->` on the line right before it is not run;
the reason is printed. No other `doc-test:` comment exists: an unknown one, or one not right
before a fence, fails the test.

Each document is one session, as a reader runs it: its blocks in order, in one scratch directory
that holds the repository's files as links (README.md's `configs/...`, `python/`, `tests/...`),
with `build/` holding the binary and the client library under test. Each block runs under
`bash -e -o pipefail`; the exported variables and the directory a block ends with carry into the
next one, and what a block starts in the background (`cupool hold ... &`) keeps serving the next
ones. A python block runs as `python3 BLOCK` with python/ on PYTHONPATH and CUPOOL_CLIENT_LIB set
(as python/cupool/_lib.py looks for the library), `python3` being the first on the user's PATH.
The environment is a fresh user's: PATH is the binary's folder (cupool on it) and then the PATH
this test inherited, as it is (the user's own python3 first where it is first: a block that needs
a module that python lacks fails, and the failure says which python3 ran, and whether
scripts/setup.sh provides that module to it or only to Debian's /usr/bin/python3), HOME is an
empty folder, XDG_RUNTIME_DIR one of
mode 0700 (as a login session has), no CUPOOL_* variable is
set (CUPOOL_PROFILE only where the document itself exports it), and as root without sudo a `sudo`
that runs its command with the environment kept (sudo -E; without root, help examples with
sudo are skipped). At the end every process the session started is stopped (each carries
CUPOOL_DOC_TEST=<session> in its environment; this test is their subreaper).

A block that is not run (a C snippet, or one marked skip) but calls the C API or the Python
package with a pool or buffer name (`cupool_alloc(conn, "NAME"`, `conn.alloc("NAME"`,
`open_buffer("NAME"`, `cupool.tensors("NAME"`, ...) is checked against the holder the document's
session has at that point (or, where the block before stopped it, the holder of the config the
document started last, started again for the question): a pool it takes memory from must exist
and have an IPC handle type, a buffer it opens must be held or made by a block of the document.

A document may state what its examples run against; the table SESSION_SETUP below makes that so
(docs/python.md: a holder of a shipped config on the simulated node, CUPOOL_SOCKET naming it, and
a python3 with numpy: the user's first where it has numpy, else setup.sh's /usr/bin/python3).

Help examples run one by one in a session of their own: a scratch directory with the
repository's files, `pools.yaml` (a copy of configs/single-gpu-inference.yaml), `model.safetensors`
(a small Llama-shaped set from tests/fuzz/safetensors-corpus/), `./train` and `./batch-job`
(stand-ins for a program: tests/docs/stand-in-program.sh), CUPOOL_PROFILE naming the bundled H100,
a holder of pools.yaml at CUPOOL_SOCKET (never the node's own), and for the examples of `keeper`,
CUPOOL_KEEPER naming a socket there (never the node's keeper). An example of `hold`, `keeper`, `exporter` or with
`--watch` runs until stopped: it passes when it is still running (or exited 0) after 1.5 s, and
keeps running, serving the examples after it, until the session ends; one that fails while an
earlier one of its verb runs is tried again once those are stopped (a socket or a port of theirs). tests/docs/help-skips.txt names the examples not run and why; an entry no help
prints any more fails the test.

  doc_test.py --cupool build/cupool --client-lib build/libcupool-client.so.1 --root . [-k TEXT] [--keep]

Exit status: 0 every block and example passed (or was skipped with its reason), 1 otherwise.
"""
import argparse
import ctypes
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

BLOCK_TIMEOUT = 30      # seconds a block or a one-shot help example may run
LONG_RUNNING_WAIT = 1.5  # seconds a command that runs until stopped must stay up (or exit 0)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUN_LANGUAGES = {"sh", "bash", "console", "python"}
SESSION_VAR = "CUPOOL_DOC_TEST"
# The repository's build trees are not what a reader has: build/ is made by the test instead.
NOT_LINKED = {".git", "build", "build-san", "build-tsan", "build-fuzz", "build-gpu"}

MARKER = re.compile(r"^\s*<!--\s*doc-test:(.*?)-->\s*$")
FENCE_OPEN = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`{]*)")


class Failed(Exception):
    pass


# ---- reading the documents ----

class Block:
    def __init__(self, doc, line, lang, lines, skip):
        self.doc = doc          # path relative to the root
        self.line = line        # 1-based line of the opening fence
        self.lang = lang
        self.lines = lines      # [(doc line number, text)]
        self.skip = skip        # reason, or None

    @property
    def where(self):
        return f"{self.doc}:{self.line}"

    def script(self):
        """(text to run, [doc line of each line of the text])."""
        if self.lang != "console":
            return "\n".join(t for _, t in self.lines) + "\n", [n for n, _ in self.lines]
        out, where, continued = [], [], False
        for n, t in self.lines:
            if continued or t.startswith("$ "):
                out.append(t[2:] if not continued else t)
                where.append(n)
                continued = t.rstrip().endswith("\\")
        return "\n".join(out) + "\n", where


def read_blocks(root, rel):
    """Every fenced block of the document, with its skip marker; raises Failed on a marker that is
    not `skip REASON` or not right before a fence."""
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if m:
            words = m.group(1).strip()
            if not re.match(r"^skip\s+\S", words):
                raise Failed(f"{rel}:{i + 1}: unknown doc-test marker {lines[i].strip()!r} "
                             "(the one form is <!-- doc-test: skip REASON -->)")
            if i + 1 >= len(lines) or not FENCE_OPEN.match(lines[i + 1]):
                raise Failed(f"{rel}:{i + 1}: a doc-test marker must be on the line right before a fence")
            i += 1
            continue
        m = FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3).lower()
        prev = MARKER.match(lines[i - 1]) if i > 0 else None
        skip = re.sub(r"^skip\s+", "", prev.group(1).strip()) if prev else None
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not re.match(r"^\s*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$",
                                               lines[i]):
            text = lines[i]
            body.append((i + 1, text[indent:] if text[:indent].strip() == "" else text.lstrip()))
            i += 1
        blocks.append(Block(rel, start, lang, body, skip))
        i += 1
    return blocks


def documents(root):
    docs = ["README.md"]
    docs += sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(root, "docs")) if n.endswith(".md"))
    return docs


# ---- sessions ----

def become_subreaper():
    """Orphans of the blocks (a holder whose shell has exited) become our children, so none is lost."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except OSError:
        pass


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class Session:
    """A scratch directory and a fresh user's environment; remembers nothing but what the blocks
    export and where they cd."""

    def __init__(self, args, name):
        self.args = args
        self.name = name
        self.id = uuid.uuid4().hex[:12]
        # Short paths: sockets live here (108 bytes at most).
        self.dir = tempfile.mkdtemp(prefix="cupool-doc-")
        self.state = tempfile.mkdtemp(prefix="cupool-doc-state-")
        for entry in sorted(os.listdir(args.root)):
            if entry not in NOT_LINKED:
                os.symlink(os.path.join(args.root, entry), os.path.join(self.dir, entry))
        build = os.path.join(self.dir, "build")
        os.mkdir(build)
        os.symlink(args.cupool, os.path.join(build, "cupool"))
        lib = os.path.basename(args.client_lib)
        os.symlink(args.client_lib, os.path.join(build, lib))
        if lib != "libcupool-client.so.1":
            os.symlink(args.client_lib, os.path.join(build, "libcupool-client.so.1"))
        bindir = os.path.join(self.state, "bin")
        os.mkdir(bindir)
        os.symlink(args.cupool, os.path.join(bindir, "cupool"))
        if os.geteuid() == 0:
            # Root's sudo, keeping the environment (CUPOOL_SOCKET, CUPOOL_KEEPER): a real sudo would
            # reset it and reach the node's own holder and keeper at their default sockets.
            with open(os.path.join(bindir, "sudo"), "w") as f:
                f.write('#!/bin/sh\n# sudo -E, as root: run the command as it is\nexec "$@"\n')
            os.chmod(os.path.join(bindir, "sudo"), 0o755)
        home = os.path.join(self.state, "home")
        os.mkdir(home)
        # A login session's runtime directory (pam_systemd's $XDG_RUNTIME_DIR: the user's, 0700),
        # where the README keeps the keeper's socket of a user without root.
        runtime = os.path.join(self.state, "run")
        os.mkdir(runtime, 0o700)
        user = pwd.getpwuid(os.geteuid()).pw_name
        self.env = {
            # The user's own PATH, as inherited (their python3 first where it is first), after the
            # binary's folder: never /usr/bin forced in front of what the user has.
            "PATH": bindir + ":" + os.environ.get("PATH", SYSTEM_PATH), "HOME": home, "USER": user, "LOGNAME": user,
            "SHELL": "/bin/bash", "LANG": "C.UTF-8", "TERM": "dumb", "XDG_RUNTIME_DIR": runtime,
            # The suite's TMPDIR (ctest gives each test its own and checks it is left empty), else a user's.
            "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
            SESSION_VAR: self.id,
        }
        self.cwd = self.dir
        self.started = []  # Popen of what the harness itself keeps running
        self.count = 0     # files of the blocks run so far

    def next(self):
        self.count += 1
        return self.count

    # a block of shell
    def run_shell(self, script, timeout=BLOCK_TIMEOUT, keep_state=True, env=None):
        """Runs `script` under bash -e -o pipefail; returns (rc, output, failed_line, timed_out).
        failed_line: the script's line (1-based) of the command that failed or was running."""
        n = self.next()
        path = os.path.join(self.state, f"block-{n}.sh")
        out_path = os.path.join(self.state, f"block-{n}.out")
        at = os.path.join(self.state, f"block-{n}.at")
        env_path = os.path.join(self.state, "env")
        cwd_path = os.path.join(self.state, "cwd")
        header = [
            "set -eo pipefail",
            # The line of the command running now (the traps' own commands are on the first lines).
            f"trap '(( LINENO <= 3 )) || echo \"$LINENO\" > {shlex.quote(at)}' DEBUG",
            f"trap '__rc=$?; trap - DEBUG; env -0 > {shlex.quote(env_path)}; pwd > {shlex.quote(cwd_path)}; "
            "exit $__rc' EXIT",
        ]
        with open(path, "w") as f:
            f.write("\n".join(header) + "\n" + script)
        for p in (env_path, cwd_path):
            if os.path.exists(p):
                os.unlink(p)
        with open(out_path, "wb") as out:
            # Output to a file, not a pipe: what the block leaves running keeps writing to it.
            p = subprocess.Popen(["bash", path], cwd=self.cwd, env=env or self.env, stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            timed_out = False
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                stop_group(p.pid)
                rc = p.wait()
        line = None
        try:
            with open(at) as f:
                line = int(f.read().strip()) - len(header)
        except (OSError, ValueError):
            pass
        if keep_state and not timed_out:
            self._load_state(env_path, cwd_path)
        with open(out_path, "rb") as f:
            output = f.read().decode("utf-8", "replace")
        return rc, output, line, timed_out

    def _load_state(self, env_path, cwd_path):
        try:
            with open(env_path, "rb") as f:
                entries = f.read().split(b"\0")
            with open(cwd_path) as f:
                cwd = f.read().rstrip("\n")
        except OSError:
            return
        env = {}
        for e in entries:
            k, sep, v = e.decode("utf-8", "replace").partition("=")
            if sep and k not in ("_", "SHLVL", "PWD", "OLDPWD"):
                env[k] = v
        env[SESSION_VAR] = self.id
        self.env = env
        if os.path.isdir(cwd):
            self.cwd = cwd

    # a block of python
    def run_python(self, code, timeout=BLOCK_TIMEOUT):
        n = self.next()
        path = os.path.join(self.state, f"block-{n}.py")
        with open(path, "w") as f:
            f.write(code)
        env = dict(self.env)
        env["PYTHONPATH"] = os.path.join(self.args.root, "python") + (
            ":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("CUPOOL_CLIENT_LIB", self.args.client_lib)
        out_path = path + ".out"
        with open(out_path, "wb") as out:
            p = subprocess.Popen(["python3", path], cwd=self.cwd, env=env, stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            timed_out = False
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                stop_group(p.pid)
                rc = p.wait()
        with open(out_path, "rb") as f:
            output = f.read().decode("utf-8", "replace")
        line = None
        for m in re.finditer(r'File "' + re.escape(path) + r'", line (\d+)', output):
            line = int(m.group(1))
        return rc, output, line, timed_out

    def start(self, argv, env_extra=None):
        """Starts a process the harness keeps running (a fixture holder); returns its Popen."""
        env = dict(self.env, **(env_extra or {}))
        log = open(os.path.join(self.state, f"fixture-{len(self.started)}.log"), "wb")
        p = subprocess.Popen(argv, cwd=self.dir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        p.log_path = log.name
        log.close()
        self.started.append(p)
        return p

    def processes(self):
        """Pids of the live processes that carry this session's mark."""
        mark = f"{SESSION_VAR}={self.id}".encode()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        with open(f"/proc/{entry}/stat") as s:
                            if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                                pids.append(int(entry))
            except OSError:
                pass
        return pids

    def close(self):
        """Stops every process of the session (SIGTERM, then SIGKILL after 5 s); returns how many
        were still running besides the harness's own (a session's holder)."""
        left = self.processes()
        ours = {p.pid for p in self.started}
        for pid in left:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            reap()
            if not self.processes():
                break
            time.sleep(0.05)
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for p in self.started:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        reap()
        if not self.args.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
            shutil.rmtree(self.state, ignore_errors=True)
        return len([pid for pid in left if pid not in ours])


def stop_group(pgid, grace=5.0):
    """SIGTERM to a process group, SIGKILL to what is left after `grace` seconds."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except OSError:
            return
        reap()  # orphans of a block are our children (subreaper): a zombie keeps its group alive
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def wait_for_socket(path, proc, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def start_holder(session, config, profile):
    """A holder of `config` on the simulated node `profile`, at <scratch>/cupool.sock; CUPOOL_SOCKET
    names it from then on."""
    sock = os.path.join(session.dir, "cupool.sock")
    p = session.start(["cupool", "hold", config, "--profile", profile, "--socket", sock])
    if not wait_for_socket(sock, p):
        with open(p.log_path, errors="replace") as f:
            raise Failed(f"the session's holder ({config}) did not start:\n{f.read()}")
    session.env["CUPOOL_SOCKET"] = sock
    return p


# What a document says its examples run against, made so before its first block.
def python_md_setup(session):
    start_holder(session, "configs/single-gpu-inference.yaml", "configs/profiles/h100.yaml")
    # "a python3 with numpy": the user's first python3 where it has numpy, else the one
    # scripts/setup.sh gave numpy (Debian's), first on PATH for this document only.
    found = python_of(session.env)
    if found and has_module(found[0], "numpy", session.env):
        print(f"   session: python3 is {found[0]} (Python {found[2]}, first on PATH), which has numpy", flush=True)
        return
    if not has_module(SYSTEM_PYTHON, "numpy", session.env):
        raise Failed(f"its examples need a python3 with numpy (as its opening says), and neither "
                     f"{found[0] if found else 'the python3 on PATH'} nor {SYSTEM_PYTHON} has it: run scripts/setup.sh "
                     "(python3-numpy), or python3 -m pip install numpy")
    bindir = os.path.join(session.state, "python-with-numpy")
    os.mkdir(bindir)
    os.symlink(SYSTEM_PYTHON, os.path.join(bindir, "python3"))
    session.env["PATH"] = bindir + ":" + session.env["PATH"]
    print(f"   session: python3 is {SYSTEM_PYTHON} (setup.sh's, with numpy): "
          f"{found[0] if found else 'the python3 on PATH'} has no numpy", flush=True)


SESSION_SETUP = {
    "docs/python.md": ("a holder of configs/single-gpu-inference.yaml on the simulated H100, CUPOOL_SOCKET "
                       "naming its socket, and a python3 with numpy (as the document's opening says)",
                       python_md_setup),
}


# ---- the python3 a block runs with ----

SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's python3: the one setup.sh's python3-* packages serve
MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([^'.]+)")


def setup_python_modules(root):
    """{module: Debian package} that scripts/setup.sh installs for /usr/bin/python3 (its python3-*
    packages; python3-pip and python3-venv are tools, not modules a block imports)."""
    try:
        with open(os.path.join(root, "scripts", "setup.sh"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return {}
    m = re.search(r"^PACKAGES=\((.*?)\)", text, re.S | re.M)
    out = {}
    for pkg in (m.group(1).split() if m else []):
        if pkg.startswith("python3-") and pkg not in ("python3-pip", "python3-venv"):
            out[pkg[len("python3-"):].replace("-", "_")] = pkg
    return out


def python_of(env, exe=None):
    """(the python3 first on env's PATH (or exe), the interpreter it runs, its version, its
    sys.prefix: a venv's is its own, Debian's /usr); None where there is no such python3."""
    exe = exe or shutil.which("python3", path=env.get("PATH", ""))
    if not exe or not os.access(exe, os.X_OK):
        return None
    try:
        p = subprocess.run([exe, "-c", "import sys; print(sys.executable); print(sys.version.split()[0]); "
                            "print(sys.prefix)"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True, timeout=30)
        real, version, prefix = p.stdout.split("\n")[:3]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        real, version, prefix = exe, "?", "?"
    return exe, real, version, prefix


def has_module(python, module, env):
    try:
        return subprocess.run([python, "-c", f"import {module}"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def missing_module_why(root, env, output):
    """Why a block failed when its output says a module is missing: which python3 ran it (the first
    on the user's PATH), and whether scripts/setup.sh provides that module to it; None otherwise."""
    m = MISSING_MODULE.search(output)
    if not m:
        return None
    module = m.group(1)
    found = python_of(env)
    if not found:
        return f"the block needs the python module {module}, and there is no python3 on PATH"
    exe, real, version, prefix = found
    which = f"python3 ({exe}" + (f", that is {real}" if real != exe else "") + f", Python {version}: the first on PATH)"
    provided = setup_python_modules(root)
    system = python_of(env, SYSTEM_PYTHON)
    if module in provided and system and (os.path.realpath(real), prefix) == (os.path.realpath(system[1]), system[3]):
        return (f"the block needs the python module {module}, which {which} lacks; scripts/setup.sh installs it "
                f"for this python ({provided[module]}): run scripts/setup.sh")
    if module in provided:
        there = " (it has it)" if has_module(SYSTEM_PYTHON, module, env) else ""
        return (f"the block needs the python module {module}, which {which} lacks, and scripts/setup.sh did not "
                f"provide it to that python: setup installs {provided[module]} for {SYSTEM_PYTHON} only{there}. "
                f"The document must say which python the block needs and run that one, or tell the reader to "
                f"give theirs {module} (python3 -m pip install {module})")
    return (f"the block needs the python module {module}, which {which} lacks, and scripts/setup.sh provides it "
            f"to no python: the document must say how to get it, or the block not need it")


# ---- snippets that are not run: the pools and buffers they name ----

# Calls of the C API and the Python package that name a pool (to take memory from it: it must
# serve other processes, so it needs an IPC handle type) or a buffer (it must exist).
SNIPPET_CALLS = [
    ("pool", re.compile(r'\b(?P<call>cupool_alloc)\s*\(\s*[^,()]+,\s*"(?P<name>[^"]*)"')),
    ("pool", re.compile(r'\.(?P<call>alloc)\(\s*(?:pool\s*=\s*)?(?P<q>["\'])(?P<name>.*?)(?P=q)')),
    ("buffer", re.compile(r'\b(?P<call>cupool_open_buffer(?:_part|_on)?)\s*\(\s*[^,()]+,\s*"(?P<name>[^"]*)"')),
    ("buffer", re.compile(r'\.(?P<call>open_buffer)\(\s*(?:name\s*=\s*)?(?P<q>["\'])(?P<name>.*?)(?P=q)')),
    ("buffer", re.compile(r'\b(?P<call>cupool\.tensors)\(\s*(?:name\s*=\s*)?(?P<q>["\'])(?P<name>.*?)(?P=q)')),
]
MADE_BUFFER = re.compile(r"\bcupool\s+buffer\s+(?:create|load)\s+([a-z0-9][a-z0-9._-]*)")


def snippet_uses(block):
    """[(doc line, 'pool'|'buffer', call, name)] of the calls in a block."""
    out = []
    for n, text in block.lines:
        for kind, rx in SNIPPET_CALLS:
            for m in rx.finditer(text):
                out.append((n, kind, m.group("call"), m.group("name")))
    return out


HOLD_COMMAND = re.compile(r"\bcupool\s+hold\s+(?!-)(\S+)(.*)")


def holds_started(block):
    """[(config, --profile or None)] of the `cupool hold CONFIG` commands of a block."""
    out = []
    for _, text in block.lines:
        m = HOLD_COMMAND.search(re.sub(r"\s#.*$", "", text))
        if m:
            prof = re.search(r"--profile[= ](\S+)", m.group(2))
            out.append((m.group(1), prof.group(1) if prof else None))
    return out


def holder_status(session, last_hold):
    """(`cupool status --format json` of the holder the document's session has at this point, what
    it is) or (None, why not). Where no holder runs there (the block before stopped it), the
    holder the document started last is started again, of the same config on the same node, at a
    socket of its own, for the question only."""
    def status(env, cwd):
        return subprocess.run(["cupool", "status", "--format", "json"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=BLOCK_TIMEOUT)
    p = status(session.env, session.cwd)
    if p.returncode == 0:
        return json.loads(p.stdout), "the document's holder here"
    if not last_hold:
        return None, f"cupool status: {p.stderr.strip() or 'exit ' + str(p.returncode)}"
    config, profile, cwd, where = last_hold
    sock = os.path.join(session.state, f"snippet-{session.next()}.sock")
    env = {k: v for k, v in session.env.items() if k != "CUPOOL_KEEPER"}  # never the session's keeper
    env["CUPOOL_SOCKET"] = sock
    argv = ["cupool", "hold", config, "--socket", sock] + (["--profile", profile] if profile else [])
    log = os.path.join(session.state, "snippet-holder.log")
    with open(log, "wb") as out:
        h = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        if not wait_for_socket(sock, h):
            with open(log, errors="replace") as f:
                return None, f"the holder of {config} the document started at {where} did not start again:\n{f.read()}"
        p = status(env, cwd)
        if p.returncode != 0:
            return None, f"cupool status of the holder of {config} (as at {where}): {p.stderr.strip()}"
        return json.loads(p.stdout), f"the holder of {config} the document started last (at {where})"
    finally:
        stop_group(h.pid)
        h.wait()


def check_snippet(session, block, made_buffers, last_hold):
    """A block that is not run (C, or marked skip) against the holder the document's session has
    at this point, as its reader's would be: every pool it takes memory from exists and has an IPC
    handle type, every buffer it opens is held or made by a block of the document. Returns
    [(where, what is wrong)]."""
    uses = snippet_uses(block)
    if not uses:
        return []
    status, holder = holder_status(session, last_hold)
    if status is None:
        return [(f"{block.doc}:{uses[0][0]}",
                 f"the snippet uses {uses[0][1]} \"{uses[0][3]}\" ({uses[0][2]}), but no holder serves the "
                 f"document at this point ({holder}): start the holder the "
                 "snippet talks to in a block before it, as its reader would")]
    config = status.get("holder", {}).get("config", "?")
    pools = {}
    for pool in status.get("pools", []):
        pools.setdefault(pool["name"], set()).update(pool.get("handle_types") or [])
    usable = sorted(n for n, h in pools.items() if "posix_fd" in h)
    buffers = {b["name"] for b in status.get("buffers", [])} | made_buffers
    wrong = []
    for line, kind, call, name in uses:
        where = f"{block.doc}:{line}"
        if kind == "pool":
            if name not in pools:
                wrong.append((where, f"{call} takes memory from pool \"{name}\", which the config of {holder} "
                                     f"({config}) does not have; its pools: "
                                     f"{', '.join(sorted(pools)) or 'none'}"))
            elif "posix_fd" not in pools[name]:
                wrong.append((where, f"{call} takes memory from pool \"{name}\", which has no IPC handle type "
                                     f"in the config of {holder} ({config}): another "
                                     "process can't get memory from it (the holder answers InvalidArgument); "
                                     f"pools of that config that can serve it: {', '.join(usable) or 'none'}"))
        elif name not in buffers:
            wrong.append((where, f"{call} opens buffer \"{name}\", which {holder} ({config}) "
                                 f"does not hold ({', '.join(sorted(buffers)) or 'none'}) and no block of the "
                                 "document makes (cupool buffer create|load)"))
    return wrong


# ---- reporting ----

class Report:
    def __init__(self):
        self.ran = 0
        self.skipped = []
        self.failures = []

    def ok(self, where, what, seconds):
        self.ran += 1
        print(f"ran   {where} ({what}, {seconds:.1f} s)", flush=True)

    def skip(self, where, reason):
        self.skipped.append((where, reason))
        print(f"skip  {where}: {reason}", flush=True)

    def fail(self, where, command, rc, output, timed_out, block=None, timeout=BLOCK_TIMEOUT, how=None, why=None):
        self.failures.append(where)
        how = how or (f"timed out after {timeout} s" if timed_out else f"exit code {rc}")
        if block and block != where:
            how += f" (the block at {block})"
        text = output if len(output) < 8000 else output[:2000] + "\n[...]\n" + output[-5000:]
        shown = "".join("    " + l + "\n" for l in text.rstrip("\n").split("\n")) if text.strip() else "    (none)\n"
        print(f"FAIL  {where}: {how}\n  command: {command}\n  output:\n{shown}" + (f"  why: {why}\n" if why else ""),
              flush=True)


def foreground_server(block, script_lines):
    """(doc line, command) of a command in the block that runs until stopped (hold, keeper,
    exporter, stats --watch) and is not sent to the background with `&`; None if there is none."""
    for n, (doc_line, text) in enumerate(zip(script_lines, block.script()[0].split("\n"))):
        code = re.sub(r"\s#.*$", "", text)
        if runs_until_stopped(code.strip()) or re.search(r"\bcupool\s+(hold|keeper|exporter)\b(?!.*--(list|release|help))", code) \
                or re.search(r"\bcupool\s+(stats|ledger)\b.*--watch", code):
            if not re.search(r"(?<![&>])&(?![&>])", code):
                return doc_line, text.strip()
    return None


def failing_command(block, script_lines, line):
    """(where, command) of the failing script line, when known."""
    if line is None or not (1 <= line <= len(script_lines)):
        return block.where, "\n".join(t for _, t in block.lines)
    doc_line = script_lines[line - 1]
    text = next(t for n, t in block.lines if n == doc_line)
    return f"{block.doc}:{doc_line}", text.strip()


def run_document(args, rel, report):
    blocks = read_blocks(args.root, rel)
    if args.k:
        blocks = [b for b in blocks if args.k in b.where or args.k in rel]
    runnable = [b for b in blocks if b.lang in RUN_LANGUAGES]
    # Not run (C, or marked skip) but naming pools or buffers: checked against the session's holder.
    checked = [b for b in blocks if (b.lang not in RUN_LANGUAGES or b.skip) and snippet_uses(b)]
    if not runnable and not checked:
        return
    print(f"== {rel}: {len(runnable)} blocks of {', '.join(sorted(RUN_LANGUAGES))}"
          + (f", {len(checked)} not run whose pools and buffers are checked" if checked else ""), flush=True)
    made_buffers = {m.group(1) for b in read_blocks(args.root, rel) for _, t in b.lines for m in MADE_BUFFER.finditer(t)}
    session = Session(args, rel)
    last_hold = None  # (config, --profile, cwd, where) of the last `cupool hold` a block ran
    try:
        if rel in SESSION_SETUP:
            what, setup = SESSION_SETUP[rel]
            print(f"   session: {what}", flush=True)
            setup(session)
        for b in blocks:
            if b in checked:
                t = time.monotonic()
                wrong = check_snippet(session, b, made_buffers, last_hold)
                lines = {f"{b.doc}:{n}": x.strip() for n, x in b.lines}
                for where, what in wrong:
                    report.fail(where, lines.get(where, b.where), None, "", False, block=b.where, how=what)
                if b.skip:
                    report.skip(b.where, b.skip + ("; its pools and buffers checked" if not wrong else ""))
                elif not wrong:
                    report.ok(b.where, f"{b.lang or 'text'} not run: its pools and buffers checked",
                              time.monotonic() - t)
                continue
            if b not in runnable:
                continue
            if b.skip:
                report.skip(b.where, b.skip)
                continue
            text, script_lines = b.script()
            if b.lang != "python":
                bad = foreground_server(b, script_lines)
                if bad:
                    line, command = bad
                    report.fail(f"{b.doc}:{line}", command, None, "", False, block=b.where,
                                how="runs until stopped: put it in the background (`&`) as a reader would, or "
                                    "mark the block <!-- doc-test: skip REASON -->")
                    continue
            t = time.monotonic()
            env, cwd = dict(session.env), session.cwd
            for config, profile in holds_started(b) if b.lang != "python" else []:
                last_hold = (config, profile, cwd, b.where)
            if b.lang == "python":
                rc, output, line, timed_out = session.run_python(text)
                where = f"{b.doc}:{b.lines[line - 1][0]}" if line and line <= len(b.lines) else b.where
                command = text.strip() if where == b.where else b.lines[line - 1][1].strip()
            else:
                rc, output, line, timed_out = session.run_shell(text)
                where, command = failing_command(b, script_lines, line)
            if rc == 0 and not timed_out:
                report.ok(b.where, b.lang, time.monotonic() - t)
            else:
                report.fail(where, command, rc, output, timed_out, block=b.where,
                            why=missing_module_why(args.root, env, output))
    except Failed as e:
        report.failures.append(rel)
        print(f"FAIL  {rel}: {e}", flush=True)
    finally:
        left = session.close()
        if left:
            print(f"   stopped {left} process(es) the blocks of {rel} left running", flush=True)


# ---- the examples of every verb's --help ----

def help_text(args, path):
    p = subprocess.run([args.cupool] + path + ["--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env={"PATH": SYSTEM_PATH, "HOME": "/nonexistent", "NO_COLOR": "1"}, timeout=30)
    if p.returncode != 0:
        raise Failed(f"`cupool {' '.join(path + ['--help'])}` exited {p.returncode}:\n{p.stdout}")
    return p.stdout


def section(text, title):
    """The lines of an indented section ("Subcommands:", "Examples:") of a help text."""
    lines = text.split("\n")
    for i, l in enumerate(lines):
        if l.strip() == title and not l.startswith(" "):
            out = []
            for l2 in lines[i + 1:]:
                if not l2.strip() or not l2.startswith(" "):
                    break
                out.append(l2)
            return out
    return []


def verbs(text):
    return [m.group(1) for l in section(text, "Subcommands:") for m in [re.match(r"^  ([a-z][a-z0-9-]*)(\s|$)", l)]
            if m]


def help_examples(args):
    """[(verb path, example line)] in the order `cupool --help` lists the verbs."""
    out = []

    def walk(path):
        text = help_text(args, path)
        out.extend((path, l.strip()) for l in section(text, "Examples:"))
        for v in verbs(text):
            walk(path + [v])

    for v in verbs(help_text(args, [])):
        walk([v])
    return out


def read_help_skips(path):
    """{example line: reason} from tests/docs/help-skips.txt."""
    skips, example = {}, None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            if line.startswith("    skip: "):
                if example is None:
                    raise Failed(f"{path}:{n}: a reason with no example before it")
                skips[example] = line[len("    skip: "):].strip()
                example = None
            elif line.startswith(" "):
                raise Failed(f"{path}:{n}: an example starts at the line's first column; its reason is '    skip: ...'")
            else:
                if example is not None:
                    raise Failed(f"{path}:{n}: {example!r} has no '    skip: REASON' line")
                example = line.rstrip("\n")
    if example is not None:
        raise Failed(f"{path}: {example!r} has no '    skip: REASON' line")
    return skips


def runs_until_stopped(example):
    """Whether the example is a command that serves until it is stopped."""
    if re.search(r"\bcupool\s+(stats|ledger)\b.*--watch", example):
        return True
    return bool(re.match(r"^(sudo\s+)?cupool\s+(hold|keeper|exporter)\b", example)) and \
        not re.search(r"--(list|release|help)\b", example)


def run_help_examples(args, report):
    here = os.path.dirname(os.path.abspath(__file__))
    skips = read_help_skips(os.path.join(here, "help-skips.txt"))
    examples = help_examples(args)
    if args.k:
        examples = [(p, e) for p, e in examples if args.k in e or args.k == "help"]
    seen = {e for _, e in examples}
    stale = [e for e in skips if e not in seen]
    if stale and not args.k:
        report.failures.append("tests/docs/help-skips.txt")
        print("FAIL  tests/docs/help-skips.txt names examples no --help prints any more (remove them):\n" +
              "".join(f"    {e}\n" for e in stale), flush=True)
    if not examples:
        return
    print(f"== cupool VERB --help: {len(examples)} examples", flush=True)
    session = Session(args, "help")
    running = {}  # verb -> [pgid] of its examples that run until stopped, still running
    try:
        shutil.copy(os.path.join(args.root, "configs/single-gpu-inference.yaml"), os.path.join(session.dir, "pools.yaml"))
        shutil.copy(os.path.join(args.root, "tests/fuzz/safetensors-corpus/model.safetensors"),
                    os.path.join(session.dir, "model.safetensors"))
        for name in ("train", "batch-job"):
            dst = os.path.join(session.dir, name)
            shutil.copy(os.path.join(here, "stand-in-program.sh"), dst)
            os.chmod(dst, 0o755)
        session.env["CUPOOL_PROFILE"] = os.path.join(args.root, "configs/profiles/h100.yaml")
        # The keeper's examples get a socket of their own, never the node's keeper at
        # /run/cupool/keeper.sock (`keeper --release` would free its buffers). Only theirs: with
        # CUPOOL_KEEPER set, `hold` would wait for a keeper.
        verb_env = {"keeper": {"CUPOOL_KEEPER": os.path.join(session.dir, "keeper.sock")}}
        start_holder(session, "pools.yaml", session.env["CUPOOL_PROFILE"])
        print(f"   session: pools.yaml (configs/single-gpu-inference.yaml) held on the simulated H100 at "
              f"CUPOOL_SOCKET; CUPOOL_PROFILE={session.env['CUPOOL_PROFILE']}", flush=True)
        for path, example in examples:
            where = f"cupool {' '.join(path)} --help"
            if example in skips:
                report.skip(f"{where}: {example}", skips[example])
                continue
            if example.startswith("sudo ") and os.geteuid() != 0:
                report.skip(f"{where}: {example}", "needs root (sudo); this test runs as another user")
                continue
            t = time.monotonic()
            env = dict(session.env, **verb_env.get(path[0], {}))
            if runs_until_stopped(example):
                rc, output, timed_out, pgid = run_until_stopped(session, example, env)
                if rc not in (None, 0) and running.get(path[0]):
                    # As a reader would: stop the one started before (its socket, its port), try again.
                    for g in running.pop(path[0]):
                        stop_group(g)
                    rc, output, timed_out, pgid = run_until_stopped(session, example, env)
                if rc is None:
                    running.setdefault(path[0], []).append(pgid)
                    report.ok(f"{where}: {example}", f"still running after {LONG_RUNNING_WAIT} s", time.monotonic() - t)
                elif rc == 0:
                    report.ok(f"{where}: {example}", "exited 0", time.monotonic() - t)
                else:
                    report.fail(f"{where}", example, rc, output, False)
                continue
            rc, output, _, timed_out = session.run_shell(example + "\n", keep_state=False, env=env)
            if rc == 0 and not timed_out:
                report.ok(f"{where}: {example}", "sh", time.monotonic() - t)
            else:
                report.fail(where, example, rc, output, timed_out)
    except Failed as e:
        report.failures.append("help")
        print(f"FAIL  cupool VERB --help: {e}", flush=True)
    finally:
        for groups in running.values():
            for g in groups:
                stop_group(g)
        left = session.close()
        if left:
            print(f"   stopped {left} process(es) the examples left running", flush=True)


def run_until_stopped(session, example, env):
    """Starts `example`; (None, output, False, pgid) when it still runs after LONG_RUNNING_WAIT
    seconds, else (rc, output, False, None)."""
    n = session.next()
    out_path = os.path.join(session.state, f"long-{n}.out")
    with open(out_path, "wb") as out:
        p = subprocess.Popen(["bash", "-o", "pipefail", "-c", example], cwd=session.dir, env=env,
                             stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = p.wait(timeout=LONG_RUNNING_WAIT)
    except subprocess.TimeoutExpired:
        rc = None
    with open(out_path, "rb") as f:
        output = f.read().decode("utf-8", "replace")
    return rc, output, False, (p.pid if rc is None else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--client-lib", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("-k", help="run only the blocks whose file:line or document contains TEXT ('help': the examples)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directories")
    args = ap.parse_args()
    args.cupool = os.path.abspath(args.cupool)
    args.client_lib = os.path.abspath(args.client_lib)
    args.root = os.path.abspath(args.root)
    become_subreaper()
    report = Report()
    t = time.monotonic()
    for rel in documents(args.root):
        if args.k == "help":
            break
        try:
            run_document(args, rel, report)
        except Failed as e:
            report.failures.append(rel)
            print(f"FAIL  {e}", flush=True)
    if not args.k or args.k == "help" or not any(args.k in d for d in documents(args.root)):
        run_help_examples(args, report)
    print(f"\n{report.ran} ran, {len(report.skipped)} skipped, {len(report.failures)} failed "
          f"in {time.monotonic() - t:.1f} s", flush=True)
    if report.failures:
        print("failed: " + ", ".join(report.failures), flush=True)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
