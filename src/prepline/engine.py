"""Runs a transform over a folder of Parquet files, on any runtime, resumably (the driver side).

:func:`run_transform` is a few named steps: open and check the paths, decide between resuming,
refusing and starting afresh, run the transform's pre-phases (global transforms) and the final
per-file map through an executor (:mod:`prepline.runtime`; the workers are :mod:`prepline.worker`),
then write ``metadata.json`` last. The driver writes a completion marker per task (under
``<output>/_prepline/markers/``) so that a rerun skips finished work. Outputs depend only on the
data and the parameters, never on the runtime, the worker count or the order in which files finish.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

import pyarrow as pa

from prepline import metadata, registry
from prepline.context import FINAL, MARKERS, ONCE, RSS_KEY, WORK, PhaseContext, WorkerSpec, task_key
from prepline.data_access import FileInfo, LocalLocation, Location, RemoteLocation, inside, open_location
from prepline.errors import (ConfigError, InputError, InternalError, Interrupted, OutputError, PreplineError, RunFailed,
                             ServiceError, ServiceUnavailable, os_error, user_mistake)
from prepline.progress import Tracker
from prepline.runtime import Executor, RunOptions, make_executor
from prepline.runtime.lock import LOCK, OutputLock, output_lock
from prepline.transform import FileTask, Phase, Transform

__all__ = ["RunOptions", "RunResult", "run_transform", "list_input", "fingerprint", "WORK", "MARKERS", "FINAL"]

log = logging.getLogger("prepline")


@dataclass
class RunResult:
    metadata: dict
    output: str
    resumed: bool = False  # True when a complete earlier run was found and nothing ran


#: makes the view of one phase's progress (a bar or log lines, :mod:`prepline.progress`); ``.close()`` ends it
ProgressFactory = Callable[[Tracker], Any]


def fingerprint(transform: Transform, files: list[FileInfo], input_uri: str) -> str:
    """The run's identity: transform, parameters, input, and each file's name, size and version tag
    (local mtime, S3 ETag: :attr:`FileInfo.tag`), so that a file edited in place, even to the same
    size, makes an unfinished run of the old file unresumable instead of mixing old and new data."""
    h = hashlib.sha256()
    h.update(json.dumps({"t": transform.name, "p": transform.config.to_dict(), "in": input_uri}, sort_keys=True, default=list).encode())
    for f in files:
        h.update(f"{f.rel}\0{f.size}\0{f.tag}\n".encode())
    return h.hexdigest()[:16]


def list_input(inp: Location, suffixes: tuple[str, ...] = (".parquet",)) -> list[FileInfo]:
    """The data files of an input folder: visible files ending with one of ``suffixes``."""
    kinds = "/".join(suffixes)
    if not inp.exists():
        raise InputError(f"input folder {inp.uri} does not exist", "check the --input path (or the URI and credentials)")
    files = inp.list_files(suffixes)
    if not files:
        others = [f.rel for f in inp.list_all() if not f.rel.startswith(("_", "."))][:5]
        if others:
            hint = " (other formats: prepline run ingest first)" if suffixes == (".parquet",) else ""
            raise InputError(
                f"input folder {inp.uri} has no {kinds} files (found e.g. {', '.join(others)})",
                f"point --input at a folder of {kinds} files (sub-folders are read too){hint}",
            )
        raise InputError(f"input folder {inp.uri} is empty", f"point --input at a folder of {kinds} files")
    return files


def open_input(uri: str, out: Location, suffixes: tuple[str, ...]) -> tuple[Location, list[FileInfo]]:
    """The input root and its files: a folder, or a single file (its folder and its name)."""
    if not uri.strip():
        raise ConfigError("--input is empty (it would be the current folder)", "pass the input folder, file or s3:// URI; an unset shell variable gives an empty value")
    inp = open_location(uri)
    if inside(out, inp):
        raise ConfigError(
            f"output {out.uri} is inside input {inp.uri}: the run would read its own output",
            "choose an output folder outside the input folder",
        )
    if inside(inp, out):
        raise ConfigError(f"input {inp.uri} is inside output {out.uri}", "choose an output folder that does not contain the input")
    one = inp.file_info()
    if one is None:
        return inp, list_input(inp, suffixes)
    parent, name = inp.parent_and_name()
    if not name.endswith(suffixes):
        raise InputError(f"input file {inp.uri} is not a {'/'.join(suffixes)} file", "pass a folder, or a file this transform reads")
    return parent, [FileInfo(name, one.size, one.tag)]


@dataclass
class _Run:
    """The driver's state of one run, filled in step by step."""

    name: str
    transform: Transform
    options: RunOptions
    inp: Location
    out: Location
    tasks: list[FileTask]
    fingerprint: str
    #: rel -> [size, version tag] of every input file, kept in run.json to name what changed
    inputs: dict[str, list]
    started: str
    t_start: float
    #: input files that failed (bad input, tolerated up to --max-failed-files)
    failures: dict[str, dict] = field(default_factory=dict)
    phases: dict[str, dict] = field(default_factory=dict)
    #: phase -> task key -> result, filled as tasks finish (a failed run's metadata says what was written)
    results: dict[str, dict[str, dict]] = field(default_factory=dict)
    resumed: list[str] = field(default_factory=list)
    complete: bool = False  # every phase ran
    #: what stopped the run (a task that may not be tolerated, the storage, a signal), if anything did
    fatal: PreplineError | None = None
    fatal_task: dict | None = None
    lock: OutputLock | None = None
    #: seconds before the workers could start: opening, listing, connecting to Ray; then the workers' own start
    startup: float = 0.0
    executor_stats: dict = field(default_factory=dict)

    def spec(self, phase: str, state: dict | None = None) -> WorkerSpec:
        return WorkerSpec(self.name, self.transform.config.to_dict(), self.inp.uri, self.out.uri, phase, state or {}, self.out.fence)

    @property
    def too_many_failures(self) -> bool:
        return len(self.failures) > self.options.max_failed_files


