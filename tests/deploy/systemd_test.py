#!/usr/bin/python3
"""The systemd units (configs/systemd/): what they say to systemd, and what survives what under one.

usage: systemd_test.py --cupool PATH --root REPO [--units DIR] [--real-systemd]

1. `systemd-analyze verify` of the three units together (where systemd-analyze exists) prints
   nothing: no unknown setting on the systemd here (252 on Debian 12, the README's target), no
   unit they name missing. FileDescriptorStorePreserve= (systemd 254+) is caught by this.
2. The relations (read from the files, as systemd reads them): the holder's unit starts the
   keeper's (Wants=, After=) and gives the holder `--keeper` at the keeper's `--socket`; nothing
   stops or restarts the keeper with the holder (no Requires=, BindsTo=, PartOf=, Requisite=
   between them, either way); both keep the shared runtime directory when they stop
   (RuntimeDirectoryPreserve=yes), so that stopping one does not take the other's socket away.
3. With --real-systemd, and where it can: a systemd (the machine's /lib/systemd/systemd) booted as
   PID 1 of a new PID and mount namespace, with /run, /tmp, /var/tmp, /var/log, /var/lib/systemd
   and /etc/systemd/system its own (empty tmpfs: nothing of this machine is touched), the units
   installed there with the build's binary and a drop-in for the simulated node (CUPOOL_PROFILE)
   and DefaultDependencies=no (so that it starts nothing but them). Then: `systemctl start cupool`
   starts the keeper too; a held buffer is in the keeper; `systemctl stop cupool` leaves the keeper
   running with it; `systemctl start cupool` adopts it; `systemctl restart cupool` adopts it;
   `systemctl stop cupool-keeper cupool` frees it. Skipped (said so) where no systemd can boot.

One line per check, then "N passed, M failed"; exit 1 if anything failed.
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy_test import Report, finish  # noqa: E402  (one report format for tests/deploy)

HOLDER, KEEPER, EXPORTER = "cupool.service", "cupool-keeper.service", "cupool-exporter.service"
FDSTORE = "cupool-fdstore.service"  # the holder's unit with systemd's fd store instead of the keeper
UNITS = (HOLDER, KEEPER, EXPORTER)
# Dependencies that stop or restart a unit with another (systemd.unit(5)).
STOPPING = ("Requires", "BindsTo", "PartOf", "Requisite", "Upholds", "PropagatesStopTo", "StopPropagatedFrom")


def read_unit(path):
    """{section: {key: [values]}}: repeated keys collected, as systemd reads them; comments dropped."""
    out = {}
    section = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                section = out.setdefault(line[1:-1], {})
                continue
            key, _, value = line.partition("=")
            section.setdefault(key.strip(), []).append(value.strip())
    return out


def words(unit, section, key):
    return [w for v in unit.get(section, {}).get(key, []) for w in v.split()]


def option(argv, name):
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def check_relations(r, units):
    holder, keeper = units[HOLDER], units[KEEPER]
    start = shlex.split(holder["Service"]["ExecStart"][-1])
    kstart = shlex.split(keeper.get("Service", {}).get("ExecStart", [""])[-1])
    r.check("the keeper's unit runs `cupool keeper --socket PATH`",
            kstart[1:2] == ["keeper"] and option(kstart, "--socket"), kstart)
    r.check("the holder's unit runs `cupool hold CONFIG --keeper` at the keeper's socket",
            start[1:2] == ["hold"] and option(start, "--keeper") is not None and
            option(start, "--keeper") == option(kstart, "--socket"), [start, kstart])
    r.check("the holder's unit starts the keeper's (Wants=) after it is up (After=)",
            KEEPER in words(holder, "Unit", "Wants") and KEEPER in words(holder, "Unit", "After"),
            holder.get("Unit"))
    tied = [f"{a}: {k}={b}" for a, b in ((HOLDER, KEEPER), (KEEPER, HOLDER)) for k in STOPPING
            if b in words(units[a], "Unit", k)]
    r.check("nothing stops or restarts the keeper with the holder (no Requires/BindsTo/PartOf/... either way)",
            not tied, tied)
    dirs = {name: (words(units[name], "Service", "RuntimeDirectory"),
                   words(units[name], "Service", "RuntimeDirectoryPreserve")) for name in (HOLDER, KEEPER)}
    socket_dir = os.path.dirname(option(kstart, "--socket") or "")
    r.check("the keeper's socket is in the runtime directory both units keep when they stop (RuntimeDirectoryPreserve=yes)",
            all(socket_dir == "/run/" + d[0][0] and d[1] == ["yes"] for d in dirs.values() if d[0]) and
            all(d[0] for d in dirs.values()), dirs)
    unknown_on_252 = [k for k in holder["Service"] if k == "FileDescriptorStorePreserve"]
    r.check("the holder's unit uses no setting systemd 252 lacks (FileDescriptorStorePreserve=)", not unknown_on_252)
    r.check("the keeper's unit is installed on its own (WantedBy=multi-user.target)",
            "multi-user.target" in words(keeper, "Install", "WantedBy"))


def verify(r, unit_dir, cupool, work):
    tool = shutil.which("systemd-analyze")
    if not tool:
        print("skip systemd-analyze verify: systemd-analyze is not installed")
        return
    version = subprocess.run([tool, "--version"], stdout=subprocess.PIPE, text=True).stdout.split("\n")[0]
    paths = []
    for name in UNITS:
        with open(os.path.join(unit_dir, name), encoding="utf-8") as f:
            text = f.read().replace("/usr/bin/cupool", cupool)  # verify wants the executable to exist
        paths.append(os.path.join(work, name))
        with open(paths[-1], "w", encoding="utf-8") as f:
            f.write(text)
    p = subprocess.run([tool, "verify"] + paths, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    r.check(f"`systemd-analyze verify` of the three units says nothing ({version})",
            p.returncode == 0 and not p.stdout.strip(), p.stdout)


# ---- 3. under a real systemd ----

def systemd_version():
    out = subprocess.run(["systemctl", "--version"], stdout=subprocess.PIPE, text=True).stdout.split()
    return int(out[1]) if len(out) > 1 and out[1].isdigit() else 0


def fd_store_variant(text, version):
    """The holder's unit as the README's fd-store rows have it: no keeper, FileDescriptorStoreMax=,
    and FileDescriptorStorePreserve=yes where systemd knows it (254 and later)."""
    out = []
    for line in text.splitlines():
        if line.startswith(("After=", "Wants=")):
            line = " ".join(w for w in line.split(" ") if w != KEEPER)
        if line.startswith("ExecStart="):
            argv = shlex.split(line[len("ExecStart="):])
            if "--keeper" in argv:
                del argv[argv.index("--keeper"):argv.index("--keeper") + 2]
            line = "ExecStart=" + shlex.join(argv)
        out.append(line)
        if line == "[Service]":
            out.append("FileDescriptorStoreMax=8192")
            if version >= 254:
                out.append("FileDescriptorStorePreserve=yes")
    return "\n".join(out) + "\n"


CONFIG = """version: 1
holder:
  socket: /run/cupool/cupool.sock
  mode: "0600"
