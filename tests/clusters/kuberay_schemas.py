"""The published KubeRay schemas as strict validators, for the fake API server and the tests: the
RayCluster CRD's ``v1`` openAPIV3Schema and the V1 swagger definitions, with unknown fields rejected
(``kubectl --validate=strict`` / ``fieldValidation=Strict``), list-map key uniqueness and ObjectMeta
name/label syntax, which JSON Schema alone cannot express. Files: ../shared/specs/kuberay (SOURCES.md)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import jsonschema
import yaml

SPECS = Path(__file__).resolve().parents[3] / "shared" / "specs" / "kuberay"
if not SPECS.is_dir():  # pragma: no cover - alternative checkout layout
    SPECS = Path("/work/shared/specs/kuberay")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_INT_RANGE = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


# -- schemas ---------------------------------------------------------------------------------------
def _strict(node, drop_read_only: bool = False):
    """Reject unknown fields: every object schema with ``properties`` and no ``additionalProperties``
    (nor ``x-kubernetes-preserve-unknown-fields``) gets ``additionalProperties: false``; integer
    formats get their ranges; optionally read-only (output) properties are removed."""
    if isinstance(node, list):
        return [_strict(n, drop_read_only) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v, drop_read_only) if k not in ("enum", "required", "default", "example") else v for k, v in node.items()}
    props = out.get("properties")
    if isinstance(props, dict) and "$ref" not in out:
        if drop_read_only:
            ro = {k for k, v in props.items() if isinstance(v, dict) and v.get("readOnly")}
            out["properties"] = {k: v for k, v in props.items() if k not in ro}
            if "required" in out:
                out["required"] = [r for r in out["required"] if r not in ro]
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if out.get("type") == "integer" and out.get("format") in _INT_RANGE:
        out["minimum"], out["maximum"] = _INT_RANGE[out["format"]]
    return out


@functools.lru_cache(maxsize=None)
def crd_schema() -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load((SPECS / "ray.io_rayclusters.yaml").read_text(), Loader=loader)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


@functools.lru_cache(maxsize=None)
def _crd_validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(_strict(crd_schema()))


_OBJECT_META = {
    "type": "object", "additionalProperties": False, "required": ["name"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                   "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                   "annotations": {"type": "object", "additionalProperties": {"type": "string"}}},
}


def _list_maps(schema: dict, value, path: str, errors: list[str]) -> None:
    """Kubernetes' list-type=map / set uniqueness, which JSON Schema cannot express."""
    if isinstance(value, list) and isinstance(schema, dict):
        lt, keys = schema.get("x-kubernetes-list-type"), schema.get("x-kubernetes-list-map-keys")
        if lt == "map" and keys:
            seen = set()
            for i, item in enumerate(value):
                k = tuple(item.get(key) for key in keys) if isinstance(item, dict) else None
                if k in seen:
                    errors.append(f"{path}[{i}]: Duplicate value: {dict(zip(keys, k))}")
                seen.add(k)
        if lt == "set" and len({json.dumps(v, sort_keys=True) for v in value}) != len(value):
            errors.append(f"{path}: Duplicate value in a set")
        for i, item in enumerate(value):
            _list_maps(schema.get("items") or {}, item, f"{path}[{i}]", errors)
    elif isinstance(value, dict) and isinstance(schema, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            sub = props.get(k, extra if isinstance(extra, dict) else None)
            if sub:
                _list_maps(sub, v, f"{path}.{k}" if path else k, errors)


def _label_errors(labels, path: str) -> list[str]:
    errs = []
    for k, v in (labels or {}).items():
        prefix, _, name = str(k).rpartition("/")
        if (prefix and not _DNS_SUBDOMAIN.match(prefix)) or not _LABEL_NAME.match(name) or len(name) > 63:
            errs.append(f"{path}: Invalid value: {k!r}: name part must consist of alphanumeric characters, '-', '_' or '.'")
        if len(str(v)) > 63 or (v and not _LABEL_NAME.match(str(v))):
            errs.append(f"{path}: Invalid value: {v!r}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.'")
    return errs


def validate_raycluster(obj) -> list[str]:
    """Errors Kubernetes (strict field validation) would report for this RayCluster; [] if valid."""
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
              for e in sorted(_crd_validator().iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]
    if not isinstance(obj, dict):
        return errors or ["body is not an object"]
    if obj.get("apiVersion") != "ray.io/v1" or obj.get("kind") != "RayCluster":
        errors.append(f"apiVersion/kind: expected ray.io/v1 RayCluster, got {obj.get('apiVersion')}/{obj.get('kind')}")
    md = obj.get("metadata")
    errors += [f"metadata.{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in jsonschema.Draft7Validator(_OBJECT_META).iter_errors(md)]
    if isinstance(md, dict):
        name = md.get("name") or ""
        if not _DNS_LABEL.match(name) or len(name) > 63:
            errors.append(f"metadata.name: Invalid value: {name!r}: must be a DNS-1123 label of at most 63 characters")
        errors += _label_errors(md.get("labels"), "metadata.labels")
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    templates = [("spec.headGroupSpec.template", (spec.get("headGroupSpec") or {}).get("template"))]
    templates += [(f"spec.workerGroupSpecs[{i}].template", (g or {}).get("template")) for i, g in enumerate(spec.get("workerGroupSpecs") or [])]
    for path, t in templates:
        if isinstance(t, dict):
            errors += _label_errors((t.get("metadata") or {}).get("labels"), f"{path}.metadata.labels")
    _list_maps(crd_schema(), obj, "", errors)
    return errors


def _swagger_defs(filename: str) -> dict:
    doc = json.loads((SPECS / filename).read_text())
    return _strict(doc["definitions"], drop_read_only=True)


@functools.lru_cache(maxsize=None)
def swagger_validator(filename: str, definition: str) -> jsonschema.Draft7Validator:
    """A validator for one request-body definition of a V1 swagger file ($refs resolved in-file)."""
    return jsonschema.Draft7Validator({"definitions": _swagger_defs(filename), "$ref": f"#/definitions/{definition}"})


def validate_swagger(filename: str, definition: str, body) -> list[str]:
    v = swagger_validator(filename, definition)
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in v.iter_errors(body)]
