"""The final map streams: a file is read and written batch by batch, so memory does not follow the
file size; a single file is an input; outputs are the same for any batch size, runtime or worker count."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import tree_bytes
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, InputError
from prepline.transform import FileTask, Output
from prepline.transforms.doc_id import DocId


def _many_row_groups(path, groups: int = 24, rows: int = 500) -> pa.Table:
    rng = np.random.default_rng(0)
    texts = [" ".join(map(str, rng.integers(0, 10**6, 30))) for _ in range(groups * rows)]
    table = pa.table({"contents": texts, "n": np.arange(groups * rows)})
    pq.write_table(table, path, row_group_size=rows)
    assert pq.ParquetFile(path).metadata.num_row_groups == groups
    return table.combine_chunks()


def _run_spied(src, out, monkeypatch, batch_mb: float) -> list[tuple[int, int, int]]:
    """Run doc_id in this process; (first_row, rows, Arrow bytes allocated since the run began) per
    transform call (what earlier tests of this process still hold is not the run's)."""
    monkeypatch.setenv("PREPLINE_BATCH_MB", str(batch_mb))
    seen: list[tuple[int, int, int]] = []
    real = DocId.transform
    before = pa.total_allocated_bytes()

    def spy(self, t: pa.Table, task: FileTask) -> Output:
        seen.append((task.first_row, t.num_rows, pa.total_allocated_bytes() - before))
        return real(self, t, task)

    monkeypatch.setattr(DocId, "transform", spy)
    run_transform("doc_id", {}, RunOptions(str(src), str(out), workers=1, progress=False))
    monkeypatch.setattr(DocId, "transform", real)
    return seen


def test_final_map_reads_bounded_batches_and_writes_incrementally(tmp_path, monkeypatch):
    src = tmp_path / "in"
    src.mkdir()
    table = _many_row_groups(src / "big.parquet")
    rows, nbytes = table.num_rows, table.nbytes
    del table  # (Arrow memory held by the test would hide the difference)
    whole = _run_spied(src, tmp_path / "whole", monkeypatch, 1024)
    assert [(s, n) for s, n, _ in whole] == [(0, rows)]  # one batch: the whole file

    seen = _run_spied(src, tmp_path / "out", monkeypatch, nbytes / 20 / 2**20)  # ~20 batches
    # many bounded batches, in file order, each handed over with where it starts in the file
    assert len(seen) >= 15
    assert seen[0][0] == 0 and all(b == a + n for (a, n, _), (b, _, _) in zip(seen, seen[1:]))
    assert max(n for _, n, _ in seen) <= rows // 10
    # memory held while transforming: a fraction of the whole-file read's
    assert max(m for _, _, m in seen) < whole[0][2] / 3
    # the writer got one row group per batch, and ids continue across batches
    out = pq.ParquetFile(tmp_path / "out" / "big.parquet")
    assert out.metadata.num_row_groups == len(seen)
    assert out.read().equals(pq.read_table(tmp_path / "whole" / "big.parquet"))


def test_output_is_the_same_for_any_worker_count_and_the_same_rows_for_any_batch_size(tmp_path, monkeypatch):
    src = tmp_path / "in"
    src.mkdir()
    _many_row_groups(src / "a.parquet", groups=6, rows=300)
    _many_row_groups(src / "b.parquet", groups=3, rows=100)
    monkeypatch.setenv("PREPLINE_BATCH_MB", "0.04")  # the spawned workers read it too
    run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "o1"), workers=1, progress=False))
    run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "o2"), workers=2, progress=False))
    assert tree_bytes(tmp_path / "o1") == tree_bytes(tmp_path / "o2")
    monkeypatch.delenv("PREPLINE_BATCH_MB")  # one batch per file
    run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "o3"), workers=1, progress=False))
    for name in ("a.parquet", "b.parquet"):
        assert pq.read_table(tmp_path / "o1" / name).equals(pq.read_table(tmp_path / "o3" / name))


def test_a_failing_batch_leaves_no_output_file(tmp_path, monkeypatch):
    src = tmp_path / "in"
    src.mkdir()
    _many_row_groups(src / "a.parquet", groups=8, rows=200)
    monkeypatch.setenv("PREPLINE_BATCH_MB", "0.03")
    real = DocId.transform

    def fail_late(self, t, task):
        if task.first_row > 600:
            raise InputError(f"{task.path}: simulated failure in a late batch", "none")
        return real(self, t, task)

    monkeypatch.setattr(DocId, "transform", fail_late)
    with pytest.raises(Exception, match="simulated failure"):
        run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "out"), workers=1, progress=False))
    left = sorted(p.name for p in (tmp_path / "out").rglob("*") if p.is_file() and "_prepline" not in p.parts)
    assert left == ["metadata.json"]  # no half-written a.parquet, no temp file


