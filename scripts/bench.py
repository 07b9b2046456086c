#!/usr/bin/env python
"""Throughput benchmark: every transform against a plain Parquet copy of the same data, in one run.

    .venv/bin/python scripts/bench.py --docs 200000            # all stages
    .venv/bin/python scripts/bench.py --docs 200000 --only exact_dedup --memory-sizes 200000,400000

Builds the corpus with the sample builder (real text, perturbed to scale), times a plain pyarrow
read+write copy of it, then runs each stage as `prepline run` in a fresh process (so peak RSS is
the stage's own) and prints docs/s, MB/s, peak RSS and the ratio to the copy time. Stages run in
pipeline order, each on the previous stage's output; a stage's `benchmarks/<name>.py` may set the
input stage, parameters, a raw-library baseline (e.g. fastText predict rate on the same texts) and
targets. Machines are noisy: only ratios measured in the same run are meaningful.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def default_order() -> list[str]:
    """The shipped super pipeline's stage order (its spec), without ingest (the corpus is Parquet)."""
    from prepline.pipelines.spec import INGEST, shipped

    return [n for n in shipped().order() if n != INGEST]


def load_specs() -> dict[str, dict]:
    specs = {}
    for f in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        spec = importlib.util.spec_from_file_location(f.stem, f)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        specs[mod.SPEC["transform"]] = {"module": mod, **mod.SPEC}
    return specs


def dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*.parquet") if "_prepline" not in f.parts)


def plain_copy(src: Path, dst: Path) -> float:
    import pyarrow.parquet as pq

    from prepline.data_access import PARQUET_WRITE_OPTIONS

    shutil.rmtree(dst, ignore_errors=True)
    t0 = time.perf_counter()
    for f in sorted(src.rglob("*.parquet")):
        if any(p.startswith("_") for p in f.relative_to(src).parts):
            continue
        out = dst / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pq.read_table(f), out, **PARQUET_WRITE_OPTIONS)
    return time.perf_counter() - t0


# Runs the stage from a fresh, small interpreter and reports the stage's own peak RSS. Linux counts
# in a child's ru_maxrss the RSS of the address space it replaced at exec: started straight from this
# process (which grows to ~1 GB once the in-process baselines have loaded their models), every later
# stage would report at least this process's size.
_RSS_LAUNCHER = (
    "import json, os, sys\n"
    "pid = os.posix_spawn(sys.argv[2], sys.argv[2:], os.environ)\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "open(sys.argv[1], 'w').write(json.dumps({'rc': os.waitstatus_to_exitcode(status), 'maxrss_kib': usage.ru_maxrss}))\n"
)


