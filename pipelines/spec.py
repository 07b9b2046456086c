"""A pipeline's shape as data: the pipeline spec (YAML, or these frozen dataclasses).

One spec says which global stages run in which order, which languages get a branch and which
stages each branch runs, every stage's parameters (per stage, and per branch), whether the
branches share one tokenizer, and the training step. The one factory
(:mod:`prepline.pipelines.factory`) compiles a spec into the nested KFP pipeline and the
SDK-chained one, :mod:`prepline.elyra_pipeline` into an Elyra template, and
:mod:`prepline.pipelines.plan` resolves it for one run. The shipped super pipeline is the spec
``specs/super.yaml`` (package data). docs/pipelines.md documents the format::

    name: my_pipeline
    input: {format: auto, text_column: text}
    stages: [doc_id, lang_id]
    branches:
      languages: [en, fr]
      stages:
        - name: filter
          params: {criteria: ['length("${text_column}") >= 20']}
          branches: {en: {params: {criteria: [...]}}}
        - tokenization
    tokenizer: {params: {vocab_size: 4096}}
    train: {params: {steps: 20}}

No kfp import here: the Ray image (which has no kfp) reads the stage order from it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from prepline.errors import ConfigError

#: input formats of the ``input_format`` parameter: auto = by the files' extensions
INPUT_FORMATS = ("auto", "parquet", "jsonl", "csv", "warc", "wet", "hf")
#: the stage that turns a non-Parquet input into Parquet (put first by the plan, when needed)
INGEST = "ingest"
#: the stage whose split makes the branches
SPLIT = "lang_id"
#: the branch over every language without its own branch (lang_id's lang=other)
OTHER = "other"
#: the stage that reads the run's shared tokenizer; the branches' loop is split before it
TOKENIZATION = "tokenization"
SHIPPED = "super"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_LANG = re.compile(r"^[A-Za-z0-9_-]+$")
_SETTING_KEYS = {"params", "cluster"}
_STAGE_KEYS = {"name", "params", "cluster", "branches", "languages"}
FIX = "see docs/pipelines.md for the spec format"


@dataclass(frozen=True)
class StageSpec:
    """One stage: a registered transform (its name is also the stage's output folder), its
    parameters and cluster settings for every branch, per-branch ones, and (branch stages only)
    the branches it runs for (empty: all)."""

    name: str
    params: dict = field(default_factory=dict)
    cluster: dict = field(default_factory=dict)
    branches: dict = field(default_factory=dict)  # {"<branch>": {"params": {...}, "cluster": {...}}}
    languages: tuple[str, ...] = ()

    def settings(self) -> dict:
        """The stage's settings in the shape of ``overrides_json`` (what the plan merges)."""
        out: dict = {}
        if self.params:
            out["params"] = dict(self.params)
        if self.cluster:
            out["cluster"] = dict(self.cluster)
        if self.branches:
            out["branches"] = {b: dict(s) for b, s in self.branches.items()}
        return out

    def runs_for(self, branch: str) -> bool:
        return not self.languages or branch in self.languages


@dataclass(frozen=True)
class BranchesSpec:
    """After lang_id's split, one branch per language (``other``: every language without its own)."""

    languages: tuple[str, ...]
    stages: tuple[StageSpec, ...]


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    description: str = ""
    input_format: str = "auto"
    text_column: str = "contents"
    input_params: dict = field(default_factory=dict)  # ingest's parameters (text_field, extractor, ...)
    stages: tuple[StageSpec, ...] = ()
    branches: BranchesSpec | None = None
    shared_tokenizer: bool = False
    tokenizer_params: dict = field(default_factory=dict)  # prepline.tokens.shared.SharedTokenizerConfig
    train: bool = False
    train_params: dict = field(default_factory=dict)  # default of train_params_json

    # -- derived ---------------------------------------------------------------------------------
    @property
    def branch_stages(self) -> tuple[StageSpec, ...]:
        return self.branches.stages if self.branches else ()

    def stage(self, name: str) -> StageSpec:
        for s in self.stages + self.branch_stages:
            if s.name == name:
                return s
        if name == INGEST:
            return StageSpec(INGEST, params=dict(self.input_params))
        raise KeyError(name)

    def order(self) -> list[str]:
        """Every stage in pipeline order, ingest first (what the image smoke test and the benchmark run)."""
        return [INGEST] + [s.name for s in self.stages + self.branch_stages]

    def tokenizer_split(self) -> int | None:
        """Index in the branch stages where the shared tokenizer is trained (before tokenization)."""
        if not self.shared_tokenizer:
            return None
        return [s.name for s in self.branch_stages].index(TOKENIZATION)

    def summary(self, head: str = "", tail: str = "") -> str:
        """The pipeline's shape in one line (its description in KFP and Elyra)."""
        glob = " → ".join(s.name for s in self.stages)
        branch = " → ".join(s.name + (f" ({', '.join(s.languages)} only)" if s.languages else "") for s in self.branch_stages)
        return (f"{head or 'prepline ' + self.name}: [ingest when the input is not Parquet] → {glob}"
                + (f" → per language ({', '.join(self.branches.languages)}): {branch}" if self.branches else "")
                + (" (one shared tokenizer)" if self.shared_tokenizer else "") + (" → fine_tune" if self.train else "") + tail
                + ". Every input document is accounted for (check_documents).")

    def kfp_name(self) -> str:
        return "prepline-" + self.name.replace("_", "-")

    def to_dict(self) -> dict:
        """The spec as its YAML mapping (load(to_dict()) gives the same spec)."""
        def stage(s: StageSpec):
            d: dict[str, Any] = {"name": s.name, **s.settings()}
            if s.languages:
                d["languages"] = list(s.languages)
            return d if len(d) > 1 else s.name

        out: dict[str, Any] = {"name": self.name, "description": self.description,
                               "input": {"format": self.input_format, "text_column": self.text_column,
                                         **({"params": dict(self.input_params)} if self.input_params else {})},
                               "stages": [stage(s) for s in self.stages]}
        if self.branches:
            out["branches"] = {"languages": list(self.branches.languages), "stages": [stage(s) for s in self.branches.stages]}
        if self.shared_tokenizer:
            out["tokenizer"] = {"params": dict(self.tokenizer_params)}
        if self.train:
            out["train"] = {"params": dict(self.train_params)}
        return out

    def to_json(self) -> str:
        """Canonical JSON (what the plan step receives, and the cache key of compiled pipelines)."""
        return json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False)


