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
found in the worker's piece cache by its bytes (:class:`PieceCache`; a piece seen for the first time
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

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline import textstats as ts
from prepline.config import TransformConfig, param, removed_sample_param
from prepline.errors import ConfigError
from prepline.hashing import utf8_bytes
from prepline.registry import register
from prepline.textscan import fnv64, space_len
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


# --- words: one pass over the bytes splits, looks each piece's token ids up and matches windows ---

@numba.njit(cache=True, nogil=True, inline="always")
def _piece_end(data, i, end):
    """The end of the piece (white-space separated run) that starts at ``i``."""
    j = i + 1
    while j < end and space_len(data, j, end) == 0:
        j += 1
    return j


@numba.njit(cache=True, nogil=True, inline="always")
def _lookup(data, i, j, h, table, pool):
    """The cache entry of the piece ``data[i:j]`` (hash ``h``; the bytes are compared), or -1. A slot
    of ``table`` is (hash, entry + 1, offset in ``pool``, length): one cache line per probe."""
    mask = len(table) - 1
    slot = np.int64(h & np.uint64(mask))
    ln = np.uint64(j - i)
    while table[slot, 1] != 0:
        if table[slot, 0] == h and table[slot, 3] == ln:
            s0 = np.int64(table[slot, 2])
            same = True
            for k in range(j - i):
                if pool[s0 + k] != data[i + k]:
                    same = False
                    break
            if same:
                return np.int64(table[slot, 1]) - 1
        slot = (slot + 1) & mask
    return np.int64(-1)


@numba.njit(cache=True, nogil=True, inline="always")
def _insert(table, h, e, off, ln):
    mask = len(table) - 1
    slot = np.int64(h & np.uint64(mask))
    while table[slot, 1] != 0:
        slot = (slot + 1) & mask
    table[slot, 0], table[slot, 1], table[slot, 2], table[slot, 3] = h, np.uint64(e + 1), np.uint64(off), np.uint64(ln)


@numba.njit(cache=True, nogil=True)
def _collect(data, offsets, d0, table, e_hash, e_off, pool, counts, pe, doc_pieces):
    """Read documents ``d0..``: each piece's cache entry goes to ``pe`` (document d's pieces are
    ``pe[doc_pieces[d]:doc_pieces[d + 1]]``); a piece the cache lacks is added (bytes and hash; its
    token ids are filled in after). Returns the first document the cache may have no room for (the
    caller grows it and calls again), or the number of documents."""
    for d in range(d0, len(offsets) - 1):
        a, end = offsets[d], offsets[d + 1]
        most = (end - a) // 2 + 1  # pieces one document can add
        if counts[0] + most >= len(e_hash) or counts[1] + (end - a) > len(pool) or 2 * (counts[0] + most) > len(table):
            return d
        k = doc_pieces[d]
        i = a
        while i < end:
            sp = space_len(data, i, end)
            if sp:
                i += sp
                continue
            j = _piece_end(data, i, end)
            h = fnv64(data, i, j)
            e = _lookup(data, i, j, h, table, pool)
            if e < 0:
                e, p = counts[0], counts[1]
                pool[p:p + j - i] = data[i:j]
                e_hash[e] = h
                e_off[e + 1] = p + j - i
                _insert(table, h, e, p, j - i)
                counts[0], counts[1] = e + 1, p + j - i
            pe[k] = e
            k += 1
            i = j
        doc_pieces[d + 1] = k
    return len(offsets) - 1


@numba.njit(cache=True, nogil=True)
def _rehash(size, e_hash, e_off, n):
    table = np.zeros((size, 4), dtype=np.uint64)
    for e in range(n):
        _insert(table, e_hash[e], e, e_off[e], e_off[e + 1] - e_off[e])
    return table


@numba.njit(cache=True, nogil=True)
def _emit(pe, doc_pieces, t_off, tok):
    """Every document's token ids, flattened, and the document of each."""
    total = 0
    for k in range(doc_pieces[-1]):
        total += t_off[pe[k] + 1] - t_off[pe[k]]
    ids, doc, total = np.empty(total, dtype=np.uint64), np.empty(total, dtype=np.int64), 0
    for d in range(len(doc_pieces) - 1):
        for k in range(doc_pieces[d], doc_pieces[d + 1]):
            for t in range(t_off[pe[k]], t_off[pe[k] + 1]):
                ids[total], doc[total] = tok[t], d
                total += 1
    return ids, doc


