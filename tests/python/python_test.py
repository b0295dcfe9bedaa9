#!/usr/bin/env python3
"""The Python package (python/cupool) against a real holder on a simulated node, with numpy.

On a simulated node a lease is host memory shared across processes (memfd), so numpy stands in for
torch and cupy: the same package code hands out __array_interface__ here and
__cuda_array_interface__ on a CUDA node, and DLPack on both. Each test_* function is one scenario
with its own holder (tests/holder/harness.py: Holder, CONFIG). The package is imported from
python/ and loads the library given with --client-lib (CUPOOL_CLIENT_LIB); no pip needed.

  python_test.py --cupool build/cupool --client-lib build/libcupool-client.so.1 --root . [-k NAME]

Exit status: 0 all passed, 1 a scenario failed, 77 numpy is missing.
"""
import argparse
import ctypes
import gc
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "holder"))
import harness as H  # noqa: E402
from harness import Failure, Holder, Skip, check, other_user  # noqa: E402

ROOT = None    # --root
FAKE_CUDA = None  # --fake-cuda: a stand-in libcuda.so.1 (tests/exec/fake_cuda.c)
DEV1 = "GPU-8d1c6a3e-0c11-4e4e-9f1e-1c2d3e4f5a6c"  # its second device's UUID
np = None      # numpy, imported in main() (exit 77 without it)
cupool = None  # the package, imported in main() from ROOT/python

MiB = 1 << 20


# ---- helpers ----

def pool(conn, name="kv"):
    """The pool's entry in the holder's status."""
    for p in conn.status()["pools"]:
        if p["name"] == name:
            return p
    raise Failure(f"no pool {name} in status")


def held(conn, name="kv"):
    """(lease_count, leased_bytes, cached_count) of the pool, as the holder counts them."""
    p = pool(conn, name)
    return p["lease_count"], p["leased_bytes"], p["cached_count"]


def expect_error(cls, fn, *args, contains="", code=None):
    """Runs fn(*args), which must raise `cls` whose message contains `contains`; returns the error."""
    try:
        fn(*args)
    except cupool.CupoolError as e:
        check(type(e) is cls, f"expected {cls.__name__}, got {type(e).__name__}: {e}")
        check(contains in str(e), f"{cls.__name__}: message {str(e)!r} lacks {contains!r}")
        check(e.status == cls.status and e.status_name == status_name(cls.status),
              f"{cls.__name__}: status {e.status} {e.status_name}")
        check(code is None or e.code == code, f"{cls.__name__}: code {e.code!r}, expected {code!r}")
        return e
    raise Failure(f"expected {cls.__name__}, nothing was raised")


def status_name(status):
    """The C library's own name for a status."""
    from cupool import _lib
    return _lib.library().cupool_status_name(status).decode()


def pattern(size, seed):
    return ((np.arange(size, dtype=np.uint64) * 31 + seed) % 251).astype(np.uint8)


def run_python(code, *args, user=None, pythonpath=None, lib=None):
    """Runs `code` in a child python3 with the package importable; returns the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=pythonpath or os.path.join(ROOT, "python"),
               CUPOOL_CLIENT_LIB=os.environ["CUPOOL_CLIENT_LIB"] if lib is None else lib)
    cmd = [sys.executable, "-c", code] + [str(a) for a in args]
    if user:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--clear-groups"] + cmd
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


CHILD_WRITE = """
import sys, numpy as np, cupool
with cupool.connect(sys.argv[1], "python-writer") as conn:
    with conn.open_buffer(sys.argv[2]) as buf:
        a = np.asarray(buf)
        a[:] = ((np.arange(a.size, dtype=np.uint64) * 31 + int(sys.argv[3])) % 251).astype(np.uint8)
"""

CHILD_VERIFY = """
import sys, numpy as np, cupool
with cupool.connect(sys.argv[1], "python-reader") as conn:
    with conn.open_buffer(sys.argv[2]) as buf:
        a = buf.numpy()
        want = ((np.arange(a.size, dtype=np.uint64) * 31 + int(sys.argv[3])) % 251).astype(np.uint8)
        ok = np.array_equal(a, want)
        del a
