"""The Python API for notebooks and scripts (docs/python_api.md); ``import prepline`` exposes it lazily.

* :func:`run` runs one transform over a folder (the engine of ``prepline run``);
* :func:`list_transforms` / :func:`describe` list the transforms (built-ins and plug-ins) and their parameters;
* :func:`read_metadata` reads a stage's ``metadata.json`` into a typed :class:`StageMetadata`.

* :func:`load_pipeline` reads a pipeline spec (docs/pipelines.md), :func:`compile_pipeline` writes its
  KFP YAML, :func:`run_pipeline` runs it on this machine (``prepline pipeline compile|run``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from prepline import metadata, registry
from prepline.config import ParamInfo
from prepline.errors import InputError, RunFailed
from prepline.registry import Plugin

__all__ = ["StageMetadata", "Totals", "TransformInfo", "compile_pipeline", "describe", "list_transforms", "load_pipeline", "read_metadata",
           "run", "run_pipeline"]


@dataclass(frozen=True)
class TransformInfo:
    """A registered transform: its name, one-line summary, parameters and where it comes from."""

    name: str
    summary: str
    params: list[ParamInfo]
    extra: str | None = None  # pip install 'prepline[<extra>]' it needs
    plugin: Plugin | None = None  # None for a built-in

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}


def describe(name: str) -> TransformInfo:
    """One transform's :class:`TransformInfo` (a ConfigError naming the choices if unknown)."""
    cls = registry.get(name)
    return TransformInfo(name, cls.summary, cls.Config.params(), cls.extra, registry.origin(name))


def list_transforms() -> list[TransformInfo]:
    """Every transform, built-ins and installed plug-ins, sorted by name."""
    return [describe(n) for n in registry.names()]


@dataclass(frozen=True)
class Totals:
    """A stage's document and byte counts: ``docs_in + sum(generated.values()) == docs_out +
    sum(removed.values())`` (``generated``: documents a stage such as synthesize adds)."""

    files: int
    docs_in: int
    docs_out: int
    removed: dict[str, int]
    bytes_in: int
    bytes_out: int
    files_failed: int = 0
    docs_in_failed_files: int = 0
    seconds: float | None = None
    counters: dict[str, int] = field(default_factory=dict)
    parts: dict[str, int] = field(default_factory=dict)  # sub-folder (e.g. lang=en) -> docs written there
    generated: dict[str, int] = field(default_factory=dict)  # documents added (not from the input), by kind
    #: peak resident memory, MiB: the driver's process, and the largest of the workers' (None: not recorded)
    driver_peak_rss_mib: float | None = None
    worker_peak_rss_mib: float | None = None
    #: the stage's temporary files (its work folder: shard files, markers), deleted when it succeeds
    work_bytes: int = 0
    work_files: int = 0

    @property
    def removed_total(self) -> int:
        return sum(self.removed.values())


@dataclass(frozen=True)
class StageMetadata:
    """What a stage did, from its ``metadata.json`` (``raw`` holds the whole document)."""

    path: str  # the stage's output folder
    transform: str
    status: str  # success | failed
    parameters: dict[str, Any]
    totals: Totals
    started: str
    ended: str
    files: dict[str, dict]
    failures: dict[str, dict]
    error: dict | None
    raw: dict
    resumed: bool = False  # returned by run(): a complete earlier run was found and nothing ran

    @property
    def ok(self) -> bool:
        return self.status == "success"


def _stage_metadata(meta: dict, path: str, resumed: bool = False) -> StageMetadata:
    if meta.get("schema_version") != metadata.SCHEMA_VERSION:
        raise InputError(f"{path}/metadata.json has schema_version {meta.get('schema_version')!r}; "
                         f"this prepline reads version {metadata.SCHEMA_VERSION}",
                         "read it with the prepline version that wrote it (metadata.json 'versions')")
    t = meta["totals"]
    totals = Totals(**{f.name: t[f.name] for f in fields(Totals) if f.name in t})
    return StageMetadata(path, meta["transform"], meta["status"], meta.get("parameters", {}), totals, meta["started"],
                         meta["ended"], meta.get("files", {}), meta.get("failures", {}), meta.get("error"), meta, resumed)


