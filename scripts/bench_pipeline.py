#!/usr/bin/env python
"""Pipeline overhead benchmark: where a local pipeline run's time goes, per task kind.

    .venv/bin/python scripts/bench_pipeline.py                      # the super pipeline on the 4,000-doc sample
    .venv/bin/python scripts/bench_pipeline.py --pipeline doc_id     # one simple pipeline

Runs `prepline pipeline run <pipeline> --local` (kfp.local, a real local Ray head per stage, local
training) in a fresh process, then prints each task kind's runs and mean/min/max seconds, and the
per-stage overhead (prepare + start cluster + stop cluster: what a stage costs besides its Ray job)
against the target. On a shared machine, read it with the load average it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_OVERHEAD_S = 5.0  # issue 15: per-stage overhead of the local super pipeline on a quiet machine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipeline", default="super")
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench_pipeline"))
    ap.add_argument("--sample-docs", type=int, default=None, help="sample size (default: the bundled sample's 4,000)")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a pipeline parameter; repeat")
    ap.add_argument("--json", default="", help="write the timings here too")
    a = ap.parse_args()
    work = Path(a.work)
    shutil.rmtree(work / "stages", ignore_errors=True)
    shutil.rmtree(work / "kfp", ignore_errors=True)
    timings = work / "timings.json"
    cmd = [sys.executable, "-m", "prepline.cli", "pipeline", "run", a.pipeline, "--local", "--work-root", str(work),
           "--timings-json", str(timings)]
    if a.sample_docs:
        cmd += ["--sample-docs", str(a.sample_docs)]
    for p in a.param:
        cmd += ["--param", p]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        print(r.stdout[-4000:] + r.stderr[-4000:], file=sys.stderr)
        return r.returncode
    t = json.loads(timings.read_text())
    print(f"{a.pipeline}: {wall:.0f}s wall ({t['seconds']:.0f}s in the pipeline); load average {load0:.1f} → {os.getloadavg()[0]:.1f}")
    print(f"{'task':<22}{'runs':>5}{'mean s':>8}{'min s':>7}{'max s':>7}{'total s':>9}")
    for kind, k in sorted(t["by_kind"].items(), key=lambda kv: -kv[1]["total"]):
        print(f"{kind:<22}{k['n']:>5}{k['mean']:>8.1f}{k['min']:>7.1f}{k['max']:>7.1f}{k['total']:>9.1f}")
    over = t["stage_overhead_seconds"]
    if over is not None:
        verdict = "meets" if over <= TARGET_OVERHEAD_S else "MISSES"
        print(f"per-stage overhead (prepare + start + stop, mean): {over:.1f}s: {verdict} the {TARGET_OVERHEAD_S:.0f}s target")
    if a.json:
        Path(a.json).write_text(json.dumps({**t, "wall_seconds": wall, "load_before": load0}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