print("match" if ok else "mismatch")
sys.exit(0 if ok else 1)
"""


# ---- scenarios ----

def test_connect_status_stats(tmp):
    h = Holder(tmp)
    try:
        with cupool.connect(h.socket, "python-test") as conn:
            check(conn.backend == "simulated", f"backend {conn.backend!r}")
            s = conn.status()
            check(isinstance(s, dict) and s["ok"] and s["source"]["simulated"] is True, f"status: {s}")
            check({p["name"] for p in s["pools"]} == {"kv", "private"}, f"pools: {s['pools']}")
            check([c for c in s["clients"] if c.get("name") == "python-test"], f"our name is not listed: {s['clients']}")
            st = conn.stats()
            check(st["ok"] and any(p["name"] == "kv" and p["reserved_bytes"] >= 64 * MiB for p in st["pools"]),
                  f"stats: {st}")
            check(not conn.closed, "closed too early")
        check(conn.closed, "leaving the with block did not close the connection")
        # Connecting through $CUPOOL_SOCKET, as the library does with socket=None.
        os.environ["CUPOOL_SOCKET"] = h.socket
        try:
            with cupool.connect() as conn:
                check(conn.status()["client_count"] == 1, "not connected through CUPOOL_SOCKET")
        finally:
            del os.environ["CUPOOL_SOCKET"]
    finally:
        h.stop()


def test_alloc_numpy(tmp):
    h = Holder(tmp)
    try:
        with cupool.connect(h.socket) as conn:
            lease = conn.alloc("kv", MiB)
            check((lease.size, lease.pool, lease.name, lease.device, lease.backend) == (MiB, "kv", None, 0, "simulated"),
                  repr(lease))
            check(lease.id > 0 and lease.address > 0 and not lease.released, repr(lease))
            a = lease.numpy()
            check(a.shape == (MiB,) and a.dtype == np.uint8 and a.flags.writeable, f"view {a.shape} {a.dtype}")
            a[:] = pattern(MiB, 3)
            # The same bytes seen through another view and through the raw address.
            check(np.array_equal(np.asarray(lease), pattern(MiB, 3)), "a second view differs")
            check(ctypes.string_at(lease.address, 8) == pattern(8, 3).tobytes(), "the address holds other bytes")
            words = lease.numpy("uint32")
            check(words.shape == (MiB // 4,), f"uint32 view {words.shape}")
            check(held(conn)[:2] == (1, MiB), f"holder counts {held(conn)}")
            check(not hasattr(lease, "__cuda_array_interface__"), "host memory offers __cuda_array_interface__")
            d = conn.alloc("kv", 4096, device=0)
            check(d.device == 0 and d.size == 4096, repr(d))
            # The arrays, and the lease numpy.asarray() was given, would keep the connection open.
            del a, words, lease
        check(conn.closed and d.released, "close() did not release the lease")
        with cupool.connect(h.socket) as watcher:
            s = watcher.status()
            check(s["client_count"] == 1 and held(watcher) == (0, 0, 0), f"left after close: {held(watcher)}")
    finally:
        h.stop()


def test_two_processes(tmp):
    h = Holder(tmp)
    try:
        size = 8 * MiB
        w = run_python(CHILD_WRITE, h.socket, "shared", 7)
        check(w.returncode == 0, f"writer failed: {w.stdout}{w.stderr}")
        with cupool.connect(h.socket, "python-parent") as conn:
            with conn.open_buffer("shared") as buf:
                check((buf.name, buf.pool, buf.size) == ("shared", None, size), repr(buf))
                a = buf.numpy()
                check(np.array_equal(a, pattern(size, 7)), "the parent does not see the child's bytes")
                check(not np.array_equal(a, pattern(size, 8)), "the check can't tell patterns apart")
                # The other way: the parent writes, a child checks (and a wrong pattern is caught).
                a[:] = pattern(size, 9)
                del a
            r = run_python(CHILD_VERIFY, h.socket, "shared", 9)
            check(r.returncode == 0 and "match" in r.stdout, f"the child does not see the parent's bytes: {r.stdout}{r.stderr}")
            bad = run_python(CHILD_VERIFY, h.socket, "shared", 10)
            check(bad.returncode == 1 and "mismatch" in bad.stdout, f"a wrong pattern was not caught: {bad.stdout}{bad.stderr}")
            check(conn.status()["buffers"][0]["open_count"] == 0, "buffer opens not back to 0")
    finally:
        h.stop()


def test_lease_lives_under_array(tmp):
    h = Holder(tmp)
    try:
        with cupool.connect(h.socket) as conn:
            conn.cache_limit = 0  # a release goes to the holder at once
            # Nothing exported: release() frees at once, and the lease exports nothing more.
            plain = conn.alloc("kv", MiB)
            check(held(conn) == (1, MiB, 0), f"after alloc: {held(conn)}")
            plain.release()
            check(held(conn) == (0, 0, 0), f"a lease with no view was not freed at release(): {held(conn)}")
            expect_error(cupool.InvalidArgument, lambda: plain.address, contains="released")
            expect_error(cupool.InvalidArgument, lambda: np.asarray(plain), contains="released")
            plain.release()  # a second release does nothing

            lease = conn.alloc("kv", 2 * MiB)
            a = np.asarray(lease)
            check(a.base is lease, "numpy does not keep the lease")
            a[:] = 3
            lease.release()
            check(lease.released, "release() not recorded")
            del lease
            gc.collect()
            check(held(conn) == (1, 2 * MiB, 0), f"the lease was freed under a live array: {held(conn)}")
            check(int(a.sum()) == 3 * 2 * MiB, "the array lost its bytes")
            a[:] = 4  # still mapped and writable
            b = a[MiB:]  # a view of the view keeps it too
            del a
            gc.collect()
            check(held(conn) == (1, 2 * MiB, 0), f"freed under a slice: {held(conn)}")
            del b
            gc.collect()
            check(held(conn) == (0, 0, 0), f"not freed when the last array went: {held(conn)}")

            # lease.numpy() arrays are counted: the lease goes with the last of them, while the
            # name `lease` is still bound. The with block of a lease releases it.
            with conn.alloc("kv", MiB) as lease:
                inner = lease.numpy()
                words = lease.numpy("uint64")[::2]
            check(held(conn)[0] == 1, f"freed under an array made in the with block: {held(conn)}")
            del inner
            check(held(conn)[0] == 1, f"freed under the second array: {held(conn)}")
            words[:] = 1
            del words
            check(held(conn)[0] == 0 and lease.released, f"not freed with the last lease.numpy() array: {held(conn)}")
            # After numpy.asarray(lease) the lease can't count: it goes with the last reference to it.
            with conn.alloc("kv", MiB) as lease:
                a = np.asarray(lease)
            del a
            gc.collect()
            check(held(conn)[0] == 1, f"freed while the lease object is referenced: {held(conn)}")
            del lease
            gc.collect()
            check(held(conn)[0] == 0, f"not freed with the last reference: {held(conn)}")
    finally:
        h.stop()


def test_dlpack(tmp):
    from cupool import dlpack
    h = Holder(tmp)
    try:
        with cupool.connect(h.socket) as conn:
            conn.cache_limit = 0
            lease = conn.alloc("kv", MiB)
            check(lease.__dlpack_device__() == (1, 0), f"device {lease.__dlpack_device__()}")
            lease.numpy()[:] = pattern(MiB, 5)  # (numpy's from_dlpack gives a read-only array)
            x = np.from_dlpack(lease)
            check(x.shape == (MiB,) and x.dtype == np.uint8, f"{x.shape} {x.dtype}")
            check(np.array_equal(x, pattern(MiB, 5)), "from_dlpack sees other bytes")
            check(dlpack.live_exports() == 1, f"{dlpack.live_exports()} exports alive")
            lease.release()
            del lease
            gc.collect()
            check(held(conn)[0] == 1, f"the lease was freed under a DLPack tensor: {held(conn)}")
            check(np.array_equal(x, pattern(MiB, 5)), "the tensor lost its bytes")
            del x
            gc.collect()
            check(dlpack.live_exports() == 0 and held(conn)[0] == 0,
                  f"not freed when the tensor went: {held(conn)}, {dlpack.live_exports()} exports")

            # A capsule no consumer took is deleted with the capsule; release() is then at once.
            lease = conn.alloc("kv", MiB)
            capsule = lease.__dlpack__(stream=None)
            check(type(capsule).__name__ == "PyCapsule" and "dltensor" in repr(capsule), repr(capsule))
            lease.release()
            check(held(conn)[0] == 1, "freed under a live capsule")
            del capsule
            check(dlpack.live_exports() == 0 and held(conn)[0] == 0, "an unconsumed capsule kept the lease")
            # What DLPack's __dlpack__ refuses.
            lease = conn.alloc("kv", MiB)
            for kwargs in ({"copy": True}, {"dl_device": (2, 0)}):
                try:
                    lease.__dlpack__(**kwargs)
                    raise Failure(f"__dlpack__({kwargs}) did not refuse")
                except BufferError:
                    pass
            check(dlpack.live_exports() == 0, "a refused export stayed alive")
            lease.release()
            check(held(conn)[0] == 0, "a lease with only refused exports was not freed at release()")
    finally:
        h.stop()


def test_close_with_live_array(tmp):
    h = Holder(tmp)
    try:
        with cupool.connect(h.socket, "closing") as conn:
            conn.cache_limit = 0
            a = np.asarray(conn.alloc("kv", MiB))
            a[:] = 6
            plain = conn.alloc("kv", MiB)
        with cupool.connect(h.socket, "watcher") as watcher:
            s = watcher.status()
            check(s["client_count"] == 2 and held(watcher) == (1, MiB, 0),
                  f"the closed connection should keep only the lease under the array: {held(watcher)}, {s['clients']}")
            expect_error(cupool.InvalidArgument, lambda: plain.address, contains="connection is closed")
            plain.release()  # after close: nothing to do, no crash
            check(plain.released, "a lease of a closed connection is not released")
            check(int(a.sum()) == 6 * MiB, "the array lost its bytes when the connection closed")
            del a
            gc.collect()
            # The last array frees the lease and closes the connection; the holder may serve the
            # watcher's status in the same turn of its loop as that free, before it drops the closed
            # connection (seen under load in CI): give it a moment.
            deadline = time.monotonic() + 5
            s = watcher.status()
            while s["client_count"] != 1 and time.monotonic() < deadline:
                time.sleep(0.02)
                s = watcher.status()
            check(s["client_count"] == 1 and held(watcher) == (0, 0, 0),
                  f"the last array did not free the lease and disconnect: {held(watcher)}, {s['clients']}")
    finally:
        h.stop()


def test_cache(tmp):
    h = Holder(tmp)
    try:
        with cupool.connect(h.socket) as conn:
            check(conn.cache_limit is None, f"default cache limit {conn.cache_limit}")
            lease = conn.alloc("kv", MiB)
            first = lease.id
            lease.release()
            check(conn.cached_bytes == MiB and held(conn) == (1, MiB, 1), f"not cached: {conn.cached_bytes}, {held(conn)}")
            again = conn.alloc("kv", MiB)
            check(again.id == first and conn.cached_bytes == 0, f"the cached block was not reused: {again.id} {first}")
            again.release()
            conn.cache_limit = 0
            check(conn.cache_limit == 0 and conn.cached_bytes == 0 and held(conn) == (0, 0, 0),
                  f"cache_limit = 0 did not free the cache: {conn.cached_bytes}, {held(conn)}")
            conn.cache_limit = None
            conn.alloc("kv", MiB).release()
            check(conn.cached_bytes == MiB, "cache_limit = None did not turn the cache back on")
    finally:
        h.stop()


def test_every_error_status(tmp):
    h = Holder(tmp)
    try:
        e = expect_error(cupool.Unreachable, cupool.connect, os.path.join(tmp, "missing.sock"),
                         contains="no holder is listening")
        # The C library's hint names the command line's --socket; a Python caller is told its own way.
        check("--socket" not in str(e) and "socket= to cupool.connect()" in str(e) and "CUPOOL_SOCKET" in str(e),
              f"Unreachable's hint: {e}")
        with cupool.connect(h.socket) as conn:
            expect_error(cupool.NotFound, conn.alloc, "nope", 4096, contains="nope")
            expect_error(cupool.NotFound, conn.open_buffer, "missing", contains="missing")
            expect_error(cupool.QuotaExceeded, conn.alloc, "kv", 600 * MiB, contains="quota")
            expect_error(cupool.OutOfMemory, conn.alloc, "private", 512 * MiB, contains="private")
            e = expect_error(cupool.InvalidArgument, conn.alloc, "kv", 0, contains="size")
            check(isinstance(e, ValueError), "InvalidArgument is not a ValueError")
            expect_error(cupool.InvalidArgument, conn.request, {"op": "status", "bogus": 1},
                         contains="bogus", code="bad_request")
            expect_error(cupool.ProtocolError, conn.request, {"op": "nonsense"}, contains="nonsense", code="unknown_op")
            expect_error(cupool.Exists, conn.request,
                         {"op": "buffer_create", "name": "shared", "pool": "kv", "device": 0, "size_bytes": 4096},
                         contains="shared", code="exists")
            with conn.open_buffer("shared"):
                expect_error(cupool.Busy, conn.request, {"op": "buffer_remove", "name": "shared"},
                             contains="shared", code="busy")
            # The library refuses what it does itself (a status, not a reply).
            expect_error(cupool.InvalidArgument, conn.request, {"op": "alloc"}, contains="cupool_alloc")
            # check=False returns the failed reply as it is.
            reply = conn.request({"op": "nonsense"}, check=False)
            check(reply["ok"] is False and reply["error"]["code"] == "unknown_op", f"raw reply {reply}")
            # Arguments Python refuses before the library sees them.
            expect_error(cupool.InvalidArgument, conn.alloc, "kv", -1, contains="size")
            # A NUL would end the C string: "kv\0evil" must not allocate from "kv" (issue 22).
            expect_error(cupool.InvalidArgument, conn.alloc, "kv\x00evil", 4096, contains="NUL")
            expect_error(cupool.InvalidArgument, conn.open_buffer, "shared\x00x", contains="NUL")
            expect_error(cupool.InvalidArgument, cupool.connect, h.socket + "\x00x", contains="NUL")
            expect_error(cupool.InvalidArgument, cupool.connect, h.socket, "me\x00you", contains="NUL")
            try:
                conn.alloc("kv", 1.5)
                raise Failure("a float size was taken")
            except TypeError:
                pass
    finally:
        h.stop()


def test_refused_as_another_user(tmp):
    user = other_user()
    if not user:
        raise Skip("needs root and setpriv to run a client as another user (test_status_mapping covers Refused)")
    os.chmod(tmp, 0o755)
    # The package and the library where that user may read them.
    shared = os.path.join(tmp, "for-user")
    shutil.copytree(os.path.join(ROOT, "python", "cupool"), os.path.join(shared, "cupool"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    lib = shutil.copy(os.path.realpath(os.environ["CUPOOL_CLIENT_LIB"]), os.path.join(shared, "libcupool-client.so.1"))
    for folder, dirs, files in os.walk(shared):
        os.chmod(folder, 0o755)
        for f in files:
            os.chmod(os.path.join(folder, f), 0o644)
    h = Holder(tmp)
    try:
        code = ("import sys, cupool\n"
                "conn = cupool.connect(sys.argv[1])\n"
                "try:\n"
                "    conn.alloc('kv', 4096)\n"
                "except cupool.Refused as e:\n"
                "    print(e.status_name, e)\n"
                "    sys.exit(0)\n"
                "sys.exit(1)\n")
        r = run_python(code, h.socket, user=user, pythonpath=shared, lib=lib)
        check(r.returncode == 0, f"{user} was not refused: {r.stdout}{r.stderr}")
        check("CUPOOL_E_REFUSED" in r.stdout and f"not shared with user {user}" in r.stdout,
              f"Refused without the holder's message: {r.stdout}")
    finally:
        h.stop()


def test_status_mapping(tmp):
    """Every status and every holder error code, including those a simulated node can't provoke
    (CudaError, InternalError; Refused without a second user): docs/protocol.md's table is the
    reference, so a code added there and not here fails."""
    from cupool import errors
    classes = {-1: cupool.Unreachable, -2: cupool.Refused, -3: cupool.NotFound, -4: cupool.QuotaExceeded,
               -5: cupool.OutOfMemory, -6: cupool.InvalidArgument, -7: cupool.ProtocolError, -8: cupool.CudaError,
               -9: cupool.Busy, -10: cupool.Exists, -11: cupool.InternalError}
    for status, cls in classes.items():
        e = errors.error_for_status(status, "the message")
        check(type(e) is cls and e.status == status and str(e) == "the message", f"status {status}: {e!r}")
        check(e.status_name == status_name(status) == cupool.STATUS_NAMES[status],
              f"status {status}: {e.status_name} vs the library's {status_name(status)}")
        check(isinstance(e, cupool.CupoolError), f"{cls.__name__} is not a CupoolError")
    check(type(errors.error_for_status(-99, "x")) is cupool.CupoolError, "an unknown status")
    with open(os.path.join(ROOT, "docs", "protocol.md")) as f:
        rows = re.findall(r"^\| `([a-z_]+)` \| .* \| `(CUPOOL_E_[A-Z_]+)` \|$", f.read(), re.M)
    check(len(rows) >= 17, f"the error table of docs/protocol.md was not found ({len(rows)} rows)")
    for code, c_status in rows:
        e = errors.error_for_reply({"ok": False, "error": {"code": code, "message": f"holder says {code}"}})
        check(e.status_name == c_status and e.code == code and str(e) == f"holder says {code}",
              f"code {code}: {type(e).__name__} {e.status_name}, docs/protocol.md says {c_status}")
    check(set(errors.CODE_TO_ERROR) == {code for code, _ in rows},
          f"codes not in docs/protocol.md or not mapped: {set(errors.CODE_TO_ERROR) ^ {c for c, _ in rows}}")
    e = errors.error_for_reply({"ok": False, "error": {"code": "from_the_future", "message": "m"}})
    check(type(e) is cupool.ProtocolError and e.code == "from_the_future", f"an unknown code: {e!r}")


def test_closed_connection(tmp):
    h = Holder(tmp)
    try:
        conn = cupool.connect(h.socket)
        conn.close()
        conn.close()  # a second close does nothing
        for what, call in [("alloc", lambda: conn.alloc("kv", 4096)), ("open_buffer", lambda: conn.open_buffer("shared")),
                           ("status", conn.status), ("stats", conn.stats), ("request", lambda: conn.request({"op": "list"})),
                           ("cached_bytes", lambda: conn.cached_bytes)]:
            e = expect_error(cupool.InvalidArgument, call, contains="closed")
            check("connection is closed" in str(e), f"{what}: {e}")
        try:
            conn.cache_limit = 0
            raise Failure("cache_limit set on a closed connection")
        except cupool.InvalidArgument:
            pass
    finally:
        h.stop()


def test_threads_share_a_connection(tmp):
    h = Holder(tmp)
    try:
        with cupool.connect(h.socket) as conn:
            conn.cache_limit = 0
            errors = []

            def work(seed):
                try:
                    for _ in range(25):
                        with conn.alloc("kv", 64 * 1024) as lease:
                            a = lease.numpy()
                            a[:] = seed
                            if not (a == seed).all():
                                errors.append(f"thread {seed}: another thread's bytes")
                            del a
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(f"thread {seed}: {e!r}")

            threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            check(not errors, "; ".join(errors))
            gc.collect()
            check(held(conn) == (0, 0, 0), f"leases left: {held(conn)}")
    finally:
        h.stop()


# ---- held tensor sets ----


def model_arrays():
    """Model-shaped arrays of several dtypes, odd sizes (so the layout must align), a scalar and an
    empty tensor."""
    rng = np.random.default_rng(7)
    return {
        "embed.weight": rng.standard_normal((33, 16)).astype(np.float16),
        "layers.0.attn.q.weight": rng.standard_normal((16, 16)).astype(np.float32),
        "layers.0.norm.weight": rng.standard_normal(16).astype(np.float64),
        "layers.0.ids": np.arange(7, dtype=np.int8),
        "layers.0.mask": np.array([True, False, True]),
        "layers.0.count": np.array(12345678901, dtype=np.int64),
        "layers.0.empty": np.zeros((0, 5), np.float32),
        "lm_head.weight": rng.standard_normal((5, 16)).astype(np.float32),
    }


DTYPES = {"float16": "F16", "float32": "F32", "float64": "F64", "int8": "I8", "bool": "BOOL", "int64": "I64"}


def write_safetensors(path, arrays, extra=()):
    import json
    import struct
    header, data = {}, b""
    for name, a in arrays.items():
        raw = a.tobytes()
        header[name] = {"dtype": DTYPES[str(a.dtype)], "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    for name, dtype, shape, raw in extra:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def load(h, name, path, *extra):
    r = subprocess.run([H.ARGS.cupool, "buffer", "load", name, path, "--pool", "kv", "--socket", h.socket, *extra],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"cupool buffer load {name}: {r.returncode}\n{r.stdout}{r.stderr}")


def opens(conn, name):
    return next(b["open_count"] for b in conn.status()["buffers"] if b["name"] == name)


CHILD_TENSORS = """
import sys, numpy as np, cupool
t = cupool.tensors(sys.argv[2], framework="numpy", socket=sys.argv[1])
print(len(t), float(t["embed.weight"].astype(np.float64).sum()), int(t["layers.0.count"]), t["layers.0.mask"].tolist())
"""


def test_tensors_across_processes(tmp):
    h = Holder(tmp)
    try:
        arrays = model_arrays()
        path = os.path.join(tmp, "model.safetensors")
        write_safetensors(path, arrays)
        load(h, "model", path)
        with cupool.connect(h.socket, "python-test") as conn:
            index = conn.tensor_index("model")
            check(index["indexed"] and len(index["tensors"]) == len(arrays), f"index: {index}")
            check("id" not in index and "ok" not in index, f"the index carries the protocol's id/ok: {sorted(index)}")
            check(all(t["offset_bytes"] % 256 == 0 for t in index["tensors"]), f"offsets not aligned: {index['tensors']}")
            t = cupool.tensors("model", framework="numpy", socket=h.socket)
            check(sorted(t) == sorted(arrays), f"names: {sorted(t)}")
            for name, a in arrays.items():
                check(t[name].dtype == a.dtype and t[name].shape == a.shape and np.array_equal(t[name], a),
                      f"{name}: {t[name].dtype} {t[name].shape} differs from the file's {a.dtype} {a.shape}")
            # Another process maps the same memory and reads the same values.
            r = run_python(CHILD_TENSORS, h.socket, "model")
            want = f"{len(arrays)} {float(arrays['embed.weight'].astype(np.float64).sum())} 12345678901 [True, False, True]"
            check(r.returncode == 0 and r.stdout.strip() == want, f"child: {r.stdout!r} vs {want!r}\n{r.stderr}")
            # Read-only unless asked: a write through a view would change every process's weights.
            check(not any(a.flags.writeable for a in t.values()), "tensors() gave writable numpy views")
            try:
                t["layers.0.count"][...] = 42
                raise Failure("a read-only view took a write")
            except ValueError:
                pass
            # Shared, not copied: a write through writable=True views is seen by a fresh process.
            w = cupool.tensors("model", framework="numpy", socket=h.socket, writable=True)
            check(all(a.flags.writeable for a in w.values()), "writable=True gave read-only views")
            w["layers.0.count"][...] = 42
            del w
            gc.collect()
            r = run_python(CHILD_TENSORS, h.socket, "model")
            check(r.returncode == 0 and r.stdout.split()[2] == "42", f"child after the write: {r.stdout!r}{r.stderr}")
            check(int(t["layers.0.count"]) == 42, "the read-only view does not see the write")
            # The buffer stays open while any tensor (or a view of one) lives, and closes after.
            check(opens(conn, "model") == 1, f"opens with tensors alive: {opens(conn, 'model')}")
            view = t["lm_head.weight"][1:, ::2]
            del t
            gc.collect()
            check(opens(conn, "model") == 1, "the buffer closed under a live view")
            check(float(view[0, 0]) == float(arrays["lm_head.weight"][1, 0]), "the view's values changed")
            del view
            gc.collect()
            check(opens(conn, "model") == 0, f"opens after the last view went: {opens(conn, 'model')}")
            check(conn.status()["client_count"] == 1, "the connection tensors() made is still open")
    finally:
        h.stop()


def test_tensors_in_parts(tmp):
    """A set loaded in parts (--part-size): each tensor in one part, each part its own allocation;
    cupool.tensors opens every part and the values are the file's."""
    h = Holder(tmp)
    try:
        rng = np.random.default_rng(7)
        arrays = {"a": rng.standard_normal(200_000).astype(np.float32),   # 800 KB
                  "b": rng.standard_normal(200_000).astype(np.float32),   # past 1 MiB with a: part 1
                  "c": rng.standard_normal(75_000).astype(np.float32),    # past 1 MiB with b: part 2
                  "d": np.arange(10, dtype=np.int64)}                     # fits with c
        path = os.path.join(tmp, "parts.safetensors")
        write_safetensors(path, arrays)
        load(h, "parted", path, "--part-size", "1MiB")
        with cupool.connect(h.socket, "python-test") as conn:
            index = conn.tensor_index("parted")
            parts = {t["name"]: t["part"] for t in index["tensors"]}
            check(parts == {"a": 0, "b": 1, "c": 2, "d": 2} and len(index["parts"]) == 3
                  and [p["part"] for p in index["parts"]] == [0, 1, 2]
                  and all(p["size_bytes"] <= 1 << 20 for p in index["parts"]), f"parts: {parts} {index['parts']}")
            t = cupool.tensors("parted", framework="numpy", conn=conn)
            for name, a in arrays.items():
                check(np.array_equal(t[name], a), f"{name} differs from the file's")
            check(opens(conn, "parted") == 3, f"opens with tensors alive: {opens(conn, 'parted')}")
            expect_error(cupool.NotFound, conn.open_buffer, "parted", 3, contains="there is no part 3")
            del t
            gc.collect()
            check(opens(conn, "parted") == 0, f"opens after the tensors went: {opens(conn, 'parted')}")
    finally:
        h.stop()


