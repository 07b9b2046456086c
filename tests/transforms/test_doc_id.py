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
