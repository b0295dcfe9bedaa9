#!/usr/bin/env python3
"""The holder across processes, on a simulated node (memfd-backed pools, so memory really is shared).

Starts real `cupool hold` processes and drives them with clients in C (testclient, through the C
API), in Python (RawClient: the wire protocol written from docs/protocol.md alone) and with the
CLI verbs. Each test_* function is one scenario; all run, failures are listed at the end.

  holder_test.py --cupool build/cupool --testclient build/tests/holder/testclient \
                 --client-lib build/libcupool-client.so --root . [-k NAME]
"""
import argparse
import json
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback

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


def check(condition, message):
    if not condition:
        raise Failure(message)


# ---- a client written from docs/protocol.md ----

class RawClient:
    MAGIC = b"CUPL"

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.next_id = 1
        self.notices = []

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
        """One frame: (kind, body, fds)."""
        fds = []
        header = self._recv_exact(16, fds)
        check(header[:4] == self.MAGIC, "bad magic from the holder")
        version, kind, length, nfds = struct.unpack("<HHII", header[4:])
        check(version == 1 and kind in (2, 3) and nfds <= 1, f"bad header {header!r}")
        body = json.loads(self._recv_exact(length, fds))
        check(len(fds) == nfds, f"header says {nfds} descriptors, got {len(fds)}")
        return kind, body, fds

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

    def hello(self):
        body, _ = self.request("hello", protocol=1, client="raw-python")
        check(body["ok"], f"hello refused: {body}")
        return body

    def close(self):
        self.sock.close()


# ---- running things ----

class Holder:
    def __init__(self, tmp, config_text=None, extra=()):
        self.tmp = tmp
        self.socket = os.path.join(tmp, "cupool.sock")
        self.config = os.path.join(tmp, "cupool.yaml")
        if config_text is None:
            config_text = CONFIG.format(socket=self.socket, user="cupool-test-nobody")
        with open(self.config, "w") as f:
            f.write(config_text)
        self.log_path = os.path.join(tmp, "holder.log")
        self.log = open(self.log_path, "a")
        node = ["--profile", PROFILE] if PROFILE else []
        self.proc = subprocess.Popen([ARGS.cupool, "--log-level", "info", "hold", self.config, "--drain-timeout", "3"]
                                     + node + list(extra),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready()

    def wait_ready(self):
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise Failure(f"holder exited with {self.proc.returncode}:\n{self.text()}")
            try:
                c = RawClient(self.socket)
                c.hello()
                c.close()
                return
            except (OSError, EOFError):
                time.sleep(0.05)
        raise Failure("holder did not start listening:\n" + self.text())

    def text(self):
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
        return self.proc.returncode


def cupool(*args, socket_path=None, stdin=None, check_rc=None):
    env = dict(os.environ)
    if socket_path:
        env["CUPOOL_SOCKET"] = socket_path
    r = subprocess.run([ARGS.cupool] + list(args), capture_output=True, text=True, env=env, input=stdin, timeout=60)
    if check_rc is not None and r.returncode != check_rc:
        raise Failure(f"cupool {' '.join(args)}: exit {r.returncode}, expected {check_rc}\n{r.stdout}{r.stderr}")
    return r


def client(holder, *args, user=None, input_text=None, timeout=60):
    cmd = [ARGS.testclient_copy, holder.socket] + [str(a) for a in args]
    if user:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--clear-groups"] + cmd
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(ARGS.testclient_copy))
    return subprocess.run(cmd, capture_output=True, text=True, input=input_text, timeout=timeout, env=env)


def status(holder):
    return json.loads(cupool("status", "--format", "json", socket_path=holder.socket, check_rc=0).stdout)


def stats(holder):
    return json.loads(cupool("stats", "--format", "json", socket_path=holder.socket, check_rc=0).stdout)


def pool_stat(holder, name, device=0):
    for p in stats(holder)["pools"]:
        if p["name"] == name and p["device"] == device:
            return p
    raise Failure(f"no pool {name} on device {device} in stats")


# ---- scenarios ----