def test_tensors_errors(tmp):
    h = Holder(tmp)
    try:
        path = os.path.join(tmp, "bf16.safetensors")
        write_safetensors(path, {"w": np.ones(4, np.float32)}, extra=[("h", "BF16", [2], b"\x80\x3f\x00\x40")])
        load(h, "bf16", path)
        expect_error(cupool.NotFound, cupool.tensors, "nope", "numpy", h.socket, contains='no buffer named "nope"')
        e = expect_error(cupool.InvalidArgument, cupool.tensors, "bf16", "jax", h.socket, contains="torch, cupy, numpy")
        check("jax.dlpack.from_dlpack(conn.open_buffer(name, part))" in str(e), f"the jax refusal says no way: {e}")
        expect_error(cupool.InvalidArgument, cupool.tensors, "bf16", "cupy", h.socket, contains="needs a CUDA node")
        try:
            import ml_dtypes  # noqa: F401
            t = cupool.tensors("bf16", framework="numpy", socket=h.socket)
            check(t["h"].astype(np.float32).tolist() == [1.0, 2.0], f"bf16 through ml_dtypes: {t['h']}")
            del t
        except ImportError:
            # numpy has no bfloat16: the BF16 tensor is its raw bits (uint16), with a warning that
            # names it; the set's other tensors are as usual.
            import warnings
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                t = cupool.tensors("bf16", framework="numpy", socket=h.socket)
            said = [str(w.message) for w in seen if issubclass(w.category, cupool.RawDtypeWarning)]
            check(t["w"].dtype == np.float32 and t["w"].tolist() == [1.0] * 4, f"the F32 tensor: {t['w']}")
            check(t["h"].dtype == np.uint16 and t["h"].tolist() == [0x3f80, 0x4000] and
                  ((t["h"].astype(np.uint32) << 16).view(np.float32)).tolist() == [1.0, 2.0], f"BF16 raw: {t['h']}")
            check(len(said) == 1 and "numpy has no dtype for 1 tensor, given as raw bits: h (BF16 as uint16)" in said[0]
                  and "install ml_dtypes, or use framework='torch'" in said[0], f"the warning: {said}")
            del t
        gc.collect()
        with cupool.connect(h.socket) as conn:
            check(opens(conn, "bf16") == 0, "a failed tensors() left the buffer open")
            # A plain buffer has no index: said, not an empty dict.
            expect_error(cupool.InvalidArgument, cupool.tensors, "shared", "numpy", None, conn,
                         contains="buffer shared has no tensor index: it was made without one")
            e = expect_error(cupool.InvalidArgument, cupool.tensors, "shared", "numpy", h.socket)
            check("cupool buffer load shared" in str(e) and "conn.open_buffer('shared')" in str(e), f"no index: {e}")
            check(opens(conn, "shared") == 0, "tensors() of a plain buffer left it open")
            check(not conn.closed, "tensors() closed a connection it was given")
            # A framework that is not installed (torch, the default; hidden if it is here): said
            # before anything is opened, with what to install and what works without it.
            saved = sys.modules.get("torch")
            sys.modules["torch"] = None  # `import torch` raises ModuleNotFoundError
            try:
                # A socket nobody listens at: Unreachable would say it connected first.
                cupool.tensors("bf16", socket=os.path.join(tmp, "nobody.sock"))
                raise Failure("tensors() without torch did not raise")
            except cupool.FrameworkMissing as e:
                check(isinstance(e, ModuleNotFoundError) and e.name == "torch", f"FrameworkMissing: {e!r}")
                for words in ("framework='torch') needs PyTorch (pip install torch)", "framework='numpy'",
                              "framework='cupy'", "DLPack"):
                    check(words in str(e), f"FrameworkMissing lacks {words!r}: {e}")
            finally:
                if saved is None:
                    del sys.modules["torch"]
                else:
                    sys.modules["torch"] = saved
        # While a loader fills a buffer, nobody else may map it; when the loader goes, so does it.
        raw = H.RawClient(h.socket)
        raw.hello()
        body, _ = raw.request("buffer_create", name="half", pool="kv", size=4096, loading=True,
                              tensors=[{"name": "w", "dtype": "F32", "shape": [4], "offset": 0, "size": 16}])
        check(body["ok"], f"buffer_create: {body}")
        expect_error(cupool.Busy, cupool.tensors, "half", "numpy", h.socket, contains="still being loaded")
        raw.close()
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                cupool.tensors("half", framework="numpy", socket=h.socket)
            except cupool.NotFound:
                break
            except cupool.Busy:
                time.sleep(0.05)
        else:
            raise Failure("the half-loaded buffer outlived its loader")
    finally:
        h.stop()


