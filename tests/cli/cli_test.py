#!/usr/bin/env python3
"""Runs the cupool binary and compares what it prints with the expected files.

Cases:
  - every tests/bad/schema/*.yaml: `cupool check` exits 2 and prints exactly NAME.out;
  - every tests/bad/fit/*.yaml: `cupool check --profile P [ARGS]` exits as its header says
    (default 1) and prints exactly NAME.out; the header names the profile:
        # profile: configs/profiles/synthetic-8gpu-mixed-peers.yaml
        # args: --deep            (optional)
        # exit: 0                 (optional)
  - every check rule in core/config/check.cpp and every parser code in core/config/parser.cpp has at least
    one bad file whose expected output names it (so a new rule cannot land untested);
  - shipped examples fit their profiles; JSON output parses; profiles round-trip; usage errors
    exit 2; the binary without a driver exits 3.

`--update` rewrites the .out files from the current binary (review the diff before committing).
Prints `N passed, M failed` last; exits 1 on any failure.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "schema"))
import output as machine_output  # noqa: E402  (schemas/cupool-*-v1: every --format json/yaml output is validated)

PROFILE_DEFAULT = "configs/profiles/h100.yaml"
# The first line of a finding: "path:line:col: severity: message [code]".
FINDING = r"^\S+?(?::\d+:\d+)?: (?:error|warning|note): .* \[([a-z-]+)\]$"


class Runner:
    def __init__(self, cupool, root, update):
        self.cupool = cupool
        self.root = root
        self.update = update
        self.passed = 0
        self.failed = []
        self.schema_checked = 0

    def run(self, args, stdin=None, env=None, validate=True):
        full_env = dict(os.environ)
        full_env.pop("CUPOOL_PROFILE", None)
        full_env.pop("CUPOOL_LOG_LEVEL", None)
        full_env["COLUMNS"] = "100"
        # query reports this host's kernel's dmem controller: the tests give it a tree of their own
        # (tests/cli/cgroup: the controller, one region), so its output is the same on every host.
        full_env["CUPOOL_CGROUP_ROOT"] = "tests/cli/cgroup"
        if env:
            full_env.update(env)
        p = subprocess.run([self.cupool] + args, cwd=self.root, input=stdin, capture_output=True,
                           text=True, errors="replace", env=full_env, timeout=60)
        try:
            if validate:  # help texts are not machine output, whatever verb they are of
                self.schema_checked += machine_output.check_command(args, p.stdout)
        except machine_output.OutputError as e:
            self.ok("output schema", False, str(e))
        return p.returncode, p.stdout, p.stderr

    def ok(self, name, cond, detail=""):
        if cond:
            self.passed += 1
        else:
            self.failed.append(name)
            print(f"FAIL {name}\n{detail}", flush=True)

    def golden(self, name, path, text):
        if self.update:
            with open(path, "w") as f:
                f.write(text)
            self.passed += 1
            return
        try:
            with open(path) as f:
                expected = f.read()
        except FileNotFoundError:
            self.ok(name, False, f"missing expected file {path} (run with --update and review it)")
            return
        self.ok(name, text == expected, diff(expected, text))


def diff(expected, actual):
    import difflib
    return "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True), "expected", "actual"))


def header(path):
    meta = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"#\s*(profile|args|exit|rule):\s*(.*?)\s*$", line)
            if m:
                meta[m.group(1)] = m.group(2)
            elif not line.startswith("#"):
                break
    return meta


def rel(root, path):
    return os.path.relpath(path, root)


def bad_files(r):
    codes_seen = set()
    for kind, default_exit in (("schema", 2), ("fit", 1)):
        folder = os.path.join(r.root, "tests", "bad", kind)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".yaml"):
                continue
            path = os.path.join(folder, name)
            meta = header(path)
            profile = meta.get("profile", PROFILE_DEFAULT)
            args = ["check", rel(r.root, path), "--profile", profile] + meta.get("args", "").split()
            code, out, err = r.run(args)
            want = int(meta.get("exit", default_exit))
            r.ok(f"{kind}/{name} exit", code == want, f"exit {code}, want {want}\n{out}{err}")
            r.golden(f"{kind}/{name} text", path[:-5] + ".out", out)
            codes = re.findall(FINDING, out, re.M)
            codes_seen.update(codes)
            # The JSON form carries the same findings.
            code_j, out_j, _ = r.run(args + ["--format", "json"])
            try:
                doc = json.loads(out_j)
                r.ok(f"{kind}/{name} json", code_j == want and doc["exit_code"] == want and
                     sorted(f["code"] for f in doc["findings"]) ==
                     sorted(codes), out_j)
            except (ValueError, KeyError) as e:
                r.ok(f"{kind}/{name} json", False, f"{e}\n{out_j}")
    return codes_seen


def rule_coverage(r, codes_seen):
    """Every finding code the source can emit appears in some bad file's expected output."""
    emitted = set()
    for src, pattern in (("core/config/check.cpp", r'd_\.(?:error|warning|note)\(\s*"([a-z-]+)"'),
                         ("core/config/parser.cpp", r'(?:d_|diags)\.invalid\(\s*"([a-z-]+)"')):
        with open(os.path.join(r.root, src)) as f:
            emitted.update(re.findall(pattern, f.read()))
    # Limits the JSON schema has no words for (sizes, nesting, alias expansion) are tested in
    # tests/unit/config/parser_test.cpp.
    exempt = {"too-many", "too-deep", "too-large"}
    missing = sorted(emitted - codes_seen - exempt)
    r.ok("every rule has a bad file", not missing, "no bad file under tests/bad/ produces: " + ", ".join(missing))


