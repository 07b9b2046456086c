"""Vectorised hashing and normalisation of text columns (Arrow and DuckDB kernels, numpy over the UTF-8
bytes; no per-document Python)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    import duckdb


def connect() -> duckdb.DuckDBPyConnection:
    """A private single-threaded DuckDB with no file or network access (workers run in parallel)."""
    import duckdb

    con = duckdb.connect(
        config={
            "threads": 1,
            "enable_external_access": False,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        }
    )
    con.execute("SET enable_progress_bar = false")
    con.execute("SET lock_configuration = true")
    return con


def sha256_hex(con: duckdb.DuckDBPyConnection, text: pa.ChunkedArray | pa.Array) -> pa.Array:
    """SHA-256 of each string's UTF-8 bytes, as lowercase hex."""
    return _select(con, "sha256(t) AS h", text).column("h").combine_chunks()


def _select(con: duckdb.DuckDBPyConnection, exprs: str, text) -> pa.Table:
    """``SELECT <exprs>`` over the strings as column ``t`` (zero-copy from Arrow)."""
    con.register("__prepline_text", pa.table({"t": text}))
    try:
        return con.sql(f"SELECT {exprs} FROM __prepline_text").to_arrow_table()
    finally:
        con.unregister("__prepline_text")


#: bytes per numpy block in normalise() (blocks hold whole strings: a longer string is a block of its
#: own): its temporaries stay in cache and are allocated once
_BLOCK = 1 << 20

#: every white-space character as Python's str.isspace() (= Arrow's utf8_split_whitespace): the
#: Unicode categories Zs, Zl and Zp, the ASCII \t..\r and \x1c..\x1f, and U+0085
SPACES = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
# the UTF-8 bytes of the multi-byte ones (all but U+3000 start with C2, E1 or E2), big-endian in an
# integer, zero-padded to 3 bytes
_MB_SPACES = np.array(sorted(int.from_bytes(c.encode().ljust(3, b"\0"), "big") for c in SPACES if ord(c) > 0x7F),
                      dtype=np.int64)
_U8 = np.uint8