def test_buffer_shared_between_processes(tmp):
    h = Holder(tmp)
    try:
        w = client(h, "write", "shared", 7)
        check(w.returncode == 0, f"writer failed: {w.stdout}{w.stderr}")
        r = client(h, "read", "shared", 7)
        check(r.returncode == 0, f"reader did not see the writer's bytes: {r.stdout}{r.stderr}")
        check(("backend simulated" if PROFILE else "backend cuda") in r.stdout, r.stdout)
        # The check can fail: another pattern is a mismatch.
        bad = client(h, "read", "shared", 8)
        check(bad.returncode == 1 and "mismatch" in bad.stdout, f"a wrong pattern was not caught: {bad.stdout}{bad.stderr}")
        check(status(h)["buffers"][0]["opens"] == 0, "buffer opens not back to 0")
    finally:
        h.stop()


def test_leases_and_cycles(tmp):
    h = Holder(tmp)
    try:
        before = pool_stat(h, "kv")["used_current"]
        r = client(h, "cycle", "kv", 0, 3 << 20, 50)
        check(r.returncode == 0, f"cycle failed: {r.stdout}{r.stderr}")
        check(pool_stat(h, "kv")["used_current"] == before, "used memory did not return to where it started")
        check(status(h)["pools"][0]["leases"] == 0, "leases left behind")
    finally:
        h.stop()


def test_sigkill_frees_leases(tmp):
    h = Holder(tmp)
    try:
        before = pool_stat(h, "kv")["used_current"]
        p = subprocess.Popen([ARGS.testclient_copy, h.socket, "alloc", "kv", "0", str(64 << 20), "3"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(ARGS.testclient_copy)))
        line = p.stdout.readline()
        check(line.startswith("testclient: ready") and len(line.split()) == 5, f"client did not allocate: {line!r}")
        s = status(h)
        check(sum(c["leases"] for c in s["clients"]) == 3, f"expected 3 leases: {s['clients']}")
        check(pool_stat(h, "kv")["used_current"] == before + (192 << 20), "used memory does not show the leases")
        p.kill()
        p.wait()
        deadline = time.time() + 10
        while time.time() < deadline and status(h)["pools"][0]["leases"]:
            time.sleep(0.05)
        check(status(h)["pools"][0]["leases"] == 0, "the killed client's leases were not freed")
        check(pool_stat(h, "kv")["used_current"] == before, "used memory did not return after the kill")
        check("freed 3 leases" in h.text(), "the holder did not log the freed leases")
    finally:
        h.stop()


def test_quota_and_errors(tmp):
    h = Holder(tmp)
    try:
        r = client(h, "expect", "kv", 0, 600 << 20, "CUPOOL_E_QUOTA")
        check(r.returncode == 0, f"quota not enforced: {r.stdout}{r.stderr}")
        r = client(h, "expect", "nope", 0, 1, "CUPOOL_E_NOT_FOUND")
        check(r.returncode == 0, r.stdout + r.stderr)
        r = client(h, "expect", "private", 0, 512 << 20, "CUPOOL_E_OUT_OF_MEMORY")
        check(r.returncode == 0, f"max_size not enforced: {r.stdout}{r.stderr}")
    finally:
        h.stop()


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


