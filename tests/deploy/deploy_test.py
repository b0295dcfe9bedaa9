#!/usr/bin/python3
"""The Kubernetes deployment (configs/kubernetes/): schemas, policy, and the config it holds.

usage: deploy_test.py --cupool PATH --root REPO

1. Every document of configs/kubernetes/*.yaml validates against Kubernetes' JSON schema for its
   kind (schemas/, standalone strict: an unknown or misspelt field is an error), and names follow
   Kubernetes' rules (DNS labels, label keys and values).
2. The policy: no hostIPC, hostPID, hostNetwork or privileged anywhere, no privilege escalation
   or added capability; the socket is closed to others (mode); the holder gets all GPUs from the
   runtime without asking for nvidia.com/gpu; holder and client mount one hostPath socket
   directory, the client read-only; the client runs as the user and group that the holder's
   `share` list and socket group name, as the image (Containerfile) defines them; the grace period
   covers the drain timeout; readiness is `cupool status` on the config's socket; node labels go
   to NFD's features.d; the keeper runs in a DaemonSet of its own (not in the holder's pod, so that
   deleting that pod leaves the held buffers), on the holder's nodes and socket directory, at the
   socket the holder's --keeper names; both DaemonSets OnDelete.
3. `cupool check --strict` of the ConfigMap's config on the recorded H100, and `cupool query
   --format nfd` on it writes what NFD reads.
4. The checks can fail: a misspelt field, hostIPC and a wrongly typed quantity are caught.

One line per check, then "N passed, M failed"; exit 1 if anything failed.
"""

import argparse
import copy
import glob
import json
import os
import posixpath
import re
import subprocess
import sys
import tempfile

try:
    import jsonschema
    import yaml
except ImportError as e:  # pragma: no cover
    print(f"deploy_test.py: {e}; install python3-jsonschema and python3-yaml (scripts/setup.sh)", file=sys.stderr)
    sys.exit(1)

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMAS = {
    ("v1", "Namespace"): "namespace-v1.json",
    ("v1", "ConfigMap"): "configmap-v1.json",
    ("apps/v1", "DaemonSet"): "daemonset-apps-v1.json",
    ("v1", "Pod"): "pod-v1.json",
}
# Kubernetes' rules (k8s.io/apimachinery/pkg/util/validation).
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
NFD_FEATURES = "/etc/kubernetes/node-feature-discovery/features.d"


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML as kubectl reads it (YAML 1.1 scalars), with a repeated key refused as kubectl does."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"repeated key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok    {name}")
        else:
            self.failed += 1
            print(f"FAIL  {name}")
            for line in str(detail).strip().splitlines():
                print(f"      {line}")
        return ok


def load_schema(kind_key):
    with open(os.path.join(HERE, "schemas", SCHEMAS[kind_key]), encoding="utf-8") as f:
        return json.load(f)


def schema_errors(doc):
    """Kubernetes' schema errors for `doc`, as "path: message" lines ([] when valid)."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in SCHEMAS:
        return [f"no schema for apiVersion {key[0]!r} kind {key[1]!r} (tests/deploy/schemas has {sorted(SCHEMAS)})"]
    validator = jsonschema.Draft7Validator(load_schema(key))
    errors = []
    for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        path = "/".join(str(p) for p in e.absolute_path) or "(top)"
        errors.append(f"{path}: {e.message[:300]}")
    return errors


def walk(node, path=""):
    """Every (path, key, value) of a document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield path, k, v
            yield from walk(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{path}/{i}")


def policy_violations(doc):
    bad = []
    for path, key, value in walk(doc):
        if key in ("hostIPC", "hostPID", "hostNetwork", "privileged", "allowPrivilegeEscalation") and value is not False:
            bad.append(f"{path}/{key}: {value!r} (must be false or left out)")
        if key == "capabilities" and isinstance(value, dict) and value.get("add"):
            bad.append(f"{path}/capabilities/add: {value['add']!r} (no capability may be added)")
    return bad


def name_problems(doc):
    problems = []
    meta = doc.get("metadata", {})
    for path, key, value in walk(doc):
        if key == "labels" and isinstance(value, dict) and (path.endswith("metadata") or path == ""):
            for k, v in value.items():
                prefix, _, name = k.rpartition("/")
                if (prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix))) or len(name) > 63 or \
                        not LABEL_NAME.match(name):
                    problems.append(f"{path}/labels: {k!r} is not a valid label key")
                if not isinstance(v, str) or len(v) > 63 or (v and not LABEL_NAME.match(v)):
                    problems.append(f"{path}/labels/{k}: {v!r} is not a valid label value")
    names = [("metadata/name", meta.get("name"))]
    pod = pod_spec(doc)
    if pod:
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            names.append(("container name", c.get("name")))
        for v in pod.get("volumes", []):
            names.append(("volume name", v.get("name")))
    for what, name in names:
        if not isinstance(name, str) or len(name) > 63 or not DNS_LABEL.match(name):
            problems.append(f"{what}: {name!r} is not a DNS label")
    return problems


