#!/usr/bin/python3
"""Writes the Kubernetes JSON schemas that tests/deploy validates the manifests against.

usage: generate.py SWAGGER_JSON OUTPUT_DIR

SWAGGER_JSON is Kubernetes' own OpenAPI v2 document (api/openapi-spec/swagger.json of a release;
README.md says which one and where it came from). For each kind the manifests use, this writes a
"standalone strict" JSON schema by the rules of yannh/kubernetes-json-schema's
`*-standalone-strict` folders (openapi2jsonschema --expanded --kubernetes --stand-alone --strict),
so the files validate as kubeconform's do:

- every $ref is replaced by the definition it names (a file stands alone);
- IntOrString accepts a string or an integer, a Quantity a string or a number;
- apiVersion and kind accept only the kind's own (from x-kubernetes-group-version-kind);
- an object schema with properties refuses any other property (additionalProperties: false);
- a field that its object does not require may be null.

One difference: descriptions are left out (they do not take part in validation, and they are
most of the bytes). Run it again, with the same input, to check the vendored files.
"""

import copy
import json
import os
import sys

# kind file name -> definition name
KINDS = {
    "namespace-v1.json": "io.k8s.api.core.v1.Namespace",
    "configmap-v1.json": "io.k8s.api.core.v1.ConfigMap",
    "daemonset-apps-v1.json": "io.k8s.api.apps.v1.DaemonSet",
    "pod-v1.json": "io.k8s.api.core.v1.Pod",
}
REF_PREFIX = "#/definitions/"


def kubernetes_definitions(swagger):
    defs = copy.deepcopy(swagger["definitions"])
    defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    # Kubernetes refuses a number for a Quantity in JSON it reads strictly, but every tool (and
    # kubectl's YAML) takes `cpu: 1`; yannh's schemas accept it too.
    defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {"oneOf": [{"type": "string"}, {"type": "number"}]}
    for d in defs.values():
        props = d.get("properties", {})
        for gvk in d.get("x-kubernetes-group-version-kind", []):
            version = gvk["group"] + "/" + gvk["version"] if gvk["group"] else gvk["version"]
            if "apiVersion" in props:
                props["apiVersion"].setdefault("enum", [])
                if version not in props["apiVersion"]["enum"]:
                    props["apiVersion"]["enum"].append(version)
            if "kind" in props:
                props["kind"].setdefault("enum", [])
                if gvk["kind"] not in props["kind"]["enum"]:
                    props["kind"]["enum"].append(gvk["kind"])
    return defs


def inline(node, defs, seen=()):
    """`node` with every $ref replaced by a copy of its definition (siblings of $ref dropped)."""
    if isinstance(node, list):
        return [inline(x, defs, seen) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"][len(REF_PREFIX):]
        if not node["$ref"].startswith(REF_PREFIX) or name not in defs:
            raise SystemExit(f"generate.py: unknown reference {node['$ref']}")
        if name in seen:
            raise SystemExit(f"generate.py: {name} refers to itself; it can't stand alone")
        return inline(defs[name], defs, seen + (name,))
    return {k: inline(v, defs, seen) for k, v in node.items() if not (k == "description" and isinstance(v, str))}


def strict(node):
    if isinstance(node, list):
        return [strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def nullable(node, parent=None, grand_parent=None, key=None):
    """A "type" becomes [type, "null"] unless it is the type of a field its object requires."""
    if isinstance(node, list):
        return [nullable(x, node, parent, key) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if isinstance(v, (dict, list)):
            out[k] = nullable(v, node, parent, k)
        elif k == "type" and isinstance(v, str) and v != "null":
            required = isinstance(grand_parent, dict) and key in grand_parent.get("required", [])
            out[k] = v if required else [v, "null"]
        else:
            out[k] = v
    return out


def schema_for(defs, name):
    spec = inline(defs[name], defs)
    spec.setdefault("type", "object")
    spec = strict(spec)
    spec["properties"] = nullable(spec["properties"])
    spec["$schema"] = "http://json-schema.org/schema#"
    return spec


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        swagger = json.load(f)
    defs = kubernetes_definitions(swagger)
    os.makedirs(argv[2], exist_ok=True)
    for file_name, name in KINDS.items():
        with open(os.path.join(argv[2], file_name), "w", encoding="utf-8") as f:
            json.dump(schema_for(defs, name), f, indent=1)
            f.write("\n")
        print(f"{file_name}: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