def run_transform(name: str, params: dict | None, options: RunOptions, progress: ProgressFactory | None = None) -> RunResult:
    """Run transform ``name`` with ``params`` (validated) according to ``options``.

    Every failure ends as a :class:`~prepline.errors.PreplineError` naming what failed and the fix;
    once the run holds its output's lock and has started, ``metadata.json`` records the failure
    (and what was written before it) and a rerun of the same command resumes.
    """
    run = _open(name, params, options)
    with output_lock(run.out) as lock:
        run.lock = lock
        run.out.fence = lock.fence()  # every write of this run (driver and workers) checks the lock first
        done = _resume_or_refuse(run)
        if done is not None:
            if empty := empty_output_error(run.transform, done.metadata.get("totals", {}), options.allow_empty_output):
                raise empty
            return done
        _start(run)
        _run_phases(run, progress)
        return _conclude(run)


def _run_phases(run: _Run, progress: ProgressFactory | None) -> None:
    """Every phase in order; a fault that is not a tolerated input file becomes ``run.fatal``."""
    executor: Executor | None = None
    try:
        executor = make_executor(run.options)
        run.startup, run.executor_stats = time.perf_counter() - run.t_start, executor.stats
        on_driver = make_executor(replace(run.options, runtime="local", workers=1, gpus_per_worker=0.0))
        for phase in run.transform.phases() + [Phase(FINAL, "files", "transform")]:
            if phase.name == FINAL and run.transform.phases():
                _check_input_unchanged(run)  # the plan was made from the files as they were
            if not _run_phase(run, phase, on_driver if phase.on_driver else executor, progress):
                return
        _check_input_unchanged(run)
        run.complete = True
    except BaseException as e:  # noqa: BLE001 - recorded in metadata.json, raised again by _conclude
        run.fatal = as_error(e, run.out.uri)
        if executor is not None and not isinstance(e, Exception):  # a signal: stop the workers now
            log.error("%s: stopping (%s)", run.name, run.fatal.message)
            executor.abort()
    finally:
        if executor is not None:
            executor.close()


