"""Elyra surface: the catalog entry of each transform, the one-step stage entrypoint it runs, and the
nodes and document of a ``.pipeline`` file (:mod:`prepline.elyra_pipeline` builds the templates and
writes the whole generated tree, ``elyra_templates/``).

Elyra's Kubeflow Pipelines connector reads components in the KFP **v1** ``component.yaml`` format.
Each catalog entry runs one transform as a whole stage in a single container step
(:func:`run_stage`: prepare → start a Ray cluster → run the transform as a Ray job → stop the
cluster in ``finally``), reusing :mod:`prepline.stages`. Its inputs are the transform's config
parameters, one per field (str/int/float as String/Integer/Float; bool and list[str] as JSON in a
String, because Elyra's Boolean/JSON inputs do not survive export), plus the stage inputs shared
with the compiled KFP pipelines (input_path, work_root, provider, provider_json, cluster_json ...).

Node ``op`` ids in a ``.pipeline`` file are ``local-directory-catalog:<sha256(file name)[:12]>``:
the templates work when ``elyra_templates/components`` is registered as a *directory* catalog.

Credentials: Elyra 4.1.1 gives custom nodes neither Kubernetes secrets nor environment variables
(``applies_to_custom = False``), only "Data Volumes" (PVC mounts). The templates mount the claim
``prepline-s3-credentials`` (made and filled from the secret by ``deploy/elyra``) at
``/etc/prepline/s3`` on every node, and the step reads it (:mod:`prepline.s3_credentials`); the Ray
pods get the secret itself (``s3_secret_name``), as in the compiled pipelines.

    python -m prepline.elyra run doc_id --input-path data/in --work-root data/work --run-id r1 ...
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import logging
import sys
import uuid
from pathlib import Path
from typing import Any

from prepline import logs, registry, s3_credentials, stage_params, stages
from prepline.errors import ConfigError, PreplineError, exit_code
from prepline.images import DEFAULT as DEFAULT_IMAGES
from prepline.images import ImageSet

log = logging.getLogger("prepline")

#: where the catalog lives inside elyra_templates/ (register this folder as a directory catalog)
CATALOG_SUBDIR = "components"
CATALOG_TYPE = "local-directory-catalog"
CATALOG_CATEGORY = "prepline"
#: the KFP placeholder for the run's id, resolved by the KFP driver (as in the compiled pipelines)
RUN_ID_PLACEHOLDER = "{{$.pipeline_job_uuid}}"
PIPELINE_VERSION = 8  # Elyra 4.x pipeline (app_data) version
_NS = uuid.UUID("0f3c2f9e-58a4-4a53-9a7c-7e7f1b3a1e10")  # for stable node/link ids

# The stage inputs every component has besides the transform's own parameters, from the table the
# compiled pipelines use (prepline.stage_params): (name, KFP type, default, pipeline-parameter?, description).
# Differences: run_id defaults to KFP's run uuid (one step per stage here), booleans are JSON in a String.
_KFP_TYPE = {str: "String", int: "Integer", float: "Float", bool: "String", list: "String"}
_STAGE_NAMES = ["input_path", "work_root", "run_id", "branch", "input_stage", "input_from_split", "provider", "provider_json",
                "cluster_json", "max_failed_files", "timeout_seconds", "start_timeout_seconds", "s3_secret_name", "ray_image",
                "s3_credentials", "from_plan"]
#: Elyra 4.1.1 renders pipeline-parameter defaults into Python source between double quotes, unescaped:
#: provider_json's default is "{}" here (the kuberay provider then uses its in-cluster default server)
_STAGE_DEFAULTS = {"run_id": RUN_ID_PLACEHOLDER, "input_from_split": "false", "s3_credentials": s3_credentials.DEFAULT_PATH,
                   "provider_json": "{}", "from_plan": "false"}
_STAGE_HELP = {
    "run_id": "Run id shared by the stages of one run (paths and cluster names derive from it); the default is KFP's run uuid.",
    "input_from_split": "JSON true/false. " + stage_params.PARAMS["input_from_split"].help,
    "from_plan": "JSON true/false. " + stage_params.PARAMS["from_plan"].help + " The super template's nodes set it: their own "
                 "transform values are then not used (change a stage through overrides_json).",
    "s3_credentials": "Folder or file of S3 credentials mounted into the step (Elyra gives custom nodes no secrets: mount the "
                      "claim prepline-s3-credentials of deploy/elyra under Data Volumes); absent = the environment's.",
    "s3_secret_name": "Kubernetes secret whose keys (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, PREPLINE_S3_ENDPOINT) the Ray head "
                      "and workers get, unless cluster_json sets env_from_secrets ('' = none).",
}
#: pipeline parameters of the templates (shared by every node)
_PIPELINE_PARAMS = set(stage_params.SUPER) | {"s3_credentials"}
#: where the templates mount the credentials claim (Elyra "Data Volumes" apply to custom nodes)
CREDENTIALS_CLAIM = "prepline-s3-credentials"


def stage_inputs(images: ImageSet = DEFAULT_IMAGES) -> list[tuple[str, str, Any, bool, str]]:
    """(name, KFP type, default, pipeline parameter?, description) of the inputs every stage component
    has besides the transform's own; ``default`` is None for a required input."""
    out = []
    for n in _STAGE_NAMES:
        p = stage_params.PARAMS.get(n)
        default = _STAGE_DEFAULTS.get(n, stage_params.image_defaults(images).get(n, p.default if p else ""))
        out.append((n, _KFP_TYPE[p.type] if p else "String", None if default is stage_params.REQUIRED else default,
                    n in _PIPELINE_PARAMS, _STAGE_HELP.get(n, p.help if p else "")))
    return out


