"""What cupool prints for scripts, held against the schemas it ships.

Every verb's --format json or yaml output carries "schema_version" first and is described by
schemas/cupool-NAME-v1.schema.json; `cupool exec --report` writes lines described by
schemas/cupool-exec-report-v1.schema.json. The objects several verbs share are defined once, in
schemas/cupool-common-v1.schema.json, which the verbs' schemas $ref (docs/naming.md). The test
suites that run the binary (cli_test.py, the holder suites, exec_test.py) pass what it printed to
check_command(); so every real output those suites produce, on a simulated node in CI and on the
driver on a GPU machine, is validated.

The published schemas accept fields they do not describe (within a version fields are only added,
and a reader ignores what it does not know). The suites validate against strict copies made here
at load time instead: the same schemas with "unevaluatedProperties": false on every object, so a
field the binary prints that no schema describes fails a test. Cross-file $refs resolve offline,
from the schemas loaded here (by their $id).

Set CUPOOL_OUTPUT_SAMPLES=DIR to also append every document to DIR/NAME.jsonl (to study real
output when a schema changes).
"""

import copy
import functools
import glob
import json
import os
import sys
from urllib.parse import urldefrag, urljoin

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from validate import Yaml12Loader, make_validator  # noqa: E402  (also imports jsonschema and yaml)

import jsonschema  # noqa: E402
import yaml  # noqa: E402

VERSION = 1
SCHEMA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "schemas")
SCHEMA_BASE = "https://cupool.dev/schemas/"
COMMON = "common"  # the shared definitions: no verb prints it, every verb's schema $refs it

# The verbs that print machine output, and the schema of each (buffer's subcommands by name).
VERBS = {"query": "query", "check": "check", "bench": "bench", "status": "status", "stats": "stats",
         "trim": "trim", "plan": "plan", "apply": "plan", "ledger": "ledger"}
BUFFER_VERBS = {"create": "buffer-create", "load": "buffer-load", "ls": "buffer-ls", "rm": "buffer-rm",
                "remove": "buffer-rm"}
BUFFER_LOAD_MANY = "buffer-load-many"  # `buffer load NAME FILE FILE...`: several files
# The options of `buffer load` that take a value (the rest of its arguments are NAME and the files).
BUFFER_LOAD_VALUES = {"--pool", "--device", "-d", "--part-size", "--read-threads", "--direct-io", "--gds", "--format",
                      "--socket"}
KEEPER_LIST = "keeper-list"  # `cupool keeper --list`
CONFIGURE = "configure"  # cupool_configure's report (the C API; tests/exec/exec_test.py)

_validators = {}
_schemas = {}  # schema dir -> {"published": {name: schema}, "strict": {name: strict copy}}
counts = {}


class OutputError(AssertionError):
    pass


def schema_path(name):
    return os.path.normpath(os.path.join(SCHEMA_DIR, f"cupool-{name}-v{VERSION}.schema.json"))


def schema_id(name):
    return f"{SCHEMA_BASE}cupool-{name}-v{VERSION}.schema.json"