def _check_input_unchanged(run: _Run) -> None:
    """Fail the run when an input file (not one that failed) was edited, replaced or removed while
    the run read it: the phases would have mixed the old and the new content."""
    if open_location(run.options.input).uri == run.inp.uri:  # a folder: one listing
        now = {f.rel: [f.size, f.tag] for f in run.inp.list_files(run.transform.input_suffixes)}
    else:  # a single file
        now = {rel: [f.size, f.tag] for rel in run.inputs if (f := run.inp.file_info(rel)) is not None}
    changed = sorted(rel for rel, was in run.inputs.items() if rel not in run.failures and now.get(rel) != list(was))
    if changed:
        raise InputError(
            f"input file(s) changed while the run read them: {', '.join(changed[:5])}{' …' if len(changed) > 5 else ''} "
            "(edited, replaced or removed): the output would mix old and new content",
            "keep the input unchanged while a run reads it, then rerun with --overwrite",
        )


def as_error(e: BaseException, output: str = "") -> PreplineError:
    """Any exception as a PreplineError: signals, write errors of the output, bugs."""
    if isinstance(e, PreplineError):
        return e
    if isinstance(e, KeyboardInterrupt):
        err: PreplineError = Interrupted("interrupted (Ctrl-C)", "rerun the same command to resume")
    elif (u := user_mistake(e)) is not None:
        err = u
    elif isinstance(e, OSError) and e.errno is not None:
        err = os_error(e, output)
    else:
        text = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        err = InternalError(f"unexpected {type(e).__name__}: {text}", "rerun with --debug for the traceback and report it (this is a bug)")
    err.__cause__ = e  # --debug shows it
    return err


def check_output_path(raw: str, out: Location) -> None:
    """Refuse an --output that can only be a mistake, before anything is written there: empty (an
    unset shell variable: the current folder), the file system's root, a bucket's root."""
    if not raw.strip():
        raise ConfigError("--output is empty (it would be the current folder)",
                          "pass the output folder (a new or empty one, or an earlier prepline output); an unset shell variable gives an empty value")
    if isinstance(out, LocalLocation):
        real = os.path.realpath(out.path())
        if os.path.dirname(real) == real:
            raise ConfigError(f"--output {raw!r} is the root of the file system ({real})",
                              "pass a folder of its own for the output, e.g. /data/out (an unset shell variable in \"$OUT/\" gives /)")
    elif isinstance(out, RemoteLocation) and not out.prefix:
        raise ConfigError(f"--output {out.uri} is the root of a bucket", f"pass a folder of its own in the bucket, e.g. {out.uri}/<name>")


def _open(name: str, params: dict | None, options: RunOptions) -> _Run:
    """Build the transform (parameters checked), check the paths and list the input."""
    t_start, started = time.perf_counter(), metadata.now_iso()
    transform = registry.build(name, params or {})
    if options.runtime == "local" and type(transform).warm.__func__ is not Transform.warm.__func__:  # the driver runs tasks too: its
        # warm-up overlaps the checks and the listing below
        threading.Thread(target=_warm, args=(type(transform),), name="prepline-warm", daemon=True).start()
    out = open_location(options.output)
    check_output_path(options.output, out)
    inp, files = open_input(options.input, out, transform.input_suffixes)
    tasks = [FileTask(inp.path(f.rel), f.rel, f.size) for f in files]
    return _Run(name, transform, options, inp, out, tasks, fingerprint(transform, files, open_location(options.input).uri),
                {f.rel: [f.size, f.tag] for f in files}, started, t_start)


def _warm(cls: type) -> None:
    try:
        cls.warm()
    except Exception as e:  # noqa: BLE001 - only a head start: the first task meets (and reports) the same failure
        log.debug("%s: warm-up failed: %s", cls.name, e)