# ----------------------------------------------------------------------------------------------
# loading and checking


def _fail(where: str, msg: str, fix: str = FIX) -> ConfigError:
    return ConfigError(f"pipeline spec {where}: {msg}", fix)


def _mapping(where: str, v: Any, keys: set[str] | None = None) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _fail(where, f"must be a mapping, got {type(v).__name__}")
    if keys is not None and set(v) - keys:
        raise _fail(where, f"unknown key(s) {', '.join(sorted(set(v) - keys))}", f"known keys: {', '.join(sorted(keys))}")
    return v


def _languages(where: str, v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) and _LANG.match(x) for x in v):
        raise _fail(where, f"must be a list of language codes, got {v!r}", "e.g. [en, ja, fr] (codes as lang_id gives them)")
    if len(set(v)) != len(v):
        raise _fail(where, f"lists a language twice: {v}")
    return tuple(v)


def _settings(where: str, v: Any) -> dict:
    s = _mapping(where, v, _SETTING_KEYS)
    for k in s:
        _mapping(f"{where}.{k}", s[k])
    return dict(s)


def _stage(where: str, v: Any, in_branch: bool) -> StageSpec:
    if isinstance(v, str):
        v = {"name": v}
    d = _mapping(where, v, _STAGE_KEYS)
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(where, "a stage needs a name (a transform: prepline list)")
    if "languages" in d and not in_branch:
        raise _fail(f"{where} ({name})", "languages applies to branch stages only")
    branches = {b: _settings(f"{where}.branches.{b}", s) for b, s in _mapping(f"{where}.branches", d.get("branches")).items()}
    for b in branches:
        if not _LANG.match(str(b)):
            raise _fail(f"{where}.branches", f"{b!r} is not a branch (language code)")
    return StageSpec(name, dict(_mapping(f"{where}.params", d.get("params"))), dict(_mapping(f"{where}.cluster", d.get("cluster"))),
                     branches, _languages(f"{where}.languages", d["languages"]) if "languages" in d else ())