def pod_spec(doc):
    if doc.get("kind") == "Pod":
        return doc.get("spec", {})
    if doc.get("kind") == "DaemonSet":
        return doc.get("spec", {}).get("template", {}).get("spec", {})
    return None


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def host_paths(pod):
    return {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}


def mounts_of(container, pod):
    """(hostPath path, mountPath, readOnly) of each hostPath mount of `container`."""
    hp = host_paths(pod)
    return [(hp[m["name"]], m["mountPath"], bool(m.get("readOnly"))) for m in container.get("volumeMounts", [])
            if m["name"] in hp]


def accounts(containerfile):
    """Users (name -> (uid, gid)) and groups (name -> gid) the image makes with useradd/groupadd."""
    text = open(containerfile, encoding="utf-8").read().replace("\\\n", " ")
    users, groups = {}, {}
    for m in re.finditer(r"groupadd\b([^&;\n]*)", text):
        words = m.group(1).split()
        if "--gid" in words:
            groups[words[-1]] = int(words[words.index("--gid") + 1])
    for m in re.finditer(r"useradd\b([^&;\n]*)", text):
        words = m.group(1).split()
        if "--uid" in words:
            gid = int(words[words.index("--gid") + 1]) if "--gid" in words else None
            users[words[-1]] = (int(words[words.index("--uid") + 1]), gid)
    return users, groups


def drain_timeout(command):
    if "--drain-timeout" in command:
        return float(command[command.index("--drain-timeout") + 1])
    return 30.0  # cupool hold's default


