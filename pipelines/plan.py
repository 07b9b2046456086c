"""One run of a pipeline spec, resolved: which stages run for which branch, what each reads, and
its parameters and cluster after every layer is merged.

The first step of a spec pipeline calls :func:`make_plan` and writes the result to
``<work_root>/<run>/plan.json``; every stage then takes its input, parameters and cluster from
its entry there (:func:`entry`), so the wiring is computed once, in one place, and no stage can
lose it. Parameters, lowest to highest (docs/pipelines.md):

1. the transform's defaults;
2. ``text_column`` for every parameter naming the text column (``content_column``, ingest's
   ``text_column``), and ``${text_column}`` inside string parameters (the filter criteria);
   ``text_field`` (when set) is ingest's ``text_field``, over the spec's ``input.params``;
3. the transform's own defaults for the branch's language (``Transform.branch_params``: the PII
   language and its recognizers, doc_quality's default language);
4. the spec's stage ``params``, then the spec's ``branches.<branch>.params`` of that stage;
5. ``overrides_json``: ``{"<stage>": {"params": ..., "cluster": ..., "branches": {"<branch>": {...}}}}``,
   stage level then branch level (a deep merge: mappings merge key by key, lists and values replace);
6. what the shape requires, which no layer may change: lang_id's ``split`` and ``languages``
   when there are branches (a conflicting value is an error), and each stage's input.

Cluster settings merge the same way over ``cluster_json``. No kfp import here.
"""

from __future__ import annotations

import json
from typing import Any

from prepline import registry
from prepline.errors import ConfigError
from prepline.pipelines.spec import INGEST, OTHER, SPLIT, PipelineSpec, StageSpec
from prepline.stage_params import ALLOW_EMPTY, allow_empty, deep_merge

PLAN_FILE = "plan.json"
PLAN_VERSION = 1
#: the stage output folder of the run's shared tokenizer
TOKENIZER_STAGE = "tokenizer"
TEXT_PARAMS = ("content_column", "text_column")
TEXT_VAR = "${text_column}"
_FORMATS = {"jsonl": (".jsonl", ".jsonl.gz", ".jsonl.zst", ".ndjson", ".ndjson.gz", ".ndjson.zst"),
            "csv": (".csv", ".tsv", ".csv.gz", ".tsv.gz"), "wet": (".wet", ".wet.gz"), "warc": (".warc", ".warc.gz"),
            "hf": (".arrow",), "parquet": (".parquet",)}


def run_root(work_root: str, run_id: str) -> str:
    from prepline.stages import run_key

    return f"{work_root.rstrip('/')}/{run_key(run_id)}"


# ----------------------------------------------------------------------------------------------
# the input's format


def format_of(name: str) -> str | None:
    n = name.lower()
    for fmt, suffixes in _FORMATS.items():
        if n.endswith(suffixes):
            return fmt
    return None


def detect_format(input_path: str) -> str:
    """The input's format from its files' extensions: one of jsonl, csv, warc, wet, hf, parquet, or
    ``mixed`` (ingest reads each file by its extension). Hidden and ``_`` files are not data."""
    from prepline.data_access import open_location
    from prepline.errors import InputError

    loc = open_location(input_path)
    if loc.file_size() is not None:
        names = [input_path.rstrip("/").rsplit("/", 1)[-1]]
    else:
        if not loc.exists():
            raise InputError(f"input {loc.uri} does not exist", "pass input_path: a folder or file of JSONL, CSV, WARC/WET, "
                             "Hugging Face dataset shards or Parquet (local or s3://)")
        names = [f.rel for f in loc.list_all() if not any(p.startswith(("_", ".")) for p in f.rel.split("/"))]
    found = {f for f in map(format_of, names) if f}
    if not found:
        raise InputError(f"input {loc.uri} has no files prepline reads (e.g. {', '.join(names[:3]) or 'none'})",
                         "give .parquet, .jsonl(.gz/.zst), .csv/.tsv, .warc(.gz), .wet(.gz) or .arrow files, or set input_format")
    if found == {"parquet", "hf"}:
        return "hf"
    return found.pop() if len(found) == 1 else "mixed"


# ----------------------------------------------------------------------------------------------
# parameters


def _substitute(v: Any, text_column: str) -> Any:
    if isinstance(v, str):
        return v.replace(TEXT_VAR, text_column)
    if isinstance(v, list):
        return [_substitute(x, text_column) for x in v]
    return v


def _user_settings(overrides: dict, stage: str, branch: str) -> tuple[dict, dict]:
    s = overrides.get(stage, {})
    b = s.get("branches", {}).get(branch, {}) if branch else {}
    return deep_merge(s.get("params", {}), b.get("params", {})), deep_merge(s.get("cluster", {}), b.get("cluster", {}))


