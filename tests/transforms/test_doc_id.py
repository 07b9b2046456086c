"""doc_id: dense ids in listing order, and the SHA-256 of each text."""

from __future__ import annotations

import hashlib

import pyarrow.parquet as pq
import pytest

from conftest import make_corpus, tree_bytes, write_parquet
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError


def test_doc_ids_dense_unique_and_sorted_by_file(tmp_path):
    src = make_corpus(tmp_path / "in")
    run_transform("doc_id", {"start_id": 100}, RunOptions(str(src), str(tmp_path / "o"), workers=1))
    ids = []
    for rel in sorted(tree_bytes(tmp_path / "o")):
        ids += pq.read_table(tmp_path / "o" / rel).column("doc_id").to_pylist()
    assert ids == list(range(100, 100 + len(ids)))


def test_hash_is_the_sha256_of_the_utf8_text_and_columns_can_be_skipped(tmp_path):
    texts = ["hello", "", "日本語のテキスト", "hello"]
    write_parquet(tmp_path / "in", "a.parquet", {"contents": texts})
    run_transform("doc_id", {}, RunOptions(str(tmp_path / "in"), str(tmp_path / "o")))
    t = pq.read_table(tmp_path / "o" / "a.parquet")
    assert t.column("doc_hash").to_pylist() == [hashlib.sha256(x.encode()).hexdigest() for x in texts]
    assert t.column_names == ["contents", "doc_hash", "doc_id"]
    run_transform("doc_id", {"hash_column": ""}, RunOptions(str(tmp_path / "in"), str(tmp_path / "o2")))
    assert pq.read_table(tmp_path / "o2" / "a.parquet").column_names == ["contents", "doc_id"]
    run_transform("doc_id", {"id_column": ""}, RunOptions(str(tmp_path / "in"), str(tmp_path / "o3")))
    assert pq.read_table(tmp_path / "o3" / "a.parquet").column_names == ["contents", "doc_hash"]
    with pytest.raises(ConfigError, match="does nothing"):
        run_transform("doc_id", {"id_column": "", "hash_column": ""}, RunOptions(str(tmp_path / "in"), str(tmp_path / "o4")))


def test_a_start_id_whose_ids_overflow_int64_is_a_usage_error_before_any_file_is_written(tmp_path, corpus):
    """Issue 30 finding 9: start_id near 2**63 made the worker fail with OverflowError, "this is a bug" (exit 70)."""
    from prepline.cli import main
    from prepline.errors import ConfigError

    n = 10  # documents in the corpus fixture
    out = tmp_path / "o"
    with pytest.raises(ConfigError, match="overflows the int64 ids") as e:
        run_transform("doc_id", {"start_id": 2**63 - n + 1}, RunOptions(str(corpus), str(out), workers=1))
    assert f"--start-id {2**63 - n}" in e.value.fix
    assert not list(out.rglob("*.parquet"))
    assert main(["run", "doc_id", "--input", str(corpus), "--output", str(tmp_path / "c"), "--start-id", str(2**63 - 1), "--no-progress"]) == 2
    meta = run_transform("doc_id", {"start_id": 2**63 - n}, RunOptions(str(corpus), str(tmp_path / "edge"), workers=1)).metadata
    assert meta["plan"]["last_id"] == 2**63 - 1