def test_other_user_refused(tmp):
    user = other_user()
    if not user:
        print("    skipped: needs root and setpriv to run a client as another user")
        return
    os.chmod(tmp, 0o755)
    h = Holder(tmp, CONFIG.format(socket=os.path.join(tmp, "cupool.sock"), user="cupool-test-nobody")
               + "  - {name: mine, pool: private, device: 0, size: 1MiB}\n")
    try:
        # Not in the share list: refused, by the kernel's word for who the peer is.
        r = client(h, "expect", "kv", 0, 4096, "CUPOOL_E_REFUSED", user=user)
        check(r.returncode == 0, f"{user} was not refused: {r.stdout}{r.stderr}")
        check("not shared with user " + user in r.stdout, r.stdout)
        r = client(h, "read", "mine", 0, user=user)
        check("CUPOOL_E_REFUSED" in r.stdout, f"{user} opened a buffer of a pool without share: {r.stdout}{r.stderr}")
        # No descriptor is ever sent to a refused peer.
        code = ("import json,socket,struct,sys\n"
                "s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[1])\n"
                "def req(i,b):\n"
                " p=json.dumps(dict(id=i,**b)).encode();s.sendall(b'CUPL'+struct.pack('<HHII',1,1,len(p),0)+p)\n"
                " m,f,_,_=socket.recv_fds(s,65552,4);return m,f\n"
                "req(1,{'op':'hello','protocol':1})\n"
                "m,f=req(2,{'op':'import_pool','pool':'kv','device':0})\n"
                "print(len(f), m[16:].decode())\n")
        r = subprocess.run(["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--clear-groups",
                            sys.executable, "-c", code, h.socket], capture_output=True, text=True, timeout=30)
        check(r.returncode == 0, r.stderr)
        fds, body = r.stdout.split(" ", 1)
        check(fds == "0", "a descriptor was sent to a refused peer")
        check(json.loads(body)["error"]["code"] == "not_permitted", body)
    finally:
        h.stop()
    # The same user, named in share, gets memory.
    tmp2 = tempfile.mkdtemp(prefix="cupool-holder-", dir=tmp)
    os.chmod(tmp2, 0o755)
    h = Holder(tmp2, CONFIG.format(socket=os.path.join(tmp2, "cupool.sock"), user=user))
    try:
        r = client(h, "cycle", "kv", 0, 1 << 20, 3, user=user)
        check(r.returncode == 0, f"{user} named in share was refused: {r.stdout}{r.stderr}")
    finally:
        h.stop()


def test_malformed_frame_isolated(tmp):
    h = Holder(tmp)
    try:
        good = RawClient(h.socket)
        good.hello()
        body, _ = good.request("alloc", pool="kv", device=0, size=1 << 20)
        check(body["ok"], body)
        lease = body["lease"]
        for garbage in (b"GARBAGE" * 5, b"CUPL" + struct.pack("<HHII", 1, 1, 1 << 30, 0),
                        b"CUPL" + struct.pack("<HHII", 1, 1, 3, 0) + b"{x}"):
            bad = RawClient(h.socket)
            bad.sock.sendall(garbage)
            kind, reply, _ = bad.receive()
            check(reply["ok"] is False and reply["error"]["code"] == "bad_frame" and reply["id"] is None, reply)
            try:
                extra = bad.sock.recv(1)
            except ConnectionResetError:
                extra = b""
            check(extra == b"", "the holder kept a connection that sent a malformed frame")
            bad.close()
        # A request without hello, and an unknown operation, on a fresh connection.
        c = RawClient(h.socket)
        body, _ = c.request("list")
        check(body["error"]["code"] == "hello_required", body)
        c.hello()
        body, _ = c.request("aloc", pool="kv", size=1)
        check(body["error"]["code"] == "unknown_op" and "did you mean \"alloc\"" in body["error"]["message"], body)
        c.close()
        # The first client did not notice.
        body, _ = good.request("list")
        check(body["ok"] and len(body["pools"]) == 2, body)
        body, _ = good.request("free", lease=lease)
        check(body["ok"], body)
        good.close()
    finally:
        h.stop()


def test_protocol_client_from_the_document(tmp):
    """A Python client maps a buffer's memfd and sees what the C client wrote."""
    import mmap
    if not PROFILE:
        print("    skipped: the memfd mapping is the simulated node's; on a GPU the C client covers it")
        return
    h = Holder(tmp)
    try:
        check(client(h, "write", "shared", 3).returncode == 0, "writer failed")
        c = RawClient(h.socket)
        hello = c.hello()
        check(hello["backend"] == "simulated" and hello["peer"]["pid"] == os.getpid(), hello)
        body, fds = c.request("import_pool", pool="kv", device=0)
        check(body["ok"] and len(fds) == 1, f"import_pool: {body} fds={fds}")
        opened, _ = c.request("buffer_open", name="shared")
        data = bytes.fromhex(opened["export_data"])
        check(data[:10] == b"CUPOOLSIM1", data[:16])
        arena, offset, size = struct.unpack("<QQQ", data[16:40])
        m = mmap.mmap(fds[0], os.fstat(fds[0]).st_size, mmap.MAP_SHARED, mmap.PROT_READ)
        first = m[offset:offset + 4]
        expected = bytes(((3 * 131 + i * 7 + (i >> 12)) & 0xff) for i in range(4))
        check(first == expected, f"python sees {first!r}, expected {expected!r}")
        m.close()
        os.close(fds[0])
        c.request("buffer_close", name="shared")
        c.close()
    finally:
        h.stop()


