"""Compiled pipeline packages and run parameters: read a package strictly (the pipeline_spec protos),
a content digest, the root inputs, and run values checked and converted to the declared types
before anything is posted."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from prepline.errors import ConfigError

def read_package(path: str | os.PathLike) -> list[dict]:
    """The YAML documents of a compiled pipeline file (pipeline spec [, platform spec]), checked
    strictly with the pipeline_spec protos."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"pipeline file {p} does not exist", "compile it first: prepline compile (files land in compiled/pipelines/)")
    if p.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"{p} is not a compiled pipeline YAML", "pass a .yaml file from compiled/pipelines/")
    import yaml
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    try:
        docs = [d for d in yaml.safe_load_all(p.read_text()) if d]
    except yaml.YAMLError as e:
        raise ConfigError(f"{p} is not valid YAML: {e}", "pass a file written by `prepline compile` or kfp's compiler") from None
    if not docs or not isinstance(docs[0], dict) or "root" not in docs[0] or "pipelineInfo" not in docs[0]:
        raise ConfigError(f"{p} is not a compiled pipeline (no pipelineInfo/root)", "pass a file from compiled/pipelines/, not a component")
    try:
        json_format.ParseDict(docs[0], pipeline_spec_pb2.PipelineSpec())
        for d in docs[1:]:
            json_format.ParseDict(d, pipeline_spec_pb2.PlatformSpec())
    except json_format.ParseError as e:
        raise ConfigError(f"{p} is not a valid pipeline spec: {e}", "recompile it with kfp 2.x") from None
    return docs


def _canonical(x):
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, dict):
        return {k: _canonical(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_canonical(v) for v in x]
    return x


def spec_docs(obj) -> list[dict]:
    """Normalize the shapes a pipeline spec travels in (list of YAML docs, a bare spec, or the
    ``{"pipeline_spec": ..., "platform_spec": ...}`` wrapper kfp sends) to ``[spec, platform?]``."""
    if not obj:
        return []
    if isinstance(obj, list):
        return [d for d in obj if d]
    if isinstance(obj, dict) and "pipeline_spec" in obj and "root" not in obj:
        return [obj["pipeline_spec"]] + ([obj["platform_spec"]] if obj.get("platform_spec") else [])
    return [obj]


def content_digest(obj) -> str:
    """sha256 of the canonical JSON of a pipeline spec (integral floats as ints): equal for the same
    pipeline however it was serialized."""
    docs = _canonical(spec_docs(obj))
    return hashlib.sha256(json.dumps(docs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def root_inputs(spec) -> dict[str, dict]:
    """``{name: {"type", "default", "optional"}}`` of a pipeline spec's root inputDefinitions parameters."""
    docs = spec_docs(spec)
    if not docs:
        return {}
    params = ((docs[0].get("root") or {}).get("inputDefinitions") or {}).get("parameters") or {}
    return {n: {"type": d.get("parameterType", "STRING"), "default": d.get("defaultValue"),
                "optional": bool(d.get("isOptional")) or "defaultValue" in d} for n, d in params.items()}


def spec_defaults(spec) -> dict:
    return {n: d["default"] for n, d in root_inputs(spec).items() if d["default"] is not None}


def parse_param_flags(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for kv in items or []:
        k, sep, v = kv.partition("=")
        if not sep or not k.strip():
            raise ConfigError(f"--param {kv!r} is not NAME=VALUE", "e.g. --param work_root=s3://bucket/work --param languages='[\"en\",\"ja\"]'")
        out[k.strip()] = v
    return out


def load_params_file(path: str) -> dict:
    """A YAML or JSON mapping of parameter values (JSON is YAML)."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read parameters file {path}: {e.strerror or e}", "check the path given to --params-file") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"parameters file {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                          'write a JSON object, e.g. {"work_root": "s3://bucket/work"}') from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ConfigError(f"parameters file {path} is not valid YAML{where}: {getattr(e, 'problem', None) or e}",
                          "write a mapping of parameter names to values, e.g. `work_root: s3://bucket/work`") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ConfigError(f"parameters file {path} must hold a mapping of parameter names to values, got {type(data).__name__}",
                          "e.g. `work_root: s3://bucket/work` / {\"work_root\": \"s3://bucket/work\"}")
    return data


_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


def _coerce(name: str, value, ptype: str):
    def bad(expect: str):
        return ConfigError(f"parameter {name} must be {expect}, got {value!r}", f"pass {name} as {expect}")

    if ptype == "STRING":
        if isinstance(value, str):
            return value
        return json.dumps(value)  # a list/mapping/number for a string parameter (the *_json ones): its JSON
    if ptype == "BOOLEAN":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise bad("true or false")
    if ptype == "NUMBER_INTEGER":
        if isinstance(value, bool):
            raise bad("an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise bad("an integer")
    if ptype == "NUMBER_DOUBLE":
        if isinstance(value, bool):
            raise bad("a number")
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return float(str(value).strip())
        except ValueError:
            raise bad("a number") from None
    if ptype in ("LIST", "STRUCT"):
        want, label = ((list, f"a JSON list or comma-separated values (e.g. --param {name}=a,b or --param '{name}=[\"a\", \"b\"]')")
                       if ptype == "LIST" else (dict, f"a JSON object (e.g. --param '{name}={{\"key\": 1}}')"))
        if isinstance(value, str):
            import yaml

            text = value
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                try:
                    value = yaml.safe_load(value)
                except yaml.YAMLError:
                    raise bad(label) from None
            if ptype == "LIST" and isinstance(value, str) and not text.strip().startswith(("[", "{")):
                value = [x.strip() for x in text.split(",") if x.strip()]  # languages=en,fr
        if isinstance(value, want):
            return value
        raise bad(label)
    raise ConfigError(f"parameter {name} has type {ptype}, which cannot be set from a run's parameters", "leave it out")


def check_parameters(pipeline: str, inputs: dict[str, dict], values: dict, require: bool = True) -> dict:
    """Check ``values`` against the root inputs of ``pipeline`` and convert them to the declared
    types (text from ``--param`` is parsed; a list/mapping for a STRING parameter becomes its JSON).
    Unknown names and missing required ones fail here, before anything is posted."""
    unknown = sorted(set(values) - set(inputs))
    if unknown:
        raise ConfigError(
            f"pipeline {pipeline} has no parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}",
            f"its parameters: {', '.join(sorted(inputs)) or '(none)'}",
        )
    out = {k: _coerce(k, v, inputs[k]["type"]) for k, v in values.items()}
    if require:
        missing = sorted(n for n, d in inputs.items() if not d["optional"] and n not in out)
        if missing:
            raise ConfigError(f"pipeline {pipeline} needs parameter{'s' if len(missing) > 1 else ''} {', '.join(missing)}",
                              "pass " + " ".join(f"--param {m}=..." for m in missing))
    return out


def gather_parameters(flags: list[str] | None, params_file: str | None) -> dict:
    """Values from a parameters file, then ``--param`` flags (flags win)."""
    values = load_params_file(params_file) if params_file else {}
    values.update(parse_param_flags(flags))
    return values

