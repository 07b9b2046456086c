"""Partitioned work files: a shard reads exactly its rows, locally and on S3 (range reads)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prepline.data_access import PARQUET_WRITE_OPTIONS, open_location
from prepline.sharded import parquet_files, read_all, read_partition, read_range, read_rows, shard_of_ids, shard_of_keys, write_partitioned


def _tables(n_files: int = 3, rows: int = 500, seed: int = 1) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    return [pa.table({"id": pa.array(rng.integers(-10**12, 10**12, rows), pa.int64()),
                      "v": pa.array([f"{f}:{i}" for i in range(rows)])}) for f in range(n_files)]


def _check_partitions(loc, shards: int) -> None:
    tables = _tables()
    for f, t in enumerate(tables):
        written = write_partitioned(loc, f"parts/f{f}.arrow", t, shard_of_ids(t.column("id").to_numpy(), shards))
        assert 0 < written <= shards
    loc.write_bytes("parts/.f9.arrow.tmp-0123", b"not a finished file")  # a killed writer's temp file
    assert write_partitioned(loc, "parts/empty.arrow", tables[0].slice(0, 0), np.zeros(0, np.int64)) == 0
    seen = []
    for s in range(shards):
        got = read_partition(loc, "parts", s)
        want = [t.filter(pa.array(shard_of_ids(t.column("id").to_numpy(), shards) == s)) for t in tables]
        want = pa.concat_tables(want)
        if want.num_rows == 0:
            assert got is None
            continue
        assert got.equals(want)  # the shard's rows, in file order then row order
        assert not got.schema.metadata  # the partition index does not leak into results
        seen += got.column("v").to_pylist()
    assert sorted(seen) == sorted(v for t in tables for v in t.column("v").to_pylist())
    assert read_partition(loc, "nothing-here", 0) is None


def test_partitions_local(tmp_path):
    _check_partitions(open_location(str(tmp_path)), shards=7)


@pytest.mark.s3
def test_partitions_on_s3_with_range_reads(s3_bucket):
    loc = open_location(f"s3://{s3_bucket}/w")
    _check_partitions(loc, shards=4)
    size = next(x.size for x in loc.list_all("parts") if x.rel == "parts/f0.arrow")
    with loc.open_input("parts/f0.arrow") as f:  # no size given: it asks for it
        assert len(f.read()) == size


def test_shards_spread_consecutive_ids_and_keys():
    counts = np.bincount(shard_of_ids(np.arange(10_000), 8), minlength=8)
    assert counts.min() > 1000  # a hash, not id % shards blocks
    keys = np.array([3, 10, 2**64 - 1], dtype=np.uint64)
    assert shard_of_keys(keys, 4).tolist() == [3, 2, 3]


def test_read_range_reads_only_overlapping_row_groups(tmp_path, monkeypatch):
    loc = open_location(str(tmp_path))
    ids = np.arange(0, 300_000, 3, dtype=np.int64)  # 100,000 rows: two row groups of 64 Ki
    pq.write_table(pa.table({"id": ids, "x": ids * 2}), tmp_path / "c.parquet", **PARQUET_WRITE_OPTIONS)
    read = []
    orig = pq.ParquetFile.read_row_groups
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", lambda self, groups, *a, **k: read.append(list(groups)) or orig(self, groups, *a, **k))
    t = read_range(loc, "c.parquet", 10, 20)
    assert t.column("id").to_pylist() == [12, 15, 18] and read == [[0]]
    assert read_range(loc, "c.parquet", 10**9, 10**10) is None
    assert read_range(loc, "missing.parquet", 0, 1) is None
    assert read_range(loc, "c.parquet", 299_990, 10**9).column("x").to_pylist() == [599_982, 599_988, 599_994]
    assert read[-1] == [1]


def test_read_all_skips_temp_files_and_empty_tables(tmp_path):
    loc = open_location(str(tmp_path))
    loc.write_parquet("e/00001.parquet", pa.table({"a": [2, 3]}))
    loc.write_parquet("e/00000.parquet", pa.table({"a": [1]}))
    loc.write_parquet("e/00002.parquet", pa.table({"a": pa.array([], pa.int64())}))
    (tmp_path / "e" / ".00003.parquet.tmp-x").write_bytes(b"junk")
    assert parquet_files(loc, "e") == ["e/00000.parquet", "e/00001.parquet", "e/00002.parquet"]
    assert read_all(loc, "e").column("a").to_pylist() == [1, 2, 3]
    assert read_all(loc, "none") is None


def test_read_rows_reads_only_the_row_groups_that_hold_the_rows(tmp_path):
    t = pa.table({"id": pa.array(np.arange(1000), pa.int64())})
    pq.write_table(t, tmp_path / "k.parquet", row_group_size=100)
    pf = pq.ParquetFile(tmp_path / "k.parquet")
    for first, count in ((0, 1000), (0, 100), (95, 10), (250, 300), (999, 1), (400, 0), (990, 50)):
        assert read_rows(pf, first, count).column("id").to_pylist() == list(range(first, min(first + count, 1000))), (first, count)
    read = []
    pf.read_row_groups = lambda groups, **kw: read.extend(groups) or pq.ParquetFile.read_row_groups(pf, groups, **kw)
    read_rows(pf, 250, 300)
    assert read == [2, 3, 4, 5]


@pytest.mark.s3
def test_a_shard_reads_an_object_stores_files_ahead_in_file_order(s3_bucket, monkeypatch):
    """Each partitioned file costs its tail's and its batch's GET (latency, not bytes): on S3 a shard task
    reads up to PARTITION_READERS of them at once, and still yields them in file order."""
    import threading
    import time

    from prepline import sharded

    loc = open_location(f"s3://{s3_bucket}/ahead")
    tables = _tables(n_files=12, rows=200, seed=5)
    for f, t in enumerate(tables):
        write_partitioned(loc, f"parts/f{f:02d}.arrow", t, shard_of_ids(t.column("id").to_numpy(), 3))
    live, most, lock = [0], [0], threading.Lock()
    read = sharded._read

    def slow_read(loc, f, lo, hi):
        with lock:
            live[0] += 1
            most[0] = max(most[0], live[0])
        time.sleep(0.05)  # a GET's latency
        with lock:
            live[0] -= 1
        return read(loc, f, lo, hi)

    monkeypatch.setattr(sharded, "_read", slow_read)
    monkeypatch.setattr(sharded, "PARTITION_READERS", 4)
    got = read_partition(loc, "parts", 1)
    want = pa.concat_tables([t.filter(pa.array(shard_of_ids(t.column("id").to_numpy(), 3) == 1)) for t in tables])
    assert got.equals(want) and most[0] == 4  # four reads at once, never more; the rows in file then row order
    first = next(sharded.iter_partition(loc, "parts", 2))  # a consumer that stops early does not hang
    assert first.num_rows > 0


@pytest.mark.s3
def test_a_shard_of_a_file_costs_two_gets_at_most(s3_bucket, monkeypatch):
    """The tail read gives the index and schema (and a small file's batches): one GET for a small file,
    two when the shard's batch lies before the tail, three only when the index outgrows the tail."""
    from prepline import objstore, sharded

    loc = open_location(f"s3://{s3_bucket}/gets")
    rng = np.random.default_rng(3)
    small = _tables(n_files=1, rows=300, seed=2)[0]
    big = pa.table({"id": pa.array(rng.integers(-10**12, 10**12, 40_000), pa.int64()),
                    "v": pa.array(rng.integers(0, 2**62, 40_000), pa.int64())})  # ~640 kB: incompressible
    for name, t, shards in (("small", small, 4), ("big", big, 4), ("many", small.slice(0, 300), 2000)):
        write_partitioned(loc, f"{name}/f.arrow", t, shard_of_ids(t.column("id").to_numpy(), shards))
    gets = []
    real = objstore.read_range
    monkeypatch.setattr(objstore, "read_range", lambda *a, **k: gets.append(a[2:4]) or real(*a, **k))
    monkeypatch.setattr(loc, "open_input", lambda *a, **k: pytest.fail("a partitioned file is read by ranges, not opened"))
    for name, t, shards, want_gets in (("small", small, 4, 1), ("big", big, 4, 2), ("many", small, 2000, 3)):
        # "many": an index of ~300 shards, larger than a (here) 2 kB tail: the index and schema, then the batch
        monkeypatch.setattr(sharded, "TAIL_BYTES", 2048 if name == "many" else 64 * 1024)
        ids = t.column("id").to_numpy()
        for s in sorted(set(shard_of_ids(ids, shards).tolist()))[:3]:
            gets.clear()
            got = read_partition(loc, name, s)
            assert got.equals(t.filter(pa.array(shard_of_ids(ids, shards) == s)))
            assert len(gets) == want_gets, (name, s, gets)


def test_a_partitioned_file_of_arrows_file_format_is_still_read(tmp_path):
    """A work folder written before the tail index (a resumed run) holds Arrow IPC files whose schema
    metadata indexes the batches: they are read as before, not skipped."""
    import json

    import pyarrow.ipc as ipc

    loc = open_location(str(tmp_path))
    t = _tables(n_files=1, rows=400, seed=9)[0]
    shard = shard_of_ids(t.column("id").to_numpy(), 3)
    order = np.argsort(shard, kind="stable")
    present = sorted(set(shard.tolist()))
    schema = t.schema.with_metadata({b"prepline.shards": json.dumps({str(s): i for i, s in enumerate(present)}).encode()})
    with loc.open_output("old/f.arrow") as f, ipc.new_file(f, schema) as w:
        for s in present:
            w.write_table(t.take(pa.array(order[shard[order] == s])).replace_schema_metadata(schema.metadata))
    for s in present:
        got = read_partition(loc, "old", s)
        assert got.equals(t.filter(pa.array(shard == s))) and not got.schema.metadata
