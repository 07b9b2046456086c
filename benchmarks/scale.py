"""``scripts/bench.py --scale``: every stage at 1M, 3M and 10M documents, against its memory and time bounds.

    .venv/bin/python scripts/bench.py --scale 1e6,3e6,1e7 --only doc_id,exact_dedup,fuzzy_dedup,line_dedup,filter --work runs/scale
    .venv/bin/python scripts/bench.py --scale 1e6,3e6 --only lang_id,doc_quality,pii_redactor,hap,tokenization --work runs/scale

The corpora are one 1M-document sample (``prepline sample --docs 1000000 --files 16``, built once
under ``--work``) grown to each size (``prepline sample --grow-from``: tagged copies, the same
62,500 documents per file at every size, so a file's batch is the same and only the corpus grows).
Each stage runs as ``prepline run`` on Ray (``--runtime ray``, 2 workers: the driver is then only
the driver, and each worker a Ray actor, as on KubeRay). From the stage's metadata.json
(``totals``: the engine records them) and its output folder, per size:

* per-document time: the engine's phases (no process or Ray start) per document;
* the driver's peak RSS and the workers' (each actor's ``VmHWM`` after each task, the largest);
* temporary bytes and files (the stage's work folder: shard files and markers), per document;
* bytes and files written (output and work folder).

Bounds (a row over one is printed and the benchmark exits 1):

* **time**: per-document time at every size within 20 % of the first size's;
* **driver**: its peak RSS at every size within 10 % (+32 MiB) of the first size's: it must not
  grow with the corpus (it holds per-file bookkeeping, never per-document state);
* **worker**: its peak RSS at most :func:`prepline.sizing.worker_mib` (the process, one row group's
  batch and its shard of the corpus-wide state, the same function ``prepline plan`` sizes workers
  with, from constants measured at 1M documents) plus ``WORKER_SLACK``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BASE_DOCS = int(os.environ.get("PREPLINE_SCALE_BASE_DOCS", 1_000_000))  # smaller only to try the benchmark out
TIME_SLACK = 0.20
DRIVER_SLACK, DRIVER_SLACK_MIB = 0.10, 32.0
#: a worker's peak over the model's: the allocator keeps what the largest batches took (measured: doc_id,
#: which holds no state, 442 → 481 MiB from 8 to 80 files per worker, +9 %)
WORKER_SLACK = 0.10
#: the dedup stages' shard count (their default num_shards)
SHARDS = {"exact_dedup": 16, "fuzzy_dedup": 16, "line_dedup": 16}


def base(work: Path, files: int) -> Path:
    """The 1M-document base sample under ``work`` (built once)."""
    out = work / f"base{BASE_DOCS}-files{files}"
    if not (out / "_truth" / "summary.json").exists():
        subprocess.run([sys.executable, "-m", "prepline.cli", "sample", "--output", str(out), "--docs", str(BASE_DOCS),
                        "--files", str(files)], check=True)
    return out


def _tree(p: Path) -> tuple[int, int]:
    files = [f for f in p.rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def measure(name: str, dst: Path, meta: dict, docs: int, files: int, workers: int, runtime: str) -> dict:
    """The scale columns of one stage's row."""
    from prepline import sizing

    t = meta["totals"]
    eng = sum(p.get("seconds", 0.0) for p in meta.get("phases", {}).values())
    n_out, b_out = _tree(dst)
    work_b, work_f = t.get("work_bytes") or 0, t.get("work_files") or 0
    return {
        "runtime": runtime, "workers": workers, "input_files": t["files"],
        "us_per_doc": eng / max(1, t["docs_in"]) * 1e6,
        "work_bytes_per_doc": work_b / max(1, t["docs_in"]),
        "written_bytes": b_out + work_b, "written_files": n_out + work_f,
        "phase_worker_peaks": {k: p.get("worker_peak_rss_mib") for k, p in meta.get("phases", {}).items()},
    }


def worker_bound(r: dict) -> float | None:
    """The memory a worker of this row's stage may reach (MiB): :func:`prepline.sizing.worker_mib` for its
    documents, file size and shards (the function ``prepline plan`` sizes workers with), plus WORKER_SLACK."""
    from prepline import sizing

    if "input_files" not in r:
        return r.get("worker_bound_mib")
    try:
        m = sizing.worker_mib(r["stage"], r["docs_in"], r["docs_in"] / max(1, r["input_files"]), shards=SHARDS.get(r["stage"], 0))
    except KeyError:  # a stage without measured constants
        return None
    return m * (1 + WORKER_SLACK)


def _stages(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["stage"] for r in rows if "us_per_doc" in r))


def violations(rows: list[dict], sizes: list[tuple[int, int]]) -> list[str]:
    out = []
    for stage in _stages(rows):
        got = [r for r in rows if r["stage"] == stage and "us_per_doc" in r]
        first = got[0]
        for r in got:
            if r is not first and r["us_per_doc"] > first["us_per_doc"] * (1 + TIME_SLACK):
                out.append(f"{stage} at {r['docs']:,}: {r['us_per_doc']:.1f} µs/doc, over {1 + TIME_SLACK:.2f} × "
                           f"{first['us_per_doc']:.1f} at {first['docs']:,}")
            d0, d = first.get("driver_peak_rss_mib"), r.get("driver_peak_rss_mib")
            if r is not first and d and d0 and d > d0 * (1 + DRIVER_SLACK) + DRIVER_SLACK_MIB:
                out.append(f"{stage} at {r['docs']:,}: driver peak {d:.0f} MiB grew from {d0:.0f} MiB at {first['docs']:,}")
            w, b = r.get("worker_peak_rss_mib"), worker_bound(r)
            if w and b and w > b:
                out.append(f"{stage} at {r['docs']:,}: worker peak {w:.0f} MiB over its bound {b:.0f} MiB")
    return out


def table(rows: list[dict], sizes: list[tuple[int, int]]) -> str:
    """Per stage and size: docs/s, µs/doc (and its ratio to the first size), driver and worker peak
    against the worker bound, temporary bytes per document, bytes and files written."""
    lines = ["\nscale: per stage and corpus size (engine time per document; peaks from metadata.json)",
             "| stage | docs | docs/s | µs/doc | × first size | driver MiB | worker MiB | worker bound MiB | temp B/doc | written GB | files written |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["stage"] == "parquet copy":
            lines.append(f"| parquet copy | {r['docs']:,} | {r['docs_per_s']:,.0f} | {r['seconds'] / r['docs'] * 1e6:.1f} | | | | | | | |")
    for stage in _stages(rows):
        got = [r for r in rows if r["stage"] == stage and "us_per_doc" in r]
        for r in got:
            b = worker_bound(r)
            lines.append(
                f"| {stage} | {r['docs_in']:,} | {r['docs_per_s']:,.0f} | {r['us_per_doc']:.1f} | {r['us_per_doc'] / got[0]['us_per_doc']:.2f} | "
                f"{r.get('driver_peak_rss_mib') or 0:.0f} | {r.get('worker_peak_rss_mib') or 0:.0f} | {f'{b:.0f}' if b else '—'} | "
                f"{r['work_bytes_per_doc']:.1f} | {r['written_bytes'] / 1e9:.2f} | {r['written_files']:,} |")
    return "\n".join(lines)


if __name__ == "__main__":  # the table of an earlier run's --json
    rows = json.loads(Path(sys.argv[1]).read_text())
    print(table(rows, []))
    for v in violations(rows, []):
        print("OVER BOUND:", v)
