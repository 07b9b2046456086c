"""The preflight of a pipeline run: what can be checked before a sample is built, a cluster starts
or a run is posted to KFP, in this order, each failure one error and one fix naming the pipeline
parameter to set (never an internal name such as a transform's ``content_column``):

1. the pipeline: a transform's simple pipeline, the shipped super pipeline (or its chained form)
   or a pipeline spec file (:func:`resolve`);
2. its parameters: names, types (:func:`check_values`), overrides_json naming real stages with
   valid parameters, a simple pipeline's params_json;
3. the input (:func:`check_input`): that it exists, its format, and its text column or field, from
   the first file's schema or first records only (never the whole input); for a spec pipeline the
   whole plan is made (every stage's parameters per branch, merged and checked) without writing it.

No kfp import here: a preflight that fails ends in about a second.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prepline.errors import ConfigError, InputError

#: JSONL records a preflight reads to find the text field
PROBE_RECORDS = 100


@dataclass(frozen=True)
class Target:
    """A pipeline to run: its name, kind ('stage', 'spec' or 'chained') and spec (None for a stage);
    ``compiled``: the compiled KFP YAML it was given as (None: built from prepline's own code)."""

    name: str
    kind: str
    spec: Any = None
    compiled: str | None = None

    def params(self) -> list[str]:
        """The pipeline's parameters, as its compiled interface has them."""
        from prepline import stage_params as sp

        if self.kind == "stage":
            return list(sp.STAGE)
        names = [p for p in sp.SUPER if self.spec.train or p not in sp.TRAIN]
        return names + ([p for p in sp.CHAINED if p not in sp.SUPER] if self.kind == "chained" else [])


def is_spec_file(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or Path(name).is_file()


def compiled_docs(path: str) -> list[dict] | None:
    """The YAML documents of ``path`` when it is a compiled KFP pipeline (the compiler's output, as
    under compiled/pipelines: ``pipelineInfo`` and ``deploymentSpec``); None for anything else."""
    import yaml

    p = Path(path)
    if not p.is_file():
        return None
    try:
        docs = [d for d in yaml.safe_load_all(p.read_text(encoding="utf-8")) if d is not None]
    except (yaml.YAMLError, UnicodeDecodeError):
        return None
    if docs and isinstance(docs[0], dict) and "pipelineInfo" in docs[0] and "deploymentSpec" in docs[0]:
        return docs
    return None


def resolve(name: str) -> Target:
    """The pipeline ``name`` stands for; an unknown name fails naming the close ones."""
    from prepline import registry
    from prepline.pipelines import spec as specs

    if is_spec_file(name):
        docs = compiled_docs(name)
        if docs is not None:
            t = kfp_target(docs)
            if t is None:
                raise ConfigError(f"{name} is a compiled KFP pipeline but not one of prepline's (no plan step, no transform's name)",
                                  "run it with kfp (prepline kfp run), or give the pipeline spec it was compiled from")
            return Target(t.name, t.kind, t.spec, compiled=name)
        spec = specs.load(Path(name))
        return Target(spec.name, "spec", spec)
    known = {n: Target(n, "stage") for n in registry.names()}
    for shipped in map(specs.shipped, specs.shipped_names()):
        known[shipped.name] = Target(shipped.name, "spec", shipped)
        known[f"{shipped.name}_chained"] = Target(f"{shipped.name}_chained", "chained", shipped)
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1)
        raise ConfigError(f"unknown pipeline '{name}'" + (f" (did you mean '{close[0]}'?)" if close else ""),
                          f"one of: {', '.join(sorted(known))}; or a pipeline spec file (.yaml)")
    return known[name]


def _example(name: str, t: type) -> str:
    if t is list:
        return f"--param {name}=en,fr (or --param '{name}=[\"en\", \"fr\"]')"
    if t is bool:
        return f"--param {name}=true"
    if t is int:
        return f"--param {name}=2"
    if name.endswith("_json"):
        return f"--param '{name}={{...}}' (a JSON object)"
    return f"--param {name}=VALUE"


def check_values(target: Target, values: dict[str, Any]) -> None:
    """Every value names a parameter of the pipeline and has its type; overrides_json names real
    stages with valid parameters; a simple pipeline's params_json makes a valid transform config."""
    from prepline.stage_params import PARAMS, check_overrides

    names = target.params()
    unknown = sorted(set(values) - set(names))
    if unknown:
        close = [c for u in unknown for c in difflib.get_close_matches(u, names, n=1)]
        raise ConfigError(f"pipeline {target.name} has no parameter {', '.join(unknown)}" + (f" (did you mean {', '.join(close)}?)" if close else ""),
                          f"its parameters: {', '.join(names)}")
    for k, v in values.items():
        t = PARAMS[k].type
        ok = {str: isinstance(v, str) or (k.endswith("_json") and isinstance(v, (dict, list))),
              int: isinstance(v, int) and not isinstance(v, bool), bool: isinstance(v, bool), list: isinstance(v, list)}[t]
        if not ok:
            what = {str: "a string", int: "a whole number", bool: "true or false", list: "a list"}[t]
            raise ConfigError(f"pipeline {target.name}: parameter {k}={v!r} is not {what}", f"pass {k} as {what}, e.g. {_example(k, t)}")
    overrides = _as_json(values.get("overrides_json", ""))
    check_overrides(overrides)
    if target.kind == "stage":
        from prepline import registry

        text = _as_json(values.get("params_json", ""))
        try:
            params = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as e:
            raise ConfigError(f"params_json is not valid JSON ({e.msg} at char {e.pos}): {text[:200]!r}",
                              'e.g. --param \'params_json={"content_column": "text"}\'') from None
        if not isinstance(params, dict):
            raise ConfigError(f"params_json must be a JSON object, got {type(params).__name__}", 'e.g. --param \'params_json={"content_column": "text"}\'')
        from prepline.stages import stage_overrides

        params = {**params, **stage_overrides(overrides, target.name)[0]}
        try:
            registry.get(target.name).Config.from_params(params)
        except ConfigError as e:
            raise ConfigError(f"{target.name}: {e.message}",
                              f"{e.fix}; this pipeline takes the transform's parameters in params_json, e.g. "
                              f"--param 'params_json={{\"<parameter>\": <value>}}' (its parameters: prepline describe {target.name})") from None


def _as_json(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def check_input(target: Target, input_path: str, values: dict[str, Any], work_root: str = "preflight") -> dict | None:
    """The input exists, has a format the pipeline reads and the text column or field it is told;
    for a spec pipeline, the whole plan is made (not written) and returned."""
    if target.kind == "stage":
        _check_stage_input(target.name, input_path, values)
        return None
    from prepline.pipelines.plan import make_plan
    from prepline.stage_params import PARAMS

    def get(k):
        return values.get(k, "" if PARAMS[k].type is str else None)

    plan = make_plan(target.spec, input_path=input_path, work_root=values.get("work_root") or work_root, run_id="preflight",
                     languages=get("languages"), text_column=get("text_column"), input_format=get("input_format"),
                     overrides=json.loads(_as_json(values.get("overrides_json") or "{}")),
                     cluster=json.loads(_as_json(values.get("cluster_json") or "{}")), text_field=get("text_field"))
    check_plan_input(plan)
    return plan


def check_plan_input(plan: dict) -> None:
    """The plan's input has the text column (Parquet) or field (JSONL, CSV, HF shards) the plan
    names, from its first file: the plan step calls it too, so that a run started in the KFP UI
    fails there, naming the pipeline's parameter, before any cluster starts."""
    from prepline.pipelines.plan import entry

    fmt, input_path = plan["input"]["format"], plan["input"]["path"]
    if fmt == "parquet":
        _check_parquet_column(input_path, plan["text_column"], "text_column")
    elif plan["input"]["ingest"] and fmt in ("jsonl", "csv", "hf", "mixed"):
        _check_text_field(input_path, entry(plan, "ingest")["params"].get("text_field", "text"),
                          lambda g: f"set the pipeline's text_field to the field holding the text: --param text_field={g}")


# ----------------------------------------------------------------------------------------------
# the input's first file


def _first(input_path: str, suffixes: tuple[str, ...], strict: bool = False):
    """(location, first non-empty data file with one of ``suffixes``) of a folder or file, or
    (None, None) when there is none; an InputError when the input does not exist (and, ``strict``,
    when it holds no such file: the engine's own message)."""
    from prepline.data_access import FileInfo, open_location
    from prepline.engine import list_input

    loc = open_location(input_path)
    size = loc.file_size()
    if size is not None:
        parent, name = loc.parent_and_name()
        if not name.endswith(suffixes):
            if strict:
                raise InputError(f"input file {loc.uri} is not a {'/'.join(suffixes)} file",
                                 "pass a folder or file the pipeline reads (other formats: the super pipeline ingests them first)")
            return None, None
        return parent, FileInfo(name, size)
    if not loc.exists():
        raise InputError(f"input {loc.uri} does not exist", "pass --input (the pipeline's input_path): a folder, file or s3:// URI that exists")
    files = list_input(loc, suffixes) if strict else loc.list_files(suffixes)
    files = [f for f in files if f.size > 0 and not any(p.startswith(("_", ".")) for p in f.rel.split("/"))]
    return (loc, files[0]) if files else (None, None)


def _guess(names: list[str]) -> str:
    from prepline.transforms.ingest import TEXT_NAMES

    return next((n for n in TEXT_NAMES if n in names), names[0] if names else "NAME")


def _check_parquet_column(input_path: str, column: str, param: str) -> None:
    loc, f = _first(input_path, (".parquet",))
    if f is None:
        return
    schema = _parquet_schema(loc, f)
    names = schema.names if schema is not None else [column]
    if column not in names:
        raise InputError(f"input {loc.path(f.rel)} has no column '{column}' (columns: {', '.join(names)})",
                         f"set the pipeline's {param} to the column holding the text: --param {param}={_guess(names)}")


def _parquet_schema(loc, f):
    """The first file's schema; None when it cannot be read (the run reports that file by name, and
    --max-failed-files may tolerate it)."""
    import pyarrow as pa

    try:
        return loc.parquet_file(f.rel, f.size).schema_arrow
    except (pa.ArrowInvalid, OSError):
        return None


def _check_text_field(input_path: str, field: str, fix_for) -> None:
    """JSONL: the field in one of the first records; CSV: in the header; dataset shards: in the schema."""
    from prepline.transforms.ingest import CSV, JSONL, SHARDS, likely_text_field

    loc, f = _first(input_path, JSONL + CSV + SHARDS)
    if f is None:
        return
    where = loc.path(f.rel)
    if f.rel.endswith(SHARDS):
        schema = _shard_schema(loc, f)
        if schema is None:
            return
        names = schema.names
        if field not in names:
            raise InputError(f"input {where} has no column '{field}' (columns: {', '.join(names)})", fix_for(_guess(names)))
        return
    if f.rel.endswith(CSV):
        header = _csv_header(loc, f)
        if header is not None and field not in header:
            raise InputError(f"input {where} has no column '{field}' in its header ({', '.join(header) or 'empty'})", fix_for(_guess(header)))
        return
    seen: dict = {}
    n = 0
    for rec in _jsonl_records(loc, f):
        if field in rec:
            return
        n += 1
        for k, v in rec.items():
            seen.setdefault(k, v)
    if n:
        raise InputError(f"input {where}: none of its first {n:,} records has the field '{field}' (fields: {', '.join(sorted(seen)[:30])})",
                         fix_for(likely_text_field(seen) or "NAME"))


def _open_text(loc, f):
    from prepline.transforms.ingest import _decompressed

    return _decompressed(f.rel, loc.open_input(f.rel, f.size))


def _jsonl_records(loc, f):
    import itertools

    stream = _open_text(loc, f)
    try:
        got = 0
        for line in itertools.islice(stream, PROBE_RECORDS * 4):
            try:
                rec = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(rec, dict):
                yield rec
                got += 1
                if got >= PROBE_RECORDS:
                    return
    except (OSError, EOFError):
        return  # a broken file: the run reports it by name (and --max-failed-files may tolerate it)
    finally:
        stream.close()


def _csv_header(loc, f) -> list[str] | None:
    import csv
    import io

    stream = io.TextIOWrapper(_open_text(loc, f), encoding="utf-8", newline="", errors="replace")
    try:
        row = next(csv.reader(stream, delimiter="\t" if ".tsv" in f.rel else ","), [])
    except (OSError, EOFError, csv.Error):
        return None  # a broken file: the run reports it by name
    finally:
        stream.close()
    return row


def _shard_schema(loc, f):
    import pyarrow as pa
    from pyarrow import ipc

    if f.rel.endswith(".parquet"):
        return _parquet_schema(loc, f)
    stream = loc.open_input(f.rel, f.size)
    try:
        try:
            return ipc.open_stream(stream).schema
        except pa.ArrowInvalid:
            stream.seek(0)
            return ipc.open_file(stream).schema
    except (pa.ArrowInvalid, OSError):
        return None  # the run reports the file by name (ingest's own error)
    finally:
        stream.close()


def _check_stage_input(transform: str, input_path: str, values: dict[str, Any]) -> None:
    """A simple pipeline's input: the transform's files, the columns it reads (its parameters from
    params_json and overrides_json)."""
    from prepline import registry
    from prepline.stages import stage_overrides

    params = {**json.loads(_as_json(values.get("params_json") or "{}")),
              **stage_overrides(_as_json(values.get("overrides_json") or "{}"), transform)[0]}
    t = registry.build(transform, params)
    if transform == "ingest":
        _first(input_path, t.input_suffixes, strict=True)
        _check_text_field(input_path, t.config.text_field,
                          lambda g: f"set text_field in the pipeline's params_json: --param 'params_json={{\"text_field\": \"{g}\"}}'")
        return
    loc, f = _first(input_path, t.input_suffixes, strict=True)
    if f is None or not f.rel.endswith(".parquet"):
        return
    schema = _parquet_schema(loc, f)
    if schema is None:
        return
    try:
        t.check_schema(schema, loc.path(f.rel))
    except InputError as e:
        raise InputError(e.message, f"{e.fix} (this pipeline: in its params_json, e.g. --param 'params_json={{\"content_column\": \"text\"}}')") from None


# ----------------------------------------------------------------------------------------------
# before a run is posted to KFP


def kfp_target(docs: list[dict]) -> Target | None:
    """The prepline pipeline a compiled pipeline spec is: a spec pipeline (its plan step holds the
    spec), a transform's simple pipeline (by its name), or None (not one of prepline's)."""
    from prepline import registry
    from prepline.pipelines import spec as specs

    if not docs or not isinstance(docs[0], dict):
        return None
    root = docs[0].get("root") or {}
    tasks = (root.get("dag") or {}).get("tasks") or {}
    spec_json = ((((tasks.get("plan-run") or {}).get("inputs") or {}).get("parameters") or {}).get("spec_json") or {}).get(
        "runtimeValue", {}).get("constant")
    if isinstance(spec_json, str):
        spec = specs.load(json.loads(spec_json))
        inputs = ((root.get("inputDefinitions") or {}).get("parameters") or {})
        return Target(spec.name, "chained" if "kfp_host" in inputs else "spec", spec)
    name = str((docs[0].get("pipelineInfo") or {}).get("name", "")).replace("-", "_")
    return Target(name, "stage") if name in registry.names() else None


def check_kfp_run(docs: list[dict], values: dict[str, Any], input_from_here: bool = False) -> Target | None:
    """Before a run of a compiled prepline pipeline is posted: its stage settings (overrides_json,
    params_json, languages, every stage's merged parameters as the plan step would resolve them)
    and, with ``input_from_here``, its input read from this machine (the cluster may see inputs
    this machine does not: a PVC path, an in-cluster object store). Values are the checked ones."""
    target = kfp_target(docs)
    if target is None:
        return None
    ours = set(target.params())
    check_values(target, {k: v for k, v in values.items() if k in ours})
    if input_from_here and values.get("input_path"):
        check_input(target, values["input_path"], values, work_root=values.get("work_root") or "preflight")
    elif target.kind != "stage":
        from prepline.pipelines.plan import make_plan

        make_plan(target.spec, input_path=values.get("input_path") or "unchecked", work_root=values.get("work_root") or "preflight",
                  run_id="preflight", languages=values.get("languages"), text_column=values.get("text_column", ""),
                  input_format=values.get("input_format", ""), text_field=values.get("text_field", ""),
                  overrides=json.loads(_as_json(values.get("overrides_json") or "{}")),
                  cluster=json.loads(_as_json(values.get("cluster_json") or "{}")), detected_format="mixed")
    return target