def from_dict(d: Any) -> PipelineSpec:
    """A spec from its YAML mapping, checked (see :func:`check`)."""
    d = _mapping("", d, {"name", "description", "input", "stages", "branches", "tokenizer", "train"})
    name = d.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _fail("name", f"{name!r} must be a snake_case name (it names the compiled file)", "e.g. name: my_pipeline")
    inp = _mapping("input", d.get("input"), {"format", "text_column", "params"})
    stages = d.get("stages") or []
    if not isinstance(stages, list):
        raise _fail("stages", "must be a list of stages")
    branches = None
    if d.get("branches") is not None:
        b = _mapping("branches", d["branches"], {"languages", "stages"})
        bst = b.get("stages") or []
        if not isinstance(bst, list) or not bst:
            raise _fail("branches.stages", "must be a non-empty list of stages")
        branches = BranchesSpec(_languages("branches.languages", b.get("languages", [])),
                                tuple(_stage(f"branches.stages[{i}]", s, True) for i, s in enumerate(bst)))
    tok = d.get("tokenizer")
    train = d.get("train")
    spec = PipelineSpec(
        name=name, description=str(d.get("description") or ""), input_format=str(inp.get("format", "auto")),
        text_column=str(inp.get("text_column", "contents")), input_params=dict(_mapping("input.params", inp.get("params"))),
        stages=tuple(_stage(f"stages[{i}]", s, False) for i, s in enumerate(stages)), branches=branches,
        shared_tokenizer=tok is not None and tok is not False,
        tokenizer_params=dict(_mapping("tokenizer.params", _mapping("tokenizer", tok if tok not in (None, True, False) else {}, {"params"}).get("params"))),
        train=train is not None and train is not False,
        train_params=dict(_mapping("train.params", _mapping("train", train if train not in (None, True, False) else {}, {"params"}).get("params"))),
    )
    check(spec)
    return spec


def check(spec: PipelineSpec) -> None:
    """What the factory needs of a spec: known transforms, each once; ingest implicit; lang_id
    last among the global stages when there are branches; tokenization where the shared
    tokenizer and training need it."""
    from prepline import registry

    if spec.input_format not in INPUT_FORMATS:
        raise _fail("input.format", f"{spec.input_format!r} is not one of {', '.join(INPUT_FORMATS)}")
    if not spec.text_column.strip():
        raise _fail("input.text_column", "must not be empty", "e.g. text_column: contents")
    names = [s.name for s in spec.stages + spec.branch_stages]
    known = set(registry.names())
    for n in names:
        if n not in known:
            raise _fail(f"stage {n!r}", "is not a transform", f"transforms: {', '.join(sorted(known))} (prepline list)")
        if names.count(n) > 1:
            raise _fail(f"stage {n!r}", "appears twice (a stage's name is its output folder)", "list each transform once")
    if INGEST in names:
        raise _fail("stage 'ingest'", "is put first by the plan when the input is not Parquet",
                    "remove it from stages; set input.format (and input.params for its parameters)")
    if not names:
        raise _fail("stages", "the pipeline has no stage")
    if spec.branches is not None:
        if not spec.stages or spec.stages[-1].name != SPLIT:
            raise _fail("branches", f"need {SPLIT} as the last global stage (its split makes the branches)",
                        f"end stages with {SPLIT}, or drop branches")
        if not spec.branches.languages:
            raise _fail("branches.languages", "is empty", "e.g. languages: [en, ja, fr]")
    if spec.shared_tokenizer:
        if TOKENIZATION not in [s.name for s in spec.branch_stages]:
            raise _fail("tokenizer", f"a shared tokenizer needs {TOKENIZATION} among the branch stages")
        i = spec.tokenizer_split()
        before = spec.branch_stages[i - 1] if i else None
        if before is not None and before.languages:
            raise _fail("tokenizer", f"the shared tokenizer trains on {before.name}'s output, which runs only for "
                        f"{list(before.languages)}", "put a stage that runs for every branch right before tokenization")
    if spec.train:
        if not spec.branch_stages or spec.branch_stages[-1].name != TOKENIZATION:
            raise _fail("train", f"fine-tuning reads the branches' token output: {TOKENIZATION} must be the last branch stage")


def load(source: str | Path | dict) -> PipelineSpec:
    """A spec from a YAML file, YAML text, or a mapping."""
    import yaml

    if isinstance(source, dict):
        return from_dict(source)
    text, where = str(source), "text"
    if isinstance(source, Path) or (("\n" not in text) and text.endswith((".yaml", ".yml", ".json"))):
        p = Path(source)
        if not p.is_file():
            raise ConfigError(f"pipeline spec {p} does not exist", "pass the path of a pipeline spec (YAML)")
        text, where = p.read_text(encoding="utf-8"), str(p)
    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"pipeline spec {where} is not valid YAML: {str(e).splitlines()[0]}", FIX) from None
    return from_dict(d)


def shipped_path(name: str = SHIPPED) -> Path:
    return Path(str(resources.files("prepline.pipelines").joinpath("specs", f"{name}.yaml")))


def shipped_names() -> list[str]:
    """The names of the specs shipped with prepline (package data ``specs/*.yaml``), ``super`` first:
    each is a pipeline of its own (``prepline pipeline run <name>``, compiled/, elyra_templates/)."""
    folder = resources.files("prepline.pipelines").joinpath("specs")
    names = sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
    return sorted(names, key=lambda n: n != SHIPPED)


def shipped(name: str = SHIPPED) -> PipelineSpec:
    """A spec shipped with prepline (package data): ``super`` is the super pipeline."""
    return load(shipped_path(name))
