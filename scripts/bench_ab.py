#!/usr/bin/env python
"""Before/after on a shared machine: one stage run by two interpreters (two checkouts), interleaved.

    .venv/bin/python scripts/bench_ab.py --before /tmp/base/.venv/bin/python --stage doc_id \\
        --input runs/bench/docs50000/sample --workers 2 --rounds 4

Each round times a plain Parquet copy in a fresh process (imports included), then runs the stage
with the ``--before`` and the ``--after`` interpreter (default: this one) in alternating order, so
both see the same load. Prints the medians of wall seconds (whole process), engine seconds (the
stage's phases, from metadata.json) and CPU seconds (all its processes), the wall ratio to the copy
process, the after/before ratios and the load average. A checkout's interpreter is any Python
that imports that checkout's prepline (e.g. its own ``.venv``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_COPY = (
    "import sys, pathlib, pyarrow.parquet as pq\n"
    "from prepline.data_access import PARQUET_WRITE_OPTIONS\n"
    "src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])\n"
    "for f in sorted(src.rglob('*.parquet')):\n"
    "    if any(p.startswith('_') for p in f.relative_to(src).parts): continue\n"
    "    out = dst / f.relative_to(src); out.parent.mkdir(parents=True, exist_ok=True)\n"
    "    pq.write_table(pq.read_table(f), out, **PARQUET_WRITE_OPTIONS)\n"
)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(cmd: list[str], env: dict) -> tuple[float, float]:
    c0, t0 = _children_cpu(), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed:\n{r.stderr[-2000:]}")
    return time.perf_counter() - t0, _children_cpu() - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="interpreter of the 'before' checkout")
    ap.add_argument("--after", default=sys.executable, help="interpreter of the 'after' checkout (default: this one)")
    ap.add_argument("--stage", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--params", default="{}", help="stage parameters (JSON)")
    a = ap.parse_args()
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    src = str(Path(a.input).resolve())
    pythons = {"before": a.before, "after": a.after}
    runs: dict[str, list[tuple[float, float, float]]] = {"copy": [], "before": [], "after": []}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        for i in range(a.rounds):
            shutil.rmtree(Path(tmp, "copy"), ignore_errors=True)
            wall, cpu = _timed([a.after, "-c", _COPY, src, str(Path(tmp, "copy"))], env)
            runs["copy"].append((wall, cpu, wall))
            for k in ("before", "after") if i % 2 == 0 else ("after", "before"):
                out = Path(tmp, k)
                wall, cpu = _timed([pythons[k], "-m", "prepline.cli", "run", a.stage, "--input", src, "--output", str(out),
                                    "--workers", str(a.workers), "--overwrite", "--no-progress", "--params", a.params], env)
                meta = json.loads((out / "metadata.json").read_text())
                runs[k].append((wall, cpu, sum(p["seconds"] for p in meta["phases"].values())))
    med = {k: [statistics.median(r[j] for r in v) for j in range(3)] for k, v in runs.items()}
    load = os.getloadavg()
    print(f"{a.stage}, {a.workers} worker(s), {a.rounds} rounds; load average {load0:.1f} before, {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} after")
    print(f"{'':<8}{'wall s':>8}{'×copy':>7}{'engine s':>10}{'CPU s':>8}")
    for k, (wall, cpu, eng) in med.items():
        print(f"{k:<8}{wall:>8.2f}{wall / med['copy'][0]:>7.2f}{eng:>10.2f}{cpu:>8.2f}")
    b, f = med["before"], med["after"]
    print(f"after/before: wall {f[0] / b[0]:.2f}, engine {f[2] / b[2]:.2f}, CPU {f[1] / b[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