STAGE_INPUTS = stage_inputs()
#: outputs (no name may contain 'output_': Elyra prefixes outputs with it and strips it when linking)
STAGE_OUTPUTS = [
    ("stage_dir", "String", "Folder or URI the stage wrote (its metadata.json is there)."),
    ("docs_written", "Integer", "Number of documents the stage wrote."),
]


# ----------------------------------------------------------------------------------------------
# the entrypoint the components run


def run_stage(
    transform: str,
    params: dict[str, Any],
    *,
    input_path: str = "",
    work_root: str,
    run_id: str,
    branch: str = "",
    input_stage: str = "",
    input_from_split: bool = False,
    provider: str = "local",
    provider_json: str = "{}",
    cluster_json: str = "{}",
    max_failed_files: int = 0,
    timeout_seconds: float = 86400,
    start_timeout_seconds: float = 900,
    s3_secret_name: str = "",
    ray_image: str = "",
    from_plan: bool = False,
    poll: float = 1.0,
    out=sys.stdout,
) -> dict:
    """One whole stage in one step: prepare (a bad parameter fails here, before any cluster) →
    start the stage's Ray cluster → run the transform as a Ray job and check its metadata.json →
    stop the cluster in ``finally``. A failure to stop fails the step, unless the stage had already
    failed (then its own error is raised and the stop failure is logged). Returns the checked
    metadata with ``output_path`` (with ``from_plan``, a stage the run's plan does not run for this
    branch returns ``{"skipped": reason}`` at once)."""
    if not run_id or "{{" in run_id:
        raise ConfigError(f"run_id {run_id!r} is empty or an unresolved placeholder",
                          "run the step under KFP (which resolves {{$.pipeline_job_uuid}}) or pass --run-id")
    stage = transform
    plan = stages.prepare(transform, json.dumps(params), work_root, run_id, stage, branch, input_path, input_stage,
                          input_from_split, cluster_json, from_plan=from_plan)
    if not plan["run"]:
        print(stages.skipped_markdown(plan), file=out, flush=True)
        return {"skipped": plan["reason"], "output_path": "", "totals": {"docs_out": 0}}
    common = dict(provider=provider, provider_json=provider_json, cluster_json=plan["cluster_json"], run_id=run_id, stage=stage,
                  branch=branch)
    ok = False
    try:
        stages.start(**common, timeout=start_timeout_seconds, image=ray_image, s3_secret_name=s3_secret_name)
        meta = stages.execute(**common, transform=transform, config_json=plan["config_json"], input_path=plan["input_path"],
                              output_path=plan["output_path"], workers=plan["workers"], max_failed_files=max_failed_files,
                              timeout=timeout_seconds, poll=poll, out=out, allow_empty_output=plan.get("allow_empty_output", False))
        ok = True
    finally:
        try:
            stages.stop(**common)
        except Exception as e:  # noqa: BLE001 - reported below
            if ok:
                raise
            log.error("%s: stopping cluster %s also failed: %s", stage, plan["cluster_name"], e)
    print(stages.summary_markdown(meta, stage + (f" ({branch})" if branch else "")), file=out, flush=True)
    return {**meta, "output_path": plan["output_path"]}


