"""fuzzy_dedup: near-duplicate documents by MinHash-LSH, clustered by connected components.

Phases (each a set of tasks whose outputs live in the stage's work folder, so each resumes):

1. ``signatures`` (per file, batch by batch): word (or character) k-shingles, a MinHash signature
   per document (:mod:`prepline.minhash`, vectorised numpy), one bucket key per band. Each input
   batch's ``(key, id)`` rows go to ``num_shards`` shards by key (the key hashes the band number
   and its rows) as they come, so a map task holds one batch, never its file's keys.
2. ``buckets`` (per shard): documents that share a key in some band are candidate pairs. With
   verification, buckets of up to 16 documents give all their pairs, larger ones a star (the
   smallest id with every other) and a chain (neighbours in id order), so a bucket of ``m``
   documents gives ``O(m)`` pairs. Without verification the star alone (same components).
3. ``extract`` (per file, batch by batch, with verification): the documents that are in a
   candidate pair are read again and their shingle set (or signature) goes to a shard by id.
4. ``verify_a`` / ``verify_b`` (per shard): a two-step join brings both documents' shingle
   sets to each pair, so no task holds more than its shard; a pair is a duplicate edge when
   its true Jaccard similarity (``verify=jaccard``) or its MinHash estimate
   (``verify=estimate``) is at least ``threshold``.
5. ``components`` (once): connected components of the edges (:class:`prepline.graph.Components`,
   fed the edge files a chunk at a time: it holds the clustered documents, not the edges). A
   cluster's id is its smallest document id.
6. final map (per file): ``remove`` drops every clustered document whose id is not its
   cluster's id (the smallest id is kept, whatever the processing order), counted as
   ``removed.near_duplicate``; ``keep_duplicates`` keeps only clustered documents (the others
   are counted as ``removed.not_near_duplicate``) and adds the cluster column; ``annotate``
   adds the cluster column (null for documents in no cluster) and removes nothing.

Shard files (``bands``, ``pairs``, ``docs``, ``half``) are partitioned files of
:mod:`prepline.sharded`: one file per producer task, and a consumer reads only its shard's batch.

Documents with fewer words than the shingle size are one shingle (the whole document).
Empty or white-space-only documents have no shingles: they are never fuzzy duplicates of
anything (exact_dedup handles them) and are counted as ``counters.empty_docs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline import minhash
from prepline.config import TransformConfig, param
from prepline.errors import ConfigError, InputError
from prepline.graph import Components
from prepline.registry import register
from prepline.sharded import (SortedFile, iter_partition, parquet_files, read_partition, read_range, shard_of_ids,
                               shard_of_keys, write_partitioned)
from prepline.transform import ONCE, Column, FileTask, Output, Phase, Transform, UniqueIds

REASON = "near_duplicate"
REASON_UNIQUE = "not_near_duplicate"
ALL_PAIRS_MAX = 16  # buckets up to this size give all their pairs for verification
# text per shingling batch (a longer document is a batch of its own): about 20 bytes of
# temporaries per byte of text for words, more for characters (one unit per character; auto
# shingles by characters only text in scripts of 3-byte characters, about 13 bytes per byte)
BATCH_BYTES = {"word": 2 << 20, "auto": 2 << 20, "char": 512 << 10}
PAIR_BATCH = 1 << 20  # shingle values per batch of the vectorised Jaccard (about 24 bytes of temporaries each)
VERIFY_CHUNK = 2 << 20  # shingle values of the a-side per chunk of verify_a's output (8 MiB): bounded verify memory
CLUSTERS = "clusters.parquet"
EDGE_CHUNK = 1 << 20  # edges per chunk of the components phase (16 MiB of pairs)


def lsh_threshold(bands: int, rows: int) -> float:
    """Jaccard similarity at which two documents share a bucket with probability about 1/2."""
    return (1.0 / bands) ** (1.0 / rows)


def _shape_text(c: "FuzzyDedupConfig") -> str:
    try:
        b, r = minhash.lsh_shape(c.threshold, c.target_recall, c.num_permutations)
    except ValueError as e:
        return str(e)
    return f"with num_permutations {c.num_permutations}: {b} × {r}"


@dataclass(frozen=True)
class FuzzyDedupConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text")
    id_column: str = param("doc_id", "int64 id column, unique (run doc_id first); a cluster keeps its smallest id")
    mode: str = param(
        "remove",
        "remove: drop all but the smallest id of each cluster; keep_duplicates: keep only documents "
        "in clusters of 2 or more; annotate: add the cluster column, remove nothing",
        choices=("remove", "keep_duplicates", "annotate"),
    )
    threshold: float = param(0.75, "Jaccard similarity of the shingle sets at or above which two documents are near duplicates", min=0.0, min_exclusive=True, max=1.0)
    shingle_type: str = param(
        "auto",
        "shingle units: auto (per document: char for text mostly in a script written without spaces, "
        "Chinese, Japanese, Thai, Lao, Khmer, Myanmar, Tibetan; word otherwise), word (lower-cased, split on "
        "white space) or char (lower-cased, white space collapsed)",
        choices=("auto", "word", "char"),
    )
    shingle_size: int = param(5, "units per shingle; a shorter document is one shingle", min=1, max=64)
    target_recall: float = param(
        0.98,
        "probability that a pair with Jaccard exactly threshold (so any pair above it) becomes a candidate; "
        "sets the LSH shape (num_bands × rows_per_band) when those are 0",
        min=0.0, min_exclusive=True, max=1.0,
    )
    num_permutations: int = param(112, "most MinHash permutations the LSH shape may use (signatures have num_bands × rows_per_band values)", min=1, max=1024)
    num_bands: int = param(0, "LSH bands (0: derived from threshold, target_recall and num_permutations); documents sharing all rows of any band are candidate pairs", min=0, max=1024)
    rows_per_band: int = param(0, "signature values per band (0: derived, with num_bands); more rows: fewer, more similar candidates", min=0, max=1024)
    verify: str = param(
        "jaccard",
        "check candidate pairs against threshold: jaccard (true Jaccard of the shingle sets), estimate "
        "(share of equal signature values) or none (every candidate pair is a duplicate)",
        choices=("jaccard", "estimate", "none"),
    )
    num_shards: int = param(16, "shards of the bucket, pair and document files (more shards: less memory per task)", min=1, max=4096)
    cluster_column: str = param("fuzzy_cluster", "column added by annotate and keep_duplicates: the smallest id of the document's cluster (null: no near duplicate)")

    def validate(self) -> None:
        self.lsh()
        if self.mode != "remove" and not self.cluster_column:
            raise ConfigError(f"mode {self.mode} adds cluster_column, which is empty", "set cluster_column to a column name")
        if self.cluster_column and self.cluster_column in (self.content_column, self.id_column):
            raise ConfigError(f"cluster_column '{self.cluster_column}' is also an input column", "choose another cluster_column name")

    def lsh(self) -> tuple[int, int]:
        """The LSH shape ``(bands, rows)``: the one given, or the steepest that meets target_recall."""
        b, r = self.num_bands, self.rows_per_band
        if (b == 0) != (r == 0):
            raise ConfigError(
                f"num_bands = {b} and rows_per_band = {r}: give both or neither",
                "set both to 0 to derive the shape from threshold and target_recall, or set both",
            )
        if b == 0:
            try:
                return minhash.lsh_shape(self.threshold, self.target_recall, self.num_permutations)
            except ValueError as e:
                raise ConfigError(f"threshold {self.threshold}, target_recall {self.target_recall}, num_permutations "
                                  f"{self.num_permutations}: {e}",
                                  "raise num_permutations, or lower target_recall") from None
        if b * r > self.num_permutations:
            raise ConfigError(
                f"num_bands × rows_per_band = {b} × {r} = {b * r} is more than num_permutations = {self.num_permutations}",
                f"raise num_permutations to {b * r}, or set num_bands and rows_per_band to 0 to derive them",
            )
        recall = float(minhash.lsh_probability(self.threshold, b, r))
        if recall < self.target_recall:
            raise ConfigError(
                f"num_bands × rows_per_band = {b} × {r} makes a pair at threshold {self.threshold} a candidate with "
                f"probability {recall:.3f}, below target_recall = {self.target_recall}",
                f"lower target_recall to {math.floor(recall * 1000) / 1000} or less, or set num_bands and "
                f"rows_per_band to 0 to derive a shape that reaches it ({_shape_text(self)})",
            )
        return b, r


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(a) == 0:
        return a, b
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    keep = np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])]
    return a[keep], b[keep]


def _bucket_pairs(key: np.ndarray, ids: np.ndarray, all_pairs: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """Pairs ``a < b`` of ids that share a key. ``key``/``ids`` sorted by (key, id).

    ``all_pairs``: every pair of a bucket up to ALL_PAIRS_MAX documents, star + chain above;
    otherwise the star only (enough for connected components). Returns (a, b, buckets).
    """
    n = len(key)
    if n < 2:
        z = np.zeros(0, np.int64)
        return z, z, 0
    start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    size = np.diff(np.r_[start, n])
    multi = size >= 2
    start, size = start[multi], size[multi]
    if len(start) == 0:
        z = np.zeros(0, np.int64)
        return z, z, 0
    a_parts, b_parts = [], []
    big = size > ALL_PAIRS_MAX if all_pairs else np.ones(len(size), dtype=bool)
    if big.any():
        s, m = start[big], size[big]
        # star: the first (smallest id) with every other member
        member = np.repeat(s, m - 1) + (np.arange(int((m - 1).sum())) - np.repeat(np.cumsum(m - 1) - (m - 1), m - 1)) + 1
        first = np.repeat(s, m - 1)
        a_parts.append(ids[first])
        b_parts.append(ids[member])
        if all_pairs:  # chain: neighbours, except (first, second) which the star has
            inner = member[member - first >= 2]
            a_parts.append(ids[inner - 1])
            b_parts.append(ids[inner])
    if all_pairs:
        for m in np.unique(size[~big]):
            s = start[(size == m) & ~big]
            members = s[:, None] + np.arange(m)[None, :]
            i, j = np.triu_indices(int(m), 1)
            a_parts.append(ids[members[:, i]].ravel())
            b_parts.append(ids[members[:, j]].ravel())
    a, b = _unique_pairs(np.concatenate(a_parts), np.concatenate(b_parts))
    return a, b, len(start)


def _jaccard_pairs(va: pa.Array, vb: pa.Array) -> np.ndarray:
    """True Jaccard similarity of each pair of sorted, distinct uint32 lists (vectorised)."""
    n = len(va)
    out = np.zeros(n, dtype=np.float64)
    la = pc.list_value_length(va).to_numpy(zero_copy_only=False).astype(np.int64)
    lb = pc.list_value_length(vb).to_numpy(zero_copy_only=False).astype(np.int64)
    lo = 0
    while lo < n:
        # a batch of pairs holding about PAIR_BATCH values (at least one pair)
        cum = np.cumsum(la[lo:] + lb[lo:])
        hi = lo + max(1, int(np.searchsorted(cum, PAIR_BATCH, side="right")))
        ia = np.repeat(np.arange(hi - lo, dtype=np.uint64), la[lo:hi])
        ib = np.repeat(np.arange(hi - lo, dtype=np.uint64), lb[lo:hi])
        xa = va.slice(lo, hi - lo).flatten().to_numpy().astype(np.uint64)
        xb = vb.slice(lo, hi - lo).flatten().to_numpy().astype(np.uint64)
        keys = np.concatenate([(ia << np.uint64(32)) | xa, (ib << np.uint64(32)) | xb])
        keys.sort()
        dup = keys[1:][keys[1:] == keys[:-1]] >> np.uint64(32)
        inter = np.bincount(dup.astype(np.int64), minlength=hi - lo)
        union = la[lo:hi] + lb[lo:hi] - inter
        out[lo:hi] = np.where(union > 0, inter / np.maximum(union, 1), 0.0)
        lo = hi
    return out


class _Docs:
    """One shard's candidate documents (id -> shingle set or signature), for lookups by id.

    Kept as read, one chunk per batch of an extract task, and never concatenated (Arrow's take on a chunked
    array copies all of it first): a lookup takes from each chunk what it needs."""

    def __init__(self, t: pa.Table | None):
        chunks = [] if t is None else [c for c in t.column("v").chunks if len(c)]
        self.chunks = chunks
        self.starts = np.cumsum([0] + [len(c) for c in chunks])
        ids = np.zeros(0, np.int64) if t is None else t.column("id").to_numpy()
        self.order = np.argsort(ids, kind="stable")  # row of the i-th smallest id
        self.ids = ids[self.order]
        self._len = (np.concatenate([pc.list_value_length(c).to_numpy() for c in chunks]).astype(np.int64)
                     if chunks else np.zeros(0, np.int64))

    def find(self, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, row of each wanted id; meaningless where not found)."""
        if len(self.ids) == 0:
            return np.zeros(len(want), dtype=bool), np.zeros(len(want), dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.ids, want), len(self.ids) - 1)
        return self.ids[pos] == want, self.order[pos]

    def lengths(self, rows: np.ndarray) -> np.ndarray:
        return self._len[rows]

    def values(self, rows: np.ndarray) -> pa.Array:
        """The values of ``rows``, in that order: a take per chunk, then the pieces put in order."""
        chunk = np.searchsorted(self.starts, rows, side="right") - 1
        order = np.argsort(chunk, kind="stable")
        pieces = []
        for k in np.unique(chunk).tolist():
            local = rows[order[chunk[order] == k]] - self.starts[k]
            pieces.append(self.chunks[k].take(pa.array(local, pa.int64())))
        if not pieces:
            return pa.array([], pa.large_list(pa.uint32()))
        back = np.empty(len(rows), dtype=np.int64)
        back[order] = np.arange(len(rows))
        return pa.concat_arrays(pieces).take(pa.array(back))


