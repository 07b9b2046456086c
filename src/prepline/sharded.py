"""Sharded multi-phase work: the files through which the phases of a global transform talk.

A global transform (exact and fuzzy dedup, the trained tokenizer) runs phases before its final
per-file map (:class:`prepline.transform.Phase`): a map over the input files, a reduce over hash
shards, or one task that runs once. Phases talk through files under the stage's work folder
(``ctx.work``), so each phase resumes from its completion markers. Two kinds of files:

* **Partitioned files** (:func:`write_partitioned`, :func:`read_partition`): what a producer task
  sends to the tasks of a shard phase. A producer writes *one* Arrow IPC file holding one record
  batch per shard it has rows for (the batch index is in the schema metadata); the task of shard
  ``s`` reads only batch ``s`` of every file under a prefix, through the storage layer's random
  access (:meth:`prepline.data_access.Location.open_input`: memory-mapped locally, range reads
  through fsspec elsewhere). So no task holds more than its shard, a producer writes one file whatever the shard count,
  and reading a shard costs no Parquet decoding.
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

#: schema metadata key of a partitioned file: {"<shard>": <record batch index>}
_INDEX_KEY = b"prepline.shards"
PARTITIONED_SUFFIX = ".arrow"


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
    index = {str(s): i for i, (s, _) in enumerate(parts)}
    schema = table.schema.with_metadata({_INDEX_KEY: json.dumps(index).encode()})
    with loc.open_output(rel) as f, ipc.new_file(f, schema, options=ipc.IpcWriteOptions(compression="lz4")) as w:
        for _, part in parts:  # streamed to the file: no second copy of the table in memory
            w.write_batch(pa.RecordBatch.from_arrays([col.combine_chunks() for col in part.columns], schema=schema))
    return len(parts)


def _visible(rel: str, suffix: str) -> bool:
    return rel.endswith(suffix) and not rel.rsplit("/", 1)[-1].startswith(".")


#: partitioned files a shard task reads at once from an object store: opening one and reading its batch
#: takes about five round trips, whose time is latency, not bytes (155 ms a file at 30 ms a request, 27 ms
#: with 16 at once: scripts/bench.py --shuffle-reads), and a shard reads a batch of every producer's file;
#: a local folder is read one file after another (no latency to hide)
PARTITION_READERS = 16


def _shard_batch(loc: Location, f, shard: int) -> pa.Table | None:
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
