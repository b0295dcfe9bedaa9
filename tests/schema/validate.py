#!/usr/bin/python3
"""Validates cupool config files against the JSON Schema.

usage: validate.py SCHEMA [--valid FILE...] [--invalid FILE...]

Every --valid file must load and validate; every --invalid file must be refused (by YAML or by the
schema). One line per file, then "N passed, M failed"; exit 1 if anything failed, 2 on bad usage.

An --invalid file may name where the schema must refuse it, as a comment line
    # schema-error-at: /pools/0/release_threshold
(a JSON pointer; `/` is the top level). The file then passes only if one of the schema's errors,
nested ones included, is at that path, so a file refused for some other reason is caught.

YAML is read as YAML 1.2 (core schema), as the parser reads it, not as PyYAML's YAML 1.1:
only true/false are booleans (`yes`, `on`, `True` stay strings), integers are decimal digits,
there are no timestamps and no `<<` merge keys, and a key repeated in a mapping is an error.
A YAML float is never an integer, even when its value is whole (`version: 1.0`).
"""

import argparse
import re
import sys

try:
    import jsonschema
    import yaml
except ImportError as e:  # pragma: no cover
    print(f"validate.py: {e}; install python3-jsonschema and python3-yaml (scripts/setup.sh)", file=sys.stderr)
    sys.exit(2)


class Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars and duplicate keys refused."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    continue  # SafeLoader reports unhashable keys itself
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found duplicate key {key!r} (first at line {seen[key].line + 1})", key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


Yaml12Loader.yaml_implicit_resolvers = {}
for _tag, _regexp, _first in [
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|false)$", ["t", "f"]),
    ("tag:yaml.org,2002:int", r"^[-+]?[0-9]+$", list("-+0123456789")),
    ("tag:yaml.org,2002:float",
     r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
     list("-+.0123456789")),
]:
    Yaml12Loader.add_implicit_resolver(_tag, re.compile(_regexp), _first)
Yaml12Loader.add_constructor(
    "tag:yaml.org,2002:int", lambda loader, node: int(loader.construct_scalar(node), 10))
Yaml12Loader.add_constructor(
    "tag:yaml.org,2002:bool", lambda loader, node: loader.construct_scalar(node) == "true")


def make_validator(schema, **kwargs):
    """A draft 2020-12 validator for `schema`; kwargs go to it (the output schemas pass where their
    cross-file $refs resolve: registry= with `referencing`, resolver= before it)."""
    base = jsonschema.Draft202012Validator
    # JSON Schema calls 1.0 an integer; in YAML it is a float, and the parser refuses it.
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool))
    cls = jsonschema.validators.extend(base, type_checker=checker)
    return cls(schema, **kwargs)


def pointer(path):
    return "/" + "/".join(str(p) for p in path) if path else "/"


def all_paths(errors):
    for e in errors:
        yield pointer(e.absolute_path)
        yield from all_paths(e.context or [])


def expected_path(text):
    m = re.search(r"^#\s*schema-error-at:\s*(\S+)\s*$", text, re.MULTILINE)
    return m.group(1) if m else None


def message(error):
    """The error's message; where the failing schema has a title, that instead of a regex dump."""
    title = error.schema.get("title") if isinstance(error.schema, dict) else None
    if title and error.validator in ("anyOf", "oneOf", "pattern"):
        return f"{error.instance!r} is not {title}"
    return error.message


def judge(validator, path):
    """(loaded, errors, text): errors is a list of (where, message); empty if the file is valid."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        return None, [("(file)", str(e))], ""
    try:
        data = yaml.load(text, Loader=Yaml12Loader)
    except yaml.YAMLError as e:
        return None, [("(yaml)", " ".join(str(e).split()))], text
    errors = list(validator.iter_errors(data))
    if not errors:
        return data, [], text
    best = jsonschema.exceptions.best_match(errors)
    first = [(pointer(best.absolute_path), message(best))]
    return data, first + [(p, "") for p in all_paths(errors)], text


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("schema")
    ap.add_argument("--valid", nargs="*", default=[], metavar="FILE")
    ap.add_argument("--invalid", nargs="*", default=[], metavar="FILE")
    args = ap.parse_args(argv)

    import json
    try:
        with open(args.schema, encoding="utf-8") as f:
            schema = json.load(f)
        jsonschema.Draft202012Validator.check_schema(schema)
    except (OSError, ValueError, jsonschema.exceptions.SchemaError) as e:
        print(f"FAIL {args.schema}: not a valid draft 2020-12 schema: {e}")
        print("0 passed, 1 failed")
        return 1
    validator = make_validator(schema)

    passed = failed = 0
    for path in args.valid:
        _, errors, _ = judge(validator, path)
        if errors:
            where, message = errors[0]
            print(f"FAIL {path}: expected valid: {where}: {message}")
            failed += 1
        else:
            print(f"ok   {path}")
            passed += 1
    for path in args.invalid:
        data, errors, text = judge(validator, path)
        if not errors:
            print(f"FAIL {path}: expected invalid, but the schema accepts it")
            failed += 1
            continue
        where, message = errors[0]
        want = expected_path(text)
        if want is not None and want not in {p for p, _ in errors}:
            print(f"FAIL {path}: refused, but not at {want}: {where}: {message}")
            failed += 1
            continue
        print(f"ok   {path}: refused: {where}: {message}")
        passed += 1

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