def test_verbs(tmp):
    h = Holder(tmp)
    sock = h.socket
    try:
        s = status(h)
        check(len(s["pools"]) == 2 and s["holder"]["backend"] == ("simulated" if PROFILE else "cuda"), s)
        prom = cupool("stats", "--format", "prometheus", socket_path=sock, check_rc=0).stdout
        check('cupool_pool_reserved_bytes{pool="kv"' in prom, prom)
        table = cupool("stats", socket_path=sock, check_rc=0).stdout
        check("kv" in table, table)
        # trim: the reserve (64 MiB) goes back; reported from before/after readings.
        t = json.loads(cupool("trim", "--format", "json", socket_path=sock, check_rc=0).stdout)
        kv = [p for p in t["pools"] if p["name"] == "kv"][0]
        check(kv["released"] == kv["reserved_before"] - kv["reserved_after"], t)
        if PROFILE:
            check(kv["released"] >= 32 << 20, t)  # the simulation releases whole 32 MiB chunks
        # plan/apply: none, then a change, then idempotent.
        cupool("plan", h.config, socket_path=sock, check_rc=0)
        changed = os.path.join(tmp, "changed.yaml")
        with open(h.config) as f:
            text = f.read()
        with open(changed, "w") as f:
            f.write(text.replace("release_threshold: max", "release_threshold: 128MiB")
                    + "  - {name: extra, pool: kv, device: 0, size: 2MiB}\n")
        p = cupool("plan", changed, socket_path=sock, check_rc=1)
        check("release_threshold" in p.stdout and "extra" in p.stdout, p.stdout)
        cupool("apply", changed, socket_path=sock, check_rc=0)
        again = json.loads(cupool("apply", changed, "--format", "json", socket_path=sock, check_rc=0).stdout)
        check(again["changes"] == [], f"second apply changed something: {again}")
        # A pool with a lease is not removed, and the answer says so.
        holder_client = subprocess.Popen([ARGS.testclient_copy, sock, "alloc", "private", "0", str(1 << 20), "1"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                         env=dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(ARGS.testclient_copy)))
        check(holder_client.stdout.readline().startswith("testclient: ready"), "client did not allocate")
        without = os.path.join(tmp, "without.yaml")
        with open(without, "w") as f:
            f.write(CONFIG.format(socket=sock, user="x").split("  - name: private")[0]
                    + "buffers:\n  - {name: shared, pool: kv, device: 0, size: 8MiB}\n")
        r = cupool("apply", without, "--format", "json", socket_path=sock)
        check(r.returncode == 1, f"apply with a blocked removal should exit 1: {r.returncode} {r.stdout}{r.stderr}")
        removal = [c for c in json.loads(r.stdout)["changes"] if c["name"] == "private"][0]
        check("1 lease held by 1 client" in removal.get("blocked", ""), removal)
        check(any(p["name"] == "private" for p in status(h)["pools"]), "a pool with a lease was removed")
        holder_client.stdin.write("\n")
        holder_client.stdin.flush()
        holder_client.wait(10)
        cupool("apply", without, socket_path=sock, check_rc=0)
        check(not any(p["name"] == "private" for p in status(h)["pools"]), "the pool was not removed after its lease went")
        # export: accepted by check, and applying it changes nothing.
        exported = os.path.join(tmp, "exported.yaml")
        cupool("export", "--output", exported, socket_path=sock, check_rc=0)
        cupool("check", exported, *(["--profile", PROFILE] if PROFILE else []), check_rc=0)
        e = json.loads(cupool("plan", exported, "--format", "json", socket_path=sock, check_rc=0).stdout)
        check(e["changes"] == [], e)
        # buffers
        cupool("buffer", "create", "scratch", "--pool", "kv", "--device", "0", "--size", "4MiB", socket_path=sock, check_rc=0)
        ls = json.loads(cupool("buffer", "ls", "--format", "json", socket_path=sock, check_rc=0).stdout)
        check("scratch" in json.dumps(ls), ls)
        cupool("buffer", "rm", "scratch", socket_path=sock, check_rc=0)
        r = cupool("buffer", "rm", "scratch", socket_path=sock)
        check(r.returncode != 0 and "scratch" in r.stderr, r.stderr)
        # A file with errors: findings, exit 2, nothing changes.
        broken = os.path.join(tmp, "broken.yaml")
        with open(broken, "w") as f:
            f.write("version: 1\npools:\n  - name: x\n    devices: [0]\n    max_sise: 1GiB\n")
        r = cupool("apply", broken, socket_path=sock)
        check(r.returncode == 2 and "max_sise" in r.stderr and ":5:5" in r.stderr, f"{r.returncode} {r.stderr}")
    finally:
        h.stop()


