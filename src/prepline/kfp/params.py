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



# -- secret names -------------------------------------------------------------------------------------
_SECRET_NAME = __import__("re").compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def secret_name_sources(spec) -> dict[str, set]:
    """Where every secret name of the pipeline's pods comes from: ``{executor: {("root", param) |
    ("constant", value) | ("other", what)}}``, following ``secretNameParameter`` (secretAsEnv,
    secretAsVolume, imagePullSecret of the kubernetes platform spec) through the nested DAGs up to
    the root inputs. The KFP driver copies a resolved name as it is into the pod (kubeflow/pipelines
    ``backend/src/v2/driver/k8s.go``: only a null parameter is skipped), and Kubernetes rejects an
    empty or malformed secret name even when the reference is optional
    (``pkg/apis/core/validation``): every source must be a valid name."""
    docs = spec_docs(spec)
    if len(docs) < 2:
        return {}
    pipeline = docs[0]
    executors = ((((docs[1].get("platforms") or {}).get("kubernetes") or {}).get("deploymentSpec") or {}).get("executors")) or {}
    components = pipeline.get("components") or {}
    dags = {name: (c.get("dag") or {}).get("tasks") or {} for name, c in components.items() if c.get("dag")}
    dags[None] = (pipeline.get("root") or {}).get("dag", {}).get("tasks") or {}

    def trace(component: str | None, param: str, seen: frozenset) -> set:
        if component is None:
            return {("root", param)}
        if (component, param) in seen:
            return {("other", f"cycle at {component}.{param}")}
        out: set = set()
        users = [(parent, t) for parent, tasks in dags.items() for t in tasks.values() if (t.get("componentRef") or {}).get("name") == component]
        for parent, t in users:
            src = ((t.get("inputs") or {}).get("parameters") or {}).get(param)
            if src is None:
                out.add(("other", f"{component}.{param} is not set by its task"))
            elif "componentInputParameter" in src:
                out |= trace(parent, src["componentInputParameter"], seen | {(component, param)})
            elif "runtimeValue" in src:
                out.add(("constant", str(((src["runtimeValue"] or {}).get("constant")))))
            else:
                out.add(("other", f"{component}.{param} comes from {sorted(src)}"))
        return out or {("other", f"component {component} is used by no task")}

    result: dict[str, set] = {}
    for label, cfg in executors.items():
        comp = next((n for n, c in components.items() if c.get("executorLabel") == label), None)
        # the name is an input of the DAG that holds the task (the driver resolves it among the task's inputs from there)
        parents = [parent for parent, tasks in dags.items() for t in tasks.values() if (t.get("componentRef") or {}).get("name") == comp]
        refs = [s for key in ("secretAsEnv", "secretAsVolume", "imagePullSecret") for s in cfg.get(key) or []]
        for ref in refs:
            p = ref.get("secretNameParameter")
            if p is None:
                result.setdefault(label, set()).add(("constant", str(ref.get("secretName") or "")))
            elif "componentInputParameter" in p:
                if not parents:
                    result.setdefault(label, set()).add(("other", f"{label}: no task runs it"))
                for parent in parents:
                    result.setdefault(label, set()).update(trace(parent, p["componentInputParameter"], frozenset()))
            elif "runtimeValue" in p:
                result.setdefault(label, set()).add(("constant", str((p["runtimeValue"] or {}).get("constant"))))
            else:
                result.setdefault(label, set()).add(("other", f"{label}: secret name from {sorted(p)}"))
    return result


def secret_name_parameters(spec) -> set[str]:
    """The root parameters that name a Kubernetes secret of some pod."""
    return {v for srcs in secret_name_sources(spec).values() for k, v in srcs if k == "root"}


def check_secret_names(pipeline: str, spec, params: dict) -> None:
    """Refuse a run whose pods would get an empty or invalid secret name (the pod would never be
    created: the driver copies the name as it is, Kubernetes refuses it even when optional)."""
    inputs = root_inputs(spec)
    for name in sorted(secret_name_parameters(spec)):
        value = params[name] if name in params else (inputs.get(name) or {}).get("default")
        if not isinstance(value, str) or len(value) > 253 or not _SECRET_NAME.match(value):
            raise ConfigError(f"pipeline {pipeline}: {name}={value!r} is not a Kubernetes secret name: every step's pod would be "
                              "rejected (the KFP driver puts it into secretKeyRef.name as it is, and Kubernetes refuses an empty "
                              "or malformed name even for an optional secret)",
                              f"pass the name of the secret (e.g. --param {name}=prepline-s3); the secret is optional, so to run "
                              f"without one name a secret that does not exist, e.g. --param {name}=no-such-secret")
