"""Runs a transform over a folder of Parquet files, on any runtime, resumably.

The driver lists the input once, checks the first file's schema and the parameters, then runs
the transform's pre-phases (global transforms) and the final per-file map through an executor
(:mod:`prepline.runtime`). Workers report per-task results; the driver writes a completion
marker for each (under ``<output>/_prepline/markers/``) so that a rerun skips finished work, and
writes ``metadata.json`` last. Outputs depend only on the data and the parameters, never on the
runtime, the worker count or the order in which files finish.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import pyarrow as pa

from prepline import metadata, registry
from prepline.data_access import FileInfo, LocalLocation, Location, inside, open_location
from prepline.errors import ConfigError, InputError, PreplineError, RunFailed
from prepline.transform import FileTask, Phase, Transform

log = logging.getLogger("prepline")

WORK = "_prepline"
MARKERS = f"{WORK}/markers"
FINAL = "final"


@dataclass(frozen=True)
class RunOptions:
    """How to run (not what to compute): these never change the output."""

    input: str
    output: str
    runtime: str = "local"  # local | ray
    workers: int = 0  # 0: one per CPU (local) or per `cpus_per_worker` of the cluster (ray)
    cpus_per_worker: float = 1.0
    ray_address: str | None = None  # join this cluster; None: start a local one
    max_failed_files: int = 0  # failed files tolerated (listed in metadata.json)
    overwrite: bool = False  # delete an existing, different output first
    progress: bool = True

    def __post_init__(self) -> None:
        if self.runtime not in ("local", "ray"):
            raise ConfigError(f"unknown runtime '{self.runtime}'", "use --runtime local or --runtime ray")
        if self.workers < 0:
            raise ConfigError(f"workers={self.workers} must be >= 0", "pass --workers N (0 = automatic)")
        if self.max_failed_files < 0:
            raise ConfigError("max_failed_files must be >= 0", "pass --max-failed-files N")
        if self.cpus_per_worker <= 0:
            raise ConfigError("cpus_per_worker must be > 0", "pass --cpus-per-worker 1 (or 0.5, 2, ...)")


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build its transform; picklable."""

    transform: str
    params: dict
    input: str
    output: str
    phase: str
    state: dict = field(default_factory=dict)


class PhaseContext:
    """What phase methods and ``Transform.setup`` see: locations, the plan state, the shard count."""

    def __init__(self, spec: WorkerSpec, transform: Transform):
        self.spec = spec
        self.input: Location = open_location(spec.input)
        self.output: Location = open_location(spec.output)
        self.work: Location = self.output.sub(f"{WORK}/work")
        self.state = spec.state
        self.num_shards = transform.num_shards()

    def read_input(self, task: FileTask, transform: Transform, columns: list[str] | None) -> pa.Table:
        return read_checked(self.input, task, transform, columns)


def read_checked(loc: Location, task: FileTask, transform: Transform, columns: list[str] | None) -> pa.Table:
    """Read one input file: footer and schema checks first, then the data, then text checks."""
    where = task.path
    if task.size == 0:
        raise InputError(
            f"{where}: file is empty (0 bytes), not a Parquet file",
            "remove or re-export it, or pass --max-failed-files N to skip up to N bad files",
        )
    try:
        pf = loc.parquet_file(task.rel)
        schema = pf.schema_arrow
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(
            f"{where}: not a readable Parquet file ({_short(e)})",
            "re-export or remove the file, or pass --max-failed-files N to skip up to N bad files",
        ) from None
    transform.check_schema(schema, where)
    try:
        table = pf.read(columns=columns)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(
            f"{where}: Parquet data is corrupt or truncated ({_short(e)})",
            "re-export or remove the file, or pass --max-failed-files N to skip up to N bad files",
        ) from None
    for col in transform.input_columns():
        if col.name not in table.column_names:
            continue
        arr = table.column(col.name)
        if not col.nullable and arr.null_count:
            first = _first_null(arr)
            raise InputError(
                f"{where}: column '{col.name}' has {arr.null_count} null value(s) (first at row {first})",
                f"fill or drop them first, e.g. prepline run filter --criteria \"{col.name} IS NOT NULL\"",
            )
        if col.kind == "string":
            try:
                arr.validate(full=True)
            except pa.ArrowInvalid as e:
                raise InputError(
                    f"{where}: column '{col.name}' holds text that is not valid UTF-8 ({_short(e)})",
                    "re-encode the text as UTF-8 before prepline (or drop those rows)",
                ) from None
    return table


def _first_null(arr: pa.ChunkedArray) -> int:
    import pyarrow.compute as pc

    return int(pc.index(pc.is_null(arr), True).as_py())


def _short(e: BaseException) -> str:
    s = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return s[:300]