@numba.njit(cache=True, nogil=True)
def _eval_table(hashes):
    """Open addressing over the evaluation n-grams' (unique) hashes: slot -> index, -1 free."""
    size = 2
    while size < 2 * len(hashes):
        size *= 2
    table = np.full(size, -1, dtype=np.int64)
    for x in range(len(hashes)):
        slot = np.int64(hashes[x] & np.uint64(size - 1))
        while table[slot] >= 0:
            slot = (slot + 1) & (size - 1)
        table[slot] = x
    return table


@numba.njit(cache=True, nogil=True)
def _match_words(pe, doc_pieces, t_off, tok, n, ev_table, ev_hashes, ev_starts, ev_ids, hit, window):
    """Per document: the evaluation n-gram (index) of its first window of ``n`` known tokens that an
    evaluation set holds (hash found, ids compared), -1 if none, and that window's ids."""
    size = 1
    while size < n:
        size *= 2
    ring, m, emask = np.zeros(size, dtype=np.uint64), size - 1, len(ev_table) - 1
    for d in range(len(doc_pieces) - 1):
        pos, last_unknown, found = 0, -1, np.int64(-1)
        for k in range(doc_pieces[d], doc_pieces[d + 1]):
            for t in range(t_off[pe[k]], t_off[pe[k] + 1]):
                ring[pos & m] = tok[t]
                if tok[t] == 0:
                    last_unknown = pos
                pos += 1
                if pos < n or last_unknown >= pos - n:
                    continue
                h = np.uint64(0)
                for q in range(pos - n, pos):
                    h = h * _MULT + ring[q & m]
                slot = np.int64(h & np.uint64(emask))
                while ev_table[slot] >= 0:
                    x = ev_table[slot]
                    if ev_hashes[x] == h:
                        same = True
                        for q in range(n):
                            if ev_ids[ev_starts[x] + q] != ring[(pos - n + q) & m]:
                                same = False
                                break
                        if same:
                            found = x
                        break
                    slot = (slot + 1) & emask
                if found >= 0:
                    for q in range(n):
                        window[d, q] = ring[(pos - n + q) & m]
                    break
            if found >= 0:
                break
        hit[d] = found


