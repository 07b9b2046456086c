"""exact_dedup: remove documents whose normalised text equals an earlier document's.

Three phases, each resumable; a map task holds one batch, a reduce task one shard's keys:

1. ``hash`` (per file, streamed batch by batch): a 128-bit key of the normalised text
   (:func:`prepline.hashing.dedup_keys`: optionally NFKC, lower-cased, trimmed, every run of
   Unicode white space collapsed to one space); the per-row keys are written for phase 3 as they
   come, and each batch's distinct keys with their smallest id and count go to a partitioned
   file (:mod:`prepline.sharded`), by key into ``num_shards`` shards.
2. ``reduce`` (per shard): group a shard's keys across files; keys seen more than once are
   duplicates, and the copy to keep is the one with the smallest id.
3. final map (per file): drop rows whose key is a duplicate and whose id is not the kept one.

The keep rule (smallest id) does not depend on the order files are processed in, so the output
is identical for any runtime and worker count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prepline import hashing
from prepline.config import TransformConfig, param
from prepline.registry import register
from prepline.errors import InputError
from prepline.sharded import read_all, read_partition, read_rows, shard_of_keys, write_partitioned
from prepline.transform import Column, FileTask, Output, Phase, Transform, UniqueIds

REASON = "exact_duplicate"


@dataclass(frozen=True)
class ExactDedupConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text")
    id_column: str = param("doc_id", "int64 id column (run doc_id first); the copy with the smallest id is kept")
    num_shards: int = param(16, "number of hash shards (more shards: less memory per reduce task)", min=1, max=4096)
    normalize: bool = param(True, "compare lower-cased text with every run of Unicode white space collapsed to one space and trimmed (False: exact bytes)")
    nfkc: bool = param(False, "with normalize: also apply Unicode NFKC first (full-width and compatibility forms, ligatures, composed accents compare equal); costs about 40 % more key time on non-ASCII text")


KEY_SCHEMA = pa.schema([("h", pa.uint64()), ("l", pa.uint64()), ("id", pa.int64())])


def _key_table(keys: np.ndarray, ids: np.ndarray) -> pa.Table:
    return pa.table({"h": pa.array(keys[:, 0]), "l": pa.array(keys[:, 1]), "id": pa.array(ids, pa.int64())}, schema=KEY_SCHEMA)


@register
class ExactDedup(Transform):
    name = "exact_dedup"
    Config = ExactDedupConfig
    summary = "remove exact duplicates (normalised text), keeping the copy with the smallest id"
    headline = ("removed.*", "plan.distinct_texts", "plan.duplicated_texts")
    plan_needs_every_file = True  # a file failing after the plan may hold the kept copies of other files' duplicates

    def input_columns(self) -> list[Column]:
        return [
            Column(self.config.content_column, "string"),
            Column(self.config.id_column, "int64", fix="run doc_id first, or set id_column to an existing int64 id column"),
        ]

    def phases(self) -> list[Phase]:
        return [Phase("hash", "files", "hash_file"), Phase("reduce", "shards", "reduce_shard")]

    def num_shards(self) -> int:
        return self.config.num_shards

    def _keys(self, text) -> np.ndarray:
        con = getattr(self, "_con", None) or hashing.connect()
        self._con = con
        return hashing.dedup_keys(con, text, self.config.normalize, self.config.nfkc)

    # phase 1 -------------------------------------------------------------------------------
    def hash_file(self, task: FileTask, ctx) -> dict:
        c = self.config
        ids, distinct = UniqueIds(task.path, c.id_column), 0
        ctx.work.delete(f"distinct/{task.rel}")  # what an interrupted attempt of this task left
        with ctx.work.parquet_writer(f"keys/{task.rel}", KEY_SCHEMA) as sink:  # streamed: memory per batch
            for b, table in enumerate(ctx.iter_input(task, self, [c.content_column, c.id_column])):
                kt = _key_table(self._keys(table.column(c.content_column)), table.column(c.id_column).to_numpy())
                sink.write(kt)
                ids.add(kt.column("id").to_numpy())
                # this batch's distinct keys (smallest id, count), partitioned by key: the reduce
                # groups them across batches and files, so no task holds more than a batch of keys
                g = kt.group_by(["h", "l"]).aggregate([("id", "min"), ("id", "count")])
                distinct += g.num_rows
                write_partitioned(ctx.work, f"distinct/{task.rel}/{b:06d}.arrow", g, shard_of_keys(g.column("l").to_numpy(), c.num_shards))
        ids.check()
        return {"rows": ids.count, "distinct": distinct}

    # phase 2 -------------------------------------------------------------------------------
    def reduce_shard(self, shard: int, ctx) -> dict:
        t = read_partition(ctx.work, "distinct", shard)
        if t is None:
            return {"keys": 0, "duplicate_keys": 0}
        # one row per batch of a file, and a file's ids are unique: a key with the same smallest id
        # twice is the same text with the same id in two files, and both copies would be kept
        again = t.group_by(["h", "l", "id_min"]).aggregate([("id_count", "count")])
        again = again.filter(pc.greater(again.column("id_count_count"), 1))
        if again.num_rows:
            raise InputError(
                f"id {again.column('id_min')[0].as_py()} of column '{self.config.id_column}' belongs to more than one "
                "document (the same text in different files: a file copied twice?)",
                "run doc_id first (it numbers every document), or set id_column to a unique int64 column",
            )
        g = t.group_by(["h", "l"]).aggregate([("id_min", "min"), ("id_count", "sum")])
        dup = g.filter(pc.greater(g.column("id_count_sum"), 1))
        dup = dup.select(["h", "l", "id_min_min"]).rename_columns(["h", "l", "keep"])
        dup = dup.sort_by([("h", "ascending"), ("l", "ascending")])
        ctx.work.write_parquet(f"duplicates/{shard:05d}.parquet", dup)
        return {"keys": g.num_rows, "duplicate_keys": dup.num_rows}

    def plan_summary(self, results) -> dict:
        red = results.get("reduce", {}).values()
        return {"distinct_texts": sum(r["keys"] for r in red), "duplicated_texts": sum(r["duplicate_keys"] for r in red)}

    # phase 3 -------------------------------------------------------------------------------
    def setup(self, ctx) -> None:
        self._work = ctx.work
        self._dup = read_all(ctx.work, "duplicates")
        self._keys: tuple[str, pq.ParquetFile | None] = ("", None)

    def _batch_keys(self, task: FileTask, n: int) -> pa.Table:
        """The hash phase's keys of rows [first_row, first_row + n) of the task's file: only the
        row groups that hold them are read (memory follows the batch, not the file)."""
        if self._keys[0] != task.rel:
            self._keys = (task.rel, self._work.parquet_file(f"keys/{task.rel}"))
        return read_rows(self._keys[1], task.first_row, n)

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        if self._dup is None or table.num_rows == 0:
            return Output.of(table)
        keys = self._batch_keys(task, table.num_rows)
        keys = keys.append_column("row", pa.array(np.arange(keys.num_rows, dtype=np.int64)))
        hits = keys.join(self._dup, keys=["h", "l"], join_type="inner", use_threads=False)
        lose = pc.not_equal(hits.column("id"), hits.column("keep"))
        drop = np.zeros(table.num_rows, dtype=bool)
        drop[hits.column("row").filter(lose).to_numpy()] = True
        return Output.of(table.filter(pa.array(~drop)), {REASON: int(drop.sum())})