def option_of(argv, name):
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def run(cmd):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, "", f"{cmd[0]}: {e}"
    return p.returncode, p.stdout, p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--root", required=True)
    args = ap.parse_args()
    r = Report()
    kdir = os.path.join(args.root, "configs", "kubernetes")

    # ---- 1. schemas and names ----
    docs = []  # (file, doc)
    files = sorted(glob.glob(os.path.join(kdir, "*.yaml")))
    r.check("configs/kubernetes has manifests", len(files) >= 2, files)
    for path in files:
        rel = os.path.relpath(path, args.root)
        try:
            with open(path, encoding="utf-8") as f:
                loaded = [d for d in yaml.load_all(f, Loader=UniqueKeyLoader) if d is not None]
        except yaml.YAMLError as e:
            r.check(f"{rel} reads as YAML", False, e)
            continue
        for doc in loaded:
            what = f"{rel}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
            errors = schema_errors(doc)
            r.check(f"{what} matches Kubernetes' schema", not errors, "\n".join(errors))
            problems = name_problems(doc)
            r.check(f"{what} names and labels", not problems, "\n".join(problems))
            violations = policy_violations(doc)
            r.check(f"{what} no hostIPC/hostPID/hostNetwork/privileged/escalation/capabilities",
                    not violations, "\n".join(violations))
            docs.append((rel, doc))

    def one(kind, name=None):
        found = [d for _, d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]
        return found[0] if len(found) == 1 else None

    def runs(d, verb):
        return any(c.get("command", [])[:2] == ["cupool", verb] for c in (pod_spec(d) or {}).get("containers", []))

    daemonsets = [d for _, d in docs if d.get("kind") == "DaemonSet"]
    holder_sets = [d for d in daemonsets if runs(d, "hold")]
    ds = holder_sets[0] if len(holder_sets) == 1 else None
    ns, cm, client = one("Namespace"), one("ConfigMap"), one("Pod")
    if not r.check("one Namespace, ConfigMap, DaemonSet of the holder and client Pod", None not in (ns, cm, ds, client)):
        return finish(r)

    # ---- 2. policy ----
    namespace = ns["metadata"]["name"]
    r.check("ConfigMap and DaemonSets are in the Namespace",
            cm["metadata"].get("namespace") == namespace and
            all(d["metadata"].get("namespace") == namespace for d in daemonsets))
    config_text = cm["data"].get("cupool.yaml", "")
    config = yaml.safe_load(config_text) or {}
    socket = config.get("holder", {}).get("socket", "/run/cupool/cupool.sock")
    socket_dir = posixpath.dirname(socket)
    pod = pod_spec(ds)
    holders = [c for c in pod.get("containers", []) if c.get("command", [])[:2] == ["cupool", "hold"]]
    if not r.check("the DaemonSet runs `cupool hold`", len(holders) == 1, pod.get("containers")):
        return finish(r)
    holder = holders[0]
    cmd = holder["command"]
    config_mounts = [m for m in holder.get("volumeMounts", []) if any(
        v["name"] == m["name"] and v.get("configMap", {}).get("name") == cm["metadata"]["name"]
        for v in pod.get("volumes", []))]
    r.check("the holder holds the ConfigMap's cupool.yaml",
            len(cmd) > 2 and any(cmd[2] == posixpath.join(m["mountPath"], "cupool.yaml") for m in config_mounts),
            f"command {cmd}, ConfigMap mounts {config_mounts}")
    r.check("the socket directory is a hostPath the holder mounts at the same path",
            (socket_dir, socket_dir, False) in mounts_of(holder, pod), f"socket {socket}: {mounts_of(holder, pod)}")
    probe = holder.get("readinessProbe", {}).get("exec", {}).get("command", [])
    r.check("readiness is `cupool status` on the config's socket",
            probe[:2] == ["cupool", "status"] and "--socket" in probe and probe[probe.index("--socket") + 1] == socket,
            probe)
    grace = pod.get("terminationGracePeriodSeconds", 30)
    r.check("terminationGracePeriodSeconds covers the drain timeout with room to free",
            grace >= drain_timeout(cmd) + 15, f"grace {grace} s, drain {drain_timeout(cmd)} s")
    all_ds_containers = pod.get("initContainers", []) + pod.get("containers", [])
    exporters = [c for c in all_ds_containers if c.get("command", [])[:2] == ["cupool", "exporter"]]
    # The exporter listens on loopback unless told: in a pod, the pod's address, on its port.
    r.check("the DaemonSet's exporter serves the pod's port 9402 (--listen :9402, containerPort 9402) from the socket",
            len(exporters) == 1 and exporters[0]["command"][2:4] == ["--listen", ":9402"] and
            any(p.get("containerPort") == 9402 for p in exporters[0].get("ports", [])) and
            "--socket" in exporters[0]["command"] and
            exporters[0]["command"][exporters[0]["command"].index("--socket") + 1] == socket,
            exporters)
    # The keeper holds the held buffers' descriptors while the holder's pod restarts, is deleted,
    # evicted or replaced (README, "What survives what"): so in a pod of its own (a DaemonSet
    # beside the holder's, on the same nodes), never a container of the holder's pod, whose
    # containers all stop when it goes. No GPU (it never loads CUDA); the holder is told where.
    holder_command = holder.get("command", []) + holder.get("args", [])
    keeper_path = option_of(holder_command, "--keeper") or env_of(holder).get("CUPOOL_KEEPER")
    keeper_sets = [d for d in daemonsets if runs(d, "keeper")]
    keepers = [c for c in all_ds_containers if c.get("command", [])[:2] == ["cupool", "keeper"]]
    r.check("no keeper in the holder's pod (deleting that pod would take the buffers with it)", not keepers, keepers)
    if r.check("a DaemonSet of its own runs the keeper", len(keeper_sets) == 1 and keeper_sets[0] is not ds,
               [d["metadata"]["name"] for d in daemonsets]):
        kpod = pod_spec(keeper_sets[0])
        keeper = [c for c in kpod["containers"] if c.get("command", [])[:2] == ["cupool", "keeper"]][0]
        kcommand = keeper.get("command", []) + keeper.get("args", [])
        r.check("the holder's --keeper is the keeper's --socket, in the socket directory",
                keeper_path is not None and option_of(kcommand, "--socket") == keeper_path and
                posixpath.dirname(keeper_path) == socket_dir, [holder_command, kcommand])
        r.check("the keeper mounts the holder's socket directory (the same hostPath) at the same path",
                (socket_dir, socket_dir, False) in mounts_of(keeper, kpod), mounts_of(keeper, kpod))
        r.check("the keeper runs on the holder's nodes (the same nodeSelector and tolerations)",
                kpod.get("nodeSelector") == pod.get("nodeSelector") and
                kpod.get("tolerations") == pod.get("tolerations"), [kpod.get("nodeSelector"), kpod.get("tolerations")])
        r.check("the keeper asks for no GPU (no NVIDIA_VISIBLE_DEVICES, no nvidia.com/gpu)",
                all("NVIDIA_VISIBLE_DEVICES" not in env_of(c) and
                    not any("nvidia.com/gpu" in c.get("resources", {}).get(k, {}) for k in ("limits", "requests"))
                    for c in kpod.get("containers", [])))
        resources = keeper.get("resources", {})
        r.check("the keeper is QoS Guaranteed (requests equal limits): the last the kubelet evicts",
                resources.get("requests") and resources.get("requests") == resources.get("limits"), resources)
        r.check("neither DaemonSet replaces its pods by itself (updateStrategy OnDelete)",
                all(d["spec"].get("updateStrategy", {}).get("type") == "OnDelete" for d in (ds, keeper_sets[0])),
                [d["spec"].get("updateStrategy") for d in (ds, keeper_sets[0])])
    # Every container but the exporter and the keeper (which never touch the GPUs) uses them.
    all_ds_containers = [c for c in all_ds_containers if c not in exporters and c not in keepers]
    gpu_requests = [c["name"] for c in all_ds_containers
                    if any("nvidia.com/gpu" in c.get("resources", {}).get(k, {}) for k in ("limits", "requests"))]
    r.check("the holder pod asks for no nvidia.com/gpu (client pods keep every GPU)", not gpu_requests, gpu_requests)
    r.check("GPUs come from the NVIDIA runtime: runtimeClassName nvidia, NVIDIA_VISIBLE_DEVICES=all",
            pod.get("runtimeClassName") == "nvidia" and
            all(env_of(c).get("NVIDIA_VISIBLE_DEVICES") == "all" for c in all_ds_containers))
    r.check("the holder has resource requests", bool(holder.get("resources", {}).get("requests")))
    r.check("GPU nodes only (nodeSelector on an NVIDIA label)",
            any("nvidia" in k or "10de" in k for k in pod.get("nodeSelector", {})), pod.get("nodeSelector"))
    labelers = [c for c in pod.get("initContainers", []) + pod.get("containers", [])
                if "cupool query --format nfd" in " ".join(c.get("command", []) + c.get("args", []))]
    r.check("a container writes `cupool query --format nfd` into NFD's features.d hostPath",
            len(labelers) == 1 and (NFD_FEATURES, NFD_FEATURES, False) in mounts_of(labelers[0], pod) and
            f"{NFD_FEATURES}/cupool" in " ".join(labelers[0].get("args", [])),
            labelers)

    mode = str(config.get("holder", {}).get("mode", "0660"))
    r.check("the socket is not open to others (mode ends in 0: root and its group only)", mode.endswith("0"), mode)

    users, groups = accounts(os.path.join(kdir, "Containerfile"))
    share = [p.get("share", {}) for p in config.get("pools", [])]
    socket_group = config.get("holder", {}).get("group")
    r.check("the socket's group is made by the image, and the holder pod is in it",
            socket_group in groups and groups[socket_group] in pod.get("securityContext", {}).get("supplementalGroups", []),
            f"group {socket_group}, image groups {groups}, supplementalGroups "
            f"{pod.get('securityContext', {}).get('supplementalGroups')}")
    for user in sorted({u for s in share for u in s.get("users", [])}):
        r.check(f"share user {user} exists in the image", user in users, users)
    for group in sorted({g for s in share for g in s.get("groups", [])}):
        r.check(f"share group {group} exists in the image", group in groups, groups)

    cpod = client["spec"]
    csc = cpod.get("securityContext", {})
    containers = cpod.get("containers", [])
    r.check("the client pod runs as a non-root user", csc.get("runAsNonRoot") is True and
            csc.get("runAsUser", 0) != 0 and all(c.get("securityContext", {}).get("runAsUser", 1) != 0 for c in containers))
    uid, gid = csc.get("runAsUser"), csc.get("runAsGroup")
    names = [n for n, (u, _) in users.items() if u == uid]
    gids = {gid} | set(csc.get("supplementalGroups", [])) | {g for n, (u, g) in users.items() if u == uid}
    group_names = {n for n, g in groups.items() if g in gids}
    r.check("the client's uid is a user the share list names (or in a group it names)",
            any(n in s.get("users", []) for n in names for s in share) or
            any(g in s.get("groups", []) for g in group_names for s in share),
            f"uid {uid} is {names or 'nobody in the image'}, groups {sorted(group_names)}, share {share}")
    r.check("the client is in the socket's group (it can connect)", socket_group in group_names,
            f"socket group {socket_group}, client groups {sorted(group_names)}")
    for c in containers:
        mounts = mounts_of(c, cpod)
        shared = [m for m in mounts if m[0] == socket_dir]
        r.check(f"client container {c['name']}: the holder's socket hostPath, mounted read-only",
                bool(shared) and all(ro for _, _, ro in shared), mounts)
        expected = posixpath.join(shared[0][1], posixpath.basename(socket)) if shared else None
        r.check(f"client container {c['name']}: CUPOOL_SOCKET names the socket there",
                env_of(c).get("CUPOOL_SOCKET") == expected, f"{env_of(c).get('CUPOOL_SOCKET')} != {expected}")
        r.check(f"client container {c['name']}: requests nvidia.com/gpu: 1",
                str(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")) == "1")

    # ---- 3. the config on the recorded H100, and the node labels ----
    profile = os.path.join(args.root, "configs", "profiles", "h100.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cupool.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(config_text)
        # --strict, but for the accounts: the group the holder gives its socket to and the users it
        # shares with exist in the image and on the node, not on the machine that runs this test.
        code, out, err = run([args.cupool, "check", path, "--profile", profile, "--strict", "--format", "json"])
        try:
            findings = json.loads(out)["findings"]
        except (ValueError, KeyError):
            findings = None
        others = [f for f in findings or [] if f["code"] not in ("unknown-user", "unknown-group")]
        r.check("`cupool check --strict` of the ConfigMap's config on configs/profiles/h100.yaml (accounts aside)",
                findings is not None and code in (0, 1) and not others, out + err)
    code, out, err = run([args.cupool, "query", "--profile", profile, "--format", "nfd"])
    lines = [line for line in out.splitlines() if line and not line.startswith("#")]
    bad = [line for line in lines if not re.match(r"cupool\.feature\.node\.kubernetes\.io/[A-Za-z0-9][-A-Za-z0-9_.]{0,61}"
                                                  r"[A-Za-z0-9]=(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$", line)]
    r.check("`cupool query --format nfd` writes name=value lines NFD accepts", code == 0 and lines and not bad,
            err + "\n".join(bad))
    r.check("the H100's labels say posix_fd pools", "cupool.feature.node.kubernetes.io/handle-type.posix_fd=true" in lines,
            out)

    # ---- 4. the checks catch what they are for ----
    broken = copy.deepcopy(ds)
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = holder.get("readinessProbe")
    r.check("a misspelt field (readinesProbe) is refused by the schema", bool(schema_errors(broken)))
    broken = copy.deepcopy(ds)
    broken["spec"]["template"]["spec"]["hostIPC"] = True
    r.check("hostIPC: true is caught", bool(policy_violations(broken)) and not schema_errors(broken))
    broken = copy.deepcopy(client)
    broken["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = [1]
    r.check("a wrong type (a list for a quantity) is refused by the schema", bool(schema_errors(broken)))
    return finish(r)


def finish(r):
    print(f"{r.passed} passed, {r.failed} failed")
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main())
