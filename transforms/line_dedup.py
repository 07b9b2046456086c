"""line_dedup: remove lines that recur across many documents of the corpus (navigation, cookie
banners, footers, share buttons). Changes the text.

A line is what lies between two ``\\n`` (a ``\\r`` before it stays part of the line, so a document
that loses nothing keeps its exact bytes). Lines are compared normalised as exact_dedup compares
documents (lower-cased, every run of Unicode white space collapsed to one space, trimmed; NFKC if
asked), by a 128-bit hash. A line found in more than ``max_docs`` documents is removed from every
document (a line repeated inside one document counts that document once). Blank lines and lines
shorter than ``min_line_chars`` characters (after normalising) are never removed.

Three phases, each resumable (the framework's markers), same bytes for any worker count:

1. ``count`` (per file, batch by batch): each batch's distinct (line, document) pairs, counted per
   line, go to a partitioned file by line hash into ``num_shards`` shards;
2. ``reduce`` (per shard): the counts of a shard's lines summed over the corpus; the lines found
   in more than ``max_docs`` documents are written (hash and document count);
3. final map (per file): lines whose hash is in that set are dropped; a document left with no
   non-blank line is removed (``all_lines_frequent``).

Memory: a reduce task holds one shard's distinct lines; every final-map worker holds the frequent
lines only (16 bytes each). Counts (non-blank lines): ``lines_in = lines_kept +
lines_removed_frequent`` per file and in total (a removed document has no kept line).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline import hashing
from prepline import textstats as ts
from prepline.config import TransformConfig, param, removed_sample_param
from prepline.registry import register
from prepline.sharded import read_all, read_partition, shard_of_keys, write_partitioned
from prepline.transform import Column, FileTask, Output, Phase, Transform

REASON = "all_lines_frequent"
COUNT_SCHEMA = pa.schema([("h", pa.uint64()), ("l", pa.uint64()), ("docs", pa.int64())])


@dataclass(frozen=True)
class LineDedupConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text (rewritten)")
    max_docs: int = param(10, "a line found in more than this many documents is removed from all of them", min=1)
    min_line_chars: int = param(1, "shorter lines (characters after normalising) are never removed", min=1)
    num_shards: int = param(16, "number of hash shards (more shards: less memory per reduce task)", min=1, max=4096)
    nfkc: bool = param(False, "also apply Unicode NFKC before comparing lines (full-width forms, ligatures compare equal)")
    removed_lines_sample: int = param(0, "keep up to N removed lines per document in a list column line_dedup_removed_lines", min=0)
    removed_sample: int = removed_sample_param()


class _Lines:
    """The lines of a batch of documents: ``lines`` (flattened), ``doc`` (row of each line), ``keys``
    ((n, 2) uint64 hash of each normalised line) and ``counted`` (lines that may be removed)."""

    def __init__(self, text: pa.Array, config: LineDedupConfig, con) -> None:
        self.lists = pc.split_pattern(pc.fill_null(text, ""), "\n")
        self.lines = self.lists.flatten()
        self.doc = pc.list_parent_indices(self.lists).to_numpy().astype(np.int64)
        norm = hashing.normalise(self.lines, config.nfkc) if len(self.lines) else self.lines
        size = pc.utf8_length(norm).to_numpy(zero_copy_only=False) if len(self.lines) else np.zeros(0, np.int64)
        self.nonblank = np.asarray(size, dtype=np.int64) > 0
        self.counted = np.asarray(size, dtype=np.int64) >= config.min_line_chars
        self.keys = hashing.hash_128(con, norm) if len(self.lines) else np.zeros((0, 2), np.uint64)


@register
class LineDedup(Transform):
    name = "line_dedup"
    Config = LineDedupConfig
    summary = "remove lines found in more than max_docs documents of the corpus (boilerplate: navigation, cookie banners, footers)"
    headline = ("lines_removed_frequent", "plan.frequent_lines")
    # a frequent line's count may come from a file that then fails: its copies elsewhere would go
    # on a count the output does not hold
    plan_needs_every_file = True

    def input_columns(self) -> list[Column]:
        return [Column(self.config.content_column, "string")]

    def added_columns(self) -> list[str]:
        return ["line_dedup_removed_lines"] if self.config.removed_lines_sample else []

    def phases(self) -> list[Phase]:
        return [Phase("count", "files", "count_file"), Phase("reduce", "shards", "reduce_shard")]

    def num_shards(self) -> int:
        return self.config.num_shards

    def _lines(self, text) -> _Lines:
        con = getattr(self, "_con", None) or hashing.connect()
        self._con = con
        return _Lines(ts.as_array(text), self.config, con)

    # phase 1 -------------------------------------------------------------------------------
    def count_file(self, task: FileTask, ctx) -> dict:
        c = self.config
        ctx.work.delete(f"counts/{task.rel}")  # what an interrupted attempt of this task left
        lines = pairs = 0
        for b, table in enumerate(ctx.iter_input(task, self, [c.content_column])):
            ln = self._lines(table.column(c.content_column))
            m = ln.counted
            lines += int(ln.nonblank.sum())
            if not m.any():
                continue
            t = pa.table({"h": ln.keys[m, 0], "l": ln.keys[m, 1], "d": ln.doc[m]})
            t = t.group_by(["h", "l", "d"]).aggregate([])  # a line repeated in one document counts it once
            pairs += t.num_rows
            g = t.group_by(["h", "l"]).aggregate([("d", "count")]).rename_columns(["h", "l", "docs"])
            write_partitioned(ctx.work, f"counts/{task.rel}/{b:06d}.arrow", g, shard_of_keys(g.column("l").to_numpy(), c.num_shards))
        return {"lines": lines, "line_doc_pairs": pairs}

    # phase 2 -------------------------------------------------------------------------------
    def reduce_shard(self, shard: int, ctx) -> dict:
        t = read_partition(ctx.work, "counts", shard)
        if t is None:
            return {"distinct_lines": 0, "frequent_lines": 0, "frequent_line_docs": 0}
        g = t.group_by(["h", "l"]).aggregate([("docs", "sum")]).rename_columns(["h", "l", "docs"])
        hot = g.filter(pc.greater(g.column("docs"), self.config.max_docs))
        hot = hot.sort_by([("h", "ascending"), ("l", "ascending")])
        ctx.work.write_parquet(f"frequent/{shard:05d}.parquet", hot.cast(COUNT_SCHEMA))
        return {"distinct_lines": g.num_rows, "frequent_lines": hot.num_rows,
                "frequent_line_docs": int(pc.sum(hot.column("docs")).as_py() or 0)}

    def plan_summary(self, results) -> dict:
        red = results.get("reduce", {}).values()
        return {k: sum(r[k] for r in red) for k in ("distinct_lines", "frequent_lines", "frequent_line_docs")}

    # phase 3 -------------------------------------------------------------------------------
    def setup(self, ctx) -> None:
        hot = read_all(ctx.work, "frequent")
        self._hot = None if hot is None else hot.select(["h", "l"])

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        c = self.config
        n = table.num_rows
        text = ts.as_array(table.column(c.content_column))
        ln = self._lines(text)
        nl = len(ln.lines)
        drop = np.zeros(nl, dtype=bool)
        if self._hot is not None and ln.counted.any():
            rows = np.flatnonzero(ln.counted)
            mine = pa.table({"h": ln.keys[rows, 0], "l": ln.keys[rows, 1], "row": rows})
            hits = mine.join(self._hot, keys=["h", "l"], join_type="inner", use_threads=False)
            drop[hits.column("row").to_numpy()] = True
        lost = np.bincount(ln.doc[drop], minlength=n) > 0
        left = np.bincount(ln.doc[ln.nonblank & ~drop], minlength=n)
        gone = lost & (left == 0)  # every non-blank line was frequent
        out = table
        if lost.any():
            keep = ~drop
            joined = pc.binary_join(ts.regroup(ln.lines.filter(pa.array(keep)), ln.doc[keep], n), "\n")
            new = pc.if_else(pa.array(lost), joined, text)  # documents that lost nothing keep their bytes
            out = table.set_column(table.column_names.index(c.content_column), c.content_column, new)
        if c.removed_lines_sample:
            out = out.append_column("line_dedup_removed_lines", self._sample(ln, drop, n))
        # a removed document has no kept line (that is why it goes): lines_in = kept + removed
        counters = {"lines_in": int(ln.nonblank.sum()), "lines_kept": int((ln.nonblank & ~drop).sum()),
                    "lines_removed_frequent": int(drop.sum()), "docs_changed": int((lost & ~gone).sum())}
        removed, masks = {}, {}
        if gone.any():
            out = out.filter(pa.array(~gone))
            removed, masks = {REASON: int(gone.sum())}, {REASON: gone}
        return Output(parts={"": out}, removed=removed, counters=counters, removed_rows=masks)

    def _sample(self, ln: _Lines, drop: np.ndarray, n: int) -> pa.Array:
        """Up to removed_lines_sample removed lines per document."""
        idx = ts.first_per_doc(np.flatnonzero(drop), ln.doc, self.config.removed_lines_sample)
        return ts.regroup(ln.lines.take(pa.array(idx, pa.int64())), ln.doc[idx], n)

    def empty_output_fix(self, reason: str) -> str:
        return "every document consisted of frequent lines: raise max_docs (or min_line_chars)"
