"""What cupool prints for scripts, held against the schemas it ships.

Every verb's --format json or yaml output carries "schema_version" first and is described by
schemas/cupool-NAME-v1.schema.json; `cupool exec --report` writes lines described by
schemas/cupool-exec-report-v1.schema.json. The test suites that run the binary (cli_test.py, the
holder suites, exec_test.py) pass what it printed to check_command(); so every real output those
suites produce, on a simulated node in CI and on the driver on a GPU machine, is validated.

Set CUPOOL_OUTPUT_SAMPLES=DIR to also append every document to DIR/NAME.jsonl (to study real
output when a schema changes).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from validate import Yaml12Loader, make_validator  # noqa: E402  (also imports jsonschema and yaml)

import yaml  # noqa: E402

VERSION = 1
SCHEMA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "schemas")

# The verbs that print machine output, and the schema of each (buffer's subcommands by name).
VERBS = {"query": "query", "check": "check", "bench": "bench", "status": "status", "stats": "stats",
         "trim": "trim", "plan": "plan", "apply": "plan"}
BUFFER_VERBS = {"create": "buffer-create", "load": "buffer-load", "ls": "buffer-ls", "rm": "buffer-rm",
                "remove": "buffer-rm"}

_validators = {}
counts = {}


class OutputError(AssertionError):
    pass


def schema_path(name):
    return os.path.normpath(os.path.join(SCHEMA_DIR, f"cupool-{name}-v{VERSION}.schema.json"))


def validator(name):
    if name not in _validators:
        with open(schema_path(name), encoding="utf-8") as f:
            _validators[name] = make_validator(json.load(f))
    return _validators[name]


def option_value(args, name):
    """The value of `--name VALUE` or `--name=VALUE` in args; None when absent."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return None


def has_flag(args, name):
    return any(a == name or a.startswith(name + "=") for a in args)


def schema_of(args):
    """(schema name, format, watching) for a cupool command line; name None when it prints no
    machine output."""
    args = [str(a) for a in args]
    fmt = option_value(args, "--format")
    if fmt not in ("json", "yaml"):
        return None, fmt, False
    for i, a in enumerate(args):
        if a in VERBS:
            return VERBS[a], fmt, a == "stats" and has_flag(args, "--watch")
        if a == "buffer":
            rest = [b for b in args[i + 1:] if b in BUFFER_VERBS]
            return (BUFFER_VERBS[rest[0]] if rest else None), fmt, False
    return None, fmt, False


def documents(text, fmt, watching):
    if fmt == "json":
        if watching:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        return [json.loads(text)]
    return [d for d in yaml.load_all(text, Loader=Yaml12Loader) if d is not None]


def validate(name, doc, what):
    """Raises OutputError naming where `doc` breaks schema `name`."""
    sample_dir = os.environ.get("CUPOOL_OUTPUT_SAMPLES")
    if sample_dir:
        os.makedirs(sample_dir, exist_ok=True)
        with open(os.path.join(sample_dir, name + ".jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(doc) + "\n")
        if not os.path.exists(schema_path(name)):
            return
    errors = sorted(validator(name).iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"  at /{'/'.join(str(p) for p in e.absolute_path)}: {e.message[:300]}" for e in errors[:8]]
        raise OutputError(f"{what}: output does not match {os.path.relpath(schema_path(name))}:\n"
                          + "\n".join(lines))
    if doc.get("schema_version") != VERSION:
        raise OutputError(f"{what}: schema_version is {doc.get('schema_version')!r}, expected {VERSION}")
    counts[name] = counts.get(name, 0) + 1


def check_command(args, stdout):
    """Validates what `cupool ARGS` printed on stdout, if it is machine output; returns the number
    of documents validated. Output that is not JSON/YAML where it should be fails too."""
    args = [str(a) for a in args]
    if "export" in args and stdout.strip() and not has_flag(args, "--output"):
        check_config(stdout, "cupool " + " ".join(args))  # a config file, `version: 1`
        return 1
    name, fmt, watching = schema_of(args)
    if not name or not stdout.strip():
        return 0
    what = "cupool " + " ".join(str(a) for a in args)
    try:
        docs = documents(stdout, fmt, watching)
    except (ValueError, yaml.YAMLError) as e:
        raise OutputError(f"{what}: --format {fmt} printed something that does not parse: {e}") from e
    for doc in docs:
        validate(name, doc, what)
    return len(docs)


def check_config(text, what):
    """Validates a config file's text (what `cupool export` writes) against the config schema."""
    doc = yaml.load(text, Loader=Yaml12Loader)
    if "config" not in _validators:
        with open(schema_path("config"), encoding="utf-8") as f:
            _validators["config"] = make_validator(json.load(f))
    errors = list(_validators["config"].iter_errors(doc))
    if errors:
        raise OutputError(f"{what}: not a config the schema accepts: "
                          + "; ".join(f"/{'/'.join(str(p) for p in e.absolute_path)}: {e.message[:200]}" for e in errors[:5]))
    counts["config"] = counts.get("config", 0) + 1


def check_exec_report(path_or_lines):
    """Validates the lines of an `exec --report` file (or a list of lines)."""
    if isinstance(path_or_lines, str):
        with open(path_or_lines, encoding="utf-8") as f:
            lines = f.read().splitlines()
    else:
        lines = path_or_lines
    for line in lines:
        if line.strip():
            validate("exec-report", json.loads(line), "cupool exec --report")
    return len(lines)


def self_check(root):
    """The output schemas are valid draft 2020-12 schemas, each is used by a verb above, and the
    README's table lists each. Returns the problems found."""
    import glob
    import jsonschema
    problems = []
    used = set(VERBS.values()) | set(BUFFER_VERBS.values()) | {"exec-report"}
    shipped = set()
    for path in sorted(glob.glob(os.path.join(root, "schemas", f"cupool-*-v{VERSION}.schema.json"))):
        name = os.path.basename(path)[len("cupool-"):-len(f"-v{VERSION}.schema.json")]
        if name == "config":
            continue
        shipped.add(name)
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.exceptions.SchemaError as e:
            problems.append(f"{path}: not a valid draft 2020-12 schema: {e.message}")
        if schema.get("$id") != f"https://cupool.dev/schemas/cupool-{name}-v{VERSION}.schema.json":
            problems.append(f"{path}: $id {schema.get('$id')!r} does not name the file")
        # The top level, or each of its oneOf branches (#/$defs/NAME), requires the version.
        branches = [schema.get("$defs", {}).get(b.get("$ref", "").split("/")[-1], b) for b in schema["oneOf"]] \
            if "oneOf" in schema and "properties" not in schema else [schema]
        for branch in branches:
            if branch.get("properties", {}).get("schema_version", {}).get("const") != VERSION or \
                    "schema_version" not in branch.get("required", []):
                problems.append(f"{path}: does not require schema_version {VERSION}")
    for name in sorted(used - shipped):
        problems.append(f"no schema for {name}: schemas/cupool-{name}-v{VERSION}.schema.json is missing")
    for name in sorted(shipped - used):
        problems.append(f"schemas/cupool-{name}-v{VERSION}.schema.json describes no verb's output (tests/schema/output.py)")
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    for name in sorted(shipped):
        if f"schemas/cupool-{name}-v{VERSION}.schema.json" not in readme:
            problems.append(f"README.md's table of machine output does not list cupool-{name}-v{VERSION}")
    return problems


if __name__ == "__main__":
    found = self_check(os.path.normpath(os.path.join(SCHEMA_DIR, "..")))
    for p in found:
        print("FAIL", p)
    print(f"{len(found)} problems in the output schemas")
    sys.exit(1 if found else 0)