def schema_good(r):
    """Files the JSON schema accepts are valid configs for the parser too (no exit 2)."""
    folder = os.path.join(r.root, "tests", "schema", "good")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".yaml"):
            code, out, err = r.run(["check", f"tests/schema/good/{name}", "--profile", PROFILE_DEFAULT])
            r.ok(f"schema-valid {name} parses", code in (0, 1) and "not a valid cupool config" not in out, out + err)


def examples(r):
    pairs = {
        "configs/single-gpu-inference.yaml": "configs/profiles/h100.yaml",
        "configs/host-numa.yaml": "configs/profiles/h100.yaml",
        "configs/ipc-multiprocess-server.yaml": "configs/profiles/h200x2.yaml",
        "configs/training-8gpu.yaml": "configs/profiles/synthetic-8gpu-mixed-peers.yaml",
        "configs/pytorch-current-pool.yaml": "configs/profiles/h100.yaml",
        "configs/systemd/cupool.yaml": "configs/profiles/h100.yaml",  # /etc/cupool/cupool.yaml in the package
    }
    for config, profile in pairs.items():
        if not os.path.exists(os.path.join(r.root, profile)):
            r.ok(f"example {config}", False, f"profile {profile} is missing")
            continue
        # --strict, but for the users and groups a shipped config names on purpose (svc-infer, gpu):
        # a fresh node lacks them, and check says so (unknown-user, unknown-group), as a warning.
        code, out, err = r.run(["check", config, "--profile", profile, "--strict", "--format", "json"])
        try:
            findings = json.loads(out)["findings"]
        except (ValueError, KeyError):
            findings = None
        others = [f for f in findings or [] if f["code"] not in ("unknown-user", "unknown-group")]
        r.ok(f"example {config} fits {profile}", findings is not None and code in (0, 1) and not others
             and all(f["severity"] == "warning" for f in findings), out + err)


def query(r):
    profiles_dir = os.path.join(r.root, "configs", "profiles")
    for name in sorted(os.listdir(profiles_dir)):
        if not name.endswith(".yaml"):
            continue
        profile = f"configs/profiles/{name}"
        code, out, err = r.run(["query", "--profile", profile])
        r.ok(f"query {name}", code == 0 and "GPU 0:" in out, out + err)
        r.golden(f"query {name} text", os.path.join(r.root, "tests", "cli", "expected", f"query-{name[:-5]}.txt"), out)
        code, out, err = r.run(["query", "--profile", profile, "--format", "json"])
        try:
            doc = json.loads(out)
            r.ok(f"query {name} json", code == 0 and doc["source"]["simulated"] is True and
                 len(doc["devices"]) == len(doc["peer_access"]), out)
        except ValueError as e:
            r.ok(f"query {name} json", False, f"{e}\n{out}{err}")
        # A profile written from a profile describes the same node.
        with tempfile.TemporaryDirectory() as tmp:
            again = os.path.join(tmp, "again.yaml")
            code, out, err = r.run(["query", "--profile", profile, "--profile-out", again, "--format", "json"])
            code2, out2, err2 = r.run(["query", "--profile", again, "--format", "json"])
            strip = lambda d: {k: v for k, v in json.loads(d).items() if k != "source"}
            r.ok(f"query {name} round trip", code == 0 and code2 == 0 and strip(out) == strip(out2), err + err2)
        code, out, err = r.run(["query", "--profile", profile, "--format", "yaml"])
        r.ok(f"query {name} yaml", code == 0 and "devices:" in out, out + err)
    # The kernel's dmem controller: a host without cgroup v2 there, and one whose kernel lacks it.
    with tempfile.TemporaryDirectory() as tmp:
        code, out, err = r.run(["query", "--profile", PROFILE_DEFAULT], env={"CUPOOL_CGROUP_ROOT": tmp})
        r.ok("query says where no cgroup v2 is", code == 0 and
             f"GPU memory limits (dmem cgroup) no: no cgroup v2 hierarchy at {tmp}" in out, out + err)
        with open(os.path.join(tmp, "cgroup.controllers"), "w") as f:
            f.write("cpu memory pids\n")
        code, out, err = r.run(["query", "--profile", PROFILE_DEFAULT, "--format", "json"],
                               env={"CUPOOL_CGROUP_ROOT": tmp})
        dmem = json.loads(out).get("dmem", {}) if code == 0 else {}
        r.ok("query says the kernel has no dmem controller", dmem.get("available") is False and
             dmem.get("controller") is False and "CONFIG_CGROUP_DMEM" in (dmem.get("note") or ""), out + err)