def normalise(text: pa.ChunkedArray | pa.Array, nfkc: bool = False, ascii_only: bool | None = None) -> pa.Array:
    """The text exact dedup compares: optionally NFKC, lower-cased, trimmed, and each run of white
    space (every Unicode white-space character: :data:`SPACES`) collapsed to one ``' '``.

    The same as ``" ".join(s.lower().split())`` in Python (with Arrow's lower-casing and NFKC).
    All-ASCII input takes Arrow's ASCII kernels (NFKC changes no ASCII text). The white space is
    handled with numpy over the UTF-8 bytes, one block of whole strings of about 1 MiB at a time (no
    per-document Python; cache-sized temporaries, allocated once; only element-wise operations,
    and Arrow's filter to drop bytes): a white-space byte is dropped when the next byte is white
    space too (runs end inside their string: trimmed strings end in a non-space), every other
    white-space byte becomes ' ', and the bytes of a multi-byte white-space character count as
    white space each. Text that needs no change comes back as is. Nulls stay null. ``ascii_only``:
    whether every string is ASCII, when the caller knows (None: checked here).
    """
    arr = text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text
    if ascii_only is None:
        ascii_only = len(arr) == 0 or bool(pc.all(pc.string_is_ascii(arr)).as_py())
    if ascii_only:
        arr = pc.utf8_trim_whitespace(pc.ascii_lower(arr))  # (ascii_trim_whitespace keeps \x1c..\x1f)
    else:
        if nfkc:
            arr = nfkc_normalise(arr)
        arr = pc.utf8_trim_whitespace(pc.utf8_lower(arr))
    arr = arr.cast(pa.large_string())  # int64 offsets: no overflow however large the column
    n = len(arr)
    if n == 0:
        return arr
    validity, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    lo, hi = int(offsets[0]), int(offsets[-1])
    size = hi - lo
    if size == 0:
        return arr
    data = np.frombuffer(data_buf, dtype=np.uint8, count=size, offset=lo)
    rel = offsets - lo
    ends = rel[np.unique(np.r_[np.searchsorted(rel, np.arange(0, size, _BLOCK), side="right") - 1, n])].tolist()
    big = int(max(b - a for a, b in zip(ends[:-1], ends[1:])))
    t1, t2, ws, w2, drop = np.empty(big, _U8), np.empty(big, _U8), np.empty(big, bool), np.empty(big, bool), np.empty(big, bool)
    out = np.empty(size, _U8)
    dropped_parts: list[np.ndarray] = []
    written, changed = 0, False
    for start, stop in zip(ends[:-1], ends[1:]):
        m = stop - start
        blk = data[start:stop]
        piece = blk
        b1, b2, w, ww, d = t1[:m], t2[:m], ws[:m], w2[:m], drop[:m]
        # white space: \t..\r (9..13) and \x1c..' ' (28..32), by uint8 wrap-around
        np.less_equal(np.subtract(blk, _U8(9), out=b1), _U8(4), out=w)
        np.less_equal(np.subtract(blk, _U8(28), out=b2), _U8(4), out=ww)
        w |= ww
        top = 0 if ascii_only else int(blk.max())
        mb = _multibyte_spaces(blk, top, b1, ww, d) if top >= 0xC2 else None
        if mb is not None:
            w[mb] = True
        np.logical_and(w[:-1], w[1:], out=d[:-1])  # white space followed by white space: dropped
        d[-1] = False  # a block ends with a string's last byte, never white space
        if mb is not None or np.less(blk, _U8(32), out=ww).any():  # white space other than ' '
            piece = np.maximum(blk, np.multiply(w.view(_U8), _U8(32), out=b1), out=b2)  # white space -> ' '
            if mb is not None:
                piece[mb] = 32
            changed = True
        if d.any():  # drop those bytes: Arrow's filter (a numpy boolean index costs five times more)
            np.logical_not(d, out=ww)
            keep = pa.BooleanArray.from_buffers(pa.bool_(), m, [None, pa.py_buffer(np.packbits(ww, bitorder="little"))])
            kept = pc.filter(pa.UInt8Array.from_buffers(pa.uint8(), m, [None, pa.py_buffer(piece)]), keep)
            piece = np.frombuffer(kept.buffers()[1], dtype=_U8, count=len(kept), offset=kept.offset)
            dropped_parts.append(np.flatnonzero(d) + start)  # few: only the extra white space
            changed = True
        out[written : written + len(piece)] = piece
        written += len(piece)
    if not changed:
        return arr
    new_off = rel - np.searchsorted(np.concatenate(dropped_parts), rel) if dropped_parts else rel
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(new_off), pa.py_buffer(out[:written]), validity, arr.null_count)
def _multibyte_spaces(blk: np.ndarray, top: int, u8: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> np.ndarray | None:
    """Positions of every byte of the multi-byte white-space characters of a block of whole strings
    (None: there are none); ``top`` is the block's largest byte, ``u8``, ``s1``, ``s2`` scratch
    arrays of the block's size (fresh block-sized temporaries cost more in page faults than the
    arithmetic). U+3000 (E3 80 80) by shifted comparisons (E3 starts every kana); the others start
    with C2, E1 or E2, whose positions are few, and are looked up there."""
    m = len(blk)
    parts = []
    if m >= 3 and top >= 0xE3:
        e, f = s1[: m - 2], s2[: m - 2]
        np.equal(blk[:-2], 0xE3, out=e)
        e &= np.equal(blk[1:-1], 0x80, out=f)
        e &= np.equal(blk[2:], 0x80, out=f)
        if e.any():
            lead = np.flatnonzero(e)
            parts += [lead, lead + 1, lead + 2]
    c, f = s1[:m], s2[:m]
    np.equal(blk, 0xC2, out=c)
    c |= np.less_equal(np.subtract(blk, _U8(0xE1), out=u8[:m]), 1, out=f)
    lead = np.flatnonzero(c)
    if len(lead):
        b0 = blk[lead].astype(np.int64)
        b1 = np.where(lead + 1 < m, blk[np.minimum(lead + 1, m - 1)], 0).astype(np.int64)
        b2 = np.where(lead + 2 < m, blk[np.minimum(lead + 2, m - 1)], 0).astype(np.int64)
        two = (b0 << 16) | (b1 << 8)  # C2 85 and C2 A0 are 2-byte characters, the others 3-byte
        code = np.where(b0 == 0xC2, two, two | b2)
        i = np.minimum(np.searchsorted(_MB_SPACES, code), len(_MB_SPACES) - 1)
        lead = lead[_MB_SPACES[i] == code]
        if len(lead):
            parts += [lead, lead + 1, lead[blk[lead] != 0xC2] + 2]
    return np.concatenate(parts) if parts else None


_NFKC_CHANGES: np.ndarray | None = None
_NFKC_PLANES = 0x30000  # code points at or above: treated as possibly changing (rare)


def _nfkc_table() -> np.ndarray:
    """For each code point below _NFKC_PLANES: whether NFKC may change a string holding it (its
    NFKC form differs, it is a combining mark, or it can compose with the character before it)."""
    global _NFKC_CHANGES
    if _NFKC_CHANGES is None:
        import unicodedata

        t = np.zeros(_NFKC_PLANES, dtype=bool)
        for c in range(0x80, _NFKC_PLANES):
            ch = chr(c)
            if unicodedata.combining(ch) or unicodedata.normalize("NFKC", ch) != ch:
                t[c] = True
            d = unicodedata.decomposition(ch)
            if d and not d.startswith("<") and len(d.split()) == 2:  # a canonical pair: its second part composes
                t[int(d.split()[1], 16)] = True
        t[0x1161:0x1176] = t[0x11A8:0x11C3] = True  # Hangul vowel and trailing jamo compose algorithmically
        _NFKC_CHANGES = t
    return _NFKC_CHANGES


def nfkc_normalise(arr: pa.Array) -> pa.Array:
    """NFKC of each string, computed (by Arrow's utf8_normalize) only for the strings holding a code
    point that NFKC may change; code points are decoded with numpy over the UTF-8 bytes."""
    arr = arr.cast(pa.large_string())
    n = len(arr)
    data, offsets = utf8_bytes(arr)
    lead = np.flatnonzero(data >= 0xC2)
    if len(lead) == 0:
        return arr
    p = np.concatenate([data, np.zeros(3, np.uint8)])
    b0 = p[lead].astype(np.uint32)
    b1, b2, b3 = (p[lead + k].astype(np.uint32) & 0x3F for k in (1, 2, 3))
    cp = np.where(b0 < 0xE0, ((b0 & 0x1F) << 6) | b1,
                  np.where(b0 < 0xF0, ((b0 & 0x0F) << 12) | (b1 << 6) | b2, ((b0 & 0x07) << 18) | (b1 << 12) | (b2 << 6) | b3))
    table = _nfkc_table()
    hit = np.ones(len(cp), dtype=bool)
    low = cp < _NFKC_PLANES
    hit[low] = table[cp[low]]
    rows = np.unique(np.searchsorted(offsets, lead[hit], side="right") - 1)
    if len(rows) == 0:
        return arr
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    fixed = pc.utf8_normalize(arr.take(pa.array(rows)), "NFKC").cast(pa.large_string())
    return pc.replace_with_mask(arr, pa.array(mask), fixed)


def utf8_bytes(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 bytes, int64 offsets rebased to 0) of a string array (nulls count as empty)."""
    arr = arr.cast(pa.large_string())
    n = len(arr)
    if arr.null_count:
        arr = pc.fill_null(arr, "")
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(data_buf, dtype=np.uint8, count=hi - lo, offset=lo) if hi > lo else np.zeros(0, np.uint8)
    return data, offsets - lo


def dedup_keys(con: duckdb.DuckDBPyConnection, text: pa.ChunkedArray | pa.Array, normalize: bool = True,
               nfkc: bool = False) -> np.ndarray:
    """Exact dedup's key of each string: :func:`hash_128` of the :func:`normalise` d text (of the
    exact bytes with ``normalize=False``), as an (n, 2) uint64 array. The all-ASCII strings and the
    others are normalised apart (ASCII kernels for the first) and their keys put back in order."""
    arr = text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text
    if not normalize:
        return hash_128(con, arr)
    ascii_rows = pc.fill_null(pc.string_is_ascii(arr), True).to_numpy(zero_copy_only=False)
    if ascii_rows.all() or not ascii_rows.any():
        return hash_128(con, normalise(arr, nfkc, bool(len(arr) == 0 or ascii_rows[0])))
    out = np.empty((len(arr), 2), dtype=np.uint64)
    for rows, ascii_only in ((ascii_rows, True), (~ascii_rows, False)):
        out[rows] = hash_128(con, normalise(arr.filter(pa.array(rows)), nfkc, ascii_only))
    return out


def hash_128(con: duckdb.DuckDBPyConnection, text: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A 128-bit key of each string as an (n, 2) uint64 array: two 64-bit DuckDB ``hash()`` values,
    of the string and of the string after a one-byte prefix, so that the two see different 8-byte blocks."""
    t = _select(con, "hash(t) AS h, hash(chr(1) || t) AS l", text)
    out = np.empty((t.num_rows, 2), dtype=np.uint64)
    out[:, 0] = t.column("h").to_numpy()
    out[:, 1] = t.column("l").to_numpy()
    return out