# A child that asks for memory and buffers by this process's devices: its CUDA driver is the
# stand-in (tests/exec/fake_cuda.c: two devices, DEV0 and DEV1, the current one set by argv[3]).
CHILD_DEVICES = """
import ctypes, json, sys, cupool
ctypes.CDLL("libcuda.so.1").fake_cuda_set_device(int(sys.argv[3]))
out = {}
with cupool.connect(sys.argv[1]) as conn:
    with conn.alloc("kv", 1 << 20) as lease:
        out["alloc_none"] = lease.device
    with conn.alloc("kv", 1 << 20, device=sys.argv[2]) as lease:
        out["alloc_uuid"] = lease.device
    with conn.alloc("kv", 1 << 20, device=0) as lease:
        out["alloc_0"] = lease.device
    with conn.open_buffer("on1", device=sys.argv[2].upper()) as lease:
        out["open_uuid"] = lease.device
    try:
        conn.alloc("kv", 1 << 20, device="GPU-00000000-0000-0000-0000-000000000000")
    except cupool.NotFound as e:
        out["alloc_unknown"] = str(e)
print(json.dumps(out))
"""

TWO_GPUS_CONFIG = """version: 1
holder: {{socket: {socket}, mode: "0666"}}
pools:
  - {{name: kv, devices: [0, 1], handle_types: [posix_fd], max_size: 1GiB}}
buffers:
  - {{name: on1, pool: kv, device: 1, size: 1MiB}}
"""