def usage(r):
    code, out, err = r.run(["--help"])
    r.ok("--help exits 0 and lists exit codes", code == 0 and "Exit codes:" in out and "130" in out, out + err)
    code, out, err = r.run([])
    r.ok("no verb exits 2", code == 2, out + err)
    code, out, err = r.run(["query", "--format", "xml"])
    r.ok("bad --format exits 2", code == 2, out + err)
    code, out, err = r.run(["check"])
    r.ok("check without a file exits 2", code == 2, out + err)
    code, out, err = r.run(["exec", "configs/pytorch-current-pool.yaml", "--at", "later", "--", "/bin/true"])
    r.ok("exec --at takes cuinit or start (exit 2)", code == 2 and "later" in err, out + err)
    code, out, err = r.run(["hold", "configs/host-numa.yaml", "--max-clients-per-user", "0"])
    r.ok("hold --max-clients-per-user 0 exits 2", code == 2 and "max-clients-per-user" in err, out + err)
    code, out, err = r.run(["check", "/nonexistent/pools.yaml", "--profile", PROFILE_DEFAULT])
    r.ok("unreadable file exits 2 and names it", code == 2 and "/nonexistent/pools.yaml" in err, out + err)
    code, out, err = r.run(["query", "--profile", "/nonexistent/node.yaml"])
    r.ok("unreadable profile exits 2", code == 2 and "/nonexistent/node.yaml" in err, out + err)
    code, out, err = r.run(["query", "--profile", "configs/single-gpu-inference.yaml"])
    r.ok("a config is not a profile", code == 2 and "not a node profile" in err, out + err)
    code, out, err = r.run(["query", "--profile", PROFILE_DEFAULT, "--devices", "7"])
    r.ok("query --devices of a missing device exits 2", code == 2 and "no device '7'" in err, out + err)
    code, out, err = r.run(["query", "--profile", PROFILE_DEFAULT, "--devices", "0", "--format", "json"])
    r.ok("query --devices 0", code == 0 and len(json.loads(out)["devices"]) == 1, out + err)
    # Standard input and the environment twin.
    with open(os.path.join(r.root, "configs", "single-gpu-inference.yaml")) as f:
        text = f.read()
    code, out, err = r.run(["check", "-"], stdin=text, env={"CUPOOL_PROFILE": PROFILE_DEFAULT})
    r.ok("check - reads stdin; CUPOOL_PROFILE is --profile", code == 0 and "\n<stdin>: fits" in "\n" + out, out + err)


