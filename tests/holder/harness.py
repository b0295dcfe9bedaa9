"""What the holder's scenario suites share: a running holder on a simulated node (or the real
driver), a client written from docs/protocol.md alone (RawClient), the C test client run as any
user, and the CLI. holder_test.py (features, load, faults) and hostile_test.py (attacks) use it.
"""
import json
import os
import pwd
import resource
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import traceback

sys_path_schema = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "schema")
if sys_path_schema not in __import__("sys").path:
    __import__("sys").path.insert(0, sys_path_schema)
import output as machine_output  # noqa: E402  (schemas/cupool-*-v1: every --format json/yaml output is validated)

ARGS = None
PROFILE = None  # the simulated node's profile; None with --gpu (the real driver)

CONFIG = """version: 1
holder:
  socket: {socket}
  mode: "0666"
pools:
  - name: kv
    devices: [0]
    handle_types: [posix_fd]
    max_size: 1GiB
    release_threshold: max
    reserve: 64MiB
    share: {{users: [{user}], quota_per_client: 512MiB}}
  - name: private
    devices: [0]
    handle_types: [posix_fd]
    max_size: 256MiB
buffers:
  - {{name: shared, pool: kv, device: 0, size: 8MiB}}
"""


class Failure(Exception):
    pass


class Skip(Exception):
    """A scenario that can't run here (no second user, no GPU, a sanitized library)."""


def check(condition, message):
    if not condition:
        raise Failure(message)


# ---- a client written from docs/protocol.md ----

class RawClient:
    MAGIC = b"CUPL"

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        deadline = time.time() + 10
        while True:
            try:
                self.sock.connect(path)
                break
            except BlockingIOError:  # the listen backlog is full (a timeout makes the socket non-blocking)
                if time.time() > deadline:
                    raise
                time.sleep(0.01)
        self.next_id = 1
        self.notices = []
        self.parts = 0  # kind 4 frames before the last reply

    def send_frame(self, body, kind=1):
        payload = json.dumps(body).encode()
        self.sock.sendall(self.MAGIC + struct.pack("<HHII", 1, kind, len(payload), 0) + payload)

    def _recv_exact(self, n, fds):
        data = b""
        while len(data) < n:
            msg, got_fds, _flags, _addr = socket.recv_fds(self.sock, n - len(data), 4)
            if not msg:
                raise EOFError("the holder closed the connection")
            fds.extend(got_fds)
            data += msg
        return data

    def receive(self):
        """One message: (kind, body, fds). A reply in parts (kind 4 frames, then kind 2) is joined."""
        fds, payload, parts = [], b"", 0
        while True:
            header = self._recv_exact(16, fds)
            check(header[:4] == self.MAGIC, "bad magic from the holder")
            version, kind, length, nfds = struct.unpack("<HHII", header[4:])
            check(version == 1 and kind in (2, 3, 4) and 2 <= length <= 65536, f"bad header {header!r}")
            check(nfds == 0 or (nfds == 1 and kind != 4), f"{nfds} descriptors on a frame of kind {kind}")
            check(kind != 3 or parts == 0, "a notice between the parts of a reply")
            payload += self._recv_exact(length, fds)
            check(len(payload) <= 16 << 20, "a reply over 16 MiB")
            if kind == 4:
                parts += 1
                continue
            check(len(fds) == nfds, f"header says {nfds} descriptors, got {len(fds)}")
            self.parts = parts
            return kind, json.loads(payload), fds

    def request(self, op, **args):
        rid = self.next_id
        self.next_id += 1
        self.send_frame(dict(id=rid, op=op, **args))
        while True:
            kind, body, fds = self.receive()
            if kind == 3:
                self.notices.append(body)
                continue
            check(body.get("id") == rid, f"reply for {body.get('id')} while waiting for {rid}")
            return body, fds

    def hello(self, protocol=1):
        body, _ = self.request("hello", protocol=protocol, client="raw-python")
        check(body["ok"], f"hello refused: {body}")
        return body

    def close(self):
        self.sock.close()


# ---- running things ----