def test_devices_of_this_process(tmp):
    """alloc(device=None) takes the device this process uses now (its current CUDA context's), not
    the pool's first; a device may be given as its UUID ("GPU-...") to alloc and open_buffer."""
    if not FAKE_CUDA:
        raise Skip("no stand-in driver (--fake-cuda)")
    import yaml
    with open(os.path.join(ROOT, "configs", "profiles", "h100.yaml")) as f:
        profile = yaml.safe_load(f)
    first = profile["node"]["devices"][0]
    second = dict(first, device=1, uuid=DEV1, pci_bus_id="0000:00:07.0")
    profile["node"]["devices"] = [first, second]
    profile["node"]["peer_access"] = [[True, True], [True, True]]
    node = os.path.join(tmp, "two.yaml")
    with open(node, "w") as f:
        yaml.safe_dump(profile, f)
    h = Holder(tmp, config_text=TWO_GPUS_CONFIG.format(socket=os.path.join(tmp, "cupool.sock")), profile=node)
    try:
        saved = os.environ.get("LD_LIBRARY_PATH")
        os.environ["LD_LIBRARY_PATH"] = os.path.dirname(FAKE_CUDA) + (":" + saved if saved else "")
        try:
            for current in (0, 1):
                r = run_python(CHILD_DEVICES, h.socket, DEV1, current)
                check(r.returncode == 0, f"current device {current}: {r.stderr}")
                out = json.loads(r.stdout)
                check(out["alloc_none"] == current, f"alloc(device=None) with device {current} current: {out}")
                check(out["alloc_uuid"] == 1 and out["alloc_0"] == 0 and out["open_uuid"] == 1, f"by UUID: {out}")
                check("pool kv is not held on device GPU-00000000-0000-0000-0000-000000000000" in
                      out.get("alloc_unknown", ""), f"an unknown UUID: {out}")
        finally:
            if saved is None:
                del os.environ["LD_LIBRARY_PATH"]
            else:
                os.environ["LD_LIBRARY_PATH"] = saved
    finally:
        h.stop()


