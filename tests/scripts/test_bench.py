"""The benchmark scripts: a small smoke of scripts/bench.py (CI runs only this; the peers are not
installed in CI), and the peer benchmark's pure parts (corpus edits, accuracy scores) on inputs
made here. Performance targets live in the benchmark, never in these tests."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

import corpus  # noqa: E402
import score  # noqa: E402

from prepline.sample import shingle_jaccard  # noqa: E402


@pytest.mark.slow
def test_bench_smoke_prints_its_table(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--docs", "2000", "--only", "doc_id,filter",
                          "--work", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["docs/files", "stage"])
    rows = [line.split() for line in lines[head + 1 :] if line.strip()]
    assert [r[1] for r in rows] == ["parquet", "doc_id", "filter"]
    for r in rows[1:]:
        assert r[0].startswith("2,000/") and float(r[2]) > 0 and float(r[8]) > 0  # seconds, peak RSS MiB


@pytest.mark.slow
def test_bench_memory_smoke_prints_its_ratios(tmp_path):
    """scripts/bench_memory.py on two tiny one-file inputs (the second spliced from the first)."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_memory.py"), "--sizes-mb", "1,2", "--chunk-mb", "1",
                          "--only", "ingest,doc_id", "--work", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split("|") for line in out.stdout.splitlines() if line.startswith("| ingest") or line.startswith("| doc_id")]
    assert [r[1].strip() for r in rows] == ["ingest", "doc_id"]
    for r in rows:
        ratio = float(r[6])
        assert 0.5 < ratio < 5  # a ratio was measured (targets live in the benchmark, not here)
    assert pq.read_metadata(tmp_path / "file2mb" / "sample" / "part-00000.parquet").num_rows == 2 * pq.read_metadata(
        tmp_path / "file1mb" / "sample" / "part-00000.parquet").num_rows