def _parse_list(name: str, text: str) -> list[str]:
    """A list parameter from the String input: JSON, or the single-quoted form Elyra's editor
    shows for catalog defaults (it turns " into '), or '' for an empty list."""
    s = text.strip()
    if not s:
        return []
    for parse in (json.loads, ast.literal_eval):
        try:
            v = parse(s)
        except (ValueError, SyntaxError):
            continue
        if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
            return list(v)
        break
    raise ConfigError(f"parameter {name}={text!r} is not a JSON list of strings", f'pass e.g. ["a", "b"] for {name}')


def _parse_bool(name: str, text: str) -> bool:
    s = text.strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no", ""):
        return False
    raise ConfigError(f"parameter {name}={text!r} is not a boolean", f"pass true or false for {name}")


def typed_params(transform: str, raw: dict[str, str]) -> dict[str, Any]:
    """The transform's parameters from the component's string arguments (types from its config)."""
    infos = {p.name: p for p in registry.get(transform).Config.params()}
    unknown = sorted(set(raw) - set(infos))
    if unknown:
        raise ConfigError(f"unknown parameter(s) {', '.join(unknown)} for {transform}",
                          f"valid parameters: {', '.join(sorted(infos))}")
    out: dict[str, Any] = {}
    for k, v in raw.items():
        t = infos[k].type
        out[k] = _parse_list(k, v) if t is list else _parse_bool(k, v) if t is bool else v
    return out


def _cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m prepline.elyra", description="Run one prepline stage (Elyra component entrypoint).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="prepare → start cluster → run transform → stop cluster (always)")
    r.add_argument("transform")
    for name, kfp_type, default, _, help_ in STAGE_INPUTS:
        r.add_argument("--" + name.replace("_", "-"), dest=name, default="" if default is None else str(default), help=help_)
    r.add_argument("--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"), help="a transform parameter")
    r.add_argument("--stage-dir-file", default="", help="write the output folder here (KFP output)")
    r.add_argument("--docs-written-file", default="", help="write the documents written here (KFP output)")
    a = ap.parse_args(argv)
    logs.setup()
    try:
        s3_credentials.apply(a.s3_credentials if a.s3_credentials != s3_credentials.DEFAULT_PATH else None)
        params = typed_params(a.transform, dict(a.param))
        ints = {}
        for k in ("max_failed_files", "timeout_seconds", "start_timeout_seconds"):
            try:
                ints[k] = int(float(getattr(a, k)))
            except ValueError:
                raise ConfigError(f"{k}={getattr(a, k)!r} is not an integer", f"pass an integer {k}") from None
        meta = run_stage(
            a.transform, params, input_path=a.input_path, work_root=a.work_root, run_id=a.run_id, branch=a.branch,
            input_stage=a.input_stage, input_from_split=_parse_bool("input_from_split", a.input_from_split),
            provider=a.provider, provider_json=a.provider_json, cluster_json=a.cluster_json, s3_secret_name=a.s3_secret_name,
            ray_image=a.ray_image, from_plan=_parse_bool("from_plan", a.from_plan), **ints,
        )
    except PreplineError as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_code(e)
    for path, value in ((a.stage_dir_file, meta["output_path"]), (a.docs_written_file, str(int(meta["totals"]["docs_out"])))):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(value)
    return 0


