"""``prepline pipeline list|compile|run``: pipelines by name or from a pipeline spec file, run
locally with kfp.local and a local Ray head per stage, then a summary of the run: where the time
went, the documents of every stage and branch, the accounting of every document, the training
(:mod:`prepline.tables`), and where the run's HTML report is (:mod:`prepline.report`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from prepline.errors import ConfigError, RunFailed


def _console():
    from rich.console import Console

    return Console(highlight=False)


def _say(line: str) -> None:
    """A line to the screen, never wrapped (paths to copy) and never through ``print``, which kfp.local
    swaps for an indenting one while a task runs."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _is_spec(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or Path(name).is_file()


def cmd_pipeline(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="prepline pipeline",
                                 description="List pipelines, compile a pipeline spec, or run a pipeline locally (kfp.local + local Ray).")
    sub = ap.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the pipelines (one per transform; each shipped spec, super and the recipes, and its chained form)")
    c = sub.add_parser("compile", help="compile a pipeline spec (YAML) into KFP YAML (nested and chained) and an Elyra template")
    c.add_argument("spec", help="a pipeline spec file (docs/pipelines.md), or 'super' for the shipped one")
    c.add_argument("--output", default=".", help="folder of <name>.yaml and <name>_chained.yaml (default: .)")
    c.add_argument("--elyra", default="", help="also write <name>.pipeline here (nodes from the catalog in elyra_templates/components)")
    r = sub.add_parser("run", help="run a pipeline")
    r.add_argument("name", help="a transform, 'super', a pipeline spec file (.yaml), or a compiled pipeline as uploaded to KFP (compiled/pipelines/NAME.yaml)")
    r.add_argument("--local", action="store_true", required=True, help="run on this machine with kfp.local (the only mode here; use `prepline kfp run` for a KFP server)")
    r.add_argument("--input", default=None, help="input folder or file (default: build the bundled sample)")
    r.add_argument("--work-root", default="runs/pipeline", help="where stage outputs go (default: runs/pipeline)")
    r.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a pipeline parameter; repeat. A list: languages=en,fr or JSON (languages='[\"en\", \"fr\"]'); "
                        "an object: JSON (overrides_json='{\"filter\": {...}}'); e.g. text_field=content, text_column=text")
    r.add_argument("--sample-docs", type=int, default=None, help="size of the sample built when --input is not given")
    r.add_argument("--timings-json", default="", help="also write each task's duration and the per-kind summary here")
    r.add_argument("--verbose", action="store_true", help="show every task's whole log (kfp's executor lines too), not only prepline's lines")
    a = ap.parse_args(argv)
    if a.action == "list":
        from prepline.pipelines.factory import pipelines

        for n in sorted(pipelines()):
            print(n)
        return 0
    if a.action == "compile":
        return _compile(a.spec, Path(a.output), a.elyra)
    return _run(a)


def load_spec(name: str):
    from prepline.pipelines import spec as specs

    return specs.load(Path(name)) if _is_spec(name) else specs.shipped(name)


def _compile(name: str, out: Path, elyra: str) -> int:
    from kfp import compiler

    from prepline.pipelines.factory import spec_pipelines

    spec = load_spec(name)
    out.mkdir(parents=True, exist_ok=True)
    for stem, p in spec_pipelines(spec).items():
        compiler.Compiler().compile(p, str(out / f"{stem}.yaml"))
        print(out / f"{stem}.yaml")
    if elyra:
        from prepline.elyra_pipeline import spec_template

        Path(elyra).mkdir(parents=True, exist_ok=True)
        path = Path(elyra) / f"{spec.name}.pipeline"
        path.write_text(json.dumps(spec_template(spec), indent=2, ensure_ascii=False) + "\n")
        print(path)
    return 0


def param_values(items: list[str]) -> dict[str, Any]:
    """``--param NAME=VALUE`` flags: JSON values, or text; a list parameter (languages) also takes
    comma-separated values (``languages=en,fr``)."""
    from prepline.stage_params import PARAMS

    params: dict[str, Any] = {}
    for kv in items:
        k, _, v = kv.partition("=")
        if not _ or not k.strip():
            raise ConfigError(f"--param {kv!r} is not NAME=VALUE", "e.g. --param languages=en,ja --param text_field=content")
        k = k.strip()
        try:
            params[k] = json.loads(v)
        except json.JSONDecodeError:
            params[k] = v
        if k in PARAMS and PARAMS[k].type is list and isinstance(params[k], str):
            params[k] = [x.strip() for x in params[k].split(",") if x.strip()]
        elif k in PARAMS and PARAMS[k].type is str and not isinstance(params[k], str) and not k.endswith("_json"):
            params[k] = v  # a string parameter given a number or true: the text as typed
    return params


def local_args(work: Path, input: str | None, params: dict[str, Any], sample_docs: int | None = None) -> dict[str, Any]:
    """The arguments of a local run: the compiled defaults are for a cluster, so a local run passes its
    local values explicitly (a local Ray head per stage, local paths); ``params`` may still override
    them. Without ``input`` the bundled sample is built under ``work/sample`` (once)."""
    args: dict[str, Any] = {"work_root": str(work / "stages"), "provider": "local", "provider_json": "{}"}
    if input:
        args["input_path"] = str(Path(input).resolve()) if "://" not in input else input
    else:
        from prepline.sample import build_sample

        sample = work / "sample"
        if not (sample / "_truth" / "summary.json").exists():
            info = build_sample(str(sample), docs=sample_docs)
            _console().print(f"sample: {info['docs']:,} docs at {sample}")
        args["input_path"] = str(sample)
    for k, v in params.items():
        args[k] = json.dumps(v) if isinstance(v, dict) or (k.endswith("_json") and not isinstance(v, str)) else v
    return args


