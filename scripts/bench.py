#!/usr/bin/env python
"""Throughput benchmark: every transform against a plain Parquet copy of the same data, in one run.

    .venv/bin/python scripts/bench.py --docs 200000            # all stages
    .venv/bin/python scripts/bench.py --docs 200000 --only exact_dedup --memory-sizes 200000,400000
    .venv/bin/python scripts/bench.py --docs 200000 --only exact_dedup --memory-sizes 200000:16,1000000:80
    .venv/bin/python scripts/bench.py --scale 1e6,3e6,1e7 --only doc_id,exact_dedup,fuzzy_dedup   # benchmarks/scale.py

Builds the corpus with the sample builder (real text, perturbed to scale), times a plain pyarrow
read+write copy of it, then runs each stage as `prepline run` in a fresh process (so peak RSS is
the stage's own) and prints docs/s, MB/s, peak RSS and the ratio to the copy time. Stages run in
pipeline order, each on the previous stage's output; a stage's `benchmarks/<name>.py` may set the
input stage, parameters, a raw-library baseline (e.g. fastText predict rate on the same texts),
variants (the same stage with other parameters, run right after it on the same input, e.g. a
former default) and targets. Machines are noisy: only ratios measured in the same run are
meaningful. A memory size ``docs:files`` builds that corpus in that many files (the same docs per
file at every size: then peak RSS grows with the stage's state, not with the file size).
"""

from __future__ import annotations

import argparse
import importlib
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

    from prepline.data_access import LocalLocation

    shutil.rmtree(dst, ignore_errors=True)
    out = LocalLocation(str(dst))
    t0 = time.perf_counter()
    for f in sorted(src.rglob("*.parquet")):
        if any(p.startswith("_") for p in f.relative_to(src).parts):
            continue
        out.write_parquet(f.relative_to(src).as_posix(), pq.read_table(f))  # encoded as every stage writes
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


def timed(cmd: list[str], what: str, env: dict | None = None) -> tuple[float, float]:
    """Run cmd from a fresh launcher; returns (wall seconds, peak RSS MiB of its largest process). Exits on failure."""
    import tempfile

    with tempfile.TemporaryFile("w+") as log, tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "rss.json"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-S", "-c", _RSS_LAUNCHER, str(report), *cmd], stdout=log, stderr=log, env=env)
        secs = time.perf_counter() - t0
        r = json.loads(report.read_text()) if report.exists() else {"rc": -1, "maxrss_kib": 0}
        if r["rc"] != 0:
            log.seek(0)
            raise SystemExit(f"{what} failed:\n{log.read()[-3000:]}")
    return secs, r["maxrss_kib"] / 1024


def run_stage(name: str, src: Path, dst: Path, params: dict, workers: int, runtime: str = "local") -> tuple[float, float, dict]:
    """Run one stage in a fresh process; returns (seconds, peak RSS MiB of its largest process, metadata)."""
    cmd = [sys.executable, "-m", "prepline.cli", "run", name, "--input", str(src), "--output", str(dst), "--runtime", runtime,
           "--workers", str(workers), "--overwrite", "--no-progress", "--params", json.dumps(params)]
    secs, rss = timed(cmd, name)
    meta = json.loads((dst / "metadata.json").read_text())
    return secs, rss, meta