# ----------------------------------------------------------------------------------------------
# the catalog


def component_file(transform: str) -> str:
    return f"{transform}.yaml"


def component_id(transform: str) -> str:
    """Elyra's id of a directory-catalog entry: the catalog type and a hash of its relative path."""
    return f"{CATALOG_TYPE}:{hashlib.sha256(component_file(transform).encode()).hexdigest()[:12]}"


def _kfp_default(p) -> str:
    """A parameter's default as the component YAML's (string) default."""
    if p.type is list:
        return json.dumps(list(p.default))
    if p.type is bool:
        return json.dumps(bool(p.default))
    if p.type is float:
        return repr(float(p.default))
    return str(p.default)


def _param_description(p) -> str:
    d = p.help.rstrip(".") + "."
    if p.choices:
        d += f" One of: {', '.join(map(str, p.choices))}."
    if p.type is list:
        d += ' A JSON list of strings, e.g. ["a", "b"].'
    elif p.type is bool:
        d += " JSON true or false."
    return d


def component_spec(transform: str, images: ImageSet = DEFAULT_IMAGES) -> dict:
    """The KFP v1 component.yaml of one transform's one-step stage."""
    cls = registry.get(transform)
    tparams = cls.Config.params()
    clash = sorted({p.name for p in tparams} & ({n for n, *_ in STAGE_INPUTS} | {n for n, *_ in STAGE_OUTPUTS}))
    if clash:
        raise ValueError(f"{transform}: parameter(s) {', '.join(clash)} clash with the stage inputs of the Elyra component")
    inputs = [{"name": p.name, "type": _KFP_TYPE[p.type], "description": _param_description(p), "default": _kfp_default(p),
               "optional": True} for p in tparams]
    inputs += [{"name": n, "type": t, "description": d, **({} if v is None else {"default": str(v), "optional": True})}
               for n, t, v, _, d in stage_inputs(images)]
    args: list[Any] = ["run", transform]
    for n, *_ in STAGE_INPUTS:
        args += ["--" + n.replace("_", "-"), {"inputValue": n}]
    for p in tparams:
        args += ["--param", p.name, {"inputValue": p.name}]
    args += ["--stage-dir-file", {"outputPath": "stage_dir"}, "--docs-written-file", {"outputPath": "docs_written"}]
    return {
        "name": f"prepline {transform}",
        "description": (
            f"{cls.summary}. One step runs the whole stage: validate the parameters, start a Ray cluster, run "
            f"{transform} as a Ray job (checking its metadata.json), and always stop the cluster. Parameters of type "
            f"String marked JSON take JSON text. Generated from the prepline registry: do not edit."
        ),
        "inputs": inputs,
        "outputs": [{"name": n, "type": t, "description": d} for n, t, d in STAGE_OUTPUTS],
        "implementation": {"container": {"image": images.launcher, "command": ["python", "-m", "prepline.elyra"], "args": args}},
    }


def _yaml(obj: Any) -> str:
    import yaml

    return yaml.safe_dump(obj, sort_keys=False, width=120, allow_unicode=True)


# ----------------------------------------------------------------------------------------------
# the .pipeline templates (pipeline-flow v3 JSON)


def _id(*parts: str) -> str:
    return str(uuid.uuid5(_NS, "/".join(parts)))


def _node_value(kfp_type: str, value: Any) -> dict:
    if kfp_type == "String":
        return {"widget": "string", "value": value}
    return {"widget": "number", "value": value}


def _stage_values(transform: str, overrides: dict) -> dict[str, Any]:
    """A node's transform parameters: the defaults with the pipeline's overrides, in the
    component's value representation (JSON text for lists and booleans)."""
    vals = {}
    for p in registry.get(transform).Config.params():
        v = overrides.get(p.name, list(p.default) if p.type is list else p.default)
        vals[p.name] = json.dumps(v) if p.type in (list, bool) else v
    return vals