class PieceCache:
    """The white-space separated pieces a worker has read, with their normalised tokens' ids: a piece
    is normalised (Arrow, :func:`tokens`) the first time it is seen, then found by its bytes. Bounded:
    emptied when it holds more than MAX_PIECES."""

    def __init__(self, index: "Index"):
        self.index = index
        self.clear()

    def clear(self) -> None:
        self.table = np.zeros((1 << 16, 4), dtype=np.uint64)
        self.e_hash = np.empty(1 << 15, dtype=np.uint64)
        self.e_off = np.zeros((1 << 15) + 1, dtype=np.int64)
        self.t_off = np.zeros((1 << 15) + 1, dtype=np.int64)
        self.pool = np.empty(1 << 20, dtype=np.uint8)
        self.tok = np.empty(1 << 18, dtype=np.uint64)
        self.counts = np.zeros(2, dtype=np.int64)  # pieces, pool bytes
        self.done = 0  # pieces whose ids are filled in

    def pieces(self, arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Each piece's cache entry (``pe``) and each document's first piece (``doc_pieces``, one more
        than documents), every piece of ``arr`` cached with its token ids."""
        if self.counts[0] > MAX_PIECES:
            self.clear()
        data, offsets = utf8_bytes(arr)
        pe = np.empty(len(data) // 2 + len(arr) + 1, dtype=np.int64)  # at most a piece per 2 bytes (touched as used)
        doc_pieces = np.zeros(len(arr) + 1, dtype=np.int64)
        d = 0
        while d < len(arr):
            d = _collect(data, offsets, d, self.table, self.e_hash, self.e_off, self.pool, self.counts, pe, doc_pieces)
            if d < len(arr):
                self._grow(int(offsets[d + 1] - offsets[d]))
        self._fill()
        return pe, doc_pieces

    def _grow(self, doc_bytes: int) -> None:
        need = int(self.counts[0]) + doc_bytes // 2 + 2
        if need >= len(self.e_hash):
            cap = max(2 * len(self.e_hash), need)
            self.e_hash = np.resize(self.e_hash, cap)
            self.e_off = np.concatenate([self.e_off, np.zeros(cap + 1 - len(self.e_off), np.int64)])
            self.t_off = np.concatenate([self.t_off, np.zeros(cap + 1 - len(self.t_off), np.int64)])
        if int(self.counts[1]) + doc_bytes > len(self.pool):
            self.pool = np.resize(self.pool, max(2 * len(self.pool), int(self.counts[1]) + doc_bytes))
        if 2 * need > len(self.table):
            size = len(self.table)
            while 2 * need > size:
                size *= 2
            self.table = _rehash(size, self.e_hash, self.e_off, int(self.counts[0]))

    def _fill(self) -> None:
        """Normalise the pieces added since the last call and store their token ids."""
        a, b = self.done, int(self.counts[0])
        if a == b:
            return
        lo = int(self.e_off[a])
        offs = self.e_off[a:b + 1] - lo
        pieces = pa.LargeStringArray.from_buffers(b - a, pa.py_buffer(offs), pa.py_buffer(self.pool[lo:int(self.e_off[b])].copy()))
        sub = tokens(pieces, "words")
        ids = self.index._ids(sub.flatten())
        t0 = int(self.t_off[a])
        if t0 + len(ids) > len(self.tok):
            self.tok = np.resize(self.tok, max(2 * len(self.tok), t0 + len(ids)))
        self.tok[t0:t0 + len(ids)] = ids
        self.t_off[a + 1:b + 1] = t0 + sub.offsets.to_numpy().astype(np.int64)[1:]
        self.done = b

    def ids(self, arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        return _emit(*self.pieces(arr), self.t_off, self.tok)

    def match(self, arr: pa.Array, ev: tuple) -> tuple[np.ndarray, np.ndarray]:
        n = self.index.n
        hit = np.empty(len(arr), dtype=np.int64)
        window = np.zeros((len(arr), n), dtype=np.uint64)
        pe, doc_pieces = self.pieces(arr)
        _match_words(pe, doc_pieces, self.t_off, self.tok, n, *ev, hit, window)
        return hit, window

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

    def _piece_cache(self) -> PieceCache:
        """The worker's :class:`PieceCache` (made on first use, with the evaluation n-grams' table)."""
        if not hasattr(self, "_cache"):
            self._cache = PieceCache(self)
            self._ev = (_eval_table(self.hashes), self.hashes, self.starts.astype(np.int64), self.ids)
        return self._cache

    def token_ids(self, arr: pa.Array, unit: str) -> tuple[np.ndarray, np.ndarray]:
        """The ids (:meth:`_ids`) of the normalised tokens of every text, flattened, and their text.
        Words: normalising never joins two white-space separated pieces (it only lowers, drops marks,
        and makes punctuation a space inside a piece), so each distinct piece is normalised and looked
        up once (:class:`PieceCache`) and a piece maps to 0 or more tokens. The same ids as
        normalising the whole text (:func:`tokens`; a test compares them)."""
        if unit != "words":
            toks = tokens(arr, unit)
            return self._ids(toks.flatten()), np.repeat(np.arange(len(arr), dtype=np.int64), np.diff(toks.offsets.to_numpy()))
        return self._piece_cache().ids(arr)

    def match(self, arr: pa.Array, unit: str) -> tuple[np.ndarray, list]:
        """Per document: the index of the matched set (-1: clean), and the matched n-gram's text (None:
        clean). Words in compiled passes (:class:`PieceCache`, :func:`_match_words`), characters with
        Arrow and NumPy; in slices of about MATCH_BYTES of text, so that the arrays stay bounded
        whatever the batch."""
        ndocs = len(arr)
        if not len(self.hashes) or not ndocs:
            return np.full(ndocs, -1, dtype=np.int64), [None] * ndocs
        parts = [self._match_slice_words(arr.slice(a, b - a)) if unit == "words" else self.match_arrays(arr.slice(a, b - a), unit)
                 for a, b in ts.byte_slices(arr, MATCH_BYTES)]
        return np.concatenate([f for f, _ in parts]), [g for _, gs in parts for g in gs]

    def _match_slice_words(self, arr: pa.Array) -> tuple[np.ndarray, list]:
        cache = self._piece_cache()
        at, window = cache.match(arr, self._ev)
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