def _resume_or_refuse(run: _Run) -> RunResult | None:
    """A complete earlier run of the same input and parameters: its result. An unfinished run of other
    input or parameters, or a folder holding something else: refused (unless --overwrite)."""
    out = run.out
    if run.options.overwrite:
        _check_overwrite(out)
        _clear(out)
        return None
    prior = _read_json(out, "metadata.json")
    run_json = _read_json(out, f"{WORK}/run.json")
    if prior and prior.get("status") == "success" and prior.get("fingerprint") == run.fingerprint and run_json is None:
        log.info("output %s is already complete (same input and parameters): nothing to do", out.uri)
        _clear(out, WORK)  # what a run killed while cleaning up left behind
        return RunResult(metadata.join_files(out, prior), out.uri, resumed=True)
    if run_json is not None and run_json.get("fingerprint") != run.fingerprint:
        _refuse_changed_input(run, run_json)
        raise OutputError(
            f"output {out.uri} holds an unfinished run with other input or parameters",
            "rerun with the same parameters to resume it, or pass --overwrite to start over",
        )
    if run_json is None and any(f.rel != LOCK for f in out.list_all()):
        raise OutputError(f"output folder {out.uri} is not empty", "choose an empty folder or pass --overwrite")
    return None


def _refuse_changed_input(run: _Run, run_json: dict) -> None:
    """An unfinished run of the same transform and parameters whose input files were edited, added
    or removed since: name them (resuming would mix the old files' work with the new files')."""
    then = run_json.get("inputs")
    params = json.loads(json.dumps(run.transform.config.to_dict(), default=list))
    if (not isinstance(then, dict) or run_json.get("transform") != run.name or run_json.get("parameters") != params
            or run_json.get("input") != run.inp.uri):
        return
    changed = sorted(k for k in then.keys() & run.inputs.keys() if list(then[k]) != list(run.inputs[k]))
    added, gone = sorted(run.inputs.keys() - then.keys()), sorted(then.keys() - run.inputs.keys())
    if not (changed or added or gone):
        return
    what = "; ".join(f"{label} {', '.join(names[:5])}{' …' if len(names) > 5 else ''}"
                     for label, names in (("changed:", changed), ("added:", added), ("removed:", gone)) if names)
    raise OutputError(
        f"output {run.out.uri} holds an unfinished run whose input files changed since it started ({what}): "
        "resuming would mix work done on the old files with the new ones",
        "restore the input files as they were to resume, or pass --overwrite to start over with the input as it is now",
    )


#: how many of the files --overwrite would have deleted an error lists
_SHOWN = 5


def _is_prepline_output(out: Location, files: list[FileInfo]) -> bool:
    """True when ``out`` holds a prepline run's own files: its work folder (run.json, completion
    markers, work files, a lease) or a metadata.json that prepline wrote."""
    if any(f.rel.startswith(WORK + "/") and f.rel != LOCK for f in files):
        return True
    if any(f.rel == "metadata.json" for f in files):
        meta = _read_json(out, "metadata.json")
        return isinstance(meta, dict) and "transform" in meta and "fingerprint" in meta
    return False


def _check_overwrite(out: Location) -> None:
    """--overwrite deletes an earlier prepline output or an empty folder, nothing else: a folder of
    other files (the current folder of an unset variable, a bucket's other objects) is refused with
    the list of what would have been deleted."""
    files = [f for f in out.list_all() if f.rel != LOCK]
    if not files or _is_prepline_output(out, files):
        return
    shown = ", ".join(f.rel for f in files[:_SHOWN]) + (f", ... ({len(files) - _SHOWN} more)" if len(files) > _SHOWN else "")
    raise OutputError(
        f"output {out.uri} is not a prepline output (no metadata.json or {WORK}/ of a run): --overwrite would delete "
        f"{len(files)} file(s) that prepline did not write: {shown}",
        "choose a new or empty --output folder (or one an earlier prepline run wrote); delete those files yourself if they are yours to lose",
    )


