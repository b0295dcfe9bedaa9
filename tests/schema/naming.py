#!/usr/bin/python3
"""The naming rules of docs/naming.md, checked over every output schema.

usage: naming.py [DIR]

DIR holds the schemas (default: the repository's schemas/). Every cupool-*-v1.schema.json there is
read, cupool-common-v1 included and the config's schema (cupool-config-v1, a file people write)
left out. One line per problem, "FILE#/JSON/POINTER: what is wrong", then a summary; exit 1 when
there is a problem.

The rules checked (docs/naming.md says why):
  unit       an integer or number property ends in _bytes, _seconds or _count, or is a rate
             (bytes_per_second) or a ratio, unless it is an identifier of IDENTIFIERS below
  plural     an array property has a plural name (ARRAY_NAMES below aside); a property that is
             not an array does not end in a plural that names an array elsewhere (a count called
             `buffers`; query's SUPPORT_FLAGS below aside)
  type       one property name has one type in every schema (null aside: "X or null" is X)
  enum       enum and const strings are snake_case (ENUM_WORDS below aside)
  identity   an object with `device` (or `process_device`) also has `uuid` and `pci_bus_id`, and
             requires them wherever it requires the ordinal
  old name   no property has a name from docs/naming.md's "old" column (OLD_NAMES below)
  snake      property names are snake_case
  shared     a verb's schema defines none of common's $defs under the same name, nor writes out
             common's objects' fields itself instead of $ref'ing them
  read       every key the CLI reads from a reply (cli/*.cpp beside DIR: its renderers read
             holder replies tolerantly, by key, as a holder of another version may lack a field;
             each segment of a dotted key; what it writes into a request aside) is a property of
             some schema, so a renamed field can't leave a reader reading a name nothing prints
"""

import glob
import json
import os
import re
import sys
from urllib.parse import urldefrag, urljoin

VERSION = 1
COMMON = f"cupool-common-v{VERSION}.schema.json"

# Integer properties that are identifiers or numbers with no unit, not quantities.
IDENTIFIERS = {
    "schema_version": "the version of the format",
    "device": "a CUDA ordinal (rule 4)",
    "process_device": "a CUDA ordinal in the reporting process (rule 4)",
    "pid": "a process id",
    "uid": "a user id",
    "id": "a connection's number in the holder",
    "line": "a position in a config file (findings)",
    "column": "a position in a config file (findings)",
    "exit_code": "the exit status check returns",
    "protocol": "the protocol version a client's hello agreed on",
    "seed": "the seed of bench's case order",
    "part": "a part's index within a buffer",
    "host_numa_id": "a NUMA node's id",
    "cuda_version_int": "the driver's version as cuDriverGetVersion gives it (13000)",
    "manifest_sequence": "a manifest's sequence number in custody",
}

# Array properties whose names are not plurals, and why.
ARRAY_NAMES = {
    "peer_access": "a matrix named after cuDeviceCanAccessPeer (and the config's access key)",
    "shape": "a tensor's dimensions, safetensors' word",
    "refused": "custody.adoption.refused: what was refused, beside the adopted buffers",
}

# Booleans of query that end in a plural: whether the device supports such pools (named after
# CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED and its kin), not a count or a list of them.
SUPPORT_FLAGS = {"memory_pools", "host_memory_pools", "host_numa_memory_pools", "managed_pools"}

# Names with two types, and why. None: buffer `allocation` (was `memory`, which query's devices use
# for an object), custody `adoption` (beside a buffer's `adopted` flag) and devices[].probes (beside
# the top-level `deep` flag) were renamed so that each name has one type.
TWO_TYPES = {}

# Properties whose enum values are someone else's words, not snake_case.
ENUM_WORDS = {
    "dtype": "safetensors' dtype names (BF16, F8_E4M3)",
    "field": "plan's config keys as the config writes them (reuse.allow_opportunistic)",
}
# A finding's `code` (a rule as people type it: unknown-key) is free text under a pattern, not an
# enum, so the enum rule never reaches it.