def test_single_file_input(tmp_path):
    src = tmp_path / "data"
    src.mkdir()
    table = _many_row_groups(src / "one.parquet", groups=2, rows=10)
    pq.write_table(table, src / "other.parquet")
    res = run_transform("doc_id", {}, RunOptions(str(src / "one.parquet"), str(tmp_path / "out"), workers=1, progress=False))
    assert sorted(res.metadata["files"]) == ["one.parquet"]  # the other file in the folder is not read
    assert pq.read_table(tmp_path / "out" / "one.parquet").num_rows == 20
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["totals"]["files"] == 1
    # the output may sit next to the file (in the same folder), but not be that folder
    run_transform("doc_id", {}, RunOptions(str(src / "one.parquet"), str(src / "ids"), workers=1, progress=False))
    assert (src / "ids" / "one.parquet").exists()
    with pytest.raises(ConfigError, match="inside output"):
        run_transform("doc_id", {}, RunOptions(str(src / "one.parquet"), str(src), workers=1, progress=False))
    (src / "notes.txt").write_text("x")
    with pytest.raises(InputError, match=r"is not a \.parquet file"):
        run_transform("doc_id", {}, RunOptions(str(src / "notes.txt"), str(tmp_path / "o2"), workers=1, progress=False))


@pytest.mark.s3
def test_single_s3_object_input(s3_bucket, tmp_path):
    from prepline.data_access import open_location

    loc = open_location(f"s3://{s3_bucket}/in")
    loc.write_parquet("x/one.parquet", pa.table({"contents": ["a", "b", "c"]}))
    loc.write_parquet("x/two.parquet", pa.table({"contents": ["d"]}))
    res = run_transform("doc_id", {}, RunOptions(f"s3://{s3_bucket}/in/x/one.parquet", f"s3://{s3_bucket}/out", workers=1, progress=False))
    assert sorted(res.metadata["files"]) == ["one.parquet"] and res.metadata["totals"]["docs_out"] == 3
    assert [f.rel for f in open_location(f"s3://{s3_bucket}/out").list_files()] == ["one.parquet"]


def test_unsupported_scheme_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="scheme 'ftp://' is not supported"):
        run_transform("doc_id", {}, RunOptions("ftp://host/in", str(tmp_path / "out"), workers=1, progress=False))
    assert not (tmp_path / "out").exists()


def test_unique_ids_checked_batch_by_batch_in_little_memory():
    """UniqueIds (exact and fuzzy dedup's map phases) finds an id repeated in any two batches of a
    file; dense ids cost a byte each of their range, not 8 bytes each and a sort of the whole file."""
    from prepline.transform import UniqueIds

    def check(batches) -> str | None:
        u = UniqueIds("f.parquet", "doc_id")
        try:
            for b in batches:
                u.add(np.asarray(b, np.int64))
            u.check()
        except InputError as e:
            return e.message
        return None

    up = [range(a, a + 1000) for a in range(10_000, 110_000, 1000)]
    assert check(up) is None and check(up[::-1]) is None  # growing upwards, then downwards
    assert check([*up[:50], [10_500], *up[50:]]) == "f.parquet: id column 'doc_id' is not unique (e.g. id 10500 appears more than once)"
    assert "id 109999 appears" in check([*up[::-1], [5, 109_999]])  # a repeat after growing downwards
    assert "id 7 appears" in check([[1, 7, 7]])  # within a batch
    u = UniqueIds("f.parquet", "doc_id")
    for b in up:
        u.add(np.asarray(b, np.int64))
    assert u.seen.nbytes <= 2 * 100_000 and u.sparse is None  # a byte per id of the range (room: at most twice)
    # sparse ids (a hash, a timestamp): kept as they are, checked at the end
    sparse = [np.arange(k, 10**12, 10**9, dtype=np.int64) for k in range(5)]
    assert check(sparse) is None
    assert "id 1000000003 appears" in check([*sparse, [10**9 + 3]])
    assert check([[], [5], []]) is None