@register
class FuzzyDedup(Transform):
    name = "fuzzy_dedup"
    Config = FuzzyDedupConfig
    summary = "near duplicates by MinHash-LSH (+ Jaccard check) and connected components: remove, keep or annotate"
    headline = ("removed.*", "plan.clusters", "plan.docs_in_clusters", "plan.largest_cluster", "plan.candidate_pairs", "empty_docs")
    plan_needs_every_file = True  # a file failing after the plan may hold the kept copies of other files' duplicates

    # -- contract --------------------------------------------------------------------------
    def __init__(self, config: FuzzyDedupConfig):
        super().__init__(config)
        self.bands, self.rows = config.lsh()
        self.perms = self.bands * self.rows  # signature length: the permutations the shape uses

    def input_columns(self) -> list[Column]:
        return [
            Column(self.config.content_column, "string"),
            Column(self.config.id_column, "int64", fix="run doc_id first, or set id_column to an existing int64 id column"),
        ]

    def added_columns(self) -> list[str]:
        return [self.config.cluster_column] if self.config.mode != "remove" else []

    def phases(self) -> list[Phase]:
        ph = [Phase("signatures", "files", "signature_file"), Phase("buckets", "shards", "bucket_shard")]
        if self.config.verify != "none":
            ph += [
                Phase("extract", "files", "extract_file"),
                Phase("verify_a", "shards", "verify_a_shard"),
                Phase("verify_b", "shards", "verify_b_shard"),
            ]
        return ph + [Phase("components", "once", "components")]

    def num_shards(self) -> int:
        return self.config.num_shards

    # -- shared ----------------------------------------------------------------------------
    def _batches(self, text: pa.ChunkedArray) -> list[tuple[int, int]]:
        """Row ranges of about BATCH_BYTES of text each (a longer document is a batch of its own)."""
        n = len(text)
        if n == 0:
            return []
        sizes = pc.binary_length(text).to_numpy(zero_copy_only=False).astype(np.int64)
        cum = np.cumsum(sizes)
        out, lo = [], 0
        while lo < n:
            base = cum[lo - 1] if lo else 0
            hi = int(np.searchsorted(cum, base + BATCH_BYTES[self.config.shingle_type], side="right"))
            hi = max(hi, lo + 1)
            out.append((lo, hi))
            lo = hi
        return out

    def _shingles(self, text: pa.Array):
        return minhash.shingle(text, self.config.shingle_size, self.config.shingle_type)

    def _stream(self, task: FileTask, ctx) -> Iterator[tuple[pa.ChunkedArray, np.ndarray]]:
        """The file's (text, ids), one bounded batch at a time (memory does not follow the file
        size); the ids are checked unique over the whole file (:class:`UniqueIds`)."""
        c = self.config
        seen = UniqueIds(task.path, c.id_column)
        for table in ctx.iter_input(task, self, [c.content_column, c.id_column]):
            ids = table.column(c.id_column).to_numpy()
            seen.add(ids)
            yield table.column(c.content_column), ids
        seen.check()

    # -- phase 1: signatures ---------------------------------------------------------------
    def signature_file(self, task: FileTask, ctx) -> dict:
        """Each input batch's ``(key, id)`` rows go to the shards as they come (one partitioned file
        per batch): memory follows the batch, not the file (the bucket phase groups across them)."""
        c = self.config
        docs_in, keyed = 0, 0
        ctx.work.delete(f"bands/{task.rel}")  # what an interrupted attempt of this task left
        ctx.work.delete(f"ids/{task.rel}")
        for b, (text, ids) in enumerate(self._stream(task, ctx)):
            docs_in += len(ids)
            # every id (empty documents too) to its shard: the bucket phase checks that no id is in two files
            write_partitioned(ctx.work, f"ids/{task.rel}/{b:06d}.arrow", pa.table({"id": pa.array(ids, pa.int64())}),
                              shard_of_ids(ids, c.num_shards))
            keys, kid = [], []
            for lo, hi in self._batches(text):
                sh = self._shingles(text.slice(lo, hi - lo))
                sig, docs = minhash.signatures(sh, self.perms)
                keys.append(minhash.band_keys(sig, self.bands, self.rows).ravel())
                kid.append(np.repeat(ids[lo:hi][docs], self.bands))
            if not keys:
                continue
            key = np.concatenate(keys)
            t = pa.table({"key": pa.array(key, pa.uint64()), "id": pa.array(np.concatenate(kid), pa.int64())})
            del keys, kid
            write_partitioned(ctx.work, f"bands/{task.rel}/{b:06d}.arrow", t, shard_of_keys(key, c.num_shards))
            keyed += len(key) // self.bands
        return {"docs": docs_in, "empty": docs_in - keyed}

    # -- phase 2: buckets ------------------------------------------------------------------
    def _check_ids_unique(self, shard: int, ctx) -> None:
        """Ids are unique within each file (:class:`UniqueIds`); an id in two files is two documents
        under one id (two datasets each numbered from 0, then merged): clusters are made of ids and
        the final map removes by id, so it would keep duplicates and remove unique documents."""
        t = read_partition(ctx.work, "ids", shard)
        if t is None or t.num_rows < 2:
            return
        ids = np.sort(t.column("id").to_numpy())
        again = ids[1:][ids[1:] == ids[:-1]]
        if len(again):
            raise InputError(
                f"id {int(again[0])} of column '{self.config.id_column}' belongs to more than one document (in different "
                f"files; {len(np.unique(again))} such id(s) in shard {shard}): the ids are not unique across the input "
                "(datasets each numbered from 0, then merged?)",
                "run doc_id first (it numbers every document), or set id_column to a unique int64 column",
            )

    def bucket_shard(self, shard: int, ctx) -> dict:
        c = self.config
        self._check_ids_unique(shard, ctx)
        t = read_partition(ctx.work, "bands", shard)
        if t is None:
            return {"rows": 0, "buckets": 0, "pairs": 0}
        rows = t.num_rows
        # the shard's rows are the largest state of the stage (16 bytes per document and band /
        # num_shards): one column at a time out of Arrow, and only the keys sorted
        key = t.column("key").to_numpy()
        t = t.select(["id"])
        ids = t.column(0).to_numpy()
        del t
        # only the rows of keys held by two or more documents matter from here (few)
        k = np.sort(key)
        held = np.unique(k[1:][k[1:] == k[:-1]])
        del k
        if len(held):
            shared = held[np.minimum(np.searchsorted(held, key), len(held) - 1)] == key
            key, ids = key[shared], ids[shared]
            del shared
        else:
            key, ids = key[:0], ids[:0]
        order = np.lexsort((ids, key))
        key, ids = key[order], ids[order]
        same = (key[1:] == key[:-1]) & (ids[1:] == ids[:-1])
        if same.any():
            raise InputError(
                f"id {int(ids[1:][same][0])} of column '{c.id_column}' belongs to more than one document (in different files)",
                "run doc_id first (it numbers every document), or set id_column to a unique int64 column",
            )
        verify = c.verify != "none"
        a, b, buckets = _bucket_pairs(key, ids, all_pairs=verify)
        pairs = pa.table({"a": pa.array(a, pa.int64()), "b": pa.array(b, pa.int64())})
        if not verify:
            if len(a):
                ctx.work.write_parquet(f"edges/{shard:05d}.parquet", pairs)
        else:
            write_partitioned(ctx.work, f"pairs/{shard:05d}.arrow", pairs, shard_of_ids(a, c.num_shards))
            need = np.unique(np.concatenate([a, b]))
            if len(need):
                ctx.work.write_parquet(f"need/{shard:05d}.parquet", pa.table({"id": pa.array(need, pa.int64())}))
        return {"rows": rows, "buckets": buckets, "pairs": len(a)}

    # -- phase 3: extract (verification only) ----------------------------------------------
    def extract_file(self, task: FileTask, ctx) -> dict:
        """The candidates' shingle sets (or signatures), batch by batch: each input batch looks up
        which of its ids some pair needs (only the overlapping row groups of the ``need`` files)
        and writes its candidates to the shards by id (one partitioned file per batch)."""
        c = self.config
        ctx.work.delete(f"docs/{task.rel}")  # what an interrupted attempt of this task left
        need_files = [SortedFile(ctx.work.parquet_file(rel)) for rel in parquet_files(ctx.work, "need")]
        docs = 0
        if not need_files:
            ctx.read_input(task, self, [])  # the file is checked as before, and nothing is extracted
            return {"docs": 0}
        for b, (text, ids) in enumerate(self._stream(task, ctx)):  # only the candidates' text is kept, as shingle sets
            if len(ids) == 0:
                continue
            parts = [t.column("id").to_numpy() for t in (f.range(int(ids.min()), int(ids.max())) for f in need_files)
                     if t is not None and t.num_rows]
            rows = np.flatnonzero(np.isin(ids, np.concatenate(parts))) if parts else np.zeros(0, np.int64)
            if len(rows) == 0:
                continue
            t = self._candidate_table(ids[rows], text.take(pa.array(rows)))
            write_partitioned(ctx.work, f"docs/{task.rel}/{b:06d}.arrow", t, shard_of_ids(ids[rows], c.num_shards))
            docs += len(rows)
        return {"docs": docs}

    def _candidate_table(self, ids: np.ndarray, text: pa.ChunkedArray) -> pa.Table:
        """``(id, v)``: each document's sorted, distinct shingle hashes (``verify=jaccard``) or its
        signature (all maximum values for a document without shingles)."""
        counts, values = [], []
        for blo, bhi in self._batches(text):  # bounded temporaries, as in signatures
            n_batch = bhi - blo
            sh = self._shingles(text.slice(blo, n_batch))
            if self.config.verify == "jaccard":
                doc = np.repeat(np.arange(n_batch, dtype=np.uint64), sh.counts)
                u = (doc << np.uint64(32)) | sh.hashes
                u.sort()
                u = u[np.r_[True, u[1:] != u[:-1]]]
                counts.append(np.bincount((u >> np.uint64(32)).astype(np.int64), minlength=n_batch))
                values.append((u & np.uint64(0xFFFFFFFF)).astype(np.uint32))
            else:
                sig, docs = minhash.signatures(sh, self.perms)
                full = np.full((n_batch, self.perms), np.iinfo(np.uint32).max, dtype=np.uint32)
                full[docs] = sig
                counts.append(np.full(n_batch, self.perms, dtype=np.int64))
                values.append(full.ravel())
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(counts), out=offsets[1:])
        v = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(values), pa.uint32()))
        return pa.table({"id": pa.array(ids, pa.int64()), "v": v})

    # -- phase 4: verification, a two-step join ----------------------------------------------
    def verify_a_shard(self, shard: int, ctx) -> dict:
        """Each pair of the shard (by ``a``) gets ``a``'s shingle set; written on by shard of ``b`` in
        chunks of about VERIFY_CHUNK values, so verify_b reads one chunk at a time."""
        c = self.config
        t = read_partition(ctx.work, "pairs", shard)
        if t is None:
            return {"pairs": 0}
        a, b = _unique_pairs(t.column("a").to_numpy(), t.column("b").to_numpy())
        del t
        docs = _Docs(read_partition(ctx.work, "docs", shard))
        found, rows = docs.find(a)
        a, b, rows = a[found], b[found], rows[found]
        cum = np.cumsum(docs.lengths(rows))
        lo, chunk = 0, 0
        while lo < len(a):
            base = cum[lo - 1] if lo else 0
            hi = max(lo + 1, int(np.searchsorted(cum, base + VERIFY_CHUNK, side="right")))
            half = pa.table({"a": pa.array(a[lo:hi], pa.int64()), "b": pa.array(b[lo:hi], pa.int64()), "va": docs.values(rows[lo:hi])})
            write_partitioned(ctx.work, f"half/{shard:05d}-{chunk:05d}.arrow", half, shard_of_ids(b[lo:hi], c.num_shards))
            lo, chunk = hi, chunk + 1
        return {"pairs": int(len(a)), "missing": int((~found).sum())}

    def verify_b_shard(self, shard: int, ctx) -> dict:
        """The pairs of the shard (by ``b``), one chunk at a time, get ``b``'s shingle set and their
        similarity; those at or above the threshold are the shard's edges."""
        c = self.config
        docs = _Docs(read_partition(ctx.work, "docs", shard))
        edges, pairs, missing = [], 0, 0
        for t in iter_partition(ctx.work, "half", shard):
            a, b = t.column("a").to_numpy(), t.column("b").to_numpy()
            found, rows = docs.find(b)
            missing += int((~found).sum())
            va = t.column("va").combine_chunks().filter(pa.array(found))
            a, b, vb = a[found], b[found], docs.values(rows[found])
            if len(a) == 0:
                continue
            if c.verify == "jaccard":
                sim = _jaccard_pairs(va, vb)
            else:
                p = self.perms
                sim = (va.flatten().to_numpy().reshape(-1, p) == vb.flatten().to_numpy().reshape(-1, p)).mean(axis=1)
            ok = sim >= c.threshold - 1e-12
            pairs += len(a)
            edges.append(pa.table({"a": pa.array(a[ok], pa.int64()), "b": pa.array(b[ok], pa.int64()), "similarity": pa.array(sim[ok], pa.float32())}))
        table = pa.concat_tables(edges) if edges else None
        if table is not None and table.num_rows:
            ctx.work.write_parquet(f"edges/{shard:05d}.parquet", table)
        return {"pairs": pairs, "edges": 0 if table is None else table.num_rows, "missing": missing}

    # -- phase 5: connected components (once) ---------------------------------------------
    def components(self, ctx) -> dict:
        """Clusters from the edge files, read EDGE_CHUNK rows at a time into :class:`Components`:
        memory follows the documents in clusters, not the edges (with ``verify=none`` every
        candidate pair is an edge)."""
        comp = Components()
        for rel in parquet_files(ctx.work, "edges"):
            for batch in ctx.work.parquet_file(rel).iter_batches(batch_size=EDGE_CHUNK, columns=["a", "b"], use_threads=False):
                comp.add(batch.column(0).to_numpy(), batch.column(1).to_numpy())
        edges, (ids, cluster) = comp.edges, comp.result()
        del comp
        _, inv, counts = np.unique(cluster, return_inverse=True, return_counts=True)
        size = counts[inv]
        del inv
        out = pa.table({"id": pa.array(ids, pa.int64()), "cluster": pa.array(cluster, pa.int64()), "size": pa.array(size, pa.int64())})
        ctx.work.write_parquet(CLUSTERS, out)
        return {
            "edges": edges,
            "clusters": len(counts),
            "docs_in_clusters": int(len(ids)),
            "largest_cluster": int(counts.max()) if len(counts) else 0,
        }

    def plan_summary(self, results) -> dict:
        sig = results.get("signatures", {}).values()
        buckets = results.get("buckets", {}).values()
        comp = results.get("components", {}).get(ONCE, {})
        out = {
            "docs": sum(r["docs"] for r in sig),
            "empty_docs": sum(r["empty"] for r in sig),
            "lsh_bands": self.bands,
            "lsh_rows": self.rows,
            "lsh_threshold": round(lsh_threshold(self.bands, self.rows), 4),
            "lsh_recall_at_threshold": round(float(minhash.lsh_probability(self.config.threshold, self.bands, self.rows)), 4),
            "candidate_buckets": sum(r["buckets"] for r in buckets),
            "candidate_pairs": sum(r["pairs"] for r in buckets),
        }
        if self.config.verify != "none":
            vb = results.get("verify_b", {}).values()
            out["verified_pairs"] = sum(r["pairs"] for r in vb)
            out["duplicate_edges"] = sum(r["edges"] for r in vb)
        out.update({k: comp[k] for k in ("clusters", "docs_in_clusters", "largest_cluster") if k in comp})
        return out

    # -- final map -------------------------------------------------------------------------
    def setup(self, ctx) -> None:
        self._work = ctx.work

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        c = self.config
        n = table.num_rows
        text = table.column(c.content_column)
        empty = int(pc.sum(pc.or_(pc.equal(pc.binary_length(text), 0), pc.utf8_is_space(text))).as_py() or 0) if n else 0
        ids = table.column(c.id_column).to_numpy() if n else np.zeros(0, np.int64)
        in_cluster = np.zeros(n, dtype=bool)
        cluster = np.zeros(n, dtype=np.int64)
        if n:
            cl = read_range(self._work, CLUSTERS, int(ids.min()), int(ids.max()))
            if cl is not None and cl.num_rows:
                cid, ccl = cl.column("id").to_numpy(), cl.column("cluster").to_numpy()
                pos = np.minimum(np.searchsorted(cid, ids), len(cid) - 1)
                in_cluster = cid[pos] == ids
                cluster = np.where(in_cluster, ccl[pos], 0)
        counters = {"empty_docs": empty, "in_clusters": int(in_cluster.sum()), "cluster_keepers": int((in_cluster & (cluster == ids)).sum())}
        if c.mode == "remove":
            drop = in_cluster & (cluster != ids)
            return Output.of(table.filter(pa.array(~drop)), {REASON: int(drop.sum())}, counters)
        col = pa.array(cluster, pa.int64(), mask=~in_cluster)
        table = table.append_column(c.cluster_column, col)
        if c.mode == "keep_duplicates":
            return Output.of(table.filter(pa.array(in_cluster)), {REASON_UNIQUE: int((~in_cluster).sum())}, counters)
        return Output.of(table, {}, counters)