def _clear(out: Location, under: str = "") -> None:
    """Delete everything under ``under`` ('' = the whole output) but the lock this run holds; the
    work folder's run.json first, so that a run killed half-way through this is seen as complete."""
    depth = len(under.split("/")) if under else 0
    tops = {"/".join(f.rel.split("/")[: depth + 1]) for f in out.list_all(under)}
    for t in sorted(tops, key=lambda t: (t != f"{WORK}/run.json", t)):
        if t == LOCK:
            continue
        if t == WORK:
            _clear(out, WORK)
        else:
            out.delete(t)


def _start(run: _Run) -> None:
    """Check the first file's schema on the driver, then claim the output folder (run.json)."""
    if isinstance(run.out, LocalLocation):
        run.out.clean_temp_files()
    _check_first_schema(run.transform, run.inp, run.tasks[0])
    try:
        run.out.write_bytes(f"{WORK}/run.json", json.dumps({"fingerprint": run.fingerprint, "transform": run.name,
                                                             "parameters": run.transform.config.to_dict(), "input": run.inp.uri,
                                                             "inputs": run.inputs}, default=list).encode())
    except OSError as e:
        raise os_error(e, run.out.uri) from None


def _tracker(run: _Run, phase: Phase, keyed: dict[str, Any], done: dict[str, dict]) -> Tracker:
    """The progress of one phase, its tasks finished by an earlier run counted as done."""
    by_files = phase.over == "files"
    size = {k: getattr(it, "size", 0) for k, it in keyed.items()}
    t = Tracker(run.name, phase.name, len(keyed), sum(size.values()), by_files, counts_docs=phase.name == FINAL)
    t.resumed(len(done), sum(int(r.get("docs_in", 0)) for r in done.values()), sum(size[k] for k in done))
    return t


_task_key = task_key


def _phase_items(run: _Run, phase: Phase, files: list[FileTask]) -> list[Any]:
    """A phase's tasks: the input files, the shard numbers, or the one task of a ``once`` phase."""
    if phase.over == "files":
        return files
    if phase.over == "once":
        return [ONCE]
    return list(range(run.transform.num_shards()))


