"""Vectorised hashing of text columns (DuckDB kernels over Arrow, no per-document Python)."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def connect() -> duckdb.DuckDBPyConnection:
    """A private single-threaded DuckDB with no file or network access (workers run in parallel)."""
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
    return _select(con, "sha256(t)", text)


def _select(con: duckdb.DuckDBPyConnection, expr: str, text) -> pa.Array:
    con.register("__prepline_text", pa.table({"t": text}))
    try:
        return con.sql(f"SELECT {expr} AS h FROM __prepline_text").to_arrow_table().column("h").combine_chunks()
    finally:
        con.unregister("__prepline_text")


#: bytes per numpy block in normalise(): its temporaries stay in cache and are allocated once
_BLOCK = 1 << 20


def normalise(text: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Lower-case, trim, and collapse each run of ASCII white space to one space.

    The key of exact dedup. Works on the UTF-8 byte buffer with numpy, one 1 MiB block at a time
    (no per-document Python; block-sized temporaries instead of column-sized ones, which cost as
    much in page faults as the arithmetic): a white-space byte is dropped when the next byte is
    white space too (runs never cross a string's end: trimmed strings end in a non-space), and
    \\t \\n \\v \\f \\r become ' '. Text that needs neither comes back as is. Nulls stay null.
    """
    arr = pc.utf8_trim_whitespace(pc.utf8_lower(text))
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
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
    out = np.empty(size, np.uint8)
    tmp, ctl, ws = np.empty(_BLOCK + 1, np.uint8), np.empty(_BLOCK + 1, bool), np.empty(_BLOCK + 1, bool)
    drop = np.empty(_BLOCK, bool)
    dropped_parts: list[np.ndarray] = []
    written, changed = 0, False
    for start in range(0, size, _BLOCK):
        m = min(_BLOCK, size - start)
        ext = min(m + 1, size - start)  # one byte of look-ahead into the next block
        blk, t, c, w, d = data[start:start + ext], tmp[:ext], ctl[:ext], ws[:ext], drop[:m]
        np.less_equal(np.subtract(blk, np.uint8(9), out=t), np.uint8(4), out=c)  # \t..\r (uint8 wrap-around)
        np.logical_or(np.equal(blk, np.uint8(32), out=w), c, out=w)
        if ext > m:
            np.logical_and(w[:m], w[1:], out=d)  # white space followed by white space
        else:  # the buffer's last byte
            np.logical_and(w[:m - 1], w[1:m], out=d[:m - 1])
            d[m - 1] = w[m - 1]
        piece = blk[:m]
        if c[:m].any():
            np.copyto(t[:m], piece)
            np.putmask(t[:m], c[:m], np.uint8(32))
            piece, changed = t[:m], True
        if d.any():
            dropped_parts.append(np.flatnonzero(d) + start)  # few: only the extra white space
            piece, changed = piece[~d], True
        out[written:written + len(piece)] = piece
        written += len(piece)
    if not changed:
        return arr
    new_off = offsets - lo
    if dropped_parts:
        dropped = np.concatenate(dropped_parts)
        new_off = new_off - np.searchsorted(dropped, new_off)
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(new_off), pa.py_buffer(out[:written]), validity, arr.null_count)


def md5_128(con: duckdb.DuckDBPyConnection, text: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """128-bit MD5 of each string as an (n, 2) uint64 array (hi, lo)."""
    arr = _select(con, "unhex(md5(t))", text)
    if len(arr) == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    fixed = arr.cast(pa.binary(16))
    buf = fixed.buffers()[1]
    return np.frombuffer(buf, dtype=">u8", count=2 * len(arr), offset=fixed.offset * 16).reshape(-1, 2).astype(np.uint64)
