"""decontaminate: flag or remove documents that share an n-gram with an evaluation set.

Evaluation sets are files the user gives (JSONL, Parquet or CSV; local or ``s3://``), each with the
text field(s) to take n-grams from: ``--eval-sets mmlu=s3://evals/mmlu.jsonl:question,answer``
(``name=path:field[,field...]``; repeat the option for several sets). Every non-null value of a
field is one text: n-grams do not run from one field or row into the next.

Text is normalised the same way on both sides: lower case, numbers (``3.14``, ``1,000``) become
``0``, accents removed (NFD, combining marks dropped), punctuation, symbols and control characters
become spaces. Tokens are then the words between white space
(``unit=words``) or every character except white space (``unit=characters``; a pipeline's ``ja``
and ``zh`` branches get it by default). An n-gram is ``n`` consecutive tokens (default 13).

Words, in compiled passes (numba) over the column's bytes: each white-space separated piece is
found in the worker's piece cache by its bytes (:mod:`prepline.piececache`; a piece seen for the first time
is normalised with Arrow and its tokens mapped to ids in the evaluation sets' vocabulary, a token
the sets never use getting id 0), then the documents' token ids are walked once: each window of
``n`` known ids in one document is hashed to 64 bits (a polynomial over the ids) and looked up in a
table of the evaluation n-grams (built once per worker), and a document stops at its first match.
A hash hit is confirmed by comparing the ids, so a match is exact. Characters (``unit=characters``):
the same with Arrow and NumPy over whole token arrays. A document's match is its first matching
n-gram; an n-gram that appears in several sets is attributed to the first set given.

``action=flag`` adds ``set_column`` (the matched set, null when clean) and ``ngram_column`` (the
n-gram, normalised) and removes nothing; ``action=remove`` drops the matched documents, counted as
``removed.contaminated_<set>`` (the sample of removed rows, ``removed_sample``, shows both
columns). Counters: ``decont_<set>``, the documents matched per set.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline import textstats as ts
from prepline.config import TransformConfig, param, removed_sample_param
from prepline.errors import ConfigError
from prepline.registry import register
from prepline.transform import Column, FileTask, Output, Transform
from prepline.userfiles import check_file, read_file

FORMATS = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
SPEC_FIX = "write each evaluation set as name=path:field[,field...], e.g. --eval-sets mmlu=s3://evals/mmlu.jsonl:question,answer"
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
#: odd 64-bit multiplier of the window hash
_MULT = np.uint64(0x9E3779B97F4A7C15)
CHAR_LANGUAGES = ("ja", "zh")
#: text bytes matched at a time (bounds the per-piece arrays; with unit=characters the token arrays, ~50 bytes per token)
MATCH_BYTES = 4 << 20
#: pieces a worker's cache holds before it is emptied (~40 bytes each, and the piece's bytes)
MAX_PIECES = 1 << 22


@dataclass(frozen=True)
class EvalSet:
    name: str
    path: str
    fields: tuple[str, ...]


def parse_eval_set(spec: str) -> EvalSet:
    name, eq, rest = spec.partition("=")
    path, colon, fields = rest.rpartition(":")
    name = name.strip()
    if not eq or not colon or not path.strip() or "://" in fields:
        raise ConfigError(f"eval_sets entry {spec!r} is not name=path:field", SPEC_FIX)
    if not _NAME.match(name):
        raise ConfigError(f"eval_sets entry {spec!r}: the name {name!r} may hold only letters, digits, _ and -", SPEC_FIX)
    fs = tuple(f.strip() for f in fields.split(","))
    if not fs or any(not f for f in fs):
        raise ConfigError(f"eval_sets entry {spec!r} names no text field (or an empty one)", SPEC_FIX)
    path = path.strip()
    if _format(path) is None:
        raise ConfigError(f"eval_sets entry {spec!r}: {path} is not .jsonl, .json, .ndjson, .parquet or .csv",
                          "convert the evaluation set to JSON lines, Parquet or CSV (the file name says which)")
    return EvalSet(name, path, fs)


def _format(path: str) -> str | None:
    for suffix, fmt in FORMATS.items():
        if path.lower().endswith(suffix):
            return fmt
    return None


def normalise(arr: pa.Array) -> pa.Array:
    """Lower case, numbers to 0, accents removed, each punctuation mark, symbol or control character
    a space (runs of white space are one separator to the split that follows: collapsing them with a
    regular expression took 2/3 of the stage's time, 2026-12-06)."""
    s = pc.utf8_lower(pc.fill_null(arr, ""))
    s = pc.replace_substring_regex(s, r"\p{Nd}+(?:[.,\x{060C}\x{066B}\x{2396}-\x{2398}]\p{Nd}+)?", "0")
    s = pc.replace_substring_regex(pc.utf8_normalize(s, "NFD"), r"\p{Mn}+", "")
    return pc.replace_substring_regex(s, r"[\p{P}\p{S}\p{Cc}]", " ")


def tokens(arr: pa.Array, unit: str) -> pa.ListArray:
    """Per text, its list of normalised tokens (words, or characters without white space)."""
    s = normalise(arr)
    if unit == "characters":
        s = pc.replace_substring_regex(pc.replace_substring_regex(s, r"\s+", ""), "(.)", r"\1 ")
    out = pc.utf8_split_whitespace(s)
    # white space at either end (and an empty text) splits into "" tokens: dropped
    flat = out.flatten()
    keep = pc.greater(pc.binary_length(flat), 0)
    if len(flat) and not pc.all(keep).as_py():
        k = keep.to_numpy(zero_copy_only=False)
        out = ts.regroup(flat.filter(keep), pc.list_parent_indices(out).to_numpy()[k], len(out))
    return out


def window_hashes(ids: np.ndarray, n: int, starts: np.ndarray) -> np.ndarray:
    """The 64-bit hash of the windows of n consecutive ids that start at ``starts`` (gathered: only the
    windows that can match are hashed, a tenth of a web text's)."""
    h = np.zeros(len(starts), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * _MULT + ids[starts + k]
    return h


def valid_windows(ids: np.ndarray, doc: np.ndarray, n: int) -> np.ndarray:
    """Windows that lie in one document and hold no unknown token (id 0)."""
    m = len(ids) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=bool)
    unknown = np.concatenate([[0], np.cumsum(ids == 0)])
    return (doc[:m] == doc[n - 1:]) & (unknown[n:] - unknown[:m] == 0)


@dataclass(frozen=True)
class DecontaminateConfig(TransformConfig):
    eval_sets: list[str] = param([], "evaluation sets as name=path:field[,field...] (JSONL/Parquet/CSV, local or s3://); repeat the option for several")
    content_column: str = param("contents", "column holding the document text")
    n: int = param(13, "tokens per n-gram", min=1)
    unit: str = param("words", "n-gram tokens: words, or characters (for ja/zh; the pipeline's ja and zh branches get it)", choices=("words", "characters"))
    action: str = param("flag", "flag: add set_column and ngram_column, keep every document; remove: drop matched documents", choices=("flag", "remove"))
    set_column: str = param("decont_set", "column to add: the evaluation set a document shares an n-gram with, null when clean")
    ngram_column: str = param("decont_ngram", "column to add: the shared n-gram (normalised), null when clean")
    removed_sample: int = removed_sample_param()

    def validate(self) -> None:
        if not self.eval_sets:
            raise ConfigError("decontaminate needs at least one evaluation set", SPEC_FIX)
        sets = [parse_eval_set(s) for s in self.eval_sets]
        names = [s.name for s in sets]
        dup = sorted({x for x in names if names.count(x) > 1})
        if dup:
            raise ConfigError(f"eval_sets names {dup[0]!r} more than once", "give every evaluation set its own name")
        cols = [self.content_column, self.set_column, self.ngram_column]
        if any(not c for c in cols) or len(set(cols)) != 3:
            raise ConfigError(f"content_column, set_column and ngram_column must be set and differ (got {', '.join(map(repr, cols))})",
                              "give each column its own name")

    def sets(self) -> list[EvalSet]:
        return [parse_eval_set(s) for s in self.eval_sets]


class Index:
    """The evaluation n-grams of all sets: vocabulary, sorted hashes, and where each n-gram's ids are."""

    def __init__(self, sets: list[EvalSet], n: int, unit: str):
        self.n, self.names = n, [s.name for s in sets]
        texts, set_of_text = [], []
        for i, s in enumerate(sets):
            for arr in _read_texts(s):
                texts.append(arr)
                set_of_text.append(np.full(len(arr), i, dtype=np.int64))
        all_texts = pa.concat_arrays([a.cast(pa.string()) for a in texts]) if texts else pa.array([], pa.string())
        set_of = np.concatenate(set_of_text) if set_of_text else np.zeros(0, dtype=np.int64)
        toks = tokens(all_texts, unit)
        flat = toks.flatten()
        self.vocab = pc.unique(flat).sort() if len(flat) else pa.array([], pa.string())
        self.lookup = pc.SetLookupOptions(value_set=self.vocab)
        self.ids = self._ids(flat)
        doc = np.repeat(np.arange(len(all_texts), dtype=np.int64), np.diff(toks.offsets.to_numpy()))
        start = np.flatnonzero(valid_windows(self.ids, doc, n))
        h = window_hashes(self.ids, n, start)
        sets_ = set_of[doc[start]] if len(start) else np.zeros(0, dtype=np.int64)
        order = np.lexsort((sets_, h))  # by hash, then set order: the first entry of a hash is its first set
        h, start, sets_ = h[order], start[order], sets_[order]
        keep = np.concatenate([[True], h[1:] != h[:-1]]) if len(h) else np.zeros(0, dtype=bool)
        self.hashes, self.starts, self.sets = h[keep], start[keep], sets_[keep]

    def _ids(self, flat: pa.Array) -> np.ndarray:
        """Token ids: 1 + position in the vocabulary, 0 for a token no evaluation set holds."""
        idx = pc.index_in(flat, options=self.lookup)
        return pc.fill_null(pc.add(idx, 1), 0).to_numpy(zero_copy_only=False).astype(np.uint64)

    def _piece_cache(self):
        """The worker's :class:`prepline.piececache.PieceCache` (made on first use, with the table of
        the evaluation n-grams; numba is imported here, not by the other stages)."""
        if not hasattr(self, "_cache"):
            from prepline.piececache import PieceCache, eval_table

            self._cache = PieceCache(self._piece_ids, self.n, int(_MULT), MAX_PIECES)
            self._ev = (eval_table(self.hashes), self.hashes, self.starts.astype(np.int64), self.ids)
        return self._cache

    def _piece_ids(self, pieces: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Each piece's normalised tokens' ids: (offsets per piece, flat ids)."""
        sub = tokens(pieces, "words")
        return sub.offsets.to_numpy().astype(np.int64), self._ids(sub.flatten())

    def token_ids(self, arr: pa.Array, unit: str) -> tuple[np.ndarray, np.ndarray]:
        """The ids (:meth:`_ids`) of the normalised tokens of every text, flattened, and their text.
        Words: normalising never joins two white-space separated pieces (it only lowers, drops marks,
        and makes punctuation a space inside a piece), so each distinct piece is normalised and looked
        up once (:mod:`prepline.piececache`) and a piece maps to 0 or more tokens. The same ids as
        normalising the whole text (:func:`tokens`; a test compares them)."""
        if unit != "words":
            toks = tokens(arr, unit)
            return self._ids(toks.flatten()), np.repeat(np.arange(len(arr), dtype=np.int64), np.diff(toks.offsets.to_numpy()))
        return self._piece_cache().ids(arr)

    def match(self, arr: pa.Array, unit: str) -> tuple[np.ndarray, list]:
        """Per document: the index of the matched set (-1: clean), and the matched n-gram's text (None:
        clean). Words in compiled passes (:mod:`prepline.piececache`), characters with
        Arrow and NumPy; in slices of about MATCH_BYTES of text, so that the arrays stay bounded
        whatever the batch."""
        ndocs = len(arr)
        if not len(self.hashes) or not ndocs:
            return np.full(ndocs, -1, dtype=np.int64), [None] * ndocs
        parts = [self._match_slice_words(arr.slice(a, b - a)) if unit == "words" else self.match_arrays(arr.slice(a, b - a), unit)
                 for a, b in ts.byte_slices(arr, MATCH_BYTES)]
        return np.concatenate([f for f, _ in parts]), [g for _, gs in parts for g in gs]

    def _match_slice_words(self, arr: pa.Array) -> tuple[np.ndarray, list]:
        at, window = self._piece_cache().match(arr, self._ev)
        found = np.where(at >= 0, self.sets[np.maximum(at, 0)], -1)
        grams: list = [None] * len(arr)
        for d in np.flatnonzero(at >= 0).tolist():
            grams[d] = " ".join(self.vocab.take(pa.array(window[d].astype(np.int64) - 1)).to_pylist())
        return found, grams

    def match_arrays(self, arr: pa.Array, unit: str) -> tuple[np.ndarray, list]:
        """:meth:`match` with Arrow and NumPy over the whole token arrays (the characters' path, and
        the words pass's reference in the tests)."""
        ndocs, n = len(arr), self.n
        found = np.full(ndocs, -1, dtype=np.int64)
        grams: list = [None] * ndocs
        if not len(self.hashes) or not ndocs:
            return found, grams
        toks = tokens(arr, unit)
        ids = self._ids(toks.flatten())
        doc = np.repeat(np.arange(ndocs, dtype=np.int64), np.diff(toks.offsets.to_numpy()))
        ok = valid_windows(ids, doc, n)
        pos = np.flatnonzero(ok)
        if not len(pos):
            return found, grams
        h = window_hashes(ids, n, pos)
        at = np.minimum(np.searchsorted(self.hashes, h), len(self.hashes) - 1)
        hit = self.hashes[at] == h
        pos, at = pos[hit], at[hit]
        if len(pos):  # confirm: the same ids, not only the same hash
            span = np.arange(n)
            same = (ids[pos[:, None] + span] == self.ids[self.starts[at][:, None] + span]).all(axis=1)
            pos, at = pos[same], at[same]
        if not len(pos):
            return found, grams
        d, first = np.unique(doc[pos], return_index=True)  # pos ascending: the first match of each document
        found[d] = self.sets[at[first]]
        for di, p in zip(d.tolist(), pos[first].tolist()):
            grams[di] = (" " if unit == "words" else "").join(self.vocab.take(pa.array(ids[p:p + n].astype(np.int64) - 1)).to_pylist())
        return found, grams


def _read_texts(s: EvalSet) -> list[pa.Array]:
    """The text fields of one evaluation set, as string arrays (nulls dropped)."""
    fix = f"check the path of evaluation set {s.name!r} ({SPEC_FIX})"
    data = read_file(s.path, f"eval_sets ({s.name})", fix)
    fmt = _format(s.path)
    try:
        if fmt == "json":
            import pyarrow.json as pj

            table = pj.read_json(io.BytesIO(data))
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(io.BytesIO(data))
        else:
            import pyarrow.csv as pcsv

            table = pcsv.read_csv(io.BytesIO(data))
    except (pa.ArrowInvalid, OSError) as e:
        raise ConfigError(f"evaluation set {s.name!r}: {s.path} cannot be read as {fmt}: {str(e).splitlines()[0][:200]}",
                          "check the file (JSON lines: one object a line; CSV with a header row)") from None
    out = []
    for f in s.fields:
        if f not in table.column_names:
            raise ConfigError(f"evaluation set {s.name!r}: {s.path} has no field {f!r} (fields: {', '.join(table.column_names)})",
                              f"name a text field of the file after the ':' in eval_sets, e.g. {s.name}={s.path}:{table.column_names[0] if table.column_names else 'text'}")
        col = table.column(f)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_null(col.type)):
            raise ConfigError(f"evaluation set {s.name!r}: field {f!r} of {s.path} holds {col.type}, not text",
                              "name a text field of the file")
        if pa.types.is_null(col.type):
            continue
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        out.append(col.drop_null())
    return out


@register
class Decontaminate(Transform):
    name = "decontaminate"
    Config = DecontaminateConfig
    summary = "flag or remove documents sharing an n-gram (13 words by default) with evaluation sets; counted per set"
    headline = ("decont_*", "removed.*")

    @classmethod
    def warm(cls) -> None:
        warm()  # the words pass from numba's cache, overlapped with the driver's planning

    @classmethod
    def branch_params(cls, branch: str) -> dict:
        return {"unit": "characters"} if branch in CHAR_LANGUAGES else {}

    def input_columns(self) -> list[Column]:
        return [Column(self.config.content_column, "string", nullable=True)]

    def added_columns(self) -> list[str]:
        return [self.config.set_column, self.config.ngram_column] if self.config.action == "flag" else []

    def check_resources(self) -> None:
        for s in self.config.sets():
            check_file(s.path, f"eval_sets ({s.name})", f"check the path of evaluation set {s.name!r} ({SPEC_FIX})")

    def check_on_driver(self, schema: pa.Schema, where: str) -> None:
        self.check_resources()
        for s in self.config.sets():  # every file reads and has its fields, before any batch
            _read_texts(s)

    def setup(self, ctx) -> None:
        self._index = Index(self.config.sets(), self.config.n, self.config.unit)

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        c = self.config
        if not hasattr(self, "_index"):
            self._index = Index(c.sets(), c.n, c.unit)
        col = table.column(c.content_column)
        arr = col.combine_chunks() if col.num_chunks != 1 else (col.chunk(0) if col.num_chunks else pa.array([], pa.string()))
        found, grams = self._index.match(arr, c.unit)
        names = self._index.names
        counters = {f"decont_{s}": int((found == i).sum()) for i, s in enumerate(names)}
        hit = found >= 0
        set_col = pa.nulls(len(found), pa.string())
        if hit.any():
            set_col = pc.if_else(pa.array(hit), pc.take(pa.array(names, pa.string()), pa.array(np.where(hit, found, 0))), set_col)
        annotated = table.append_column(c.set_column, set_col).append_column(c.ngram_column, pa.array(grams, pa.string()))
        if c.action == "flag":
            return Output.of(annotated, counters=counters)
        masks = {f"contaminated_{s}": found == i for i, s in enumerate(names) if (found == i).any()}
        removed = {k: int(m.sum()) for k, m in masks.items()}
        if removed:
            table = table.filter(pa.array(found < 0))
        return Output.of(table, removed=removed, counters=counters, removed_rows=masks, removed_from=annotated)


def warm() -> None:
    """Compile the words pass (or load it from numba's cache) on a one-line evaluation set:
    :mod:`prepline.kernels`."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "e.jsonl").write_text('{"t": "one two three"}\n')
        index = Index([parse_eval_set(f"e={tmp}/e.jsonl:t")], 2, "words")
    index.match(pa.array(["zero one two", None]), "words")
    index.token_ids(pa.array(["one"]), "words")