def _run_phase(run: _Run, phase: Phase, executor: Executor, progress: ProgressFactory | None) -> bool:
    """Run one phase's pending tasks (finished ones are read back from their markers). False: stop."""
    live = [t for t in run.tasks if t.rel not in run.failures]
    first = (run.transform.phases() + [phase])[0].name  # a file may fail (tolerated) only before any phase used it
    state: dict = {}
    if phase.name == FINAL:
        plan = run.transform.plan(run.results, live)
        live = [FileTask(t.path, t.rel, t.size, plan.file_extras.get(t.rel, {})) for t in live]
        state = plan.state
    items = _phase_items(run, phase, live)
    keyed = {_task_key(it): it for it in items}
    res = {k: v for k, v in _load_markers(run.out, phase.name).items() if k in keyed}
    if phase.name == FINAL:
        run.resumed = sorted(res)
    pending = sorted((it for k, it in keyed.items() if k not in res), key=lambda it: -(it.size if isinstance(it, FileTask) else 0))
    t0 = time.perf_counter()
    tracker = _tracker(run, phase, keyed, res)
    view = progress(tracker) if progress else None

    peak: list[float] = []  # the workers' peak RSS after each task of this run (a resumed task has none)

    def on_result(item: Any, r: dict) -> bool:
        key = _task_key(item)
        if (rss := r.pop(RSS_KEY, None)) is not None:
            peak.append(rss)
        tracker.finished(key, int(r.get("docs_in", 0)) if "error" not in r else 0, getattr(item, "size", 0))
        run.lock.check()  # an S3 lease taken over by another run: stop before writing more
        if "error" in r:
            log.error("%s", r["error"])
            after_plan = phase.name != first and run.transform.plan_needs_every_file
            if isinstance(item, FileTask) and r.get("kind") == "input" and not after_plan:  # a bad input file: tolerated up to N
                run.failures[key] = {"phase": phase.name, **r}
                return not run.too_many_failures
            if isinstance(item, FileTask) and r.get("kind") == "input":
                # an earlier phase read this file into the plan (its documents may be the kept copies of
                # duplicates in other files): the plan no longer holds, so the run fails
                r = {**r, "error": f"{key} failed in phase '{phase.name}' after its documents went into {run.name}'s plan "
                                   f"(phase '{first}'), which now counts on them: {r['error']}",
                     "fix": f"repair, restore or remove {key} (a file that fails after the plan cannot be tolerated, even with "
                            f"--max-failed-files), then rerun; if you removed it, rerun with --overwrite"}
            run.fatal_task = {"phase": phase.name, "task": key, **r}  # never tolerated: a shard, a lost worker, the storage
            run.fatal = task_error(r)
            return False
        res[key] = r
        run.out.write_bytes(f"{MARKERS}/{phase.name}/{key}.json", json.dumps(r, sort_keys=True).encode())
        return True

    run.results[phase.name] = res
    retried, stalled = executor.stats.get("retried", 0), executor.stats.get("stalled", 0)
    try:
        ok = executor.run(run.spec(phase.name, state), pending, on_result, tracker.report) if pending else True
    finally:
        if view:
            view.close()
    run.phases[phase.name] = {"tasks": len(items), "resumed": len(items) - len(pending), "retried": executor.stats.get("retried", 0) - retried,
                              **({"stalled": n} if (n := executor.stats.get("stalled", 0) - stalled) else {}),
                              "seconds": round(time.perf_counter() - t0, 3), "workers": executor.workers,
                              **({"worker_peak_rss_mib": max(peak)} if peak else {}),
                              **({"on_driver": True} if phase.on_driver else {})}
    return ok and not run.too_many_failures


#: a task result's kind -> the error it stops the run with
_KINDS: dict[str, type[PreplineError]] = {"input": InputError, "transient": ServiceUnavailable, "service": ServiceError,
                                          "output": OutputError, "internal": InternalError, "usage": ConfigError}


def task_error(r: dict) -> PreplineError:
    """The error a failed task's result stands for (worker lost: RunFailed)."""
    return _KINDS.get(r.get("kind", ""), RunFailed)(r["error"], r.get("fix") or "see metadata.json 'error'")