def load_output_schemas(schema_dir=SCHEMA_DIR):
    """{name: schema} of every output schema in schema_dir (cupool-NAME-vN, the config's aside)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(schema_dir, f"cupool-*-v{VERSION}.schema.json"))):
        name = os.path.basename(path)[len("cupool-"):-len(f"-v{VERSION}.schema.json")]
        if name == "config":
            continue
        with open(path, encoding="utf-8") as f:
            found[name] = json.load(f)
    return found


# ---- strict copies ----
#
# "unevaluatedProperties": false sees through allOf and $ref (draft 2020-12), so it goes on every
# object schema that has properties, with one exception: a definition another object extends with
# allOf (common's identity, usage, threshold, error, buffer ...) must stay open, or the fields the
# extending object adds would be refused inside it. Such a base is closed where it is used instead:
# the object that extends it gets the keyword (it sees the base's fields through allOf), and so
# does every plain {"$ref": BASE} (status's graph, custody's error). Conditional subschemas
# (if/then/else/not) are left alone: they describe no object of their own.

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs")
_SCHEMA_ONE = ("items", "additionalProperties")
_SCHEMA_LISTS = ("oneOf", "anyOf", "prefixItems")


def _escape(key):
    return str(key).replace("~", "~0").replace("/", "~1")


def _subschemas(node, pointer):
    """(child, its JSON pointer, whether it is an allOf member) for each subschema of `node` that
    describes the instance or a part of it."""
    for key in _SCHEMA_MAPS:
        for name, child in (node.get(key) or {}).items():
            yield child, f"{pointer}/{key}/{_escape(name)}", False
    for key in _SCHEMA_ONE:
        if isinstance(node.get(key), dict):
            yield node[key], f"{pointer}/{key}", False
    for key in _SCHEMA_LISTS:
        for i, child in enumerate(node.get(key) or []):
            yield child, f"{pointer}/{key}/{i}", False
    for i, child in enumerate(node.get("allOf") or []):
        yield child, f"{pointer}/allOf/{i}", True


def _allof_bases(schemas):
    """The absolute URIs (id#pointer) of every schema some allOf member $refs."""
    bases = set()

    def walk(node, sid, pointer):
        if not isinstance(node, dict):
            return
        for member in node.get("allOf") or []:
            if isinstance(member, dict) and "$ref" in member:
                bases.add(urljoin(sid, member["$ref"]))
        for child, where, _ in _subschemas(node, pointer):
            walk(child, sid, where)

    for schema in schemas.values():
        walk(schema, schema["$id"], "")
    return bases


def strict_copies(schemas):
    """{name: strict copy} of {name: schema} (see above)."""
    bases = _allof_bases(schemas)
    strict = {}

    def refs_base(node, sid):
        return isinstance(node, dict) and "$ref" in node and urljoin(sid, node["$ref"]) in bases

    def tighten(node, sid, pointer, member):
        if not isinstance(node, dict):
            return
        closes = "properties" in node or refs_base(node, sid) or \
            any(refs_base(m, sid) for m in node.get("allOf") or [])
        if closes and not member and f"{sid}#{pointer}" not in bases and "unevaluatedProperties" not in node:
            node["unevaluatedProperties"] = False
        for child, where, is_member in _subschemas(node, pointer):
            tighten(child, sid, where, is_member)

    for name, schema in schemas.items():
        strict[name] = copy.deepcopy(schema)
        tighten(strict[name], schema["$id"], "", False)
    return strict


# ---- validators, their $refs resolved from the schemas loaded (offline) ----

@functools.lru_cache(maxsize=None)
def _uses_registry():
    """jsonschema >= 4.18 resolves $ref through a `referencing` registry; older ones (Debian 12's
    4.10) through RefResolver."""
    try:
        import referencing
        jsonschema.Draft202012Validator({}, registry=referencing.Registry())
        return True
    except (ImportError, TypeError):
        return False


def build_validator(schema, schemas):
    """A validator for `schema` whose $refs resolve against {name: schema} by $id, and nowhere else."""
    if _uses_registry():
        import referencing
        import referencing.jsonschema
        registry = referencing.Registry().with_resources(
            (s["$id"], referencing.jsonschema.DRAFT202012.create_resource(s)) for s in schemas.values())
        return make_validator(schema, registry=registry)
    store = {urldefrag(s["$id"])[0]: s for s in schemas.values()}
    return make_validator(schema, resolver=jsonschema.RefResolver(schema["$id"], schema, store=store))


def loaded(schema_dir=SCHEMA_DIR):
    """{"published": {name: schema}, "strict": {name: strict copy}} for schema_dir (loaded once)."""
    key = os.path.normpath(schema_dir)
    if key not in _schemas:
        published = load_output_schemas(schema_dir)
        _schemas[key] = {"published": published, "strict": strict_copies(published)}
    return _schemas[key]


def validator(name, strict=True):
    """The validator of output schema `name`: the strict copy (what the suites use) or, with
    strict=False, the schema as published."""
    kind = "strict" if strict else "published"
    if (name, kind) not in _validators:
        schemas = loaded()[kind]
        if name not in schemas:
            raise OutputError(f"no output schema {schema_path(name)}")
        _validators[(name, kind)] = build_validator(schemas[name], schemas)
    return _validators[(name, kind)]


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


def load_positionals(args):
    """How many of `buffer load`'s arguments are NAME and the files (not options or their values)."""
    count, skip = 0, False
    for a in args:
        if skip:
            skip = False
        elif a in BUFFER_LOAD_VALUES:
            skip = True
        elif not a.startswith("-"):
            count += 1
    return count


def schema_of(args):
    """(schema name, format, watching) for a cupool command line; name None when it prints no
    machine output."""
    args = [str(a) for a in args]
    fmt = option_value(args, "--format")
    if fmt not in ("json", "yaml"):
        return None, fmt, False
    for i, a in enumerate(args):
        if a in VERBS:
            return VERBS[a], fmt, a in ("stats", "ledger") and has_flag(args, "--watch")
        if a == "keeper":
            return (KEEPER_LIST if has_flag(args, "--list") else None), fmt, False
        if a == "buffer":
            rest = [b for b in args[i + 1:] if b in BUFFER_VERBS]
            if rest and rest[0] == "load" and load_positionals(args[args.index("load", i) + 1:]) > 2:
                return BUFFER_LOAD_MANY, fmt, False
            return (BUFFER_VERBS[rest[0]] if rest else None), fmt, False
    return None, fmt, False


def documents(text, fmt, watching):
    if fmt == "json":
        if watching:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        return [json.loads(text)]
    return [d for d in yaml.load_all(text, Loader=Yaml12Loader) if d is not None]


def validate(name, doc, what):
    """Raises OutputError naming where `doc` breaks schema `name` (its strict copy: a field no
    schema describes fails too)."""
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


def _walk(node, pointer=""):
    """(subschema or value, JSON pointer) for everything in a schema document."""
    yield node, pointer
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{pointer}/{_escape(key)}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{pointer}/{i}")


def _resolve(uri, by_id):
    """The schema at absolute `uri` (id#pointer) among {id: schema}; None where nothing is there."""
    base, fragment = urldefrag(uri)
    node = by_id.get(base)
    if node is None or (fragment and not fragment.startswith("/")):
        return None
    for part in [p.replace("~1", "/").replace("~0", "~") for p in fragment.split("/")[1:]]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


# Two small documents every output schema set must take as published and refuse in its strict copy
# once they carry a field no schema describes (at the top, and through allOf into common's objects).
_SAMPLES = {
    KEEPER_LIST: {"schema_version": VERSION, "socket": "/run/cupool/keeper.sock", "names": ["cupool-manifest.1"]},
    "buffer-rm": {"schema_version": VERSION, "name": "weights", "pool": "default", "device": 0,
                  "uuid": "GPU-00000000-0000-0000-0000-000000000000", "pci_bus_id": "0000:1b:00.0",
                  "size_bytes": 1048576},
}


def self_check(root):
    """The output schemas are valid draft 2020-12 schemas, each is used by a verb above (common by
    every verb's schema), every $ref resolves among them, none refuses unknown fields
    (additionalProperties: false), their strict copies refuse them, and docs/verbs.md's table lists
    each. Returns the problems found."""
    problems = []
    used = set(VERBS.values()) | set(BUFFER_VERBS.values()) | {BUFFER_LOAD_MANY, "exec-report", KEEPER_LIST, CONFIGURE}
    schemas = load_output_schemas(os.path.join(root, "schemas"))
    by_id = {urldefrag(s.get("$id", ""))[0]: s for s in schemas.values()}
    shipped = set(schemas)
    common_ref = f"cupool-{COMMON}-v{VERSION}.schema.json#"
    for name, schema in sorted(schemas.items()):
        path = f"schemas/cupool-{name}-v{VERSION}.schema.json"
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.exceptions.SchemaError as e:
            problems.append(f"{path}: not a valid draft 2020-12 schema: {e.message}")
        if schema.get("$id") != schema_id(name):
            problems.append(f"{path}: $id {schema.get('$id')!r} does not name the file")
        refs = [(node["$ref"], where) for node, where in _walk(schema) if isinstance(node, dict)
                and isinstance(node.get("$ref"), str)]
        for ref, where in refs:
            if _resolve(urljoin(schema.get("$id", ""), ref), by_id) is None:
                problems.append(f"{path}#{where}: $ref {ref!r} resolves to nothing among the output schemas")
        for node, where in _walk(schema):
            if isinstance(node, dict) and node.get("additionalProperties") is False:
                problems.append(f"{path}#{where}: additionalProperties: false (a published schema accepts "
                                "fields it does not know; the suites' strict copies refuse them)")
        if name == COMMON:
            if schema.get("$defs", {}).get("schema_version", {}).get("const") != VERSION:
                problems.append(f"{path}: $defs/schema_version is not const {VERSION}")
            continue
        if not any(ref.startswith(common_ref) for ref, _ in refs):
            problems.append(f"{path}: $refs nothing of cupool-{COMMON}-v{VERSION}.schema.json (the shared objects)")
        # The top level, or each of its oneOf branches (#/$defs/NAME), requires the version.
        branches = [schema.get("$defs", {}).get(b.get("$ref", "").split("/")[-1], b) for b in schema["oneOf"]] \
            if "oneOf" in schema and "properties" not in schema else [schema]
        for branch in branches:
            version = branch.get("properties", {}).get("schema_version", {})
            if "$ref" in version:
                version = _resolve(urljoin(schema.get("$id", ""), version["$ref"]), by_id) or {}
            if version.get("const") != VERSION or "schema_version" not in branch.get("required", []):
                problems.append(f"{path}: does not require schema_version {VERSION}")
    for name in sorted(used - shipped):
        problems.append(f"no schema for {name}: schemas/cupool-{name}-v{VERSION}.schema.json is missing")
    for name in sorted(shipped - used - {COMMON}):
        problems.append(f"schemas/cupool-{name}-v{VERSION}.schema.json describes no verb's output (tests/schema/output.py)")
    if COMMON not in shipped:
        problems.append(f"schemas/cupool-{COMMON}-v{VERSION}.schema.json (the shared definitions) is missing")
    if not problems:
        strict = strict_copies(schemas)
        for name, schema in sorted(strict.items()):
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.exceptions.SchemaError as e:
                problems.append(f"the strict copy of cupool-{name}-v{VERSION}: not a valid schema: {e.message}")
        for name, doc in _SAMPLES.items():
            extra = dict(doc, surprise=1)
            for what, kind, instance, want in (("a valid document", schemas, doc, True),
                                               ("a valid document", strict, doc, True),
                                               ("an unknown field", schemas, extra, True),
                                               ("an unknown field", strict, extra, False)):
                got = build_validator(kind[name], kind).is_valid(instance)
                if got != want:
                    label = "strict copy" if kind is strict else "published schema"
                    problems.append(f"the {label} of cupool-{name}-v{VERSION} {'refuses' if want else 'accepts'} {what}")
    with open(os.path.join(root, "docs", "verbs.md"), encoding="utf-8") as f:
        readme = f.read()
    for name in sorted(shipped):
        if f"schemas/cupool-{name}-v{VERSION}.schema.json" not in readme:
            problems.append(f"docs/verbs.md's table of machine output does not list cupool-{name}-v{VERSION}")
    return problems


if __name__ == "__main__":
    found = self_check(os.path.normpath(os.path.join(SCHEMA_DIR, "..")))
    for p in found:
        print("FAIL", p)
    print(f"{len(found)} problems in the output schemas")
    sys.exit(1 if found else 0)
