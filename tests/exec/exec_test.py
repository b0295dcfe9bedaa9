#!/usr/bin/env python3
"""`cupool exec` on a simulated node: the process: section is applied inside an unmodified
program, right after its first cuInit (exec_probe reaching a stand-in driver library the ways real
programs reach libcuda.so.1) or before its main (--at start; python3 and echo), and --report writes
its pool figures at exit.

  exec_test.py --cupool build/cupool --root . --probe build/tests/exec/cupool_exec_probe \
               --fake-cuda build/tests/exec/libfakecuda.so
"""
import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "schema"))
import output as machine_output  # noqa: E402  (schemas/cupool-exec-report-v1)

SECTION = """version: 1
process:
  devices: all
  default_pool:
    release_threshold: max
    reuse: {allow_opportunistic: false}
"""


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_configure_report(client, config, profile, check):
    """cupool_configure's report, from the C library in a child process (it applies the section
    to that process) on the simulated node: held against schemas/cupool-configure-v1."""
    code = f"""
import ctypes, sys
lib = ctypes.CDLL({client!r})
lib.cupool_configure.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
lib.cupool_free_string.argtypes = [ctypes.c_void_p]
out = ctypes.c_void_p()
rc = lib.cupool_configure({config!r}.encode(), ctypes.byref(out))
sys.stdout.write(ctypes.string_at(out.value).decode() if out.value else "")
lib.cupool_free_string(out)
sys.exit(rc)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, CUPOOL_PROFILE=profile))
    check(r.returncode == 0, f"cupool_configure on the simulated node: rc {r.returncode} {r.stderr[-300:]}")
    if r.returncode != 0:
        return
    doc = json.loads(r.stdout)
    try:
        machine_output.validate("configure", doc, "cupool_configure's report")
        check(True, "cupool_configure's report matches schemas/cupool-configure-v1")
    except machine_output.OutputError as e:
        check(False, str(e))
    changes = doc.get("changes", [])
    check(len(changes) > 0 and all(c.get("process_device") == c.get("device") and c.get("uuid", "").startswith("GPU-")
                                   for c in changes),
          f"each change names the process's device, its UUID and (until 0.2) its old name: {changes}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--probe", required=True)
    ap.add_argument("--probe-linked", required=True)
    ap.add_argument("--fake-cuda", required=True)
    ap.add_argument("--client", required=True, help="libcupool-client.so (cupool_configure's report)")
    ap.add_argument("--sanitized", action="store_true", help="the build is sanitized: skip (exit 77)")
    args = ap.parse_args()
    # The test programs find the stand-in driver (libcuda.so.1) through their RUNPATH; a directory on
    # LD_LIBRARY_PATH that holds the real driver (as on the GPU machines) would be searched first.
    os.environ["LD_LIBRARY_PATH"] = ":".join(
        d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d and not os.path.exists(os.path.join(d, "libcuda.so.1")))
    if args.sanitized:
        print("skipped: a sanitized preload library can't be loaded into an unsanitized python3")
        return 77
    profile = os.path.join(args.root, "configs", "profiles", "h100.yaml")
    tmp = tempfile.mkdtemp(prefix="cupool-exec-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # also when a check fails
    config = os.path.join(tmp, "p.yaml")
    with open(config, "w") as f:
        f.write(SECTION)
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    check_configure_report(args.client, config, profile, check)

    # When: right after the program's first successful cuInit, whichever way it got there; never in
    # a program that doesn't initialise CUDA; in a forked child that does, and not in its parent.
    def probe(mode, *extra):
        r = subprocess.run([args.cupool, "exec", config, "--profile", profile] + list(extra) +
                           ["--", args.probe, mode, args.fake_cuda], capture_output=True, text=True, timeout=60)
        fields = {}
        for line in r.stdout.splitlines():
            for word in line.split():
                if "=" in word:
                    k, v = word.split("=", 1)
                    fields.setdefault(k, v)
        applied = [line for line in r.stderr.splitlines() if line.startswith("cupool exec: applied")]
        return r, fields, applied

    r, f, applied = probe("none")
    check(r.returncode == 0 and applied == [], f"a program that never calls cuInit gets nothing applied: {r.stderr}")
    r, f, applied = probe("direct")
    check(r.returncode == 0 and f.get("cuInit") == "0" and f.get("driver_calls") == "1",
          f"dlsym(cuInit): the program's call reaches the driver once: {r.stdout}")
    check(len(applied) == 1 and f"to pid {f.get('pid')}:" in applied[0], f"applied after cuInit: {r.stderr}")
    # What was applied, in words ("device 0: release_threshold 0B -> 75%, ..."), not a JSON dump.
    check("{" not in applied[0] and ("device 0: " in applied[0] or "nothing to change" in applied[0]),
          f"the applied line is in words: {applied[0]}")
    r, f, applied = probe("getproc")
    check(r.returncode == 0 and f.get("cuGetProcAddress") == "0" and f.get("driver_calls") == "1" and len(applied) == 1,
          f"cuInit through cuGetProcAddress_v2 (the CUDA runtime's way): {r.stdout} {r.stderr}")
    r, f, applied = probe("getproc2")
    check(r.returncode == 0 and f.get("cuGetProcAddress") == "0" and f.get("driver_calls") == "1" and len(applied) == 1,
          f"cuInit through the cuGetProcAddress that cuGetProcAddress_v2 gave for itself: {r.stdout} {r.stderr}")
    r, f, applied = probe("fork")
    child = f.get("pid")
    check(r.returncode == 0 and len(applied) == 1 and f"to pid {child}:" in applied[0] and child != f.get("main_pid"),
          f"a forked child that initialises CUDA gets the section, its parent does not: {r.stdout} {r.stderr}")
    r = subprocess.run([args.cupool, "exec", config, "--profile", profile, "--", args.probe_linked],
                       capture_output=True, text=True, timeout=60)
    applied = [line for line in r.stderr.splitlines() if line.startswith("cupool exec: applied")]
    check(r.returncode == 0 and "cuInit=0 driver_calls=1" in r.stdout and len(applied) == 1,
          f"a program linked against the driver library (cuInit through its PLT): {r.stdout} {r.stderr}")
    r, f, applied = probe("rtld")
    check(r.returncode == 0 and f.get("rtld_next_same") == "1" and f.get("rtld_default_same") == "1",
          f"RTLD_NEXT and RTLD_DEFAULT keep their meaning under the preload library: {r.stdout}")
    check(f.get("missing_null") == "1" and f.get("dlerror_set") == "1", f"a failed dlsym still sets dlerror: {r.stdout}")
    r, f, applied = probe("hidden", "--strict")
    check(r.returncode == 3 and applied == [] and "--strict: pid" in r.stderr,
          f"--strict: a process that used CUDA out of sight, nothing applied, exits 3: {r.returncode} {r.stderr}")
    r, f, applied = probe("hidden")
    check(r.returncode == 0 and applied == [] and "initialised the CUDA driver without cupool seeing its cuInit" in r.stderr
          and "--at start" in r.stderr, f"a driver initialised out of sight is reported at exit: {r.stderr}")
    r, f, applied = probe("load")
    check(r.returncode == 0 and applied == [] and "without cupool seeing" not in r.stderr,
          f"a program that loaded but never initialised the driver: nothing applied, nothing to report: {r.stderr}")
    r, f, applied = probe("none", "--at", "start")
    check(r.returncode == 0 and len(applied) == 1 and f"to pid {f.get('main_pid')}:" in applied[0],
          f"--at start applies before main: {r.stderr}")
    plain = subprocess.run([args.probe, "rtld", args.fake_cuda], capture_output=True, text=True, timeout=60)
    check("rtld_next_same=1 rtld_default_same=1" in plain.stdout, f"the probe's own check, without cupool: {plain.stdout}")

    # Applied before main (--at start), reported at exit (an unmodified python3 here).
    report = os.path.join(tmp, "report.jsonl")
    r = subprocess.run([args.cupool, "exec", config, "--at", "start", "--profile", profile, "--report=" + report, "--",
                        sys.executable, "-c", "import sys; print('inside'); sys.exit(7)"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 7, f"the command's exit status comes through (got {r.returncode})")
    check(r.stdout == "inside\n", f"the command ran unmodified: {r.stdout!r}")
    check("device 0: release_threshold 0B -> max" in r.stderr, f"the change is reported: {r.stderr}")
    machine_output.check_exec_report(report)
    lines = [json.loads(line) for line in open(report)]
    check(len(lines) >= 1, f"one report line per process: {len(lines)}")
    pool = lines[0]["stats"]["devices"][0]["pools"][0]
    check(pool["release_threshold"] == "max" and pool["release_threshold_bytes"] is None
          and pool["reuse"]["allow_opportunistic"] is False,
          f"the report shows the settings seen inside the program: {pool}")

    # current_pool: a pool made inside the program and made current; the report shows both pools.
    current = os.path.join(tmp, "current.yaml")
    with open(current, "w") as f:
        f.write("version: 1\nprocess:\n  current_pool: {release_threshold: 1GiB, reserve: 512MiB}\n")
    report2 = os.path.join(tmp, "report-current.jsonl")
    r = subprocess.run([args.cupool, "exec", current, "--at", "start", "--profile", profile, "--report=" + report2, "--",
                        sys.executable, "-c", "print('inside')"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and "current_pool the default pool -> a new pool" in r.stderr,
          f"current_pool is made inside the program: {r.returncode} {r.stderr}")
    machine_output.check_exec_report(report2)
    pools = [json.loads(line) for line in open(report2)][0]["stats"]["devices"][0]["pools"]
    by = {p["role"]: p for p in pools}
    check(set(by) == {"default", "current"} and by["current"]["release_threshold_bytes"] == 1 << 30
          and by["current"]["reserved_bytes"] == 512 << 20 and by["default"]["release_threshold_bytes"] == 0,
          f"the report shows the current pool with its settings and reserve, the default pool untouched: {pools}")

    # A share of the device: said as the file wrote it, in the line exec prints and in the report
    # (not as the driver's bytes, 75% of the H100 being 62268672KiB).
    share = os.path.join(tmp, "share.yaml")
    with open(share, "w") as f:
        f.write("version: 1\nprocess:\n  default_pool: {release_threshold: 75%}\n")
    report_share = os.path.join(tmp, "report-share.jsonl")
    r = subprocess.run([args.cupool, "exec", share, "--at", "start", "--profile", profile, "--report=" + report_share,
                        "--", sys.executable, "-c", "print('inside')"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and "device 0: release_threshold 0B -> 75%" in r.stderr, f"75% as written: {r.stderr}")
    machine_output.check_exec_report(report_share)
    pool = [json.loads(line) for line in open(report_share)][0]["stats"]["devices"][0]["pools"][0]
    check(pool["release_threshold"] == "75%" and pool["release_threshold_bytes"] == 62268672 << 10,
          f"the report says 75%: {pool}")

    # A program whose path holds quotes, backslashes, control and non-UTF-8 bytes: the report is
    # still one JSON object a line, the path escaped (the bad byte as U+FFFD).
    odd_dir = os.path.join(tmp.encode(), b'we"ird\\dir\x01\xff')
    os.makedirs(odd_dir, exist_ok=True)
    odd = os.path.join(odd_dir, b"echo")
    with open("/bin/echo", "rb") as src, open(odd, "wb") as dst:
        dst.write(src.read())
    os.chmod(odd, 0o755)
    report3 = os.path.join(tmp, "report-odd.jsonl")
    r = subprocess.run([args.cupool.encode(), b"exec", config.encode(), b"--at", b"start", b"--profile", profile.encode(),
                        b"--report=" + report3.encode(), b"--", odd, b"odd"], capture_output=True, timeout=60)
    machine_output.check_exec_report(report3)
    odd_line = json.loads(open(report3, encoding="utf-8").readline())
    check(r.returncode == 0 and odd_line["program"] == os.fsdecode(odd).replace("\udcff", "\ufffd"),
          f"a program with an odd path is reported as JSON: {r.returncode} {odd_line.get('program')!r}")

    # A bare --report right before `--`: CMD's own options stay CMD's (echo -n, not cupool's -n).
    r = subprocess.run([args.cupool, "exec", config, "--at", "start", "--profile", profile, "--report", "--",
                        "/bin/echo", "-n", "hi"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and r.stdout == "hi", f"--report -- CMD -n: {r.returncode} {r.stdout!r} {r.stderr}")

    # --report FILE, the file a separate argument, is --report=FILE (issue 22: it exited 2).
    report4 = os.path.join(tmp, "report-separate.jsonl")
    r = subprocess.run([args.cupool, "exec", config, "--at", "start", "--profile", profile, "--report", report4, "--",
                        sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and os.path.exists(report4), f"--report FILE -- CMD: {r.returncode} {r.stderr}")
    r = subprocess.run([args.cupool, "exec", config, "--at", "start", "--profile", profile, "--report", "-", "--",
                        "/bin/echo", "-n", "hi"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and r.stdout == "hi", f"--report - -- CMD -n: {r.returncode} {r.stdout!r} {r.stderr}")
    if os.path.exists(report4):
        machine_output.check_exec_report(report4)
        mode = os.stat(report4).st_mode & 0o777
        check(mode == 0o600 & ~current_umask(), f"a new report file is the user's alone: {oct(mode)}")

    # The report's path may be in a directory others can write (issue 22): a link there is not
    # followed (root appended to a root-only file through it), a FIFO does not hold the process at
    # exit; either is said on stderr and the command's status stands.
    victim = os.path.join(tmp, "victim")
    with open(victim, "w") as f:
        f.write("keep\n")
    link = os.path.join(tmp, "link.jsonl")
    os.symlink(victim, link)
    r = subprocess.run([args.cupool, "exec", config, "--at", "start", "--profile", profile, "--report=" + link, "--",
                        sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and open(victim).read() == "keep\n" and "symbolic link" in r.stderr,
          f"--report through a link: {r.returncode} {open(victim).read()!r} {r.stderr}")
    fifo = os.path.join(tmp, "fifo.jsonl")
    os.mkfifo(fifo)
    start = time.monotonic()
    try:
        r = subprocess.run([args.cupool, "exec", config, "--at", "start", "--profile", profile, "--report=" + fifo,
                            "--", sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=30)
        check(r.returncode == 0 and "can't write the report" in r.stderr and time.monotonic() - start < 20,
              f"--report to a FIFO nobody reads: {r.returncode} {r.stderr}")
    except subprocess.TimeoutExpired:
        check(False, "--report to a FIFO nobody reads: the process hung at exit")

    # A preload path the dynamic loader would split (a space or colon) or look up in the command's
    # working directory (relative) is refused before the command runs (issue 22: with --strict the
    # command ran with nothing applied, and the part after the space was another user's library).
    for preload in ("/opt/my tools/libcupool-preload.so", "/opt/a:b/libcupool-preload.so", "libcupool-preload.so"):
        r = subprocess.run([args.cupool, "exec", config, "--strict", "--profile", profile, "--", "/bin/echo", "ran"],
                           capture_output=True, text=True, timeout=60, env=dict(os.environ, CUPOOL_PRELOAD=preload))
        check(r.returncode == 1 and "ran" not in r.stdout and "preload library's path" in r.stderr,
              f"CUPOOL_PRELOAD={preload!r}: {r.returncode} {r.stdout!r} {r.stderr}")

    # A program the dynamic loader puts no library into (set-user-ID, statically linked, or a script
    # run by one) gets nothing applied: a warning, or with --strict exit 1 before it runs (issue 22:
    # it ran with nothing applied and exited 0).
    suid = os.path.join(tmp, "suid-true")
    shutil.copy("/bin/true", suid)
    if os.geteuid() == 0:  # set-user-ID to nobody, not root: no set-user-ID-root program is made
        os.chown(suid, 65534, 65534)
    os.chmod(suid, 0o4755)
    script = os.path.join(tmp, "by-suid.sh")
    with open(script, "w") as f:
        f.write(f"#!{suid}\n")
    os.chmod(script, 0o755)
    static = os.path.join(tmp, "static-true")
    with open(static + ".c", "w") as f:
        f.write("int main(void) { return 0; }\n")
    built = subprocess.run(["cc", "-static", "-o", static, static + ".c"], capture_output=True, text=True)
    programs = [(suid, "set-user-ID"), (script, "set-user-ID")]
    if built.returncode == 0:
        programs.append((static, "statically linked"))
    else:
        print("skip  a statically linked program: cc -static does not link here")
    for program, why in programs:
        r = subprocess.run([args.cupool, "exec", config, "--strict", "--profile", profile, "--", program],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 1 and why in r.stderr, f"--strict -- {os.path.basename(program)}: {r.returncode} {r.stderr}")
        r = subprocess.run([args.cupool, "exec", config, "--profile", profile, "--", program],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 0 and "nothing will be applied" in r.stderr,
              f"-- {os.path.basename(program)}: {r.returncode} {r.stderr}")

    # A broken file stops before the command (exit 2), with the finding.
    bad = os.path.join(tmp, "bad.yaml")
    with open(bad, "w") as f:
        f.write("version: 1\nprocess:\n  default_pool: {release_threshold: 12}\n")
    r = subprocess.run([args.cupool, "exec", bad, "--profile", profile, "--", "/bin/echo", "never"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "never" not in r.stdout and "bad.yaml:3:" in r.stderr,
          f"an invalid file stops before the command: {r.returncode} {r.stderr}")

    # A section that does not fit this node: exit 1.
    far = os.path.join(tmp, "far.yaml")
    with open(far, "w") as f:
        f.write("version: 1\nprocess:\n  devices: [3]\n  default_pool: {release_threshold: max}\n")
    r = subprocess.run([args.cupool, "exec", far, "--profile", profile, "--", "/bin/true"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "no device '3'" in r.stderr, f"a missing device: {r.returncode} {r.stderr}")

    # Inside the program the failure is a line on stderr and the program still runs, unless
    # --strict: simulate it by breaking the file after the check (CUPOOL_EXEC_CONFIG points to it).
    env = dict(os.environ, CUPOOL_EXEC_CONFIG=bad, CUPOOL_PROFILE=profile, CUPOOL_EXEC_AT="start",
               LD_PRELOAD=os.path.join(os.path.dirname(os.path.abspath(args.cupool)), "libcupool-preload.so"))
    r = subprocess.run(["/bin/echo", "ran"], capture_output=True, text=True, env=env, timeout=60)
    check(r.returncode == 0 and r.stdout == "ran\n" and "was not applied" in r.stderr,
          f"a failure inside the program is reported and the program runs: {r.returncode} {r.stderr}")
    r = subprocess.run(["/bin/echo", "ran"], capture_output=True, text=True, env=dict(env, CUPOOL_EXEC_STRICT="1"), timeout=60)
    check(r.returncode == 3 and r.stdout == "" and "--strict" in r.stderr,
          f"--strict stops the program before main: {r.returncode} {r.stderr}")

    # The same at cuInit (the default): the program's cuInit still returns, unless --strict.
    env_cuinit = dict(env, CUPOOL_EXEC_AT="cuinit")
    r = subprocess.run([args.probe, "direct", args.fake_cuda], capture_output=True, text=True, env=env_cuinit, timeout=60)
    check(r.returncode == 0 and "cuInit=0" in r.stdout and "was not applied" in r.stderr,
          f"a failure at cuInit is reported and cuInit returns: {r.returncode} {r.stdout} {r.stderr}")
    r = subprocess.run([args.probe, "direct", args.fake_cuda], capture_output=True, text=True,
                       env=dict(env_cuinit, CUPOOL_EXEC_STRICT="1"), timeout=60)
    check(r.returncode == 3 and "cuInit=" not in r.stdout and "--strict" in r.stderr,
          f"--strict ends the process at its first cuInit: {r.returncode} {r.stdout} {r.stderr}")

    print(f"{'all' if not failures else len(failures)} {'passed' if not failures else 'failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