def preflight(name, values: dict[str, Any], input: str | None, work: Path):
    """Everything checked before a sample is built or a cluster starts (:mod:`prepline.preflight`):
    the pipeline's name (or a loaded pipeline spec), its parameters, then the input. Returns the
    pipeline's Target."""
    from prepline import preflight as pf

    target = pf.resolve(name) if isinstance(name, str) else pf.Target(name.name, "spec", name)
    pf.check_values(target, values)
    if target.kind == "chained" and not values.get("kfp_host"):
        import os

        from prepline.kfp.connection import ENV_ENDPOINT

        if not os.environ.get(ENV_ENDPOINT) and not os.environ.get("KUBERNETES_SERVICE_HOST"):  # (in a pod: the in-cluster service)
            raise ConfigError(f"{target.name} starts every stage as a run on a Kubeflow Pipelines server, and none is given",
                              f"pass --param kfp_host=http://<host> (or set {ENV_ENDPOINT}), or run '{target.spec.name}' locally")
    if input:
        pf.check_input(target, str(Path(input).resolve()) if "://" not in input else input,
                       {**values, "work_root": values.get("work_root") or str(work / "stages")})
    return target


def _run(a) -> int:
    work = Path(a.work_root).resolve()
    values = param_values(a.param)
    target = preflight(a.name, values, a.input, work)  # before anything is built or started
    from prepline.kfp.local import TaskTimes, run_local, strip_ansi
    from prepline.kfp.local_tasks import FAILURES
    from prepline.tables import print_run_counts, print_task_times

    pipeline, name = None, target.name
    if target.compiled:  # the compiled YAML as given (what a user uploads to KFP), not this code's pipeline
        from kfp import components

        pipeline = components.load_component_from_file(target.compiled)
    elif _is_spec(a.name):
        from prepline.pipelines.factory import spec_pipeline

        pipeline = spec_pipeline(target.spec)
    args = local_args(work, a.input, values, a.sample_docs)
    times = TaskTimes()
    started = time.time()
    try:
        with RunFolder(work / "stages", args, name, say=_say):
            secs = run_local(name, args, str(work / "kfp"), times, pipeline=pipeline, verbose=a.verbose)
    except RuntimeError as e:  # kfp.local's "pipeline finished with status FAILURE ..."
        msg = strip_ansi(str(e))
        _report(print_run_counts(work / "stages", started))  # what the stages up to the failure did
        if FAILURES:  # the failing task's own error, as `prepline run` would say it (its log: task.log)
            from prepline import errors

            f = FAILURES[-1]
            kind = getattr(errors, f.kind, None)
            kind = kind if isinstance(kind, type) and issubclass(kind, errors.PreplineError) else RunFailed
            raise kind(f.message, f.fix or f"see the task's log: {f.log}") from None
        raise RunFailed(msg, f"see the failing task's log above (every task's log: task.log in its folder under {work / 'kfp'})") from None
    print_task_times(times, secs)
    report = _report(print_run_counts(work / "stages", started))
    if a.timings_json:
        Path(a.timings_json).write_text(json.dumps({"pipeline": name, "seconds": secs, "by_kind": times.by_kind(),
                                                    "stage_overhead_seconds": times.stage_overhead(), "tasks": times.tasks}, indent=2))
    _console().print(f"[bold]{name}[/]: succeeded in {secs:,.0f}s; stage outputs and metadata.json under {work / 'stages'}, "
                     f"each KFP task's outputs and log (task.log) under {work / 'kfp'}")
    if report:
        print(f"report: {report}", flush=True)  # never wrapped: a path to copy
    return 0


def _report(run_dir) -> str | None:
    """Write the run report into the run folder; its path (None when the run wrote no stage)."""
    if run_dir is None:
        return None
    from prepline.report import write_report

    return write_report(run_dir)


class RunFolder:
    """The orientation of a local run: a header first (the pipeline, its input, where it writes),
    then the run id and its folder as soon as the run's first task creates it (the folder is named
    by kfp's job id, drawn when the run starts, or by the ``run_id`` parameter when one is given).
    ``folder`` is the run folder once known (None if the run wrote nothing)."""

    def __init__(self, stages_root: Path, args: dict[str, Any], name: str, say=None, poll: float = 0.5):
        import threading

        self.root, self.args, self.name, self.say, self.poll = stages_root, args, name, say, poll
        self.folder: Path | None = None
        self._before: set[str] = set()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def header(self) -> str:
        from prepline.stages import run_key

        given = self.args.get("run_id")
        where = f"{self.root}/{run_key(str(given))}/" if given else f"{self.root}/<run id>/"
        return (f"pipeline {self.name} (local): input {self.args.get('input_path', '?')}\n"
                f"  output: {where} (stage outputs, metadata.json, report.html); each task's log: {self.root.parent / 'kfp'}/")

    def _found(self) -> Path | None:
        from prepline.stages import run_key

        if self.args.get("run_id"):
            d = self.root / run_key(str(self.args["run_id"]))
            return d if d.is_dir() else None
        new = [d for d in self.root.iterdir() if d.is_dir() and d.name not in self._before] if self.root.is_dir() else []
        return min(new, key=lambda d: d.stat().st_mtime) if new else None

    def _watch(self) -> None:
        while not self._done.wait(self.poll):
            if self._check():
                return

    def _check(self) -> bool:
        if self.folder is None and (d := self._found()) is not None:
            self.folder = d
            if self.say:
                self.say(f"run {d.name}: {d}/")
        return self.folder is not None

    def __enter__(self) -> "RunFolder":
        import threading

        self._before = {d.name for d in self.root.iterdir()} if self.root.is_dir() else set()
        if self.say:
            self.say(self.header())
        self._thread = threading.Thread(target=self._watch, name="prepline-run-folder", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self._check()