def _spec_settings(st: StageSpec, branch: str) -> tuple[dict, dict]:
    b = st.branches.get(branch, {}) if branch else {}
    return deep_merge(st.params, b.get("params", {})), deep_merge(st.cluster, b.get("cluster", {}))


def stage_params(st: StageSpec, branch: str, text_column: str, overrides: dict, wired: dict) -> dict:
    """The parameters of one stage for one branch, every layer merged (see the module doc), checked."""
    cls = registry.get(st.name)
    names = {p.name for p in cls.Config.params()}
    p: dict = {k: text_column for k in TEXT_PARAMS if k in names}
    if branch:
        p = deep_merge(p, cls.branch_params(branch))
    p = deep_merge(p, _spec_settings(st, branch)[0])
    p = deep_merge(p, _user_settings(overrides, st.name, branch)[0])
    for k, v in wired.items():
        if k in p and p[k] != v:
            raise ConfigError(f"{st.name}.{k}={json.dumps(p[k])} conflicts with the pipeline's shape, which sets it to "
                              f"{json.dumps(v)} (the branches read {st.name}'s split)",
                              f"remove {k} from the {st.name} settings; choose the branches with the languages parameter")
        p[k] = v
    p = {k: _substitute(v, text_column) for k, v in p.items()}
    where = st.name + (f" (branch {branch})" if branch else "")
    try:
        cfg = cls.Config.from_params(p)
        cls(cfg).check_resources()  # a tokenizer or model path that is wrong: now, not when the stage is reached
    except ConfigError as e:
        raise ConfigError(f"{where}: {e.message}", e.fix) from None
    return json.loads(json.dumps({k: v for k, v in cfg.to_dict().items() if k in p}))  # as plan.json holds them


# ----------------------------------------------------------------------------------------------
# the plan


def _entry(stage: str, branch: str, runs: bool, reason: str = "", **kw) -> dict:
    return {"stage": stage, "branch": branch, "runs": runs, **({"reason": reason} if reason else {}), **kw}


def make_plan(spec: PipelineSpec, *, input_path: str, work_root: str, run_id: str, languages: list | None = None,
              text_column: str = "", input_format: str = "", overrides: dict | None = None, cluster: dict | None = None,
              detected_format: str | None = None, text_field: str = "") -> dict:
    """The resolved run (see the module doc). ``detected_format`` is the input's format when
    ``input_format`` is auto (:func:`detect_format`; computed here when not given)."""
    from prepline.stage_params import check_overrides
    from prepline.stages import stage_output

    if not work_root:
        raise ConfigError("work_root is empty", "pass the folder or s3:// URI where stage outputs go")
    if not input_path:
        raise ConfigError("input_path is empty", "pass the input folder, file or s3:// URI")
    overrides = check_overrides(json.dumps(overrides or {}))
    if text_field and INGEST in registry.names():  # the pipeline's text_field is ingest's (overrides_json still wins)
        overrides = deep_merge({INGEST: {"params": {"text_field": text_field}}}, overrides)
    text_column = text_column or spec.text_column
    fmt = input_format or spec.input_format
    if fmt == "auto":
        fmt = detected_format or detect_format(input_path)
    from prepline.pipelines.spec import INPUT_FORMATS

    if fmt not in INPUT_FORMATS + ("mixed",):
        raise ConfigError(f"input_format={fmt!r} is not one of {', '.join(INPUT_FORMATS)}", "e.g. input_format=auto")
    langs = _branches(spec, languages)
    cluster = cluster or {}
    entries: list[dict] = []

    def add(st: StageSpec, branch: str, src: str, wired: dict | None = None) -> str:
        if not st.runs_for(branch):
            entries.append(_entry(st.name, branch, False, f"{st.name} runs for {', '.join(st.languages)} only (pipeline spec)"))
            return src
        sp, sc = _spec_settings(st, branch)
        uc = _user_settings(overrides, st.name, branch)[1]
        out = stage_output(work_root, run_id, st.name, branch)
        entries.append(_entry(st.name, branch, True, input=src, output=out,
                              params=stage_params(st, branch, text_column, overrides, wired or {}),
                              cluster=deep_merge(deep_merge(cluster, sc), uc),
                              **({ALLOW_EMPTY: True} if allow_empty(overrides, st.name, branch) else {})))
        return out

    needs_ingest = fmt != "parquet"
    src = input_path
    if INGEST in registry.names():
        ingest = spec.stage(INGEST)
        if needs_ingest:
            src = add(ingest, "", src)
        else:
            entries.append(_entry(INGEST, "", False, "the input is Parquet"))
    elif needs_ingest:
        raise ConfigError(f"the input is {fmt}, and the ingest transform is not installed", "pip install 'prepline[ingest]'")
    for st in spec.stages:
        wired = {"split": True, "languages": [x for x in langs if x != OTHER]} if st.name == SPLIT and spec.branches else {}
        src = add(st, "", src, wired)
    split_out = src
    finals = {}
    for b in langs:
        bsrc = f"{split_out}/lang={b}"
        for st in spec.branch_stages:
            bsrc = add(st, b, bsrc)
        finals[b] = bsrc
    plan = {"format": "prepline.plan", "version": PLAN_VERSION, "pipeline": spec.name, "spec": json.loads(spec.to_json()),
            "run": run_root(work_root, run_id), "work_root": work_root, "input": {"path": input_path, "format": fmt,
            "ingest": needs_ingest}, "text_column": text_column, "branches": langs, "finals": finals, "entries": entries}
    if spec.branches and OTHER not in langs:
        plan["sinks"] = [{"stage": SPLIT, "part": f"lang={OTHER}", "path": f"{split_out}/lang={OTHER}",
                          "what": "documents of languages without a branch (kept, counted, not processed further)"}]
    if spec.shared_tokenizer:
        plan["tokenizer"] = _tokenizer(spec, overrides, text_column, work_root, run_id, langs)
    return plan