def nvml_used_mib(device=0):
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", str(device)],
                         capture_output=True, text=True, timeout=30)
    check(out.returncode == 0, f"nvidia-smi failed: {out.stderr}")
    return int(out.stdout.strip())


def test_trim_matches_device_memory(tmp):
    """On a GPU: what trim reports as released is what the device gets back (NVML's used memory)."""
    if PROFILE:
        print("    skipped: needs a real device")
        return
    h = Holder(tmp, CONFIG.format(socket=os.path.join(tmp, "cupool.sock"), user="x").replace("reserve: 64MiB", "reserve: 512MiB"))
    try:
        before_stats = pool_stat(h, "kv")
        used_before = nvml_used_mib()
        t = json.loads(cupool("trim", "--pool", "kv", "--format", "json", socket_path=h.socket, check_rc=0).stdout)
        time.sleep(0.5)
        used_after = nvml_used_mib()
        kv = t["pools"][0]
        after_stats = pool_stat(h, "kv")
        released_mib = kv["released"] / (1 << 20)
        print(f"    reserved before {kv['reserved_before'] >> 20} MiB (stats said {before_stats['reserved_current'] >> 20} MiB), "
              f"after {kv['reserved_after'] >> 20} MiB; trim released {released_mib:.0f} MiB; "
              f"NVML used {used_before} -> {used_after} MiB (drop {used_before - used_after} MiB)")
        check(kv["reserved_before"] == before_stats["reserved_current"], "trim's before differs from stats")
        check(after_stats["reserved_current"] == kv["reserved_after"], "stats after trim differ from trim's after")
        check(abs((used_before - used_after) - released_mib) <= 8,
              f"the device got back {used_before - used_after} MiB, trim reported {released_mib:.0f} MiB")
    finally:
        h.stop()


def test_peer_access(tmp):
    """Two GPUs: a pool on device 0 that the config opens to device 1. The holder gives access in
    its process; the C library gives it again on the imported pool (it does not carry over)."""
    global PROFILE
    saved = PROFILE
    if PROFILE:
        PROFILE = os.path.join(ARGS.root, "configs", "profiles", "h200x2.yaml")
    else:
        q = json.loads(subprocess.run([ARGS.cupool, "query", "--format", "json"], capture_output=True, text=True,
                                      timeout=120).stdout)
        if len(q["devices"]) < 2 or not q["peer_access"][1][0]:
            print("    skipped: needs two devices with peer access")
            return
    text = CONFIG.format(socket=os.path.join(tmp, "cupool.sock"), user="x").replace(
        "buffers:", "  - name: peer\n    devices: [0]\n    handle_types: [posix_fd]\n    max_size: 1GiB\n"
                    "    release_threshold: max\n    access: [1]\nbuffers:")
    try:
        h = Holder(tmp, text)
        try:
            check(any(p["name"] == "peer" for p in status(h)["pools"]), status(h))
            r = client(h, "cycle", "peer", 0, 4 << 20, 5)
            check(r.returncode == 0, f"cycle on a pool with peer access failed: {r.stdout}{r.stderr}")
        finally:
            h.stop()
    finally:
        PROFILE = saved


def test_unreachable(tmp):
    r = cupool("status", socket_path=os.path.join(tmp, "none.sock"))
    check(r.returncode == 4, f"exit {r.returncode}")
    check("no holder is listening on" in r.stderr, r.stderr)


