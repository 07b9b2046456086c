"""``prepline pipeline list|compile|run``: pipelines by name or from a pipeline spec file, run
locally with kfp.local and a local Ray head per stage, then a summary of the run: where the time
went, the documents of every stage and branch, the accounting of every document, the training."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from prepline.errors import ConfigError, RunFailed


def _console():
    from rich.console import Console

    return Console(highlight=False)


def _is_spec(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or Path(name).is_file()


def cmd_pipeline(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="prepline pipeline",
                                 description="List pipelines, compile a pipeline spec, or run a pipeline locally (kfp.local + local Ray).")
    sub = ap.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the pipelines (one per transform, the super pipeline and its chained form)")
    c = sub.add_parser("compile", help="compile a pipeline spec (YAML) into KFP YAML (nested and chained) and an Elyra template")
    c.add_argument("spec", help="a pipeline spec file (docs/pipelines.md), or 'super' for the shipped one")
    c.add_argument("--output", default=".", help="folder of <name>.yaml and <name>_chained.yaml (default: .)")
    c.add_argument("--elyra", default="", help="also write <name>.pipeline here (nodes from the catalog in elyra_templates/components)")
    r = sub.add_parser("run", help="run a pipeline")
    r.add_argument("name", help="a transform, 'super', or a pipeline spec file (.yaml)")
    r.add_argument("--local", action="store_true", required=True, help="run on this machine with kfp.local (the only mode here; use `prepline kfp run` for a KFP server)")
    r.add_argument("--input", default=None, help="input folder or file (default: build the bundled sample)")
    r.add_argument("--work-root", default="runs/pipeline", help="where stage outputs go (default: runs/pipeline)")
    r.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a pipeline parameter (JSON values allowed); repeat")
    r.add_argument("--sample-docs", type=int, default=None, help="size of the sample built when --input is not given")
    r.add_argument("--timings-json", default="", help="also write each task's duration and the per-kind summary here")
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


def _args(a, work: Path) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for kv in a.param:
        k, _, v = kv.partition("=")
        if not _:
            raise ConfigError(f"--param {kv!r} is not NAME=VALUE", "e.g. --param languages='[\"en\",\"ja\"]'")
        try:
            params[k] = json.loads(v)
        except json.JSONDecodeError:
            params[k] = v
    return local_args(work, a.input, params, a.sample_docs)


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


def _run(a) -> int:
    from prepline.kfp.local import TaskTimes, run_local, strip_ansi

    pipeline, name = None, a.name
    if _is_spec(a.name):
        from prepline.pipelines.factory import spec_pipeline

        spec = load_spec(a.name)
        pipeline, name = spec_pipeline(spec), spec.name
    work = Path(a.work_root).resolve()
    args = _args(a, work)
    times = TaskTimes()
    started = time.time()
    try:
        secs = run_local(name, args, str(work / "kfp"), times, pipeline=pipeline)
    except RuntimeError as e:  # kfp.local's "pipeline finished with status FAILURE ..."
        msg = strip_ansi(str(e))
        print_run_counts(work / "stages", started)  # what the stages up to the failure did
        raise RunFailed(msg, f"see the failing task's log above; its outputs are under {work / 'kfp'}") from None
    print_task_times(times, secs)
    print_run_counts(work / "stages", started)
    if a.timings_json:
        Path(a.timings_json).write_text(json.dumps({"pipeline": name, "seconds": secs, "by_kind": times.by_kind(),
                                                    "stage_overhead_seconds": times.stage_overhead(), "tasks": times.tasks}, indent=2))
    _console().print(f"[bold]{name}[/]: succeeded in {secs:,.0f}s; stage outputs and metadata.json under {work / 'stages'}, "
                     f"KFP task outputs and logs under {work / 'kfp'}")
    return 0


# ----------------------------------------------------------------------------------------------
# the summary of a run


def _newest_run_dir(stages_root: Path, since: float):
    """The run folder (``<work_root>/<run id>``) written since ``since`` (this process's run), if any."""
    dirs = [d for d in stages_root.iterdir() if d.is_dir() and d.stat().st_mtime >= since - 1] if stages_root.exists() else []
    return max(dirs, key=lambda d: d.stat().st_mtime) if dirs else None


def _removed_cell(meta: dict) -> str:
    """Removed documents by reason (filter's criterion_<n> spelled out), lang_id's split, failed files."""
    tot, crit = meta.get("totals", {}), meta.get("parameters", {}).get("criteria") or []

    def reason(k: str) -> str:
        n = k.removeprefix("criterion_")
        return f"`{crit[int(n) - 1]}`" if n.isdigit() and 0 < int(n) <= len(crit) else k

    parts = [", ".join(f"{reason(k)}: {v:,}" for k, v in sorted(tot.get("removed", {}).items()))]
    if not parts[0] and tot.get("parts"):
        top = sorted(tot["parts"].items(), key=lambda kv: -kv[1])[:6]
        parts = ["split into " + ", ".join(f"{k.split('=')[-1]} {v:,}" for k, v in top) + (" …" if len(tot["parts"]) > 6 else "")]
    failed = sorted(meta.get("failures") or {})
    if failed:  # a failed stage's files, or files tolerated by --max-failed-files
        parts.append(f"failed file(s): {', '.join(failed[:3])}" + (" …" if len(failed) > 3 else ""))
    return ", ".join(p for p in parts if p)


def _stage_order(run_dir: Path) -> dict[str, int]:
    """Stage order from the run's plan (a spec pipeline), else the shipped spec's."""
    plan = run_dir / "plan.json"
    if plan.exists():
        names = list(dict.fromkeys(e["stage"] for e in json.loads(plan.read_text())["entries"]))
    else:
        from prepline.pipelines import spec as specs

        names = specs.shipped().order()
    return {s: i for i, s in enumerate(names)}


def print_run_counts(stages_root: Path, since: float = 0.0) -> None:
    """The documents of every stage of the run written since ``since``: in, out, removed by reason,
    in pipeline order and per branch, from their metadata.json; the accounting of every document
    (conservation.json); then the training result."""
    from rich.table import Table

    run_dir = _newest_run_dir(stages_root, since)
    if run_dir is None:
        return
    order = _stage_order(run_dir)
    rows = []
    for m in run_dir.rglob("metadata.json"):
        rel = m.parent.relative_to(run_dir).parts
        if "_prepline" in rel or len(rel) > 2:
            continue
        branch = rel[0].removeprefix("lang=") if len(rel) == 2 else ""
        rows.append((branch != "", branch, order.get(rel[-1], len(order)), rel[-1], json.loads(m.read_text())))
    if not rows:
        return
    t = Table(title="documents per stage", title_justify="left")
    for col in ("stage", "branch", "in", "out", "removed", "seconds"):
        t.add_column(col, justify="right" if col in ("in", "out", "seconds") else "left")
    for _, branch, _, stage, meta in sorted(rows, key=lambda r: r[:4]):
        tot, status = meta.get("totals", {}), meta.get("status", "success")
        t.add_row(stage if status == "success" else f"{stage} ({status.upper()})", branch, f"{tot.get('docs_in', 0):,}",
                  f"{tot.get('docs_out', 0):,}", _removed_cell(meta), f"{tot.get('seconds', 0):.1f}")
    _console().print(t)
    _console().print(f"(from the metadata.json of each stage under {run_dir})")
    cons = run_dir / "conservation.json"
    if cons.exists():
        from prepline.pipelines.conservation import summary_lines

        for line in summary_lines(json.loads(cons.read_text())):
            _console().print(line, soft_wrap=True)
    metrics = run_dir / "fine_tune" / "metrics.json"
    if metrics.exists():
        mt = json.loads(metrics.read_text())
        _console().print(f"fine_tune: {mt.get('steps')} steps, loss {mt.get('initial_loss', 0):.2f} → {mt.get('final_loss', 0):.2f}, "
                         f"{mt.get('tokens_seen', 0):,} tokens at {mt.get('tokens_per_s', 0):,.0f}/s; model in {mt.get('output', run_dir / 'fine_tune')}")


def print_task_times(times, secs: float) -> None:
    """Where a local pipeline run's time went, per task kind."""
    from rich.table import Table

    kinds = times.by_kind()
    if not kinds:
        return
    t = Table(title=f"tasks ({secs:,.0f}s in all)", title_justify="left")
    for col in ("task", "runs", "mean s", "min s", "max s", "total s"):
        t.add_column(col, justify="left" if col == "task" else "right")
    for kind, k in sorted(kinds.items(), key=lambda kv: -kv[1]["total"]):
        t.add_row(kind, str(k["n"]), f"{k['mean']:.1f}", f"{k['min']:.1f}", f"{k['max']:.1f}", f"{k['total']:.1f}")
    _console().print(t)
    over = times.stage_overhead()
    if over is not None:
        _console().print(f"per-stage overhead (prepare + start cluster + stop cluster, mean): {over:.1f}s")