class Worker:
    """Runs tasks of one phase in a worker process or actor. Errors become results, never crashes."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.transform = registry.build(spec.transform, spec.params)
        self.ctx = PhaseContext(spec, self.transform)
        self._ready = False

    def run(self, task: Any) -> dict:
        t0 = time.perf_counter()
        try:
            if self.spec.phase == FINAL:
                if not self._ready:
                    self.transform.setup(self.ctx)
                    self._ready = True
                result = process_file(self.transform, self.ctx, task)
            else:
                phase = {p.name: p for p in self.transform.phases()}[self.spec.phase]
                result = getattr(self.transform, phase.method)(task, self.ctx) or {}
            result["seconds"] = round(time.perf_counter() - t0, 4)
            return result
        except PreplineError as e:
            return {"error": e.message, "fix": e.fix, "seconds": round(time.perf_counter() - t0, 4)}
        except Exception as e:  # a bug or an unexpected library error: keep the traceback
            return {
                "error": f"{getattr(task, 'path', task)}: {type(e).__name__}: {_short(e)}",
                "fix": "see the traceback in the logs; report it if the input looks fine",
                "traceback": traceback.format_exc(limit=8),
                "seconds": round(time.perf_counter() - t0, 4),
            }


def process_file(transform: Transform, ctx: PhaseContext, task: FileTask) -> dict:
    table = ctx.read_input(task, transform, transform.read_columns())
    out = transform.transform(table, task)
    written, parts = [], {}
    bytes_out = docs_out = 0
    for sub, t in sorted(out.parts.items()):
        rel_out = f"{sub}/{task.rel}" if sub else task.rel
        bytes_out += ctx.output.write_parquet(rel_out, t)
        written.append(rel_out)
        parts[sub] = t.num_rows
        docs_out += t.num_rows
    stats = {
        "docs_in": table.num_rows,
        "docs_out": docs_out,
        "removed": {k: int(v) for k, v in sorted(out.removed.items()) if v},
        "counters": {k: int(v) for k, v in sorted(out.counters.items())},
        "bytes_in": task.size,
        "bytes_out": bytes_out,
        "outputs": written,
        "parts": parts,
    }
    metadata.check_file_counts(task.rel, stats)
    return stats


# ----------------------------------------------------------------------------------------------
# driver


@dataclass
class RunResult:
    metadata: dict
    output: str
    resumed: bool = False  # True when a complete earlier run was found and nothing ran


ProgressFactory = Callable[[str, int], Any]


def fingerprint(transform: Transform, files: list[FileInfo], input_uri: str) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"t": transform.name, "p": transform.config.to_dict(), "in": input_uri}, sort_keys=True, default=list).encode())
    for f in files:
        h.update(f"{f.rel}\0{f.size}\n".encode())
    return h.hexdigest()[:16]


def list_input(inp: Location) -> list[FileInfo]:
    if not inp.exists():
        raise InputError(f"input folder {inp.uri} does not exist", "check the --input path (or the S3 URI and credentials)")
    files = inp.list_files(".parquet")
    if not files:
        others = [f.rel for f in inp.list_all() if not f.rel.startswith(("_", "."))][:5]
        if others:
            raise InputError(
                f"input folder {inp.uri} has no .parquet files (found e.g. {', '.join(others)})",
                "point --input at a folder of Parquet files (sub-folders are read too)",
            )
        raise InputError(f"input folder {inp.uri} is empty", "point --input at a folder of Parquet files")
    return files


def run_transform(
    name: str,
    params: dict | None,
    options: RunOptions,
    progress: ProgressFactory | None = None,
) -> RunResult:
    """Run transform ``name`` with ``params`` (validated) according to ``options``."""
    t_start = time.perf_counter()
    started = metadata.now_iso()
    transform = registry.build(name, params or {})
    inp, out = open_location(options.input), open_location(options.output)
    if inside(out, inp):
        raise ConfigError(
            f"output {out.uri} is inside input {inp.uri}: the run would read its own output",
            "choose an output folder outside the input folder",
        )
    if inside(inp, out):
        raise ConfigError(f"input {inp.uri} is inside output {out.uri}", "choose an output folder that does not contain the input")
    files = list_input(inp)
    fp = fingerprint(transform, files, inp.uri)

    prior = _read_json(out, "metadata.json")
    run_json = _read_json(out, f"{WORK}/run.json")
    if not options.overwrite:
        if prior and prior.get("status") == "success" and prior.get("fingerprint") == fp and run_json is None:
            log.info("output %s is already complete (same input and parameters): nothing to do", out.uri)
            return RunResult(prior, out.uri, resumed=True)
        if run_json is not None and run_json.get("fingerprint") != fp:
            raise ConfigError(
                f"output {out.uri} holds an unfinished run with other input or parameters",
                "rerun with the same parameters to resume it, or pass --overwrite to start over",
            )
        if run_json is None and out.exists() and [f for f in out.list_all()]:
            raise ConfigError(f"output folder {out.uri} is not empty", "choose an empty folder or pass --overwrite")
    else:
        out.delete()
        prior = run_json = None
    if isinstance(out, LocalLocation):
        out.clean_temp_files()
    tasks = [FileTask(inp.path(f.rel), f.rel, f.size) for f in files]
    _check_first_schema(transform, inp, tasks[0])
    out.write_bytes(f"{WORK}/run.json", json.dumps({"fingerprint": fp, "transform": name}).encode())

    from prepline.runtime import make_executor

    failures: dict[str, dict] = {}
    phase_info: dict[str, dict] = {}
    resumed: list[str] = []
    live = list(tasks)
    results: dict[str, dict[str, dict]] = {}
    executor = make_executor(options)
    try:
        for phase in transform.phases() + [Phase(FINAL, "files", "transform")]:
            if phase.name == FINAL:
                plan = transform.plan(results, live)
                live = [FileTask(t.path, t.rel, t.size, plan.file_extras.get(t.rel, {})) for t in live]
                state = plan.state
            else:
                state = {}
            items: list[Any] = list(live) if phase.over == "files" else list(range(transform.num_shards()))
            keyed = {(it.rel if isinstance(it, FileTask) else f"{it:05d}"): it for it in items}
            done = _load_markers(out, phase.name)
            res = {k: v for k, v in done.items() if k in keyed}
            if phase.name == FINAL:
                resumed = sorted(res)
            pending = [it for k, it in keyed.items() if k not in res]
            pending.sort(key=lambda it: -(it.size if isinstance(it, FileTask) else 0))
            spec = WorkerSpec(name, transform.config.to_dict(), inp.uri, out.uri, phase.name, state)
            t0 = time.perf_counter()
            bar = progress(phase.name, len(items)) if progress else None
            if bar:
                bar.advance(len(res))

            def on_result(item: Any, r: dict) -> bool:
                key = item.rel if isinstance(item, FileTask) else f"{item:05d}"
                if bar:
                    bar.advance(1)
                if "error" in r:
                    failures[key] = {"phase": phase.name, **r}
                    log.error("%s", r["error"])
                    return len(failures) <= options.max_failed_files
                res[key] = r
                out.write_bytes(f"{MARKERS}/{phase.name}/{key}.json", json.dumps(r, sort_keys=True).encode())
                return True

            ok = executor.run(spec, pending, on_result) if pending else True
            if bar:
                bar.close()
            phase_info[phase.name] = {
                "tasks": len(items),
                "resumed": len(items) - len(pending),
                "seconds": round(time.perf_counter() - t0, 3),
                "workers": executor.workers,
            }
            if not ok or len(failures) > options.max_failed_files:
                break
            results[phase.name] = res
            if phase.over == "files":
                live = [t for t in live if t.rel not in failures]
    finally:
        executor.close()

    final = results.get(FINAL, {})
    status = "success" if len(failures) <= options.max_failed_files and FINAL in results else "failed"
    finished: dict = {}
    if status == "success":
        spec = WorkerSpec(name, transform.config.to_dict(), inp.uri, out.uri, "finish", {})
        finished = transform.finish(results, PhaseContext(spec, transform))
    files_meta = {k: v for k, v in sorted(final.items())}
    meta = metadata.build(
        transform=name,
        parameters=transform.config.to_dict(),
        options={k: v for k, v in asdict(options).items() if k not in ("progress",)},
        fingerprint=fp,
        files=files_meta,
        failures=dict(sorted(failures.items())),
        skipped_files=resumed,
        started=started,
        seconds=time.perf_counter() - t_start,
        phases=phase_info,
        status=status,
        state_summary=transform.plan_summary(results) if status == "success" else None,
    )
    if finished:
        meta["finish"] = finished
    out.write_bytes("metadata.json", json.dumps(meta, indent=2, sort_keys=False, default=list).encode())
    if status != "success":
        first = next(iter(failures.values()), {})
        raise RunFailed(
            f"{name}: {len(failures)} file(s) failed (tolerance {options.max_failed_files}); first: {first.get('error')}",
            first.get("fix") or "see metadata.json 'failures'",
        )
    out.delete(WORK)
    return RunResult(meta, out.uri)


def _read_json(loc: Location, rel: str) -> dict | None:
    try:
        txt = loc.read_text(rel)
    except Exception:
        return None
    if not txt:
        return None
    try:
        return json.loads(txt)
    except json.JSONDecodeError:
        return None


def _load_markers(out: Location, phase: str) -> dict[str, dict]:
    prefix = f"{MARKERS}/{phase}"
    done = {}
    for f in out.list_all(prefix):
        if not f.rel.endswith(".json") or "/." in f.rel:
            continue
        key = f.rel[len(prefix) + 1 : -len(".json")]
        r = _read_json(out, f.rel)
        if r is not None and "error" not in r:
            done[key] = r
    return done


def _check_first_schema(transform: Transform, inp: Location, task: FileTask) -> None:
    """Fail in a second, on the driver, when the parameters do not fit the data at all."""
    if task.size == 0:
        return  # reported per file by the worker
    try:
        footer = getattr(inp, "parquet_footer", None)
        pf = footer(task.rel, task.size) if footer else inp.parquet_file(task.rel)
        schema = pf.schema_arrow
    except (pa.ArrowInvalid, OSError):
        return  # reported per file by the worker, which may be tolerated
    transform.check_schema(schema, task.path)
    transform.check_on_driver(schema, task.path)


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()
