"""decontaminate's words pass, compiled with numba: split a column on white space, find each piece in
a per-worker cache (its token ids), and match windows of ``n`` token ids against the evaluation
n-grams, in two reads (transforms/decontaminate.py; docs/transforms/decontaminate.md). Imported
when a worker first matches: other stages do not load numba."""

from __future__ import annotations

from typing import Callable

import numba
import numpy as np
import pyarrow as pa

from prepline.hashing import utf8_bytes
from prepline.textscan import fnv64, space_len


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
def eval_table(hashes):
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
def _match_words(pe, doc_pieces, t_off, tok, n, mult, ev_table, ev_hashes, ev_starts, ev_ids, hit, window):
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
                    h = h * mult + ring[q & m]
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
    is given to ``ids_of`` (decontaminate: normalised with Arrow, looked up in the evaluation sets'
    vocabulary) the first time it is seen, then found by its bytes. Bounded: emptied when it holds
    more than ``max_pieces``."""

    def __init__(self, ids_of: Callable[[pa.Array], tuple[np.ndarray, np.ndarray]], n: int, mult: int, max_pieces: int):
        """``ids_of(pieces)``: (offsets per piece, flat token ids); ``n``: tokens per window;
        ``mult``: the window hash's multiplier."""
        self.ids_of, self.n, self.mult, self.max_pieces = ids_of, n, np.uint64(mult), max_pieces
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
        if self.counts[0] > self.max_pieces:
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
        sub_off, ids = self.ids_of(pieces)
        t0 = int(self.t_off[a])
        if t0 + len(ids) > len(self.tok):
            self.tok = np.resize(self.tok, max(2 * len(self.tok), t0 + len(ids)))
        self.tok[t0:t0 + len(ids)] = ids
        self.t_off[a + 1:b + 1] = t0 + sub_off[1:]
        self.done = b

    def ids(self, arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        return _emit(*self.pieces(arr), self.t_off, self.tok)

    def match(self, arr: pa.Array, ev: tuple) -> tuple[np.ndarray, np.ndarray]:
        """Per document: the index of its first window found in ``ev`` (``eval_table(hashes)``,
        hashes, starts, ids of the evaluation n-grams), -1 if none, and that window's ids."""
        n = self.n
        hit = np.empty(len(arr), dtype=np.int64)
        window = np.zeros((len(arr), n), dtype=np.uint64)
        pe, doc_pieces = self.pieces(arr)
        _match_words(pe, doc_pieces, self.t_off, self.tok, n, self.mult, *ev, hit, window)
        return hit, window