pools:
  - name: kv
    devices: [0]
    handle_types: [posix_fd]
    max_size: 1GiB
buffers:
  - {name: scratch, pool: kv, device: 0, size: 2MiB}
"""
# The units are started alone: nothing of sysinit.target (tmpfiles, sysctl, remount, udev) runs.
ALONE = "[Unit]\nDefaultDependencies=no\n"
TARGET = "[Unit]\nDescription=cupool's units, alone\nDefaultDependencies=no\n"
# And should anything pull sysinit.target all the same, what would touch this machine is masked.
MASKED = ("systemd-tmpfiles-setup.service", "systemd-tmpfiles-setup-dev.service", "systemd-tmpfiles-clean.service",
          "systemd-tmpfiles-clean.timer", "systemd-sysctl.service", "systemd-remount-fs.service",
          "systemd-sysusers.service", "ldconfig.service", "systemd-modules-load.service", "systemd-binfmt.service",
          "systemd-hwdb-update.service", "systemd-machine-id-commit.service", "systemd-firstboot.service",
          "systemd-random-seed.service", "systemd-udev-trigger.service", "systemd-udevd.service",
          "systemd-update-utmp.service", "systemd-journal-flush.service")


class Systemd:
    """A systemd as PID 1 of its own PID and mount namespaces, with its own /run, /tmp, /var/tmp,
    /var/log, /var/lib/systemd and /etc/systemd/system (tmpfs, gone with it)."""

    def __init__(self, work, unit_dir, cupool, profile):
        self.work = work
        self.cupool = cupool
        etc = os.path.join(work, "etc-systemd")
        os.makedirs(etc)
        config = os.path.join(work, "cupool.yaml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(CONFIG)
        texts = {}
        for name in (HOLDER, KEEPER):
            with open(os.path.join(unit_dir, name), encoding="utf-8") as f:
                texts[name] = f.read().replace("/usr/bin/cupool", cupool).replace("/etc/cupool/cupool.yaml", config)
        texts[FDSTORE] = fd_store_variant(texts[HOLDER], systemd_version())
        for name, text in texts.items():
            with open(os.path.join(etc, name), "w", encoding="utf-8") as f:
                f.write(text)
            os.makedirs(os.path.join(etc, name + ".d"))
            with open(os.path.join(etc, name + ".d", "test.conf"), "w", encoding="utf-8") as f:
                # No journald here: each unit's output goes to a file the test shows when a check fails.
                f.write(ALONE + f"[Service]\nEnvironment=CUPOOL_PROFILE={profile}\n"
                        f"StandardOutput=append:/run/{name}.log\nStandardError=inherit\n")
        with open(os.path.join(etc, "cupool-test.target"), "w", encoding="utf-8") as f:
            f.write(TARGET)
        for name in MASKED:
            os.symlink("/dev/null", os.path.join(etc, name))
        boot = (
            "set -e\n"
            "for d in /run /tmp /var/tmp /var/log /var/lib/systemd /etc/systemd/system; do\n"
            "  mount -t tmpfs -o mode=0755 cupool-test \"$d\"\n"
            "done\n"
            "chmod 1777 /tmp /var/tmp\n"
            f"cp -a {shlex.quote(etc)}/. /etc/systemd/system/\n"
            "exec env container=cupool-test /lib/systemd/systemd --system --unit=cupool-test.target "
            "--log-target=console --log-level=warning --show-status=no\n")
        self.log = open(os.path.join(work, "systemd.log"), "w")
        self.proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount", "--propagation", "private",
                                      "--mount-proc", "sh", "-c", boot], stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.pid = None
        deadline = time.time() + 60
        while time.time() < deadline and self.proc.poll() is None:
            kids = children(self.proc.pid)
            if kids:
                self.pid = int(kids[0])
                state = self.run("systemctl", "is-system-running").stdout.strip()
                if state in ("running", "degraded"):
                    return
            time.sleep(0.2)
        raise RuntimeError(f"no systemd came up: {self.text()}")

    def text(self):
        self.log.flush()
        with open(os.path.join(self.work, "systemd.log"), encoding="utf-8", errors="replace") as f:
            return f.read()[-4000:]

    def run(self, *argv, timeout=60):
        return subprocess.run(["nsenter", "-t", str(self.pid), "-m", "-p", "--"] + list(argv), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)

    def systemctl(self, *argv):
        return self.run("systemctl", "--no-pager", *argv, timeout=120)

    def active(self, unit):
        return self.systemctl("is-active", unit).stdout.strip()

    def kept(self):
        p = self.run(self.cupool, "keeper", "--list", "--socket", "/run/cupool/keeper.sock", "--format", "json")
        try:
            return json.loads(p.stdout)["names"]
        except (ValueError, KeyError):
            return None

    def adopted(self):
        """The names the running holder adopted at its start, from `cupool status`."""
        p = self.run(self.cupool, "status", "--socket", "/run/cupool/cupool.sock", "--format", "json")
        try:
            adoption = json.loads(p.stdout)["custody"].get("adoption") or {}
        except (ValueError, KeyError):
            return None
        return sorted(b["name"] for b in adoption.get("buffers", []))

    def journal(self):
        logs = self.run("sh", "-c", f"tail -n 15 /run/{HOLDER}.log /run/{KEEPER}.log /run/{FDSTORE}.log").stdout
        return self.systemctl("status", HOLDER, KEEPER, FDSTORE).stdout + logs

    def close(self):
        if self.pid:
            try:
                self.systemctl("poweroff")
            except subprocess.TimeoutExpired:
                pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            if self.pid:
                os.kill(self.pid, signal.SIGKILL)  # PID 1 of its namespace: everything in it goes
            self.proc.wait(30)
        self.log.close()


def children(pid):
    """The processes whose parent is `pid` (unshare's child is PID 1 of the new namespace)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def can_boot_systemd():
    if os.geteuid() != 0:
        return "not root"
    for tool in ("unshare", "nsenter"):
        if not shutil.which(tool):
            return f"no {tool}"
    if not os.access("/lib/systemd/systemd", os.X_OK):
        return "no /lib/systemd/systemd"
    p = subprocess.run(["unshare", "--pid", "--fork", "--mount", "--propagation", "private", "--mount-proc", "sh",
                        "-c", "mount -t tmpfs cupool-test /run && echo ok"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    return "" if p.stdout.strip() == "ok" else "can't make a PID and mount namespace: " + p.stdout.strip()


def under_systemd(r, unit_dir, cupool, profile, work):
    why = can_boot_systemd()
    if why:
        print(f"skip under a real systemd: {why}")
        return
    try:
        sd = Systemd(work, unit_dir, cupool, profile)
    except RuntimeError as e:
        print(f"skip under a real systemd: {e}")
        return
    try:
        version = sd.systemctl("--version").stdout.split("\n")[0]
        print(f"under {version}, PID 1 of its own namespaces")
        p = sd.systemctl("start", HOLDER)
        if not r.check("`systemctl start cupool` starts the holder and the keeper",
                       p.returncode == 0 and sd.active(HOLDER) == "active" and sd.active(KEEPER) == "active",
                       p.stdout + sd.journal()):
            return
        deadline = time.time() + 10
        while time.time() < deadline and "cupool-buffer.scratch.0" not in (sd.kept() or []):
            time.sleep(0.1)
        r.check("the held buffer is in the keeper", "cupool-buffer.scratch.0" in (sd.kept() or []), sd.kept())
        p = sd.systemctl("stop", HOLDER)
        r.check("`systemctl stop cupool` stops the holder and leaves the keeper running with the buffer",
                p.returncode == 0 and sd.active(HOLDER) == "inactive" and sd.active(KEEPER) == "active" and
                "cupool-buffer.scratch.0" in (sd.kept() or []), p.stdout + str(sd.kept()) + sd.journal())
        p = sd.systemctl("start", HOLDER)
        r.check("`systemctl start cupool` after the stop adopts the buffer",
                p.returncode == 0 and sd.adopted() == ["scratch"], p.stdout + str(sd.adopted()) + sd.journal())
        p = sd.systemctl("restart", HOLDER)
        r.check("`systemctl restart cupool` adopts the buffer, the keeper stays",
                p.returncode == 0 and sd.adopted() == ["scratch"] and sd.active(KEEPER) == "active",
                p.stdout + str(sd.adopted()) + sd.journal())
        p = sd.systemctl("restart", KEEPER)
        time.sleep(0.5)
        deadline = time.time() + 15
        while time.time() < deadline and "cupool-buffer.scratch.0" not in (sd.kept() or []):
            time.sleep(0.2)
        r.check("`systemctl restart cupool-keeper` with the holder running: the holder gives the buffer again",
                p.returncode == 0 and sd.active(HOLDER) == "active" and "cupool-buffer.scratch.0" in (sd.kept() or []),
                p.stdout + str(sd.kept()) + sd.journal())
        p = sd.systemctl("stop", KEEPER, HOLDER)
        r.check("`systemctl stop cupool-keeper cupool` stops both (the held memory goes)",
                p.returncode == 0 and sd.active(HOLDER) == "inactive" and sd.active(KEEPER) == "inactive",
                p.stdout + sd.journal())
        p = sd.systemctl("start", HOLDER)
        r.check("the next start finds nothing to adopt", p.returncode == 0 and sd.adopted() == [],
                p.stdout + str(sd.adopted()) + sd.journal())
        sd.systemctl("stop", HOLDER, KEEPER)
        # The README's rows for systemd's fd store instead of the keeper, on this systemd's version.
        version = systemd_version()
        p = sd.systemctl("start", FDSTORE)
        p2 = sd.systemctl("restart", FDSTORE)
        r.check("fd store alone: `systemctl restart` adopts the buffer",
                p.returncode == 0 and p2.returncode == 0 and sd.adopted() == ["scratch"],
                p.stdout + p2.stdout + str(sd.adopted()) + sd.journal())
        p = sd.systemctl("stop", FDSTORE)
        p2 = sd.systemctl("start", FDSTORE)
        expected = ["scratch"] if version >= 254 else []
        r.check(f"fd store alone: `systemctl stop` then `start` on systemd {version} "
                + ("keeps the buffer (FileDescriptorStorePreserve=yes)" if version >= 254 else "drops the buffer"),
                p.returncode == 0 and p2.returncode == 0 and sd.adopted() == expected,
                p.stdout + p2.stdout + str(sd.adopted()) + sd.journal())
        sd.systemctl("stop", FDSTORE)
    finally:
        sd.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--units", help="the units' folder (default: ROOT/configs/systemd)")
    ap.add_argument("--real-systemd", action="store_true", help="also boot a systemd and try the units under it")
    args = ap.parse_args()
    unit_dir = args.units or os.path.join(args.root, "configs", "systemd")
    cupool = os.path.abspath(args.cupool)
    r = Report()
    missing = [u for u in UNITS if not os.path.exists(os.path.join(unit_dir, u))]
    if not r.check("configs/systemd has the holder's, the keeper's and the exporter's units", not missing, missing):
        return finish(r)
    units = {u: read_unit(os.path.join(unit_dir, u)) for u in UNITS}
    check_relations(r, units)
    # Not under /tmp: the real systemd gets a /tmp of its own, and the units must see these files.
    work = tempfile.mkdtemp(prefix="systemd-test.", dir=os.path.dirname(cupool))
    try:
        verify(r, unit_dir, cupool, work)
        if args.real_systemd:
            profile = os.path.abspath(os.path.join(args.root, "configs", "profiles", "h100.yaml"))
            under_systemd(r, unit_dir, cupool, profile, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return finish(r)


if __name__ == "__main__":
    sys.exit(main())