def forgiving(r):
    """Mistyped verbs and options get a hint; global options work after the verb; --version names
    the build; NO_COLOR and the journal change how diagnostics are written, never what they say."""
    code, out, err = r.run(["quer"])
    r.ok("a mistyped verb: exit 2 with a hint",
         code == 2 and err.startswith('cupool: unknown verb "quer" (did you mean "query"?)\n'), out + err)
    code, out, err = r.run(["stauts"])
    r.ok("a mistyped verb is named as one, not 'a subcommand is required'",
         code == 2 and err.splitlines()[0] == 'cupool: unknown verb "stauts" (did you mean "status"?)' and
         "subcommand" not in err.lower(), out + err)
    code, out, err = r.run(["buffer", "craete", "x"])
    r.ok("a mistyped nested verb gets a hint",
         code == 2 and err.startswith('cupool buffer: unknown verb "craete" (did you mean "create"?)\n'), out + err)
    code, out, err = r.run(["query", "--formt", "json", "--profile", PROFILE_DEFAULT])
    r.ok("a mistyped option gets a hint",
         code == 2 and err.startswith('cupool query: unknown option "--formt" (did you mean "--format"?)\n'), out + err)
    code, out, err = r.run(["frobnicate"])
    r.ok("a word near nothing gets no hint",
         code == 2 and err.startswith('cupool: unknown verb "frobnicate"\n') and "did you mean" not in err, out + err)
    code, out, err = r.run(["--version"])
    r.ok("--version names the commit and the CUDA headers",
         code == 0 and re.match(r"cupool \d+\.\d+\.\d+ \(commit ([0-9a-f]{12}(-dirty)?|unknown)\)", out) is not None
         and "CUDA " in out and " headers" in out, out + err)

    def hold_log(env, stderr_file=None, read_back=True):
        """A holder on the simulated node, --log-level after the verb, stopped once it listens:
        its diagnostics (info lines: pools created, listening)."""
        with tempfile.TemporaryDirectory() as tmp:
            full = dict(os.environ, **env)
            full.pop("CUPOOL_PROFILE", None)
            full.pop("CUPOOL_LOG_LEVEL", None)
            log = stderr_file or open(os.path.join(tmp, "log"), "w+b")
            config = os.path.join(tmp, "pools.yaml")
            with open(config, "w") as c:
                c.write("version: 1\npools:\n  - {name: kv, devices: [0], handle_types: [posix_fd], max_size: 1GiB}\n")
            p = subprocess.Popen([r.cupool, "hold", config, "--profile", PROFILE_DEFAULT,
                                  "--socket", os.path.join(tmp, "s.sock"), "--log-level", "info"],
                                 cwd=r.root, stdout=subprocess.DEVNULL, stderr=log, env=full)
            deadline = time.time() + 20
            text = ""
            if not read_back:  # a terminal: its other end reads; give the holder time to listen
                sock = os.path.join(tmp, "s.sock")
                while time.time() < deadline and not os.path.exists(sock) and p.poll() is None:
                    time.sleep(0.05)
                time.sleep(0.2)
            while read_back and time.time() < deadline and "listening" not in text and p.poll() is None:
                time.sleep(0.05)
                log.seek(0)
                text = log.read().decode(errors="replace")
            p.terminate()
            p.wait(20)
            if not read_back:
                return ""
            log.seek(0)
            return log.read().decode(errors="replace")

    text = hold_log({})
    r.ok("--log-level after the verb", "cupool hold: info: " in text and "listening" in text and "\x1b[" not in text,
         text)
    # On a terminal the level is coloured, unless NO_COLOR is set.
    import pty
    for env, coloured in (({}, True), ({"NO_COLOR": "1"}, False)):
        master, slave = pty.openpty()
        with os.fdopen(slave, "w+b", buffering=0) as tty:
            hold_log(env, stderr_file=tty, read_back=False)
        os.set_blocking(master, False)
        seen = b""
        try:
            while True:
                chunk = os.read(master, 65536)
                if not chunk:
                    break
                seen += chunk
        except (BlockingIOError, OSError):
            pass
        os.close(master)
        text = seen.decode(errors="replace")
        r.ok(f"on a terminal {'with' if env else 'without'} NO_COLOR: {'colour' if coloured else 'plain'}",
             "listening" in text and ("\x1b[" in text) == coloured, repr(text[:400]))
    # Under systemd (JOURNAL_STREAM names stderr) each line starts with its journald priority.
    with tempfile.TemporaryFile() as f:
        st = os.fstat(f.fileno())
        text = hold_log({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, stderr_file=f)
    lines = [l for l in text.splitlines() if l.strip()]
    r.ok("under the journal: priority prefixes", lines and "<6>info: " in text and
         all(re.match(r"<[2-7]>(trace|debug|info|warning|error|critical): ", l) for l in lines), text)


def bench(r):
    """bench puts under test the threshold of the pool applications allocate from."""
    cases = {
        "configs/pytorch-current-pool.yaml": "16GiB",         # process.current_pool
        "configs/single-gpu-inference.yaml": "75%",           # process.default_pool
        "configs/host-numa.yaml": "max",                      # neither: max
    }
    for config, want in cases.items():
        code, out, err = r.run(["bench", config, "--profile", PROFILE_DEFAULT, "--sizes", "1MiB", "-n", "2",
                                "--format", "json"])
        got = json.loads(out)["settings"]["release_threshold"] if code == 0 else None
        r.ok(f"bench {config} tests threshold {want}", got == want, f"got {got!r}\n" + out + err)


def output_schemas(r):
    """Runner.run validates every --format json/yaml output against its schema; here the YAML forms
    too, and proof that the schemas refuse what they should (a missing schema_version, an unknown
    field, a wrong type), so the validation can fail."""
    for config in ("configs/ipc-multiprocess-server.yaml", "configs/training-8gpu.yaml"):
        r.run(["check", config, "--profile", PROFILE_DEFAULT, "--format", "yaml"])
    r.run(["query", "--profile", "configs/profiles/h200x2.yaml", "--deep", "--format", "yaml"])
    r.run(["bench", "--profile", PROFILE_DEFAULT, "--sizes", "1MiB", "-n", "2", "--format", "yaml"])
    for verb in ("query", "check", "bench"):
        r.ok(f"{verb} output validated", machine_output.counts.get(verb, 0) >= 2,
             f"{machine_output.counts.get(verb, 0)} {verb} documents were validated against their schema")
    code, out, err = r.run(["query", "--profile", PROFILE_DEFAULT, "--format", "json"])
    doc = json.loads(out)
    broken = {
        "without schema_version": {k: v for k, v in doc.items() if k != "schema_version"},
        "with an unknown field": dict(doc, surprise=1),
        "with a device ordinal as text": dict(doc, devices=[dict(doc["devices"][0], device="0")]),
        "in the old names (index)": dict(doc, devices=[{("index" if k == "device" else k): v
                                                        for k, v in doc["devices"][0].items()}]),
    }
    for what, bad in broken.items():
        try:
            machine_output.validate("query", bad, "query " + what)
            r.ok(f"the query schema refuses output {what}", False, json.dumps(bad)[:300])
        except machine_output.OutputError:
            r.ok(f"the query schema refuses output {what}", True)
    # Published, the schema takes a field it does not know (a later cupool may add one); only the
    # suite's strict copy refuses it.
    errors = list(machine_output.validator("query", strict=False).iter_errors(dict(doc, surprise=1)))
    r.ok("the published query schema accepts an added field", not errors, str(errors[:1]))


def old_profile(r):
    """A profile written in the names before v1 was amended (index, memory.total, deep[].error as
    text) is read, with a warning that says how to write it again; the output has the new names."""
    code, out, err = r.run(["query", "--profile", "tests/profiles/old-names-h100.yaml", "--deep", "--format", "json"])
    doc = json.loads(out) if code == 0 else {}
    device = (doc.get("devices") or [{}])[0]
    r.ok("an old profile is read", code == 0 and device.get("device") == 0 and
         device.get("memory", {}).get("total_bytes") == 85017493504, out + err)
    r.ok("an old profile is read with a warning", "warning" in err and "--profile-out" in err and
         "docs/naming.md" in err, err)
    fabric = [p for p in device.get("probes", []) if p.get("handle_type") == "fabric"]
    r.ok("an old profile's probe error becomes an error object",
         fabric and fabric[0]["error"]["result"] == "CUDA_ERROR_NOT_PERMITTED" and
         fabric[0]["error"]["api"] == "cuMemPoolExportToShareableHandle", json.dumps(fabric))
    code, out, err = r.run(["query", "--profile", PROFILE_DEFAULT, "--format", "json"])
    r.ok("a profile in the new names reads without a warning", code == 0 and "warning" not in err, err)


def no_driver(r):
    """Without libcuda the binary still starts and says so, exit 3 (only where no driver is installed).
    A program that asked query for JSON or YAML gets a document that says why (a node without a device:
    everywhere)."""
    with tempfile.TemporaryDirectory() as tmp:
        empty = os.path.join(tmp, "empty.yaml")
        with open(os.path.join(r.root, PROFILE_DEFAULT)) as f, open(empty, "w") as g:
            text = f.read()
            g.write(text[:text.index("  devices:\n")] + "  devices: []\n  peer_access: []\n")
        for fmt in ("json", "yaml"):
            code, out, err = r.run(["query", "--profile", empty, "--format", fmt])
            try:
                doc = json.loads(out) if fmt == "json" else machine_output.yaml.safe_load(out)
            except Exception as e:  # noqa: BLE001  (what did not parse is the failure)
                doc = {"unparsed": f"{e}: {out!r}"}
            r.ok(f"query --format {fmt} with no device: exit 3, a document that says why",
                 code == 3 and doc.get("driver", "") is None and doc.get("devices") == [] and
                 doc.get("error", {}).get("message") == "the simulated node has no CUDA device" and
                 doc.get("source", {}).get("simulated") is True and "no CUDA device" in err,
                 f"exit {code}\n{out}{err}")
        code, out, err = r.run(["query", "--profile", empty])
        r.ok("query (table) with no device: exit 3, nothing on stdout", code == 3 and not out, out + err)
    probe = subprocess.run(["sh", "-c", "ldconfig -p | grep -q 'libcuda.so.1 '"], capture_output=True)
    if probe.returncode == 0 or os.path.exists("/usr/local/nvidia/lib64/libcuda.so.1"):
        print("skip no-driver: this machine has libcuda.so.1")
        return
    code, out, err = r.run(["query"])
    r.ok("query without a driver exits 3", code == 3 and "no NVIDIA driver" in err and "--profile" in err, out + err)
    code, out, err = r.run(["query", "--format", "json"])
    doc = json.loads(out) if out.startswith("{") else {}
    r.ok("query --format json without a driver: exit 3, the reason in the document",
         code == 3 and doc.get("driver", "") is None and "no NVIDIA driver" in doc.get("error", {}).get("message", ""),
         out + err)
    code, out, err = r.run(["check", "configs/single-gpu-inference.yaml"])
    r.ok("check without a driver exits 3", code == 3, out + err)


def verb_paths(r, path=()):
    """Every verb of the command line, nested ones too, as its --help lists them: ("buffer", "create")."""
    _, out, _ = r.run(list(path) + ["--help"], validate=False)
    section = out.split("Subcommands:\n", 1)
    if len(section) < 2:
        return []
    paths = []
    for line in section[1].split("\n\n", 1)[0].splitlines():
        m = re.match(r"^  ([a-z][a-z-]*)(?:, [a-z-]+)*\s", line)
        if m:
            paths.append(tuple(path) + (m.group(1),))
            paths += verb_paths(r, tuple(path) + (m.group(1),))
    return paths


def help_and_man(r):
    """`cupool help [VERB...]` prints what --help prints; `cupool man` the man page (through `man -l -`
    on a terminal); every verb's --help ends with its exit codes."""
    code, out, err = r.run(["help"])
    _, want, _ = r.run(["--help"])
    r.ok("help is --help", code == 0 and out == want and not err, out + err)
    paths = verb_paths(r)
    r.ok("the verbs are listed", ("query",) in paths and ("buffer", "create") in paths and ("help",) in paths and
         ("man",) in paths, str(paths))
    for path in paths:
        code, out, err = r.run(["help"] + list(path), validate=False)
        _, want, _ = r.run(list(path) + ["--help"], validate=False)
        r.ok(f"help {' '.join(path)} is {' '.join(path)} --help", code == 0 and out == want and not err,
             diff(want, out) + err)
        last = want.rstrip("\n").split("\n\n")[-1]
        r.ok(f"{' '.join(path)} --help ends with its exit codes", last.startswith("Exit codes:"), last)
    _, out, _ = r.run(["--help"])
    r.ok("--help ends with the exit codes", out.rstrip("\n").split("\n\n")[-1].startswith("Exit codes:"), out)
    code, out, err = r.run(["help", "nosuch"])
    r.ok("help NOSUCH: exit 2, the verbs named",
         code == 2 and not out and err.startswith('cupool help: unknown verb "nosuch"') and "query" in err, out + err)
    code, out, err = r.run(["help", "stauts"])
    r.ok("help of a mistyped verb: did you mean",
         code == 2 and err == 'cupool help: unknown verb "stauts" (did you mean "status"?)\n', out + err)
    code, out, err = r.run(["help", "buffer", "craete"])
    r.ok("help of a mistyped nested verb",
         code == 2 and err == "cupool help: 'cupool buffer' has no verb \"craete\" (did you mean \"create\"?)\n",
         out + err)
    # The log level's default is warn, and info for the daemons: the help says so, not "[warn]" for all.
    _, out, _ = r.run(["--help"], validate=False)
    words = " ".join(out.split())
    r.ok("--help: the log level's default per verb",
         "(default: warn; info for the daemons, hold and keeper without --list or --release)" in words and
         "[warn]" not in words, out)
    for verb in ("hold", "keeper"):
        _, out, _ = r.run([verb, "--help"], validate=False)
        words = " ".join(out.split())
        r.ok(f"{verb} --help: it logs at info", "logs at info" in words and
             "unless --log-level or CUPOOL_LOG_LEVEL says otherwise" in words, out)
    # --help after a verb that does not exist: the verb is unknown (exit 2), not the help of what came before.
    code, out, err = r.run(["nosuchverb", "--help"], validate=False)
    r.ok("nosuchverb --help: exit 2, the verb is unknown",
         code == 2 and not out and err.startswith('cupool: unknown verb "nosuchverb"\n'), out + err)
    code, out, err = r.run(["stauts", "--help"], validate=False)
    r.ok("a mistyped verb with --help: did you mean",
         code == 2 and not out and err.startswith('cupool: unknown verb "stauts" (did you mean "status"?)\n'), out + err)
    code, out, err = r.run(["buffer", "craete", "-h"], validate=False)
    r.ok("a mistyped nested verb with -h: did you mean",
         code == 2 and not out and err.startswith('cupool buffer: unknown verb "craete" (did you mean "create"?)\n'),
         out + err)
    # The man page: roff when stdout is not a terminal, the same as `completion man`.
    code, out, err = r.run(["man"])
    _, want, _ = r.run(["completion", "man"])
    r.ok("man prints the man page, as completion man does", code == 0 and ".TH " in out and out == want and not err,
         diff(want, out) + err)
    # On a terminal, through `man -l -` (a stand-in man records what it was given).
    import pty
    with tempfile.TemporaryDirectory() as tmp:
        fake = os.path.join(tmp, "man")
        with open(fake, "w") as f:
            f.write(f"#!/bin/sh\necho \"$@\" > {tmp}/args\ncat > {tmp}/page\nexit 0\n")
        os.chmod(fake, 0o755)
        master, slave = pty.openpty()
        env = dict(os.environ, PATH=tmp + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
        p = subprocess.run([r.cupool, "man"], stdout=slave, stderr=subprocess.PIPE, env=env, timeout=60)
        os.close(slave)
        os.close(master)
        args = open(os.path.join(tmp, "args")).read() if os.path.exists(os.path.join(tmp, "args")) else None
        page = open(os.path.join(tmp, "page")).read() if os.path.exists(os.path.join(tmp, "page")) else None
        r.ok("man on a terminal: shown through 'man -l -'", p.returncode == 0 and args == "-l -\n" and page == want,
             f"exit {p.returncode}, man got {args!r}, page {'same' if page == want else repr((page or '')[:200])}")


# The first line of a compiler-style finding, which goes to stderr as it is (exec, plan, apply, hold).
FINDING_ANY = r"^\S+?(?::\d+:\d+)?: (?:error|warning|note): "


def error_style(r):
    """One message style: every line the CLI writes to stderr starts with `cupool VERB: ` (`cupool: `
    with no verb), continues an indented message, or is a compiler-style finding. Every verb is run
    with an unknown option, without its arguments, with files that are not there, with bad values and
    with no holder to talk to."""
    with tempfile.TemporaryDirectory() as tmp:
        nowhere = os.path.join(tmp, "none", "cupool.sock")
        missing = os.path.join(tmp, "none", "pools.yaml")
        # Per verb, besides `--no-such-option`: command lines that fail (each names no real holder).
        cases = {
            (): [[], ["--log-level", "loud", "query"], ["stauts"]],
            ("query",): [[], ["--profile", missing], ["--format", "xml"], ["--devices", "x"],
                         ["--profile", PROFILE_DEFAULT, "--devices", "7"],
                         ["--profile", "configs/single-gpu-inference.yaml"]],
            ("check",): [[], [missing], [tmp], ["configs/single-gpu-inference.yaml"], ["a.yaml", "b.yaml"]],
            ("hold",): [[], [missing], ["configs/host-numa.yaml", "--max-clients-per-user", "0"],
                        ["configs/training-8gpu.yaml", "--profile", PROFILE_DEFAULT, "--socket", nowhere]],
            ("keeper",): [["--socket", nowhere, "--list"], ["--socket", nowhere, "--release"]],
            ("status",): [[], ["--format", "xml"]],
            ("stats",): [[], ["--watch", "-1"], ["--format", "prometheus", "--output", os.path.join(tmp, "m.prom")]],
            ("ledger",): [[], ["--watch", "0"], ["--format", "xml"]],
            ("trim",): [[], ["--keep", "lots"]],
            ("plan",): [[], [missing], ["configs/host-numa.yaml"]],
            ("apply",): [[], [missing], ["configs/host-numa.yaml"]],
            ("export",): [[], ["--format", "toml"], ["--output", missing]],
            ("buffer",): [[]],
            ("buffer", "create"): [[], ["w", "--pool", "kv", "--device", "0", "--size", "lots"],
                                   ["w", "--pool", "kv", "--device", "0", "--size", "1MiB"]],
            ("buffer", "load"): [[], ["llama", missing, "--pool", "kv"], ["llama", "configs/host-numa.yaml", "--pool", "kv"]],
            ("buffer", "ls"): [[], ["a", "b"]],
            ("buffer", "rm"): [[], ["weights"]],
            ("exporter",): [["--listen", "9402"], ["--listen", "127.0.0.1:99999"]],
            ("exec",): [[], [missing, "--", "true"], ["configs/host-numa.yaml", "--at", "later", "--", "true"],
                        ["tests/bad/schema/process-list.yaml", "--profile", PROFILE_DEFAULT, "--", "true"],
                        ["tests/bad/fit/current-pool.yaml", "--profile", PROFILE_DEFAULT, "--", "true"],
                        ["configs/pytorch-current-pool.yaml", "--profile", PROFILE_DEFAULT, "--", os.path.join(tmp, "none", "cmd")],
                        ["configs/single-gpu-inference.yaml", "--profile", PROFILE_DEFAULT, "--budget", "lots", "--", "true"],
                        ["configs/single-gpu-inference.yaml", "--profile", PROFILE_DEFAULT, "--budget", "20GiB", "--",
                         "true"],
                        ["configs/single-gpu-inference.yaml", "--profile", PROFILE_DEFAULT, "--wait", "--", "true"]],
            ("bench",): [[], [missing], ["--sizes", "lots", "--profile", PROFILE_DEFAULT]],
            ("completion",): [[], ["tcsh"]],
            ("help",): [["nosuch"], ["buffer", "nosuch"]],
            ("man",): [["extra"]],
        }
        # Where a driver answers, the lines that fail only for want of one (no --profile) succeed.
        probe = subprocess.run(["sh", "-c", "ldconfig -p | grep -q 'libcuda.so.1 '"], capture_output=True)
        if probe.returncode == 0 or os.path.exists("/usr/local/nvidia/lib64/libcuda.so.1"):
            for path, lines in cases.items():
                cases[path] = [l for l in lines if path + tuple(l) not in
                               (("query",), ("check", "configs/single-gpu-inference.yaml"), ("bench",))]
            print("error style: a driver is installed: query, check and bench without --profile are not error cases")
        paths = verb_paths(r)
        r.ok("every verb has error cases", not [p for p in paths if p not in cases], str([p for p in paths if p not in cases]))
        runs = failed_runs = 0
        for path, lines in cases.items():
            prefix = "cupool" + "".join(" " + v for v in path) + ": "
            for extra in lines + ([["--no-such-option"]] if path else []):
                args = list(path) + extra
                code, out, err = r.run(args, env={"CUPOOL_SOCKET": nowhere})
                runs += 1
                failed_runs += code != 0
                bad = [l for l in err.splitlines()
                       if l and not l[0].isspace() and not l.startswith(prefix) and not re.match(FINDING_ANY, l)]
                # The program's own options: the prefix names the verb where the line has one.
                if not path:
                    bad = [l for l in bad if not re.match(r"^cupool(?: [a-z-]+)*: ", l)]
                r.ok(f"cupool {' '.join(args)}: every stderr line starts with '{prefix}'",
                     code != 0 and err.strip() and not bad, f"exit {code}\n{err}")
        r.ok("the error cases ran", runs > 60 and failed_runs == runs, f"{runs} runs, {failed_runs} failed")


def check_colour(r):
    """check colours severity words on a terminal (error red, warning yellow, note cyan), not with
    NO_COLOR, not into a pipe."""
    import pty

    def on_terminal(args, env=None):
        master, slave = pty.openpty()
        full = dict(os.environ)
        full.pop("NO_COLOR", None)
        full.update(env or {})
        p = subprocess.Popen([r.cupool] + args, stdout=slave, stderr=subprocess.PIPE, cwd=r.root, env=full)
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        os.close(master)
        p.wait(60)
        return seen.decode(errors="replace")

    args = ["check", "configs/training-8gpu.yaml", "--profile", PROFILE_DEFAULT]
    text = on_terminal(args)
    r.ok("check on a terminal: errors red", "\x1b[1;31merror\x1b[0m: no device" in text, repr(text[:300]))
    fit = [os.path.join("tests/bad/fit", n) for n in sorted(os.listdir(os.path.join(r.root, "tests/bad/fit")))
           if n.endswith(".out")]
    coloured = {"warning": "\x1b[1;33mwarning\x1b[0m: ", "note": "\x1b[1;36mnote\x1b[0m: "}
    for severity, painted in coloured.items():
        # A bad file whose expected output has a finding of this severity.
        name = next((f for f in fit if re.search(rf"^\S+: {severity}: ", open(os.path.join(r.root, f)).read(), re.M)),
                    None)
        if name is None:
            r.ok(f"a bad file with a {severity}", False, "none found under tests/bad/fit")
            continue
        meta = header(os.path.join(r.root, name[:-4] + ".yaml"))
        text = on_terminal(["check", name[:-4] + ".yaml", "--profile", meta.get("profile", PROFILE_DEFAULT)] +
                           meta.get("args", "").split())
        r.ok(f"check on a terminal: {severity} coloured", painted in text, repr(text[:400]))
    text = on_terminal(args, env={"NO_COLOR": "1"})
    r.ok("check on a terminal with NO_COLOR: plain", "error: no device" in text and "\x1b[" not in text, repr(text[:300]))
    code, out, err = r.run(args)
    r.ok("check into a pipe: plain", code == 1 and "\x1b[" not in out, out[:300])


def missing_devices_once(r):
    """A device the node lacks is one finding however often the file names it: the 8-GPU example on a
    one-GPU node is 7 findings (devices 1-7), each saying where else it is named, not one per mention."""
    code, out, err = r.run(["check", "configs/training-8gpu.yaml", "--profile", PROFILE_DEFAULT])
    found = re.findall(r"^\S+: error: no device '(\d+)' .*\[unknown-device\]$", out, re.M)
    r.ok("8-GPU example on one GPU: one finding per missing device",
         code == 1 and found == [str(d) for d in range(1, 8)] and out.count("(named 4 times; also at ") == 7, out + err)


def exec_without_process_section(r):
    """exec of a file with no process: section says that nothing is applied, and runs CMD."""
    code, out, err = r.run(["exec", "configs/host-numa.yaml", "--profile", PROFILE_DEFAULT, "--", "echo", "ran"])
    r.ok("exec without process: says so and runs CMD",
         code == 0 and out == "ran\n" and "cupool exec: note: configs/host-numa.yaml has no process: section" in err,
         out + err)
    code, out, err = r.run(["exec", "configs/pytorch-current-pool.yaml", "--profile", PROFILE_DEFAULT, "--", "echo",
                            "ran"])
    r.ok("exec with a process: section: no such note", code == 0 and out == "ran\n" and "no process:" not in err,
         out + err)


def missing_config(r):
    """Every verb that reads a CONFIG says, in cupool's words, that there is no file at the path (with
    the directory a relative path was looked for in), and how to start one from the shipped sample;
    hold, what runs under the unit, also how to start it again. Exit 2, before anything else."""
    missing = "/nonexistent/cupool/pools.yaml"
    sample = "configs/systemd/cupool.yaml"  # run from the checkout's root: its path from there
    runs = {
        "check": ["check", missing, "--profile", PROFILE_DEFAULT],
        "plan": ["plan", missing, "--socket", "/nonexistent/cupool.sock"],
        "apply": ["apply", missing, "--socket", "/nonexistent/cupool.sock"],
        "hold": ["hold", missing, "--profile", PROFILE_DEFAULT],
        "exec": ["exec", missing, "--profile", PROFILE_DEFAULT, "--", "/bin/echo", "ran"],
        "bench": ["bench", missing, "--profile", PROFILE_DEFAULT],
    }
    for verb, args in runs.items():
        code, out, err = r.run(args)
        lines = err.splitlines()
        r.ok(f"{verb} of a missing config: cupool's words, the path, the sample to copy (exit 2)",
             code == 2 and out == "" and lines[:1] == [f"cupool {verb}: no config file at '{missing}'"]
             and f"cp {sample} {missing}" in err and f"'cupool check {missing}'" in err
             and ("systemctl restart cupool" in err) == (verb == "hold") and "File does not exist" not in err,
             out + err)
    code, out, err = r.run(["check", "missing.yaml", "--profile", PROFILE_DEFAULT])
    r.ok("a relative missing config: where it was looked for",
         code == 2 and f"cupool check: no config file at 'missing.yaml' (looked for in {r.root})" in err, out + err)
    # Standard input and files that exist but can't be read are the reader's to say, as before.
    code, out, err = r.run(["check", "configs", "--profile", PROFILE_DEFAULT])
    r.ok("a folder as the config is not 'no config file'", code == 2 and "no config file" not in err, out + err)


def installed_hints(r):
    """Hints name a profile this binary can reach: the installed data folder's beside an installed
    binary (PREFIX/bin/cupool -> PREFIX/share/cupool/configs/...), not the repository's path."""
    probe = subprocess.run(["sh", "-c", "ldconfig -p | grep -q 'libcuda.so.1 '"], capture_output=True)
    if probe.returncode == 0 or os.path.exists("/usr/local/nvidia/lib64/libcuda.so.1"):
        print("skip installed hints: this machine has libcuda.so.1 (no hint to see)")
        return
    import shutil
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "usr")
        os.makedirs(os.path.join(prefix, "bin"))
        shutil.copy(r.cupool, os.path.join(prefix, "bin", "cupool"))
        # The client library where the binary's RUNPATH finds it beside the binary ($ORIGIN).
        shutil.copy(os.path.join(os.path.dirname(os.path.abspath(r.cupool)), "libcupool-client.so.1"),
                    os.path.join(prefix, "bin"))
        data = os.path.join(prefix, "share", "cupool", "configs", "profiles")
        os.makedirs(data)
        shutil.copy(os.path.join(r.root, PROFILE_DEFAULT), data)
        env = dict(os.environ)
        env.pop("CUPOOL_PROFILE", None)
        p = subprocess.run([os.path.join(prefix, "bin", "cupool"), "query"], cwd=tmp, capture_output=True, text=True,
                           env=env, timeout=60)
        want = os.path.join(data, "h100.yaml")
        r.ok("installed: the hint names the installed profile",
             p.returncode == 3 and f"--profile {want}" in p.stderr and os.path.exists(want), p.stderr)
        # In a checkout, run from its root: the repository's relative path, which works from there.
        code, out, err = r.run(["query"])
        r.ok("in a checkout: the hint names configs/profiles/h100.yaml",
             code == 3 and "--profile configs/profiles/h100.yaml ..." in err, err)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--update", action="store_true")
    ap.add_argument("--sanitized", action="store_true",
                    help="the build is sanitized: its preload can't go into an unsanitized CMD (exec runs skipped)")
    a = ap.parse_args()
    r = Runner(os.path.abspath(a.cupool), os.path.abspath(a.root), a.update)
    codes = bad_files(r)
    rule_coverage(r, codes)
    schema_good(r)
    examples(r)
    bench(r)
    query(r)
    usage(r)
    forgiving(r)
    help_and_man(r)
    error_style(r)
    check_colour(r)
    missing_devices_once(r)
    if a.sanitized:
        print("skip exec without process: a sanitized preload can't be loaded into an unsanitized CMD")
    else:
        exec_without_process_section(r)
    installed_hints(r)
    missing_config(r)
    output_schemas(r)
    old_profile(r)
    no_driver(r)
    print(f"{r.schema_checked} outputs validated against schemas/cupool-*-v{machine_output.VERSION}.schema.json")
    print(f"{r.passed} passed, {len(r.failed)} failed")
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main())
