"""Sharded multi-phase work: the files through which the phases of a global transform talk.

A global transform (exact and fuzzy dedup, the trained tokenizer) runs phases before its final
per-file map (:class:`prepline.transform.Phase`): a map over the input files, a reduce over hash
shards, or one task that runs once. Phases talk through files under the stage's work folder
(``ctx.work``), so each phase resumes from its completion markers. Two kinds of files:

* **Partitioned files** (:func:`write_partitioned`, :func:`read_partition`): what a producer task
  sends to the tasks of a shard phase. A producer writes *one* file: an Arrow IPC stream with one
  record batch per shard it has rows for, then the schema again and an index of each shard's byte
  span, then the index's length and a magic tag. The task of shard ``s`` reads the file's tail (one
  ranged read of ``TAIL_BYTES``: the index and schema) and then only its batch's bytes (a second
  read, none when the batch is in the tail): two requests a file on an object store, where Arrow's
  file format took about five (its magic, footer length, footer, then the batch). So no task holds
  more than its shard, a producer writes one file whatever the shard count, and reading a shard
  costs no Parquet decoding. Files of Arrow's file format (an older version's work folder being
  resumed) are still read.
* **Parquet results** (:func:`read_all`, :func:`read_range`): what a phase leaves for the plan or
  the final map (duplicate keys, edges, clusters). :func:`read_range` reads only the row groups
  of an id-sorted file whose statistics overlap the wanted ids.

Rows go to shards by a hash (:func:`shard_of_ids` for ids, :func:`shard_of_keys` for keys that are
hashes already), never by order of arrival: every layout here depends only on the data, so the
output is the same for any runtime and worker count.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from prepline.data_access import LocalLocation, Location
from prepline.minhash import mix64

__all__ = ["iter_partition", "parquet_files", "read_all", "read_partition", "read_range", "read_rows", "SortedFile", "shard_of_ids", "shard_of_keys", "write_partitioned"]

#: schema metadata key of a partitioned file of Arrow's file format (before the tail index): {"<shard>": <batch index>}
_INDEX_KEY = b"prepline.shards"
PARTITIONED_SUFFIX = ".arrow"
#: a partitioned file ends with ``<index JSON><its length: uint32 LE><_MAGIC>``
_MAGIC = b"PLSHARD1"
#: bytes of a partitioned file's end read first: the index and schema (and, in a small file, every batch)
TAIL_BYTES = 64 * 1024


class _Counted:
    """A write-only file that counts the bytes written through it (the shards' byte spans)."""

    def __init__(self, f):
        self._f, self.n, self.closed = f, 0, False

    def write(self, b) -> int:
        b = memoryview(b)
        self._f.write(b)
        self.n += b.nbytes
        return b.nbytes

    def flush(self) -> None:
        pass

    def close(self) -> None:  # the stream writer's close must not close the file: the tail follows
        pass


def shard_of_ids(ids: np.ndarray, shards: int) -> np.ndarray:
    """The shard of each id (hashed, so consecutive ids spread over the shards)."""
    return (mix64(np.asarray(ids).astype(np.int64).view(np.uint64)) % np.uint64(shards)).astype(np.int64)


def shard_of_keys(keys: np.ndarray, shards: int) -> np.ndarray:
    """The shard of each key that is a hash already (uint64): its remainder."""
    return (np.asarray(keys, dtype=np.uint64) % np.uint64(shards)).astype(np.int64)


def _split_by(table: pa.Table, shard: np.ndarray) -> list[tuple[int, pa.Table]]:
    """(shard, rows of that shard) for each shard present, rows in their original order."""
    if table.num_rows == 0:
        return []
    order = np.argsort(shard, kind="stable")
    s = shard[order]
    cuts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[cuts[1:], len(s)]
    table = table.take(pa.array(order))
    return [(int(s[c]), table.slice(c, e - c)) for c, e in zip(cuts, ends)]


def write_partitioned(loc: Location, rel: str, table: pa.Table, shard: np.ndarray) -> int:
    """Write ``table`` (row ``i`` to shard ``shard[i]``) as one partitioned file at ``rel``
    (which should end with ``.arrow``). Nothing is written for an empty table. Returns the number
    of shards written."""
    parts = _split_by(table, shard)
    if not parts:
        return 0
    schema = table.schema
    spans: dict[str, list[int]] = {}
    with loc.open_output(rel) as f:
        out = _Counted(f)
        with ipc.new_stream(out, schema, options=ipc.IpcWriteOptions(compression="lz4")) as w:
            for s, part in parts:  # streamed to the file: no second copy of the table in memory
                lo = out.n
                w.write_batch(pa.RecordBatch.from_arrays([col.combine_chunks() for col in part.columns], schema=schema))
                spans[str(s)] = [lo, out.n - lo]
        schema_bytes = schema.serialize().to_pybytes()
        index = json.dumps({"schema": [out.n, len(schema_bytes)], "shards": spans}, separators=(",", ":")).encode()
        out.write(schema_bytes)
        out.write(index + struct.pack("<I", len(index)) + _MAGIC)
    return len(parts)


def _visible(rel: str, suffix: str) -> bool:
    return rel.endswith(suffix) and not rel.rsplit("/", 1)[-1].startswith(".")


#: partitioned files a shard task reads at once from an object store: a file's tail and its batch are two
#: round trips, whose time is latency, not bytes (scripts/bench.py --shuffle-reads), and a shard reads a
#: batch of every producer's file; a local folder is read one file after another (no latency to hide)
PARTITION_READERS = 16


def _read(loc: Location, f, lo: int, hi: int) -> bytes:
    """Bytes ``[lo, hi)`` of a listed file: one ranged GET on an object store."""
    if isinstance(loc, LocalLocation):
        with loc.open_input(f.rel, f.size) as fh:
            fh.seek(lo)
            return fh.read(hi - lo)
    from prepline.objstore import read_range

    return read_range(loc, f.rel, lo, hi)


def _shard_batch(loc: Location, f, shard: int) -> pa.Table | None:
    """Shard ``shard``'s rows of one partitioned file: its tail (index and schema), then its batch's bytes."""
    if f.size is None:
        raise ValueError(f"{f.rel}: a partitioned file is read from a listing that gives its size")
    base = max(0, f.size - TAIL_BYTES)
    tail = _read(loc, f, base, f.size)
    if tail[-len(_MAGIC):] != _MAGIC:  # Arrow's file format (written before the tail index)
        return _shard_batch_of_ipc_file(loc, f, shard)
    (n,) = struct.unpack("<I", tail[-len(_MAGIC) - 4 : -len(_MAGIC)])
    start = f.size - len(_MAGIC) - 4 - n
    if start < base:  # an index larger than the tail (thousands of shards): one more read, with the schema before it
        base = max(0, start - 16 * 1024)
        tail = _read(loc, f, base, f.size)
    index = json.loads(tail[start - base : start - base + n])
    span = index["shards"].get(str(shard))
    if span is None:
        return None

    def piece(lo: int, length: int) -> bytes:
        return tail[lo - base : lo - base + length] if lo >= base else _read(loc, f, lo, lo + length)

    schema = ipc.read_schema(pa.py_buffer(piece(*index["schema"])))
    # the stream writer writes its schema message with the first batch: the first span holds both
    msg = next(m for m in ipc.MessageReader.open_stream(pa.py_buffer(piece(*span))) if m.type == "record batch")
    batch = ipc.read_record_batch(msg, schema)
    return pa.Table.from_batches([batch]).replace_schema_metadata(None) if batch.num_rows else None


def _shard_batch_of_ipc_file(loc: Location, f, shard: int) -> pa.Table | None:
    reader = ipc.open_file(loc.open_input(f.rel, f.size))
    i = json.loads(reader.schema.metadata[_INDEX_KEY]).get(str(shard))
    if i is None:
        return None
    batch = reader.get_batch(i)
    return pa.Table.from_batches([batch]).replace_schema_metadata(None) if batch.num_rows else None


def iter_partition(loc: Location, prefix: str, shard: int) -> Iterator[pa.Table]:
    """The rows of ``shard`` from each partitioned file under ``prefix``, in file order, one file at a
    time (files without rows for it are skipped): for consumers that can work a piece at a time. From
    an object store up to PARTITION_READERS files are read ahead at once (memory: that many batches)."""
    files = [f for f in loc.list_all(prefix) if _visible(f.rel, PARTITIONED_SUFFIX)]
    if isinstance(loc, LocalLocation) or len(files) < 2:
        for f in files:
            if (t := _shard_batch(loc, f, shard)) is not None:
                yield t
        return
    with ThreadPoolExecutor(PARTITION_READERS, thread_name_prefix="partition") as pool:
        ahead = iter(files)
        window = deque(pool.submit(_shard_batch, loc, f, shard) for f in itertools.islice(ahead, PARTITION_READERS))
        try:
            while window:
                t = window.popleft().result()
                if (f := next(ahead, None)) is not None:
                    window.append(pool.submit(_shard_batch, loc, f, shard))
                if t is not None:
                    yield t
        finally:
            for fut in window:  # a consumer that stopped early, or a failed read: the rest is not waited for
                fut.cancel()


def read_partition(loc: Location, prefix: str, shard: int) -> pa.Table | None:
    """The rows of ``shard`` from every partitioned file under ``prefix`` (None: no rows)."""
    tables = list(iter_partition(loc, prefix, shard))
    return pa.concat_tables(tables) if tables else None


def parquet_files(loc: Location, prefix: str) -> list[str]:
    """The Parquet files under ``prefix`` (temp files left out), sorted."""
    return [f.rel for f in loc.list_all(prefix) if _visible(f.rel, ".parquet")]


def read_all(loc: Location, prefix: str) -> pa.Table | None:
    """Every row of the Parquet files under ``prefix``, in path order (None: no rows)."""
    tables = [t for t in (loc.read_parquet(rel) for rel in parquet_files(loc, prefix)) if t.num_rows]
    return pa.concat_tables(tables) if tables else None


def read_range(loc: Location, rel: str, lo: int, hi: int, column: str = "id") -> pa.Table | None:
    """Rows of a Parquet file sorted by ``column`` with ``lo <= column <= hi``: only the row groups
    whose statistics overlap are read. None when the file does not exist or nothing overlaps."""
    try:
        pf = loc.parquet_file(rel)
    except (FileNotFoundError, OSError):
        return None
    return SortedFile(pf, column).range(lo, hi)


class SortedFile:
    """A Parquet file sorted by ``column``, opened once for many :meth:`range` reads (e.g. one per
    batch of an input file): each reads only the row groups whose statistics overlap."""

    def __init__(self, pf: pq.ParquetFile, column: str = "id"):
        self.pf, self.column = pf, column
        md, col = pf.metadata, pf.schema_arrow.get_field_index(column)
        stats = [md.row_group(i).column(col).statistics for i in range(md.num_row_groups)]
        self.bounds = [(st.min, st.max) if st is not None and st.has_min_max else None for st in stats]

    def range(self, lo: int, hi: int) -> pa.Table | None:
        """Rows with ``lo <= column <= hi`` (None: no row group overlaps)."""
        groups = [i for i, b in enumerate(self.bounds) if b is None or not (b[1] < lo or b[0] > hi)]
        if not groups:
            return None
        t = self.pf.read_row_groups(groups)
        v = t.column(self.column).to_numpy()
        return t.filter(pa.array((v >= lo) & (v <= hi)))


def read_rows(pf: pq.ParquetFile, first: int, count: int) -> pa.Table:
    """Rows [first, first + count) of a Parquet file, reading only the row groups that hold them."""
    md = pf.metadata
    starts = np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)])
    groups = [i for i in range(md.num_row_groups) if starts[i] < first + count and starts[i + 1] > first]
    if not groups:
        return pf.schema_arrow.empty_table()
    return pf.read_row_groups(groups).slice(first - int(starts[groups[0]]), count)