def _row(docs: int, files: int, label: str, secs: float, rss: float, meta: dict, copy_s: float, mb: float, spec: dict,
         baseline_src: Path | None) -> dict:
    t = meta["totals"]
    in_mb = t["bytes_in"] / 1e6
    # the engine's own time (its phases), without the ~1 s of process start and imports that the
    # in-process copy does not pay: what a long run converges to
    eng = sum(p.get("seconds", 0.0) for p in meta.get("phases", {}).values())
    copy_same = copy_s * in_mb / mb if mb else None
    row = {"docs": docs, "files": files, "stage": label, "seconds": secs, "docs_per_s": t["docs_in"] / secs, "mb_per_s": in_mb / secs,
           "ratio": secs / copy_same if copy_same else None, "engine_seconds": eng,
           "engine_ratio": eng / copy_same if copy_same else None, "peak_rss_mib": rss,
           "docs_in": t["docs_in"], "docs_out": t["docs_out"], "removed": t["removed"],
           # what the engine measured (metadata.json): its own process, the workers' processes, its temporary files
           "driver_peak_rss_mib": t.get("driver_peak_rss_mib"), "worker_peak_rss_mib": t.get("worker_peak_rss_mib"),
           "work_bytes": t.get("work_bytes"), "work_files": t.get("work_files"), "bytes_out": t["bytes_out"]}
    baseline = getattr(spec.get("module"), "baseline", None)
    if baseline and baseline_src is not None:
        row["baseline"] = baseline(baseline_src)
    if spec.get("targets"):
        row["targets"] = spec["targets"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench"))
    ap.add_argument("--workers", type=int, default=1, help="workers per stage (1: per-core cost, comparable to the 1-process copy)")
    ap.add_argument("--only", default="", help="comma-separated stages, run in pipeline order, each on the previous one's output")
    ap.add_argument("--memory-sizes", default="", help="also run the --only stages at these corpus sizes (docs or docs:files) and compare peak RSS")
    ap.add_argument("--json", default="", help="write the results here too")
    ap.add_argument("--peers", action="store_true",
                    help="compare with Data Prep Kit and datatrove on the peer corpus (benchmarks/peers/; installs them into .venv-peers/)")
    ap.add_argument("--skip-install", action="store_true", help="--peers: use .venv-peers/ as it is")
    ap.add_argument("--peer-tools", default="dpk,datatrove", help="--peers: which peers to run")
    ap.add_argument("--rescore", default="", help="--peers: score the outputs of the run whose --json is given again")
    ap.add_argument("--train-loading", action="store_true",
                    help="the fine-tune's data wait from S3 (moto behind a latency proxy), epoch 1 vs 2, node cache vs none "
                         "(benchmarks/train_loading.py)")
    ap.add_argument("--latency-ms", type=float, default=30.0, help="--train-loading, --shuffle-reads: delay of every S3 request")
    ap.add_argument("--synthesize", action="store_true",
                    help="synthesize's generation: new tokens/s by batch size and max_new_tokens, torch on CPU; vLLM where a GPU is "
                         "(benchmarks/synthesize.py)")
    ap.add_argument("--shuffle-reads", action="store_true",
                    help="one dedup shard task's reads of 200 partitioned files on S3 (moto behind a latency proxy), one at a "
                         "time against PARTITION_READERS at once (benchmarks/shuffle_reads.py)")
    ap.add_argument("--scale", default="",
                    help="comma-separated corpus sizes (e.g. 1e6,3e6,1e7): grown corpora (prepline sample --grow-from one "
                         "1M-document base), the --only stages at each size on --runtime ray with --workers 2 by default; prints "
                         "per-document time, driver and worker peak RSS against their bounds and fails when one is exceeded "
                         "(benchmarks/scale.py)")
    ap.add_argument("--nodes", type=int, default=0,
                    help="the 10-billion-document plan's shard shape on this many lab hosts (root): doc_id, exact_dedup and "
                         "fuzzy_dedup on the --scale corpus (default 1e7) with each shard holding a plan shard's documents and "
                         "every host's memory limited to the plan's per worker; fails when a job fails, a process is OOM-killed "
                         "or a worker passes its bound (benchmarks/nodes.py)")
    ap.add_argument("--runtime", default="", help="runtime of the stages (default: local; ray with --scale)")
    args = ap.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    runtime = args.runtime or ("ray" if args.scale else "local")
    if args.scale:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import scale

        args.workers = args.workers if "--workers" in sys.argv else 2
    if args.peers:
        return peers(args)
    if args.nodes:
        docs = int(float(args.scale or 1e7))
        corpus = build_sample(Path(args.work) / f"docs{docs}", docs, args.files, grown=docs > 1_000_000)
        return run_module("nodes", {"corpus": str(corpus), "work": str(Path(args.work) / f"nodes{docs}"), "nodes": args.nodes}, args.json)
    for flag, module, kwargs in (("synthesize", "synthesize", {}), ("shuffle_reads", "shuffle_reads", {"latency_ms": args.latency_ms}),
                                 ("train_loading", "train_loading", {"latency_ms": args.latency_ms})):
        if getattr(args, flag):
            return run_module(module, kwargs, args.json)

    from prepline import registry

    specs = load_specs()
    pipeline_order = default_order()
    order = [n for n in pipeline_order if n in registry.names()] + [n for n in registry.names() if n not in pipeline_order]
    wanted = [n for n in args.only.split(",") if n] or order
    rows = []
    sizes = [(int(float(x)), args.files) for x in args.scale.split(",") if x] or [(args.docs, args.files)]
    for item in filter(None, args.memory_sizes.split(",")):
        docs, _, files = item.partition(":")
        if (int(docs), int(files or args.files)) not in sizes:
            sizes.append((int(docs), int(files or args.files)))
    for docs, files in sizes:
        work = Path(args.work) / (f"docs{docs}" if files == 16 else f"docs{docs}-files{files}")
        sample = build_sample(work, docs, files, grown=bool(args.scale))
        copy_s = plain_copy(sample, work / "copy")
        mb = dir_bytes(sample) / 1e6
        rows.append({"docs": docs, "files": files, "stage": "parquet copy", "seconds": copy_s, "docs_per_s": docs / copy_s, "mb_per_s": mb / copy_s,
                     "ratio": 1.0, "engine_seconds": copy_s, "engine_ratio": 1.0})
        prev = sample
        outputs = {"sample": sample}
        # the wanted stages, in pipeline order; each reads its spec's input stage if that ran, else the previous one
        for name in [n for n in order if n in wanted]:
            spec = specs.get(name, {})
            want_in = spec.get("input", "")
            if want_in in outputs or want_in not in order:  # ran now, or the sample, or not registered here
                src = outputs.get(want_in, prev)
            elif args.scale and name != "doc_quality":  # a stage that judges each document alone reads the corpus
                src = sample
            elif (work / want_in / "metadata.json").exists():  # ran in an earlier bench of this --work
                src = work / want_in
            else:
                raise SystemExit(f"{name} reads {want_in}'s output: add {want_in} to --only (or bench it once in this --work)")
            runs = [(name, spec.get("params", {}))]
            if (docs, files) == sizes[0] and not args.scale:  # variants at the first size only
                runs += [(f"{name} [{label}]", {**spec.get("params", {}), **p}) for label, p in spec.get("variants", {}).items()]
            for label, params in runs:
                dst = work / label.replace(" [", "-").replace("]", "").replace(" ", "_")
                secs, rss, meta = run_stage(name, src, dst, params, args.workers, runtime)
                if label == name:
                    outputs[name], prev = dst, dst
                rows.append(_row(docs, files, label, secs, rss, meta, copy_s, mb, spec, src if label == name and not args.scale else None))
                if args.scale:
                    rows[-1].update(scale.measure(name, dst, meta, docs, files, args.workers, runtime))
                print(f"[bench] {docs:>9,} {label:<14} {secs:8.2f}s {rows[-1]['docs_per_s']:>9,.0f} docs/s  peak RSS {rss:5.0f} MiB  "
                      f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr)
                if args.json:  # a long run leaves what it measured so far
                    Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
        if args.scale:  # a size's outputs are 6 GB a stage at 10M: only the corpus stays
            for d in [work / "copy", *outputs.values()]:
                if d != sample:
                    shutil.rmtree(d, ignore_errors=True)
    print("\n×copy: wall time of the stage's process / the copy's; engine: the stage's phases only (no process start)")
    width = max(14, *(len(r["stage"]) + 1 for r in rows))
    print(f"{'docs/files':>14}  {'stage':<{width}}{'seconds':>9}{'docs/s':>10}{'MB/s':>8}{'×copy':>7}{'engine s':>9}{'×copy':>7}{'RSS MiB':>9}  notes")
    for r in rows:
        notes = ""
        if "baseline" in r:
            b = r["baseline"]
            notes = f"baseline {b['name']}: {b['docs_per_s']:,.0f} docs/s → {r['docs_per_s'] / b['docs_per_s']:.2f}× of it"
        if r.get("removed"):
            notes += ("; " if notes else "") + "removed " + ", ".join(f"{k} {v:,}" for k, v in r["removed"].items())
        rss = f"{r['peak_rss_mib']:9.0f}" if "peak_rss_mib" in r else " " * 9
        print(f"{r['docs']:>9,}/{r['files']:<4}  {r['stage']:<{width}}{r['seconds']:>9.2f}{r['docs_per_s']:>10,.0f}{r['mb_per_s']:>8.1f}{r['ratio']:>7.2f}"
              f"{r['engine_seconds']:>9.2f}{r['engine_ratio']:>7.2f}{rss}  {notes}")
    if args.scale:
        print(scale.table(rows, sizes))
        failed = scale.violations(rows, sizes)
        for v in failed:
            print(f"[bench] OVER BOUND: {v}", file=sys.stderr)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
        return 1 if failed else 0
    if len(sizes) > 1:
        print_scale([r for r in rows if "[" not in r["stage"]], sizes)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
    return 0


def run_module(name: str, kwargs: dict, json_out: str) -> int:
    """A benchmark of benchmarks/<name>.py: its run(), its table on stdout, its results as JSON if asked;
    exit 1 when its results list violations."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    mod = importlib.import_module(name)
    res = mod.run(**kwargs, log=lambda m: print(m, file=sys.stderr))
    print(mod.table(res))
    if json_out:
        Path(json_out).write_text(json.dumps(res, indent=2, default=str))
    return 1 if res.get("violations") else 0


def build_sample(work: Path, docs: int, files: int, grown: bool) -> Path:
    """The corpus of one size under ``work``/sample, built once (grown from the 1M base: --scale, --nodes)."""
    sample = work / "sample"
    if not (sample / "_truth" / "summary.json").exists():
        shutil.rmtree(sample, ignore_errors=True)
        t0 = time.perf_counter()
        if grown:
            sys.path.insert(0, str(ROOT / "benchmarks"))
            import scale

        grow = ["--grow-from", str(scale.base(work.parent, files))] if grown else []
        subprocess.run([sys.executable, "-m", "prepline.cli", "sample", "--output", str(sample), "--docs", str(docs),
                        "--files", str(files), *grow], check=True)
        print(f"[bench] sample of {docs:,} docs built in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return sample


GLOBAL_STAGES = ("exact_dedup", "fuzzy_dedup")


def print_scale(rows: list[dict], sizes: list[tuple[int, int]]) -> None:
    """Per stage: docs/s and peak RSS at every size (docs/files), the throughput spread, and (global
    stages) the RSS growth per added document from the first size to each other one."""
    names = [f"{d:,}/{f}" for d, f in sizes]
    print(f"\nscale: docs/s and peak RSS MiB at {', '.join(names)} documents/files")
    print("| stage | " + " | ".join(f"{n} docs/s | RSS" for n in names) + " | docs/s spread | RSS growth / doc |")
    print("|---|" + "---:|---:|" * len(sizes) + "---:|---:|")
    by = {(r["stage"], r["docs"], r.get("files")): r for r in rows if "peak_rss_mib" in r}
    for stage in dict.fromkeys(r["stage"] for r in rows if "peak_rss_mib" in r):
        got = [by.get((stage, d, f)) for d, f in sizes]
        rates = [g["docs_per_s"] for g in got if g]
        cells = [f"{g['docs_per_s']:,.0f} | {g['peak_rss_mib']:.0f}" if g else "— | —" for g in got]
        spread = f"{(max(rates) / min(rates) - 1) * 100:.0f} %" if len(rates) > 1 else "—"
        growth = []
        for g, n in zip(got[1:], names[1:]):
            if stage in GLOBAL_STAGES and got[0] and g and g["docs_in"] != got[0]["docs_in"]:
                per_doc = (g["peak_rss_mib"] - got[0]["peak_rss_mib"]) * 2**20 / (g["docs_in"] - got[0]["docs_in"])
                growth.append(f"{per_doc:.0f} B ({n})")
        print(f"| {stage} | " + " | ".join(cells) + f" | {spread} | {', '.join(growth) or '—'} |")


def peers(args) -> int:
    sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
    import harness

    if args.rescore:  # the accuracy of an earlier --peers run's outputs again, its timings kept
        data = json.loads(Path(args.rescore).read_text())
        data["rows"] = harness.rescore(Path(args.work), args.docs, data["rows"])
        Path(args.rescore).write_text(json.dumps(data, indent=2, default=str))
        harness.print_table(data["rows"])
        return 0
    load = os.getloadavg()
    rows = harness.run(Path(args.work), args.docs, [n for n in args.only.split(",") if n], timed, args.skip_install,
                       tuple(t for t in args.peer_tools.split(",") if t))
    print(f"\n{args.docs:,} documents; load average before the run {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, "
          f"after {os.getloadavg()[0]:.1f}")
    harness.print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"load_before": load, "rows": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