def read_metadata(path: str) -> StageMetadata:
    """The metadata of the stage whose output is ``path`` (a folder or its metadata.json; local or s3://)."""
    from prepline.data_access import open_location

    folder = path[: -len("/metadata.json")] if path.endswith("/metadata.json") else path.rstrip("/")
    loc = open_location(folder)
    text = loc.read_text("metadata.json")
    if text is None:
        raise InputError(f"no metadata.json in {loc.uri}",
                         "point at a stage's output folder; a stage writes metadata.json last, when it ends")
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{loc.uri}/metadata.json is not JSON ({e.msg} at char {e.pos})",
                         "rerun the stage (metadata.json is written atomically, so this file was not written by prepline)") from None
    return _stage_metadata(metadata.join_files(loc, meta), loc.uri)


def run(transform: str, input: str, output: str, *, params: dict | None = None, runtime: str = "local", workers: int = 0,
        cpus_per_worker: float = 1.0, ray_address: str | None = None, max_failed_files: int = 0, task_retries: int = 2,
        overwrite: bool = False, gpus_per_worker: float = 0.0, progress: bool = False, workers_over_cpus: bool = False, allow_empty_output: bool = False,
        **transform_params: Any) -> StageMetadata:
    """Run ``transform`` over ``input`` into ``output`` (what ``prepline run`` does) and return its metadata.

    Transform parameters come as keywords (``min_chars=10``) or as ``params={...}`` (keywords win);
    the other keywords are how to run it (never what it computes). Raises a PreplineError with a fix
    (RunFailed when every document of a non-empty input was removed, unless ``allow_empty_output``).
    """
    from prepline.engine import RunOptions, run_transform

    opts = RunOptions(input=str(input), output=str(output), runtime=runtime, workers=workers, cpus_per_worker=cpus_per_worker,
                      gpus_per_worker=gpus_per_worker,
                      ray_address=ray_address, max_failed_files=max_failed_files, task_retries=task_retries,
                      overwrite=overwrite, progress=progress, workers_over_cpus=workers_over_cpus,
                      allow_empty_output=allow_empty_output)
    result = run_transform(transform, {**(params or {}), **transform_params}, opts)  # checked by Config.from_params
    return _stage_metadata(result.metadata, result.output, result.resumed)


def load_pipeline(source: str | Path | dict = "super"):
    """A checked :class:`prepline.pipelines.spec.PipelineSpec`: a spec file (``.yaml``), a dict of the
    same shape, or the name of a shipped spec (``"super"``)."""
    from prepline.pipelines import spec as specs

    if isinstance(source, str) and not source.endswith((".yaml", ".yml")):
        return specs.shipped(source)
    return specs.load(source)


def compile_pipeline(spec, output_dir: str | Path) -> list[Path]:
    """Compile a spec (or what :func:`load_pipeline` takes) into KFP YAML under ``output_dir``: the
    pipeline and the simple pipelines of its stages. Returns the files written."""
    from kfp import compiler

    from prepline.pipelines.factory import spec_pipelines

    spec = spec if not isinstance(spec, (str, Path, dict)) else load_pipeline(spec)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, pipeline in spec_pipelines(spec).items():
        compiler.Compiler().compile(pipeline, str(out / f"{stem}.yaml"))
        written.append(out / f"{stem}.yaml")
    return written


def run_pipeline(spec, work_root: str | Path, input: str | None = None, **params: Any) -> Path:
    """Run a spec on this machine (kfp's local runner, a local Ray head per stage), as ``prepline
    pipeline run my.yaml --local`` does; ``params`` are pipeline parameters (``languages=["en"]``).
    Without ``input`` the bundled sample is built. Returns the run folder,
    ``<work_root>/stages/<run id>/`` (its stages' outputs and metadata.json, plan.json, report.html)."""
    from prepline.kfp import local as kfp_local
    from prepline.pipeline_cli import RunFolder, local_args, preflight
    from prepline.pipelines.factory import spec_pipeline

    spec = spec if not isinstance(spec, (str, Path, dict)) else load_pipeline(spec)
    work = Path(work_root).resolve()
    preflight(spec, params, input, work)  # parameters and input checked before a sample is built or a cluster starts
    args = local_args(work, input, params)
    with RunFolder(work / "stages", args, spec.name) as run:
        kfp_local.run_local(spec.name, args, str(work / "kfp"), pipeline=spec_pipeline(spec))
    if run.folder is None:
        raise RunFailed(f"the run of {spec.name} wrote no run folder under {work / 'stages'}", "see the tasks' logs under " + str(work / "kfp"))
    return run.folder