def test_single_instance_and_stale_socket(tmp):
    h = Holder(tmp)
    second = subprocess.run([ARGS.cupool, "hold", h.config] + (["--profile", PROFILE] if PROFILE else []),
                            capture_output=True, text=True, timeout=60)
    check(second.returncode == 4 and "another holder" in second.stderr and str(h.proc.pid) in second.stderr,
          f"second holder: {second.returncode} {second.stderr}")
    h.proc.kill()  # a crash: the socket file stays behind
    h.proc.wait()
    h.log.close()
    check(os.path.exists(h.socket), "the socket should be left behind by SIGKILL")
    r = cupool("status", socket_path=h.socket)
    check(r.returncode == 4, f"status against a dead holder: {r.returncode}")
    h2 = Holder(tmp)
    try:
        check("removing the stale socket" in h2.text(), h2.text())
        check(client(h2, "cycle", "kv", 0, 1 << 20, 2).returncode == 0, "the restarted holder does not serve")
    finally:
        h2.stop()


def test_sighup_reload(tmp):
    h = Holder(tmp)
    try:
        good = open(h.config).read()
        with open(h.config, "w") as f:
            f.write(good.replace("max_size: 256MiB", "max_size: 256MB_"))
        h.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 10
        while time.time() < deadline and "was not applied" not in h.text():
            time.sleep(0.05)
        check("was not applied" in h.text() and "max_size" in h.text(), h.text())
        check(len(status(h)["pools"]) == 2, "state changed after a bad reload")
        with open(h.config, "w") as f:
            f.write(good + "  - {name: added, pool: kv, device: 0, size: 1MiB}\n")
        h.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 10
        while time.time() < deadline and len(status(h)["buffers"]) < 2:
            time.sleep(0.05)
        check(len(status(h)["buffers"]) == 2, "a good reload was not applied")
        check(status(h)["holder"]["reloads"] == 1, status(h)["holder"])
    finally:
        h.stop()


def test_sigterm_drains(tmp):
    h = Holder(tmp)
    c = RawClient(h.socket)
    c.hello()
    body, _ = c.request("alloc", pool="kv", device=0, size=1 << 20)
    check(body["ok"], body)
    lease = body["lease"]
    h.proc.send_signal(signal.SIGTERM)
    kind, notice, _ = c.receive()
    check(kind == 3 and notice["notice"] == "draining", notice)
    body, _ = c.request("alloc", pool="kv", device=0, size=1 << 20)
    check(body["error"]["code"] == "draining", body)
    check(not os.path.exists(h.socket), "the socket is still there while draining")
    body, _ = c.request("free", lease=lease)
    c.close()
    rc = h.proc.wait(10)
    check(rc == 0, f"holder exit {rc}")
    check("stopped" in h.text(), h.text())


def main():
    global ARGS, PROFILE
    ap = argparse.ArgumentParser()
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--testclient", required=True)
    ap.add_argument("--client-lib", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("-k", default="")
    ap.add_argument("--gpu", action="store_true", help="hold pools on the real driver (exit 77 without one)")
    ARGS = ap.parse_args()
    ARGS.cupool = os.path.abspath(ARGS.cupool)
    PROFILE = None if ARGS.gpu else os.path.join(ARGS.root, "configs", "profiles", "h100.yaml")
    if ARGS.gpu:
        q = subprocess.run([ARGS.cupool, "query"], capture_output=True, text=True, timeout=120)
        if q.returncode == 3:
            print("skipped: no usable CUDA driver or device here")
            return 77
    # The client and its library are copied where any user may run them (another-user test).
    bindir = tempfile.mkdtemp(prefix="cupool-bin-")
    os.chmod(bindir, 0o755)
    ARGS.testclient_copy = shutil.copy(ARGS.testclient, bindir)
    lib = os.path.realpath(ARGS.client_lib)
    shutil.copy(lib, os.path.join(bindir, "libcupool-client.so.1"))
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and ARGS.k in n]
    failed = []
    for name, fn in tests:
        tmp = tempfile.mkdtemp(prefix="cupool-holder-")
        start = time.time()
        try:
            fn(tmp)
            print(f"ok    {name} ({time.time() - start:.1f} s)")
        except Exception as e:  # noqa: BLE001 - report every scenario
            failed.append(name)
            print(f"FAIL  {name}: {e}")
            traceback.print_exc()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(bindir, ignore_errors=True)
    print(f"{len(tests) - len(failed)} of {len(tests)} holder scenarios passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