class Holder:
    def __init__(self, tmp, config_text=None, extra=(), nofile=None, env=None, profile=None, log_level="info",
                 started=True):
        self.tmp = tmp
        self.socket = os.path.join(tmp, "cupool.sock")
        self.config = os.path.join(tmp, "cupool.yaml")
        if config_text is None:
            config_text = CONFIG.format(socket=self.socket, user="cupool-test-nobody")
        with open(self.config, "w") as f:
            f.write(config_text)
        self.log_path = os.path.join(tmp, "holder.log")
        self.log = open(self.log_path, "a")
        node = ["--profile", profile or PROFILE] if (profile or PROFILE) else []
        self.proc = subprocess.Popen([ARGS.cupool, "--log-level", log_level, "hold", self.config, "--drain-timeout", "3"]
                                     + node + list(extra),
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile)) if nofile else None)
        self.wait_ready(started)

    def wait_ready(self, started=True):
        """Until the holder answers hello; with `started`, until its start is over too (it listens
        before the driver is up: status says holder.start.state "ready")."""
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise Failure(f"holder exited with {self.proc.returncode}:\n{self.text()}")
            try:
                c = RawClient(self.socket)
                c.hello()
                if started:
                    body, _ = c.request("status")
                    start = body.get("holder", {}).get("start")
                    if start and start["state"] != "ready":
                        c.close()
                        time.sleep(0.02)
                        continue
                c.close()
                return
            except (OSError, EOFError):
                time.sleep(0.05)
        raise Failure("holder did not start listening:\n" + self.text())

    def text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise Failure("holder did not stop within %d s:\n%s" % (timeout, self.text()))
        self.log.close()
        # A sanitizer build (CUPOOL_TSAN, CUPOOL_SANITIZE) reports into the holder's log.
        text = self.text()
        for marker in ("WARNING: ThreadSanitizer", "ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer"):
            check(marker not in text, f"the holder's log has a sanitizer report:\n{text}")
        return self.proc.returncode

    def fds(self):
        """How many descriptors the holder has open (/proc/PID/fd)."""
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def fd_list(self):
        out = []
        for name in sorted(os.listdir(f"/proc/{self.proc.pid}/fd"), key=int):
            try:
                out.append(f"{name} -> {os.readlink(f'/proc/{self.proc.pid}/fd/{name}')}")
            except OSError:
                pass
        return out

    def idle_fds(self, pool="kv"):
        """The holder's descriptor count once no client but a checker has come and gone: waits until
        status shows only itself and the count stays the same for a while. First one client imports
        `pool` and allocates from it, so what a driver opens on first use is open already."""
        warm = RawClient(self.socket)
        warm.hello()
        body, fds = warm.request("import_pool", pool=pool, device=0)
        for fd in fds:
            os.close(fd)
        body, _ = warm.request("alloc", pool=pool, device=0, size=1 << 20)
        check(body["ok"], f"warm-up alloc: {body}")
        warm.request("free", lease=body["lease"])
        warm.close()
        deadline = time.time() + 10
        while time.time() < deadline:
            if len(status(self)["clients"]) == 1:
                counts = []
                for _ in range(4):
                    time.sleep(0.05)
                    counts.append(self.fds())
                if len(set(counts)) == 1:
                    return counts[0]
            time.sleep(0.05)
        raise Failure("the holder's descriptors did not settle: " + "; ".join(self.fd_list()))

    def wait_fds(self, expected, timeout=10):
        """Waits until the holder has `expected` descriptors open; fails with the list otherwise."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.fds() == expected:
                return
            time.sleep(0.05)
        raise Failure(f"the holder has {self.fds()} descriptors open, {expected} before (leaked?): "
                      + "; ".join(self.fd_list()))


def cupool(*args, socket_path=None, stdin=None, check_rc=None, env=None):
    env = dict(os.environ, **(env or {}))
    if socket_path:
        env["CUPOOL_SOCKET"] = socket_path
    r = subprocess.run([ARGS.cupool] + list(args), capture_output=True, text=True, env=env, input=stdin, timeout=60)
    if check_rc is not None and r.returncode != check_rc:
        raise Failure(f"cupool {' '.join(args)}: exit {r.returncode}, expected {check_rc}\n{r.stdout}{r.stderr}")
    try:
        machine_output.check_command(args, r.stdout)
    except machine_output.OutputError as e:
        raise Failure(str(e)) from e
    return r


def client(holder, *args, user=None, input_text=None, timeout=60):
    cmd = [ARGS.testclient_copy, holder.socket] + [str(a) for a in args]
    if user:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--clear-groups"] + cmd
    env = dict(os.environ, LD_LIBRARY_PATH=library_path())
    return subprocess.run(cmd, capture_output=True, text=True, input=input_text, timeout=timeout, env=env)


def library_path():
    """LD_LIBRARY_PATH for the copies in the shared folder (the client library beside them), keeping
    what the environment had (a machine whose build found libraries outside the system's)."""
    here = os.environ.get("LD_LIBRARY_PATH")
    return os.path.dirname(ARGS.testclient_copy) + (":" + here if here else "")


def status(holder):
    return json.loads(cupool("status", "--format", "json", socket_path=holder.socket, check_rc=0).stdout)


def stats(holder):
    return json.loads(cupool("stats", "--format", "json", socket_path=holder.socket, check_rc=0).stdout)


def pool_stat(holder, name, device=0):
    for p in stats(holder)["pools"]:
        if p["name"] == name and p["device"] == device:
            return p
    raise Failure(f"no pool {name} on device {device} in stats")



def other_user():
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return None
    for name in ("nobody", "daemon"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            pass
    return None


def setup(args, gpu):
    """Sets the suite's arguments (ARGS, PROFILE) and copies the C client and its library where any
    user may run them (scenarios with a second user). Returns the folder to remove at the end."""
    global ARGS, PROFILE
    ARGS = args
    ARGS.cupool = os.path.abspath(ARGS.cupool)
    bindir = tempfile.mkdtemp(prefix="cupool-bin-")
    os.chmod(bindir, 0o755)
    # The node profile too: a holder run as another user must read it, and a checkout may lie
    # where only its owner can reach (a clone in a 0700 directory).
    PROFILE = None if gpu else shutil.copy(os.path.join(ARGS.root, "configs", "profiles", "h100.yaml"), bindir)
    ARGS.testclient_copy = shutil.copy(ARGS.testclient, bindir)
    shutil.copy(os.path.realpath(ARGS.client_lib), os.path.join(bindir, "libcupool-client.so.1"))
    ARGS.client_lib_copy = os.path.join(bindir, "libcupool-client.so.1")
    return bindir


def sanitized(name=""):
    """Whether the binaries run under a sanitizer (any, or the one named)."""
    return bool(ARGS.sanitizer) and (not name or name in ARGS.sanitizer.split(","))


def slowness():
    """How much slower than build/ the binaries run: a sanitized tree is a Debug build (ASan,
    UBSan) or instrumented (TSan); limits of time are multiplied by this there."""
    return 10 if ARGS.sanitizer else 1


def client_library_path():
    """The C client library's path, for ctypes in this process or in a Python run as another user.
    A sanitized library can't go into an unsanitized python3 (the sanitizer's runtime must come
    first): the scenario is skipped there; the C test client covers the library in those trees."""
    if ARGS.sanitizer:
        raise Skip("a sanitized client library can't be loaded into python3 (build/ runs it)")
    return ARGS.client_lib_copy


def client_library():
    import ctypes
    return ctypes.CDLL(client_library_path())


def run_scenarios(scenarios, what):
    """Runs each (name, function) with a fresh temporary folder; returns the exit status."""
    failed = []
    for name, fn in scenarios:
        tmp = tempfile.mkdtemp(prefix="cupool-holder-")
        start = time.time()
        try:
            fn(tmp)
            print(f"ok    {name} ({time.time() - start:.1f} s)", flush=True)
        except Skip as e:
            print(f"skip  {name}: {e}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every scenario
            failed.append(name)
            print(f"FAIL  {name}: {e}", flush=True)
            traceback.print_exc()
        finally:
            if not os.environ.get("CUPOOL_KEEP_TMP"):
                shutil.rmtree(tmp, ignore_errors=True)
    counts = machine_output.counts
    print(f"{sum(counts.values())} outputs validated against schemas/cupool-*-v{machine_output.VERSION}.schema.json"
          + (f" ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})" if counts else ""))
    print(f"{len(scenarios) - len(failed)} of {len(scenarios)} {what} passed")
    return 1 if failed else 0


def main(scenarios, what, gpu_option=False, after=None):
    """A suite's command line: runs the test_* functions of `scenarios` (a module's globals())."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--testclient", required=True)
    ap.add_argument("--client-lib", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("-k", default="", help="run only the scenarios whose name contains this")
    ap.add_argument("--sanitizer", default="",
                    help="the binaries' sanitizers: address,undefined (CUPOOL_SANITIZE) or thread (CUPOOL_TSAN)")
    if gpu_option:
        ap.add_argument("--gpu", action="store_true", help="hold pools on the real driver (exit 77 without one)")
    args = ap.parse_args()
    gpu = gpu_option and args.gpu
    if gpu:
        q = subprocess.run([os.path.abspath(args.cupool), "query"], capture_output=True, text=True, timeout=120)
        if q.returncode == 3:
            print("skipped: no usable CUDA driver or device here")
            return 77
    bindir = setup(args, gpu)
    tests = [(n, f) for n, f in sorted(scenarios.items()) if n.startswith("test_") and args.k in n]
    try:
        rc = run_scenarios(tests, what)
    finally:
        shutil.rmtree(bindir, ignore_errors=True)
    if after:
        after()
    return rc