@pytest.mark.slow
def test_bench_ingest_smoke_prints_its_ratios():
    """scripts/bench_ingest.py on 40 pages, one round: every baseline and the stage are timed."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_ingest.py"), "--pages", "40", "--files", "2",
                          "--extractors", "resiliparse", "--rounds", "1"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.stdout.splitlines() if line.startswith("| |")]
    assert [r[1] for r in rows[:2]] == ["1", "2"]  # FastWARC + extractor on 1 and 2 processes
    # then ingest on 1 and 2 workers, as it runs (mimalloc: scripts/setup.sh installs it) and on the system allocator
    assert [(r[1], r[2]) for r in rows[2:]] == [("mimalloc", "1"), ("mimalloc", "2"), ("system", "1"), ("system", "2")]
    for r in rows[2:]:
        assert all(float(x) > 0 for x in r[4:7])  # ratios were measured (targets live in the benchmark, not here)
    assert "baselines on the system allocator" in out.stdout


def _words(n: int, rng: random.Random) -> str:
    return " ".join(f"w{rng.randrange(5000)}" for _ in range(n))


def test_near_copy_reaches_its_target_and_reports_the_true_jaccard():
    rng = random.Random(1)
    for target in (0.55, 0.7, 0.8, 0.95):
        text = _words(220, rng)
        got = corpus._near_copy(text, target, rng)
        assert got is not None
        copy, j = got
        assert 0.5 <= j <= target and j == pytest.approx(shingle_jaccard(text, copy))
    assert corpus._near_copy(_words(30, rng), 0.8, rng) is None  # too short to edit


def test_recut_keeps_every_word_in_order():
    rng = random.Random(2)
    texts = [_words(rng.randint(5, 900), rng) for _ in range(40)]
    docs = corpus._recut(texts, random.Random(3))
    assert " ".join(" ".join(docs).split()) == " ".join(" ".join(texts).split())
    assert all(len(d) <= 2 * corpus.CUT[1] + 20 for d in docs[:-1])


def _write(folder: Path, ids: list[str], **cols) -> Path:
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"id": ids, **cols}), folder / "part-00000.parquet")
    return folder


def test_scores_against_a_known_truth(tmp_path):
    truth = tmp_path / "truth"
    truth.mkdir()
    docs = [("a", "original", None, "en"), ("b", "exact", "a", "en"), ("c", "exact_case", "a", "en"),
            ("d", "original", None, "de"), ("e", "near", "d", "de"), ("f", "original", None, "ja")]
    pq.write_table(pa.table({"id": [d[0] for d in docs], "kind": [d[1] for d in docs], "dup_of": [d[2] for d in docs],
                             "lang": [d[3] for d in docs]}), truth / "docs.parquet")
    pq.write_table(pa.table({"a": ["d", "a"], "b": ["e", "f"], "jaccard": [0.8, 0.6]}), truth / "pairs.parquet")
    src = _write(tmp_path / "src", [d[0] for d in docs])
    # exact: one of a's two copies removed, and d (no copy of anything) removed by mistake
    out = _write(tmp_path / "exact", ["a", "c", "e", "f"])
    assert score.exact(truth, src, out) == {"removed": 2, "recall": 0.5, "precision": 0.5}
    # fuzzy: the d/e pair (0.8) caught by removing d; f removed although its only partner is at 0.6
    out = _write(tmp_path / "fuzzy", ["a", "b", "c", "e"])
    assert score.fuzzy(truth, src, out) == {"removed": 2, "pairs": 1, "recall": 1.0, "precision": 0.5}
    # lang: region and script suffixes and fastText labels are cut off; documents without truth are not scored
    out = _write(tmp_path / "lang", ["a", "d", "f", "zz"], lang=["en-US", "__label__de", "zh_Hans", "en"])
    assert score.lang(truth, out, "lang") == {"docs": 3, "accuracy": pytest.approx(2 / 3)}
    ref = {"a": 3, "b": 0, "d": 5}
    assert score.compare_tokens(ref, {"a": 3, "d": 4}) == {"docs": 2, "identical_docs": 1, "missing_nonempty": 0,
                                                          "total": 7, "prepline_total": 8}
    assert score.compare_tokens(ref, None, 8)["identical_total"] is True


def test_c4_agreement_compares_a_peer_with_preplines_output(tmp_path):
    """--peers c4_clean: prepline's output is the reference; a peer's keep/remove decisions and texts are scored against it."""
    for name, cols in {"src": {"id": ["a", "b", "c", "d"], "contents": ["1", "2", "3", "4"]},
                       "mine": {"id": ["a", "b", "c"], "contents": ["x", "y", "z"]},
                       "peer": {"id": ["a", "b", "d"], "text": ["x", "Y", "w"]}}.items():
        (tmp_path / name).mkdir()
        pq.write_table(pa.table(cols), tmp_path / name / "p.parquet")
    ref: dict = {}
    assert score.c4_agreement(tmp_path / "src", tmp_path / "mine", "contents", ref) == {"docs_out": 3}
    got = score.c4_agreement(tmp_path / "src", tmp_path / "peer", "text", ref)
    assert got == {"docs_out": 3, "agreement": 0.5, "both_kept": 2, "same_text": 1}


def _scale_row(stage: str, docs: int, us: float, driver: float, worker: float, bound: float | None) -> dict:
    return {"stage": stage, "docs": docs, "docs_in": docs, "docs_per_s": 1e6 / us, "us_per_doc": us, "driver_peak_rss_mib": driver,
            "worker_peak_rss_mib": worker, "worker_bound_mib": bound, "work_bytes_per_doc": 0.0, "written_bytes": 0, "written_files": 0}


def test_scale_bounds_flag_time_driver_and_worker_growth():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import scale

    ok = [_scale_row("exact_dedup", 10**6, 10.0, 180, 600, 700), _scale_row("exact_dedup", 10**7, 11.9, 197, 690, 720)]
    assert scale.violations(ok, []) == []
    slow = [ok[0], _scale_row("exact_dedup", 10**7, 12.1, 180, 600, 720)]  # 21 % more time per document
    driver = [ok[0], _scale_row("exact_dedup", 10**7, 10.0, 240, 600, 720)]  # the driver grew with the corpus
    worker = [ok[0], _scale_row("exact_dedup", 10**7, 10.0, 180, 721, 720)]  # a worker over its shard's bound
    assert [len(scale.violations(r, [])) for r in (slow, driver, worker)] == [1, 1, 1]
    assert "µs/doc" in scale.violations(slow, [])[0] and "driver" in scale.violations(driver, [])[0]
    assert "over its bound 720" in scale.violations(worker, [])[0]
    assert "| exact_dedup | 10,000,000 |" in scale.table(ok, [])


@pytest.mark.slow
def test_bench_scale_smoke_grows_its_corpora_and_prints_the_bounds(tmp_path):
    env = {**os.environ, "PREPLINE_SCALE_BASE_DOCS": "1500"}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--scale", "1500,3000", "--only", "doc_id,exact_dedup",
                          "--runtime", "local", "--work", str(tmp_path)], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode in (0, 1), out.stderr[-2000:]
    assert (out.returncode == 1) == ("OVER BOUND" in out.stderr)  # it fails exactly when a bound is exceeded
    rows = [line for line in out.stdout.splitlines() if line.startswith("| exact_dedup |")]
    assert [r.split("|")[2].strip() for r in rows] == ["1,500", "3,000"]
    assert all(float(r.split("|")[7]) > 30 for r in rows)  # the workers' peak RSS from metadata.json
    assert (tmp_path / "docs3000" / "sample" / "_truth" / "summary.json").exists()  # grown from the base
    assert not (tmp_path / "docs3000" / "exact_dedup").exists()  # a size's outputs are deleted once measured
