"""line_dedup: boilerplate lines planted in real text from the sample are removed from every
document and nothing else changes (a plain-Python reference decides the same lines), counts
conserved, the same bytes for any worker and shard count, parameters validated."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import tree_bytes, write_parquet
from prepline import registry
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError

FOOTER = "Share this article on Facebook  |  Twitter"
COOKIE = "We use cookies to give you the best experience.\r"  # a CRLF line: the \r stays part of it
RARE = "Subscribe to our newsletter"  # in max_docs documents: not more, kept


def _docs(tmp_path: Path, n: int = 400) -> list[str]:
    from prepline.sample import build_sample

    build_sample(tmp_path / "s", docs=n, files=1)
    files = [p for p in sorted((tmp_path / "s").rglob("*.parquet")) if "contents" in pq.read_schema(p).names]  # not the truth file
    return [x for p in files for x in pq.read_table(p, columns=["contents"])["contents"].to_pylist()]


def _planted(tmp_path: Path) -> tuple[Path, list[str], list[str]]:
    """Real documents in 4 files, FOOTER after 30 of them (in two spellings: case and spaces
    differ), COOKIE before 12, RARE in 10, 3 documents of FOOTER alone."""
    docs = _docs(tmp_path)
    out = []
    for i, d in enumerate(docs):
        if i % 13 == 0:
            d = d + "\n" + (FOOTER if i % 2 else "  share this ARTICLE on facebook | twitter ")
        if i % 31 == 0:
            d = COOKIE + "\n" + d
        if i % 37 == 5 and i < 370:  # exactly 10
            d = d + "\n" + RARE
        out.append(d)
    out += [FOOTER, FOOTER + "\n\n", "\n" + FOOTER.lower()]
    src = tmp_path / "in"
    for f in range(4):
        part = out[f::4]
        write_parquet(src, f"part-{f}.parquet", {"contents": part, "doc_id": list(range(f * 1000, f * 1000 + len(part)))})
    return src, out, docs


def _reference(texts: list[str], max_docs: int, min_chars: int = 1) -> list[str | None]:
    """Plain Python: the normalised lines found in more than max_docs documents, removed."""
    norm = lambda s: " ".join(s.lower().split())  # noqa: E731 (exact_dedup's normalisation)
    seen = collections.Counter()
    for t in texts:
        seen.update({norm(x) for x in t.split("\n") if len(norm(x)) >= min_chars})
    hot = {k for k, v in seen.items() if v > max_docs}
    out: list[str | None] = []
    for t in texts:
        lines = t.split("\n")
        kept = [x for x in lines if norm(x) not in hot]
        if len(kept) == len(lines):
            out.append(t)
        elif any(norm(x) for x in kept):
            out.append("\n".join(kept))
        else:
            out.append(None)
    return out


def _read(out: Path) -> pa.Table:
    files = sorted(p for p in out.rglob("*.parquet") if "_removed" not in p.parts)
    return pa.concat_tables([pq.read_table(p) for p in files]).sort_by("doc_id")


def test_planted_boilerplate_goes_from_every_document_and_nothing_else_changes(tmp_path):
    src, texts, _ = _planted(tmp_path)
    out = tmp_path / "o"
    meta = run_transform("line_dedup", {"removed_sample": 5}, RunOptions(str(src), str(out), workers=1, progress=False)).metadata
    tot = meta["totals"]
    t = _read(out)
    ref = _reference(texts, 10)
    idx = {f * 1000 + j: f + 4 * j for f in range(4) for j in range(len(texts[f::4]))}  # doc_id -> position in texts
    by_id = {k: texts[i] for k, i in idx.items()}
    want = {k: ref[i] for k, i in idx.items()}
    got = dict(zip(t["doc_id"].to_pylist(), t["contents"].to_pylist()))
    assert got == {k: v for k, v in want.items() if v is not None}
    # the planted lines are gone, in every spelling; RARE (in exactly max_docs documents) stays
    planted = {" ".join(x.lower().split()) for x in (FOOTER, COOKIE)}
    for text in got.values():
        assert not planted & {" ".join(x.lower().split()) for x in text.split("\n")}
    assert sum(RARE in x for x in got.values()) == 10
    changed = [k for k in got if got[k] != by_id[k]]
    assert len(changed) >= 30 + 12 - 3 and all(by_id[k].replace(COOKIE + "\n", "").startswith(got[k][:20]) for k in changed)
    # documents of nothing but the footer are removed with the reason; counts conserved
    assert tot["removed"].get("all_lines_frequent", 0) >= 3
    assert tot["docs_in"] == len(texts) == tot["docs_out"] + sum(tot["removed"].values()) == t.num_rows + sum(tot["removed"].values())
    c = tot["counters"]
    assert c["lines_in"] == c["lines_kept"] + c["lines_removed_frequent"] and c["lines_removed_frequent"] >= 33 + 12
    assert meta["plan"]["frequent_lines"] >= 2
    assert (out / "_removed" / "all_lines_frequent").is_dir()


def test_the_same_bytes_for_any_worker_and_shard_count(tmp_path):
    src, _, _ = _planted(tmp_path)
    runs = {}
    for name, workers, shards in (("a", 1, 16), ("b", 2, 3), ("c", 2, 1)):
        run_transform("line_dedup", {"num_shards": shards}, RunOptions(str(src), str(tmp_path / name), workers=workers, progress=False))
        runs[name] = tree_bytes(tmp_path / name)
    assert runs["a"] == runs["b"] == runs["c"] and len(runs["a"]) == 4


def test_thresholds_through_the_engine(tmp_path):
    docs = [f"Story number {i} is about the river.\nRead more\nOK" for i in range(6)] + ["Read more"]
    write_parquet(tmp_path / "in", "a.parquet", {"contents": docs})
    out = tmp_path / "o"
    meta = run_transform("line_dedup", {"max_docs": 5, "min_line_chars": 3, "removed_lines_sample": 1},
                         RunOptions(str(tmp_path / "in"), str(out), workers=1, progress=False)).metadata
    t = pq.read_table(out / "a.parquet")
    # "Read more" is in 7 documents (> 5): gone; "OK" is in 6 but shorter than 3 characters: kept
    assert t["contents"].to_pylist() == [f"Story number {i} is about the river.\nOK" for i in range(6)]
    assert t["line_dedup_removed_lines"].to_pylist() == [["Read more"]] * 6
    assert meta["totals"]["removed"] == {"all_lines_frequent": 1}
    c = meta["totals"]["counters"]
    assert (c["lines_in"], c["lines_kept"], c["lines_removed_frequent"], c["docs_changed"]) == (19, 12, 7, 6)
    # at max_docs 7 nothing is frequent: the output is the input, byte for byte in the text
    run_transform("line_dedup", {"max_docs": 7}, RunOptions(str(tmp_path / "in"), str(tmp_path / "same"), workers=1, progress=False))
    assert pq.read_table(tmp_path / "same" / "a.parquet")["contents"].to_pylist() == docs


def test_bad_parameters_and_input(tmp_path):
    for params, word in [({"max_docs": 0}, "max_docs"), ({"min_line_chars": 0}, "min_line_chars"),
                         ({"num_shards": 0}, "num_shards"), ({"max_docs": "ten"}, "max_docs")]:
        with pytest.raises(ConfigError, match=word):
            registry.build("line_dedup", params)
    write_parquet(tmp_path / "in", "a.parquet", {"text": ["a\nb"]})
    r = subprocess.run([sys.executable, "-m", "prepline.cli", "run", "line_dedup", "--input", str(tmp_path / "in"),
                        "--output", str(tmp_path / "o")], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode != 0 and "contents" in r.stderr and "fix: " in r.stderr and "Traceback" not in r.stderr, r.stderr