def stage_node(template: str, transform: str, label: str, pos: tuple[int, int], parents: list[str] | str | None, node_inputs: dict,
          overrides: dict) -> dict:
    values = _stage_values(transform, overrides)
    params: dict[str, dict] = {p.name: _node_value(_KFP_TYPE[p.type], values[p.name]) for p in registry.get(transform).Config.params()}
    params.update(_inputs_values(STAGE_INPUTS, node_inputs))
    for name, *_ in STAGE_OUTPUTS:
        params[f"output_{name}"] = ""
    return raw_node(template, component_id(transform), label, pos, parents, params, f"prepline {transform}: {registry.get(transform).summary}")


def _inputs_values(inputs, node_inputs: dict) -> dict[str, dict]:
    """A node's values of ``inputs`` (name, KFP type, default, pipeline parameter?, help): pipeline
    parameters by reference, the rest from ``node_inputs`` or the default."""
    return {name: {"widget": "parameter", "value": name} if is_pp else _node_value(kfp_type, node_inputs.get(name, default))
            for name, kfp_type, default, is_pp, _ in inputs}


def raw_node(template: str, op: str, label: str, pos: tuple[int, int], parents: list[str] | str | None, params: dict,
             description: str) -> dict:
    """One execution node of a template: catalog entry ``op``, its parameters, links from ``parents``."""
    parents = [parents] if isinstance(parents, str) else list(parents or [])
    port_ui = {"cardinality": {"min": 0, "max": -1}}
    inport: dict = {"id": "inPort", "app_data": {"ui_data": {**port_ui, "label": "Input Port"}}}
    if parents:
        inport["links"] = [{"id": _id(template, "link", label, *([p] if i else [])), "node_id_ref": p, "port_id_ref": "outPort"}
                           for i, p in enumerate(parents)]
    return {
        "id": _id(template, label),
        "type": "execution_node",
        "op": op,
        "app_data": {
            "component_parameters": params,
            "label": label,
            "ui_data": {"label": label, "x_pos": pos[0], "y_pos": pos[1], "description": description},
        },
        "inputs": [inport],
        "outputs": [{"id": "outPort", "app_data": {"ui_data": {**port_ui, "label": "Output Port"}}}],
    }


def _pipeline_parameters(inputs) -> list[dict]:
    out, seen = [], set()
    for n, t, v, is_pp, d in inputs:
        if is_pp and n not in seen:
            seen.add(n)
            out.append({"name": n, "description": d, "default_value": {"type": t, "value": "" if v is None else v}, "required": v is None})
    return out


def document(template: str, name: str, description: str, nodes: list[dict], images: ImageSet, inputs=None) -> dict:
    """A pipeline-flow v3 document of ``nodes``; its pipeline parameters from ``inputs`` (default: the stage inputs)."""
    pid = _id(template, "pipeline")
    return {
        "doc_type": "pipeline",
        "version": "3.0",
        "json_schema": "http://api.dataplatform.ibm.com/schemas/common-pipeline/pipeline-flow/pipeline-flow-v3-schema.json",
        "id": _id(template, "document"),
        "primary_pipeline": pid,
        "pipelines": [{
            "id": pid,
            "nodes": nodes,
            "app_data": {
                "ui_data": {"comments": []},
                "version": PIPELINE_VERSION,
                "runtime_type": "KUBEFLOW_PIPELINES",
                "properties": {
                    "name": name,
                    "runtime": "Kubeflow Pipelines",
                    "description": description,
                    "pipeline_defaults": {
                        "disable_node_caching": "True",
                        "mounted_volumes": [{"path": s3_credentials.DEFAULT_PATH, "pvc_name": CREDENTIALS_CLAIM, "read_only": True}],
                    },
                    "pipeline_parameters": _pipeline_parameters(stage_inputs(images) if inputs is None else inputs),
                },
            },
            "runtime_ref": "",
        }],
        "schemas": [],
    }


if __name__ == "__main__":
    sys.exit(_cli())
