"""Running a pipeline on this machine with kfp's local runner, and where its time went."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from pathlib import Path

from prepline.errors import ConfigError
from prepline.kfp import require_kfp


class TaskTimes(logging.Filter):
    """Collects each kfp.local task's start and end from the local runner's log records
    ("Executing task 'x'" … "Task 'x' finished with status ..."), timed by the records themselves.
    Tasks of parallel branches overlap, so the kinds' totals can add up to more than the wall time.
    A filter on the root logger (it lets every record through): kfp.local replaces the root
    logger's handlers while it runs, but not its filters."""

    _START = re.compile(r"Executing task '([^']+)'")
    _END = re.compile(r"Task '([^']+)' finished with status (\w+)")

    def __init__(self) -> None:
        super().__init__()
        self._open: dict[tuple[int | None, str], float] = {}
        self.tasks: list[dict] = []  # {"task", "kind", "seconds", "status"} in finishing order

    def filter(self, record: logging.LogRecord) -> bool:
        msg = strip_ansi(str(record.msg))
        # ParallelFor iterations run at once in threads and reuse task names: key by thread too
        if m := self._START.search(msg):
            self._open[(record.thread, m.group(1))] = record.created
        elif (m := self._END.search(msg)) and (record.thread, m.group(1)) in self._open:
            task = m.group(1)
            self.tasks.append({"task": task, "kind": re.sub(r"-\d+$", "", task), "status": m.group(2),
                               "seconds": record.created - self._open.pop((record.thread, task))})
        return True

    def by_kind(self) -> dict[str, dict]:
        """Per task kind (prepare-args, start-ray-cluster, ...): count, total, mean, min, max seconds."""
        out: dict[str, dict] = {}
        for t in self.tasks:
            k = out.setdefault(t["kind"], {"n": 0, "total": 0.0, "min": float("inf"), "max": 0.0})
            k["n"] += 1
            k["total"] += t["seconds"]
            k["min"], k["max"] = min(k["min"], t["seconds"]), max(k["max"], t["seconds"])
        for k in out.values():
            k["mean"] = k["total"] / k["n"]
        return out

    def stage_overhead(self) -> float | None:
        """Mean seconds a stage spends outside its Ray job: prepare + start cluster + stop cluster."""
        k = self.by_kind()
        parts = ("prepare-args", "start-ray-cluster", "stop-ray-cluster")
        return sum(k[p]["mean"] for p in parts) if all(p in k for p in parts) else None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    """kfp.local colours task and pipeline names: without the escape codes."""
    return _ANSI.sub("", text)


def check_pipeline_args(name: str, pipeline, args: dict) -> None:
    """Refuse, before anything runs, an argument the pipeline does not have or stage parameters that
    cannot work (every stage's overrides, a simple pipeline's params_json)."""
    from prepline import registry
    from prepline.stage_params import check_overrides

    known = set(pipeline.component_spec.inputs or {})
    unknown = sorted(set(args) - known)
    if unknown:
        raise ConfigError(f"pipeline {name} has no parameter(s) {', '.join(unknown)}", f"its parameters: {', '.join(sorted(known))}")
    for k, v in args.items():
        kind = pipeline.component_spec.inputs[k].type
        ok = {"String": isinstance(v, str), "Integer": isinstance(v, int) and not isinstance(v, bool),
              "Boolean": isinstance(v, bool), "List": isinstance(v, list)}.get(kind, True)
        if not ok:
            raise ConfigError(f"pipeline {name}: parameter {k}={v!r} is not a {kind.lower()}", f"pass {k} as a {kind.lower()}")
    check_overrides(args.get("overrides_json", ""))
    if name in registry.names() and args.get("params_json"):
        try:
            params = json.loads(args["params_json"])
        except json.JSONDecodeError as e:
            raise ConfigError(f"params_json is not valid JSON ({e.msg} at char {e.pos})", 'e.g. {"num_shards": 8}') from None
        check_overrides(json.dumps({name: {"params": params}}))


def run_local(name: str, args: dict, pipeline_root: str, times: TaskTimes | None = None, pipeline=None, verbose: bool = False) -> float:
    """Run a pipeline (``pipeline``, or the one named ``name``) with kfp.local's SubprocessRunner in
    this Python (the local cluster provider starts a Ray head per stage). Returns the wall time;
    raises when the pipeline fails. With ``times``, each task's duration is collected there. Each
    task's log goes to task.log in its folder; only prepline's lines are shown, unless ``verbose``
    (:mod:`prepline.kfp.local_tasks`)."""
    require_kfp()
    import kfp.local

    from prepline.pipelines.factory import pipelines

    if pipeline is None:
        table = pipelines()
        if name not in table:
            raise ConfigError(f"unknown pipeline '{name}'", f"one of: {', '.join(sorted(table))} (or a pipeline spec file)")
        pipeline = table[name]
    check_pipeline_args(name, pipeline, args)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # the components run as subprocesses of this interpreter: put it first on PATH
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=pipeline_root, raise_on_error=True)
    root = logging.getLogger()
    if times is not None:
        root.addFilter(times)
    t0 = time.perf_counter()
    from prepline.kfp.local_tasks import task_output

    try:
        with task_output(verbose):
            pipeline(**args)
    finally:
        if times is not None:
            root.removeFilter(times)
    return time.perf_counter() - t0