def test_library_not_found(tmp):
    code = ("import cupool\n"
            "try:\n"
            "    cupool.connect('/nonexistent/cupool.sock')\n"
            "except cupool.LibraryError as e:\n"
            "    print(e)\n"
            "except cupool.Unreachable:\n"
            "    print('loaded')\n")
    missing = os.path.join(tmp, "libcupool-client.so.1")
    r = run_python(code, lib=missing)
    check(r.returncode == 0 and f"CUPOOL_CLIENT_LIB={missing}" in r.stdout, f"a missing library: {r.stdout}{r.stderr}")
    # Not set: the system's search path (cupool may be installed here), else the message says
    # what to install or set.
    r = run_python(code, lib="")
    check(r.returncode == 0 and (r.stdout.strip() == "loaded" or
                                 ("Install cupool" in r.stdout and "set CUPOOL_CLIENT_LIB" in r.stdout)),
          f"no library on the search path: {r.stdout}{r.stderr}")
    # A library that is not the client library.
    r = run_python(code, lib="libc.so.6")
    check(r.returncode == 0 and "not the cupool client library" in r.stdout, f"another library: {r.stdout}{r.stderr}")


def main():
    global ROOT, np, cupool, FAKE_CUDA
    ap = argparse.ArgumentParser()
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--client-lib", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--fake-cuda", default="", help="a stand-in libcuda.so.1 (tests/exec/fake_cuda.c)")
    ap.add_argument("-k", default="", help="run only the scenarios whose name contains this")
    args = ap.parse_args()
    try:
        import numpy
    except ImportError:
        print("skipped: numpy is missing (Debian: python3-numpy)")
        return 77
    np = numpy
    ROOT = os.path.abspath(args.root)
    FAKE_CUDA = os.path.abspath(args.fake_cuda) if args.fake_cuda else None
    os.environ["CUPOOL_CLIENT_LIB"] = os.path.abspath(args.client_lib)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import cupool as package
    cupool = package
    # The harness's Holder reads the binary and the simulated node's profile from these.
    H.ARGS = argparse.Namespace(cupool=os.path.abspath(args.cupool), sanitizer="")
    H.PROFILE = os.path.join(ROOT, "configs", "profiles", "h100.yaml")
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and args.k in n]
    return H.run_scenarios(tests, "Python package scenarios")


if __name__ == "__main__":
    sys.exit(main())