def _branches(spec: PipelineSpec, languages: list | None) -> list[str]:
    if not spec.branches:
        return []
    langs = list(spec.branches.languages if languages is None else languages)
    if not langs:
        raise ConfigError("languages is empty: no branch would run", 'pass e.g. ["en", "ja"] (and "other" for the rest)')
    bad = [x for x in langs if not isinstance(x, str) or not x or not x.replace("-", "").replace("_", "").isalnum()]
    if bad or len(set(langs)) != len(langs):
        raise ConfigError(f"languages {langs!r} must be distinct language codes", 'e.g. ["en", "ja", "fr"] as lang_id gives them')
    return langs


def _tokenizer(spec: PipelineSpec, overrides: dict, text_column: str, work_root: str, run_id: str, langs: list[str]) -> dict:
    from prepline.stages import stage_output
    from prepline.tokens.shared import SharedTokenizerConfig

    i = spec.tokenizer_split()
    params = deep_merge({"content_column": text_column}, spec.tokenizer_params)
    params = deep_merge(params, overrides.get(TOKENIZER_STAGE, {}).get("params", {}))
    try:
        SharedTokenizerConfig.from_params(params)
    except ConfigError as e:
        raise ConfigError(f"tokenizer: {e.message}", e.fix) from None
    stage, from_split = (spec.branch_stages[i - 1].name, False) if i else (SPLIT, True)
    inputs = [f"{stage_output(work_root, run_id, stage)}/lang={b}" if from_split else stage_output(work_root, run_id, stage, b)
              for b in langs]
    return {"input_stage": stage, "from_split": from_split, "languages": langs, "inputs": inputs, "params": params,
            "output": stage_output(work_root, run_id, TOKENIZER_STAGE)}


def entry(plan: dict, stage: str, branch: str = "") -> dict:
    for e in plan["entries"]:
        if e["stage"] == stage and e["branch"] == branch:
            return e
    raise ConfigError(f"the run's plan has no stage {stage}" + (f" for branch {branch}" if branch else ""),
                      "start the stage from the pipeline that wrote the plan (its branches come from its languages parameter)")


def plan_markdown(plan: dict) -> str:
    """The plan as a table (the plan step's summary in the KFP UI)."""
    lines = [f"## plan of {plan['pipeline']}", "", f"input {plan['input']['path']} ({plan['input']['format']}), text column "
             f"`{plan['text_column']}`, branches: {', '.join(plan['branches']) or 'none'}", "",
             "| stage | branch | runs | reads |", "|---|---|---|---|"]
    lines += [f"| {e['stage']} | {e['branch']} | {'yes' if e['runs'] else 'no: ' + e.get('reason', '')} | {e.get('input', '')} |"
              for e in plan["entries"]]
    for s in plan.get("sinks", []):
        lines.append(f"\nkept aside: {s['path']} ({s['what']})")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# plan.json in the run folder


def write_plan(plan: dict) -> str:
    from prepline.data_access import open_location

    loc = open_location(plan["run"])
    loc.write_bytes(PLAN_FILE, (json.dumps(plan, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    return f"{plan['run']}/{PLAN_FILE}"


def read_plan(work_root: str, run_id: str) -> dict:
    from prepline.data_access import open_location
    from prepline.errors import InputError

    root = run_root(work_root, run_id)
    text = open_location(root).read_text(PLAN_FILE)
    if text is None:
        raise InputError(f"the run's plan {root}/{PLAN_FILE} does not exist",
                         "the pipeline's first step (plan) writes it: run the stage from its pipeline, or with from_plan=false")
    return json.loads(text)