def _conclude(run: _Run) -> RunResult:
    """Finish (driver-side), write metadata.json last, then raise or clean the work folder."""
    finished: dict = {}
    if run.complete and not run.too_many_failures and run.fatal is None:
        try:
            finished = run.transform.finish(run.results, PhaseContext(run.spec("finish"), run.transform.num_shards()))
        except Exception as e:  # noqa: BLE001 - recorded like any other fault
            run.fatal = as_error(e, run.out.uri)
    status = "success" if run.complete and not run.too_many_failures and run.fatal is None else "failed"
    meta = metadata.build(
        transform=run.name,
        parameters=run.transform.config.to_dict(),
        options={k: v for k, v in asdict(run.options).items() if k not in ("progress",)},
        fingerprint=run.fingerprint,
        files=dict(sorted(run.results.get(FINAL, {}).items())),
        failures=dict(sorted(run.failures.items())),
        skipped_files=run.resumed,
        started=run.started,
        seconds=time.perf_counter() - run.t_start,
        startup_seconds=run.startup + run.executor_stats.get("worker_start_seconds", 0.0),
        phases=run.phases,
        status=status,
        state_summary=run.transform.plan_summary(run.results) if status == "success" else None,
    )
    if finished:
        meta["finish"] = finished
    work = [f for f in run.out.list_all(WORK) if f.rel != LOCK]  # the phases' files and markers: deleted below on success
    meta["totals"]["work_files"], meta["totals"]["work_bytes"] = len(work), sum(f.size for f in work)
    meta["totals"]["driver_peak_rss_mib"] = metadata.peak_rss_mib()  # the process that ran the driver (with an in-process pool: its tasks too)
    meta["totals"]["worker_peak_rss_mib"] = max((p["worker_peak_rss_mib"] for p in run.phases.values() if "worker_peak_rss_mib" in p), default=None)
    _describe(run.transform, meta)
    if status == "success" and (empty := empty_output_error(run.transform, meta["totals"], run.options.allow_empty_output)):
        run.fatal, meta["status"] = empty, "failed"  # the work folder stays: a rerun with --allow-empty-output resumes
    if run.fatal is not None:
        meta["error"] = {"message": run.fatal.message, "fix": run.fatal.fix, "type": type(run.fatal).__name__,
                         **({k: v for k, v in run.fatal_task.items() if k not in ("error", "fix")} if run.fatal_task else {})}
    _write_metadata(run, meta)
    if run.fatal is not None:
        raise run.fatal
    if status != "success":
        first = next(iter(run.failures.values()), {})
        raise RunFailed(
            f"{run.name}: {len(run.failures)} input file(s) failed (tolerance {run.options.max_failed_files}); first: {first.get('error')}",
            first.get("fix") or "see metadata.json 'failures'",
        )
    _clear(run.out, WORK)
    return RunResult(meta, run.out.uri)


def empty_output_error(transform: Transform, totals: dict, allowed: bool) -> RunFailed | None:
    """The error of a run that removed every document of a non-empty input (never silent: a wrong
    text field or criterion looks exactly like this), naming the reasons; None when allowed."""
    if allowed or not totals.get("docs_in") or totals.get("docs_out"):
        return None
    reasons = sorted(totals.get("removed", {}).items(), key=lambda kv: (-kv[1], kv[0]))
    why = ", ".join(f"{transform.label(k)} {v:,}" for k, v in reasons) or "no reason recorded"
    fix = transform.empty_output_fix(reasons[0][0]) if reasons else f"check {transform.name}'s parameters against the data"
    return RunFailed(f"{transform.name} removed all {totals['docs_in']:,} input documents (removed: {why}): the output is empty",
                     f"{fix}; if an empty output is what you want, pass --allow-empty-output")


def _describe(transform: Transform, meta: dict) -> None:
    """What the UI and the report show: removal reasons and counters by their names for people
    (``labels``, where they differ from the key) and the transform's headline numbers."""
    t = meta["totals"]
    labels = {k: transform.label(k) for k in [*t["removed"], *t["counters"]]}
    meta["labels"] = {k: v for k, v in labels.items() if v != k}
    meta["headline"] = metadata.headline(meta, transform.headline, transform.label)


def _write_metadata(run: _Run, meta: dict) -> None:
    """metadata.json, last. When the output cannot take it, a failed run still fails with its own error."""
    try:
        doc, detail = metadata.split_files(meta)
        if detail is not None:  # before metadata.json, which names it
            run.out.write_bytes(metadata.FILES_DETAIL, detail)
        run.out.write_bytes("metadata.json", json.dumps(doc, indent=2, sort_keys=False, default=list, allow_nan=False).encode())
    except Exception as e:  # noqa: BLE001
        err = as_error(e, run.out.uri)
        if run.fatal is None:
            raise err from None
        log.error("could not write metadata.json (%s): %s", err.message, run.fatal.message)


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
    if task.size == 0 or not task.rel.endswith(".parquet"):
        return  # reported per file by the worker; other formats are read by the transform itself
    try:
        schema = inp.parquet_file(task.rel, task.size).schema_arrow
    except (pa.ArrowInvalid, OSError):
        return  # reported per file by the worker, which may be tolerated
    transform.check_schema(schema, task.path)
    transform.check_on_driver(schema, task.path)