def run_stage(name: str, src: Path, dst: Path, params: dict, workers: int) -> tuple[float, float, dict]:
    """Run one stage in a fresh process; returns (seconds, peak RSS MiB of its largest process, metadata)."""
    import tempfile

    cmd = [sys.executable, "-m", "prepline.cli", "run", name, "--input", str(src), "--output", str(dst),
           "--workers", str(workers), "--overwrite", "--no-progress", "--params", json.dumps(params)]
    with tempfile.TemporaryFile("w+") as log, tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "rss.json"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-S", "-c", _RSS_LAUNCHER, str(report), *cmd], stdout=subprocess.DEVNULL, stderr=log)
        secs = time.perf_counter() - t0
        r = json.loads(report.read_text()) if report.exists() else {"rc": -1, "maxrss_kib": 0}
        if r["rc"] != 0:
            log.seek(0)
            raise SystemExit(f"{name} failed:\n{log.read()[-3000:]}")
    meta = json.loads((dst / "metadata.json").read_text())
    return secs, r["maxrss_kib"] / 1024, meta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench"))
    ap.add_argument("--workers", type=int, default=1, help="workers per stage (1: per-core cost, comparable to the 1-process copy)")
    ap.add_argument("--only", default="", help="comma-separated stages, run in pipeline order, each on the previous one's output")
    ap.add_argument("--memory-sizes", default="", help="also run the --only stages at these corpus sizes and compare peak RSS")
    ap.add_argument("--json", default="", help="write the results here too")
    args = ap.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

    from prepline import registry

    specs = load_specs()
    pipeline_order = default_order()
    order = [n for n in pipeline_order if n in registry.names()] + [n for n in registry.names() if n not in pipeline_order]
    wanted = [n for n in args.only.split(",") if n] or order
    rows = []
    sizes = [args.docs] + [int(s) for s in args.memory_sizes.split(",") if s and int(s) != args.docs]
    for docs in sizes:
        work = Path(args.work) / f"docs{docs}"
        sample = work / "sample"
        if not (sample / "_truth" / "summary.json").exists():
            shutil.rmtree(sample, ignore_errors=True)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "prepline.cli", "sample", "--output", str(sample), "--docs", str(docs),
                            "--files", str(args.files)], check=True)
            print(f"[bench] sample of {docs:,} docs built in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        copy_s = plain_copy(sample, work / "copy")
        mb = dir_bytes(sample) / 1e6
        rows.append({"docs": docs, "stage": "parquet copy", "seconds": copy_s, "docs_per_s": docs / copy_s, "mb_per_s": mb / copy_s,
                     "ratio": 1.0, "engine_seconds": copy_s, "engine_ratio": 1.0})
        prev = sample
        outputs = {"sample": sample}
        # the wanted stages, in pipeline order; each reads its spec's input stage if that ran, else the previous one
        for name in [n for n in order if n in wanted]:
            spec = specs.get(name, {})
            want_in = spec.get("input", "")
            if want_in in outputs or want_in not in order:  # ran now, or the sample, or not registered here
                src = outputs.get(want_in, prev)
            elif (work / want_in / "metadata.json").exists():  # ran in an earlier bench of this --work
                src = work / want_in
            else:
                raise SystemExit(f"{name} reads {want_in}'s output: add {want_in} to --only (or bench it once in this --work)")
            dst = work / name
            params = spec.get("params", {})
            secs, rss, meta = run_stage(name, src, dst, params, args.workers)
            outputs[name], prev = dst, dst
            t = meta["totals"]
            in_mb = t["bytes_in"] / 1e6
            # the engine's own time (its phases), without the ~1 s of process start and imports that the
            # in-process copy does not pay: what a long run converges to
            eng = sum(p.get("seconds", 0.0) for p in meta.get("phases", {}).values())
            copy_same = copy_s * in_mb / mb if mb else None
            row = {"docs": docs, "stage": name, "seconds": secs, "docs_per_s": t["docs_in"] / secs, "mb_per_s": in_mb / secs,
                   "ratio": secs / copy_same if copy_same else None, "engine_seconds": eng,
                   "engine_ratio": eng / copy_same if copy_same else None, "peak_rss_mib": rss,
                   "docs_in": t["docs_in"], "docs_out": t["docs_out"], "removed": t["removed"]}
            baseline = getattr(spec.get("module"), "baseline", None)
            if baseline:
                row["baseline"] = baseline(src)
            if spec.get("targets"):
                row["targets"] = spec["targets"]
            rows.append(row)
    print("\n×copy: wall time of the stage's process / the copy's; engine: the stage's phases only (no process start)")
    print(f"{'docs':>8}  {'stage':<14}{'seconds':>9}{'docs/s':>10}{'MB/s':>8}{'×copy':>7}{'engine s':>9}{'×copy':>7}{'RSS MiB':>9}  notes")
    for r in rows:
        notes = ""
        if "baseline" in r:
            b = r["baseline"]
            notes = f"baseline {b['name']}: {b['docs_per_s']:,.0f} docs/s → {r['docs_per_s'] / b['docs_per_s']:.2f}× of it"
        if r.get("removed"):
            notes += ("; " if notes else "") + "removed " + ", ".join(f"{k} {v:,}" for k, v in r["removed"].items())
        rss = f"{r['peak_rss_mib']:9.0f}" if "peak_rss_mib" in r else " " * 9
        print(f"{r['docs']:>8,}  {r['stage']:<14}{r['seconds']:>9.2f}{r['docs_per_s']:>10,.0f}{r['mb_per_s']:>8.1f}{r['ratio']:>7.2f}"
              f"{r['engine_seconds']:>9.2f}{r['engine_ratio']:>7.2f}{rss}  {notes}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
