"""exact_dedup: normalised-text duplicates removed, the copy with the smallest id kept."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from conftest import tree_bytes, write_parquet
from prepline.engine import RunOptions, run_transform
from prepline.errors import InputError


def test_exact_dedup_keeps_smallest_id_and_counts(tmp_path, corpus):
    run_transform("doc_id", {}, RunOptions(str(corpus), str(tmp_path / "ids"), workers=1))
    m = run_transform("exact_dedup", {}, RunOptions(str(tmp_path / "ids"), str(tmp_path / "d"), workers=1)).metadata
    kept = []
    for rel in tree_bytes(tmp_path / "d"):
        kept += pq.read_table(tmp_path / "d" / rel).to_pylist()
    texts = sorted(" ".join(r["contents"].lower().split()) for r in kept)
    assert texts == sorted(set(texts))  # no duplicates remain
    # ids follow the sorted listing a, c, lang=en/b: the empty text of c (n=9) precedes that of b (n=4)
    assert {r["n"] for r in kept} == {0, 2, 3, 6, 8, 9}  # the copy with the smallest id of each text
    assert m["totals"]["removed"] == {"exact_duplicate": 4}


def test_normalize_false_compares_exact_bytes(tmp_path):
    write_parquet(tmp_path / "in", "a.parquet", {"contents": ["A  b", "a b", "a b", "a\tb"], "doc_id": [3, 1, 2, 0]})
    m = run_transform("exact_dedup", {"normalize": False}, RunOptions(str(tmp_path / "in"), str(tmp_path / "o"))).metadata
    assert pq.read_table(tmp_path / "o" / "a.parquet").column("doc_id").to_pylist() == [3, 1, 0]
    assert m["totals"]["removed"] == {"exact_duplicate": 1}
    m = run_transform("exact_dedup", {}, RunOptions(str(tmp_path / "in"), str(tmp_path / "o2"))).metadata
    assert pq.read_table(tmp_path / "o2" / "a.parquet").column("doc_id").to_pylist() == [0]  # all four are "a b"
    assert m["totals"]["removed"] == {"exact_duplicate": 3}


def test_without_ids_it_says_to_run_doc_id_first(tmp_path):
    write_parquet(tmp_path / "in", "a.parquet", {"contents": ["x", "x"]})
    with pytest.raises(InputError, match="run doc_id first"):
        run_transform("exact_dedup", {}, RunOptions(str(tmp_path / "in"), str(tmp_path / "o")))


def test_repeated_ids_are_refused_like_fuzzy_dedup(tmp_path):
    ids = {"contents": ["a", "b", "a"], "doc_id": [1, 2, 3]}
    write_parquet(tmp_path / "in", "x.parquet", ids)
    write_parquet(tmp_path / "in", "y.parquet", ids)  # the same file twice: ids 1 and 2 are kept copies in both
    with pytest.raises(InputError, match="id [12] of column 'doc_id' belongs to more than one document"):  # either shard's
        run_transform("exact_dedup", {}, RunOptions(str(tmp_path / "in"), str(tmp_path / "out"), workers=1, max_failed_files=5))
    write_parquet(tmp_path / "in2", "x.parquet", {"contents": ["a", "b"], "doc_id": [7, 7]})
    with pytest.raises(Exception, match="id column 'doc_id' is not unique"):
        run_transform("exact_dedup", {}, RunOptions(str(tmp_path / "in2"), str(tmp_path / "out2"), workers=1))


def test_a_file_read_in_many_batches_gives_the_same_output(tmp_path, monkeypatch):
    """The hash phase keeps one batch of keys (each batch's distinct keys go to the shards), the
    final map reads only its batch's keys: duplicates across batches of one file are still found."""
    texts = [f"text {i % 37}" for i in range(3000)]  # each text ~81 times, spread over every batch
    write_parquet(tmp_path / "in", "a.parquet", {"contents": texts, "doc_id": list(range(3000))[::-1]})
    whole = run_transform("exact_dedup", {}, RunOptions(str(tmp_path / "in"), str(tmp_path / "one"))).metadata
    monkeypatch.setenv("PREPLINE_BATCH_MB", "0.002")
    parts = run_transform("exact_dedup", {}, RunOptions(str(tmp_path / "in"), str(tmp_path / "many"))).metadata
    assert parts["totals"]["removed"] == whole["totals"]["removed"] == {"exact_duplicate": 3000 - 37}
    assert pq.read_table(tmp_path / "many" / "a.parquet").equals(pq.read_table(tmp_path / "one" / "a.parquet"))
    assert sorted(pq.read_table(tmp_path / "many" / "a.parquet").column("doc_id").to_pylist()) == list(range(37))  # the smallest ids
