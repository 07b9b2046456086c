"""Run the fault suite and print its table: fault | expected | observed | docs lost | docs duplicated |
seconds to a clear error or recovery.

    .venv/bin/python scripts/faults.py                 # every case (~5 min on 2 cores)
    .venv/bin/python scripts/faults.py -k s3_ -k race  # cases whose id contains one of these
    .venv/bin/python scripts/faults.py --markdown docs/reliability-table.md

The cases live in tests/faults (the same ones run as tests: ``pytest -m faults``). It starts its own
local S3 server (moto) and, for the Ray cases, a local Ray. Exit status 1 when a case failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def cell(v) -> str:
    return "–" if v is None else str(v)


def table(rows) -> str:
    out = ["| # | fault | expected | observed | docs lost | docs duplicated | seconds | ok |", "|---|---|---|---|---:|---:|---:|---|"]
    for i, (cid, r) in enumerate(rows, 1):
        esc = [s.replace("|", "\\|").replace("\n", " ") for s in (r.fault, r.expected, r.observed)]
        out.append(f"| {i} | {esc[0]} (`{cid}`) | {esc[1]} | {esc[2]} | {cell(r.lost)} | {cell(r.duplicated)} | {r.seconds:.1f} | "
                   f"{'✓' if r.ok else '✗'} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", action="append", default=[], help="run only cases whose id contains this (repeat for several)")
    ap.add_argument("--markdown", default="", help="also write the table to this file")
    ap.add_argument("--work", default="", help="work folder (default: a temporary one, deleted after)")
    ap.add_argument("--docs", type=int, default=20_000, help="documents in the corpus (default 20,000)")
    a = ap.parse_args()

    import logging

    logging.basicConfig(level=logging.WARNING, format="[prepline] %(message)s")
    from faults import cases_local, cases_ray, cases_s3, fuzz  # noqa: F401 - they register the cases
    from faults.harness import CASES, Env, run_case

    chosen = [c for cid, c in CASES.items() if not a.k or any(k in cid for k in a.k)]
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="prepline-faults-"))
    env = Env(work, docs=a.docs)
    rows = []
    t0 = time.perf_counter()
    try:
        for c in chosen:
            print(f"[faults] {c.id} ...", file=sys.stderr, flush=True)
            r = run_case(c, env)
            print(f"[faults] {c.id}: {'ok' if r.ok else 'FAILED'} ({r.seconds:.1f}s) {r.observed}", file=sys.stderr, flush=True)
            for p in r.problems:
                print(f"    problem: {p}", file=sys.stderr)
            rows.append((c.id, r))
    finally:
        env.close()
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        except ImportError:
            pass
        if not a.work:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    text = table(rows)
    print(text)
    bad = [cid for cid, r in rows if not r.ok]
    print(f"{len(rows) - len(bad)} of {len(rows)} cases as expected in {time.perf_counter() - t0:.0f}s, on {a.docs:,} documents"
          + (f"; failed: {', '.join(bad)}" if bad else ""))
    if a.markdown:
        Path(a.markdown).write_text(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