# Old names (docs/naming.md, "Old names"), each with its replacement. A name the amendment kept
# with another meaning (buffers, tensors, parts, warnings, error, adopted) is not here: the plural
# and type rules catch it where it is misused.
OLD_NAMES = {
    "index": "device",
    "total": "total_bytes",
    "free": "free_bytes",
    "reason": "error {code, message}",
    "node": "source (and bench's gpu)",
    "not_listed": "not_listed_count",
    "iterations": "iteration_count",
    "sizes": "sizes_bytes",
    "case": "name",
    "what": "description",
    "size": "size_bytes",
    "threshold": "release_threshold and release_threshold_bytes",
    "n": "iteration_count",
    "median_us": "median_seconds",
    "p99_us": "p99_seconds",
    "mean_us": "mean_seconds",
    "min_us": "min_seconds",
    "findings_total": "finding_count",
    "reloads": "reload_count",
    "uptime_s": "uptime_seconds",
    "max_size": "max_size_bytes (null: the driver's default)",
    "leases": "lease_count",
    "cached": "cached_count",
    "opens": "open_count",
    "manifest": "manifest_sequence",
    "buffers_kept": "kept_buffer_count",
    "released": "released_bytes or released_count",
    "seconds": "elapsed_seconds",
    "asked_to_drop": "asked_to_drop_count",
    "open_buffers": "open_buffer_count",
    "connected_s": "connected_seconds",
    "clients_total": "client_count",
    "reserved_current": "reserved_bytes",
    "reserved_high": "reserved_peak_bytes",
    "used_current": "used_bytes",
    "used_high": "used_peak_bytes",
    "graph_reserved_current": "graph.reserved_bytes",
    "graph_reserved_high": "graph.reserved_peak_bytes",
    "graph_used_current": "graph.used_bytes",
    "graph_used_high": "graph.used_peak_bytes",
    "graph_reserved_before": "graph.reserved_before_bytes",
    "graph_reserved_after": "graph.reserved_after_bytes",
    "reserved_before": "reserved_before_bytes",
    "reserved_after": "reserved_after_bytes",
    "cached_dropped_bytes": "dropped_bytes",
    "offset": "offset_bytes",
}

UNIT_SUFFIXES = ("_bytes", "_seconds", "_count", "bytes_per_second")
UNITLESS_NUMBERS = ("ratio",)
SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
NUMERIC = {"integer", "number"}


def escape(key):
    return str(key).replace("~", "~0").replace("/", "~1")


class Schemas:
    """The output schemas of one folder, by file name and by $id, and $ref resolution among them."""

    def __init__(self, folder):
        self.files = {}
        for name in sorted(os.listdir(folder)):
            if re.fullmatch(rf"cupool-[a-z0-9-]+-v{VERSION}\.schema\.json", name) and name != f"cupool-config-v{VERSION}.schema.json":
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    self.files[name] = json.load(f)
        self.by_id = {urldefrag(s.get("$id", name))[0]: name for name, s in self.files.items()}

    def id_of(self, name):
        return self.files[name].get("$id", name)

    def resolve(self, ref, name):
        """(file, node) that $ref `ref` in file `name` points at; (None, None) where nothing is."""
        base, fragment = urldefrag(urljoin(self.id_of(name), ref))
        target = self.by_id.get(base)
        node = self.files.get(target)
        for part in [p.replace("~1", "/").replace("~0", "~") for p in fragment.split("/")[1:]]:
            node = node.get(part) if isinstance(node, dict) else None
        return (target, node) if node is not None else (None, None)


def walk(node, pointer=""):
    """(node, JSON pointer, property name or None) for every subschema of a schema document; the
    property name is set where the node is the schema of a property."""
    if not isinstance(node, dict):
        return
    yield node, pointer
    for key, value in node.items():
        where = f"{pointer}/{escape(key)}"
        if key in ("properties", "$defs", "patternProperties", "dependentSchemas") and isinstance(value, dict):
            for child, schema in value.items():
                yield from walk(schema, f"{where}/{escape(child)}")
        elif key in ("allOf", "anyOf", "oneOf", "prefixItems") and isinstance(value, list):
            for i, schema in enumerate(value):
                yield from walk(schema, f"{where}/{i}")
        elif key in ("items", "additionalProperties", "unevaluatedProperties", "if", "then", "else", "not",
                     "contains", "propertyNames") and isinstance(value, dict):
            yield from walk(value, where)


def types(schemas, name, node, seen=()):
    """The JSON types a schema allows ("integer" for integers, "null" included); empty: any."""
    if not isinstance(node, dict) or id(node) in seen:
        return set()
    seen = seen + (id(node),)
    found = set()
    t = node.get("type")
    if isinstance(t, str):
        found.add(t)
    elif isinstance(t, list):
        found.update(t)
    if "type" not in node:
        found.update(json_type(v) for v in node.get("enum", []) + ([node["const"]] if "const" in node else []))
    if "$ref" in node:
        target, resolved = schemas.resolve(node["$ref"], name)
        if resolved is not None:
            found |= types(schemas, target, resolved, seen)
    for key in ("oneOf", "anyOf", "allOf"):
        for branch in node.get(key, []):
            found |= types(schemas, name, branch, seen)
    return found


def json_type(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def fields(schemas, name, node, seen=()):
    """(properties, required) of an object schema, with what it takes from allOf and $ref."""
    if not isinstance(node, dict) or id(node) in seen:
        return {}, set()
    seen = seen + (id(node),)
    props = dict(node.get("properties", {}))
    required = set(node.get("required", []))
    parts = [(name, member) for member in node.get("allOf", [])]
    if "$ref" in node:
        parts.append(schemas.resolve(node["$ref"], name))
    for part_name, part in parts:
        more_props, more_required = fields(schemas, part_name, part, seen)
        props = {**more_props, **props}
        required |= more_required
    return props, required


def main(argv):
    folder = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "schemas")
    schemas = Schemas(folder)
    problems = []

    def problem(name, pointer, text):
        problems.append(f"{name}#{pointer or '/'}: {text}")

    if not schemas.files:
        print(f"FAIL {folder}: no cupool-*-v{VERSION}.schema.json")
        return 1
    if COMMON not in schemas.files:
        problem(COMMON, "", "missing: the shared objects are defined there")

    # Every property of every schema, with its types.
    props = []  # (file, pointer, property name, schema, types less null)
    objects = []  # (file, pointer, node) of every schema with properties or allOf
    enums = []  # (file, pointer, property name or None, value)
    for name, doc in schemas.files.items():
        for node, pointer in walk(doc):
            if "properties" in node or "allOf" in node:
                objects.append((name, pointer, node))
            for prop, schema in (node.get("properties") or {}).items():
                if isinstance(schema, dict) and schema.get("deprecated") is True:
                    continue  # an old name written beside its new one for a release (docs/naming.md)
                where = f"{pointer}/properties/{escape(prop)}"
                props.append((name, where, prop, schema, types(schemas, name, schema) - {"null"}))
            owner = property_of(pointer)
            for value in node.get("enum", []) + ([node["const"]] if "const" in node else []):
                if isinstance(value, str):
                    enums.append((name, pointer, owner, value))

    arrays = {prop for _, _, prop, _, t in props if t == {"array"}}
    by_name = {}
    for name, where, prop, schema, t in props:
        if t:
            by_name.setdefault(prop, {}).setdefault(frozenset(t), []).append(f"{name}#{where}")

        if prop in OLD_NAMES:
            problem(name, where, f"old name {prop!r} (docs/naming.md): {OLD_NAMES[prop]}")
        if not SNAKE.match(prop):
            problem(name, where, f"property name {prop!r} is not snake_case")
        if t & NUMERIC and not (prop.endswith(UNIT_SUFFIXES) or prop in UNITLESS_NUMBERS or prop.endswith("_ratio")
                                or prop in IDENTIFIERS):
            problem(name, where, f"number {prop!r} does not end in its unit (_bytes, _seconds, _count; "
                                 "bytes_per_second; ratio) and is no identifier naming.py knows")
        if "array" in t:
            stem = re.sub(r"_(bytes|seconds)$", "", prop)
            if not stem.endswith("s") and prop not in ARRAY_NAMES:
                problem(name, where, f"array {prop!r} is not a plural")
        elif t and prop not in TWO_TYPES and not (prop in SUPPORT_FLAGS and t == {"boolean"}):
            words = prop.split("_")
            for i in range(len(words)):
                tail = "_".join(words[i:])
                if tail in arrays:
                    problem(name, where, f"{prop!r} is not an array but ends in {tail!r}, an array elsewhere "
                                         f"(a count is {tail[:-1] if tail.endswith('s') else tail}_count)")
                    break

    for prop, kinds in sorted(by_name.items()):
        if len(kinds) > 1 and prop not in TWO_TYPES:
            where = "; ".join(f"{'/'.join(sorted(k))} at {locs[0]}" + (f" (+{len(locs) - 1})" if len(locs) > 1 else "")
                              for k, locs in sorted(kinds.items(), key=lambda kv: sorted(kv[0])))
            problems.append(f"{prop!r} has {len(kinds)} types: {where}")

    for name, pointer, owner, value in enums:
        if owner in ENUM_WORDS:
            continue
        if not SNAKE.match(value):
            problem(name, pointer, f"enum value {value!r} is not snake_case")

    common_defs = schemas.files.get(COMMON, {}).get("$defs", {})
    common_fields = {}
    for def_name, node in common_defs.items():
        own = set((node.get("properties") or {}))
        if len(own) >= 2:
            common_fields[def_name] = own
    for name, pointer, node in objects:
        all_props, required = fields(schemas, name, node)
        for ordinal in ("device", "process_device"):
            if ordinal in all_props:
                missing = [k for k in ("uuid", "pci_bus_id") if k not in all_props]
                if missing:
                    problem(name, pointer, f"has {ordinal!r} but not {', '.join(missing)} (one device identity, rule 4)")
                elif ordinal in required and not {"uuid", "pci_bus_id"} <= required:
                    problem(name, pointer, f"requires {ordinal!r} but not uuid and pci_bus_id")
        if name != COMMON:
            inline = {k for k, v in (node.get("properties") or {}).items() if isinstance(v, dict) and "$ref" not in v}
            for def_name, own in common_fields.items():
                if own <= inline:
                    problem(name, pointer, f"writes out the fields of {COMMON}#/$defs/{def_name} "
                                           f"({', '.join(sorted(own))}) instead of $ref'ing it")

    for name, doc in schemas.files.items():
        if name == COMMON:
            continue
        for def_name in doc.get("$defs", {}):
            if def_name in common_defs:
                problem(name, f"/$defs/{escape(def_name)}", f"defines {def_name!r}, which {COMMON} defines: $ref that one")

    # The renderers read replies tolerantly (a holder of another version may lack a field), by key.
    cli = os.path.join(folder, "..", "cli")
    for renderer in sorted(glob.glob(os.path.join(cli, "*.cpp"))):
        known = {prop for _, _, prop, _, _ in props}
        with open(renderer, encoding="utf-8") as f:
            source = f.read()
        reads = re.findall(r'\b(?:field|u64|i64|boolean|text|number|bytes|list|count_and_bytes)\(\s*[a-z_]+\s*,\s*"([a-z_.]+)"'
                           r'|\.value\("([a-z_.]+)"|\.contains\("([a-z_.]+)"\)|\["([a-z_]+)"\](?!\s*=[^=])', source)
        for groups in reads:
            for key in filter(None, groups):
                for segment in key.split("."):
                    if segment not in known:
                        problems.append(f"cli/{os.path.basename(renderer)} reads {key!r}, but no schema has a property "
                                        f"{segment!r}: a name cupool no longer prints?")

    for line in problems:
        print("FAIL", line)
    print(f"{len(problems)} naming problems in {len(schemas.files)} output schemas ({os.path.normpath(folder)})")
    return 1 if problems else 0


def property_of(pointer):
    """The property whose schema `pointer` is in (the last properties/NAME of it), or None."""
    parts = pointer.split("/")
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "properties":
            return parts[i + 1].replace("~1", "/").replace("~0", "~")
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv))
