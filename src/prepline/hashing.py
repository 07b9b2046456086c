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


def normalise(text: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Lower-case, trim, and collapse each run of ASCII white space to one space.

    The key of exact dedup. Works on the whole UTF-8 byte buffer with numpy (no per-document
    Python): after trimming, a white-space byte is dropped when the next byte is white space too
    (runs never cross a string's end: trimmed strings end in a non-space), and \\t \\n \\v \\f \\r
    become ' '. Text that needs neither is returned without copying the buffer. Nulls stay null.
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
    if hi == lo:
        return arr
    data = np.frombuffer(data_buf, dtype=np.uint8, count=hi - lo, offset=lo)
    ctl = (data - np.uint8(9)) <= np.uint8(4)  # \t \n \v \f \r (uint8 wrap-around: one compare)
    ws = ctl | (data == 32)
    drop = np.empty_like(ws)
    np.logical_and(ws[:-1], ws[1:], out=drop[:-1])  # white space followed by white space
    drop[-1] = ws[-1]
    has_ctl, has_drop = bool(ctl.any()), bool(drop.any())
    if not (has_ctl or has_drop):
        return arr
    out = data.copy()
    np.putmask(out, ctl, np.uint8(32))
    if not has_drop:
        return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets - lo), pa.py_buffer(out), validity, arr.null_count)
    dropped = np.flatnonzero(drop)  # few: only the extra white space
    new_off = (offsets - lo) - np.searchsorted(dropped, offsets - lo)
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(new_off), pa.py_buffer(out[~drop]), validity, arr.null_count)


def md5_128(con: duckdb.DuckDBPyConnection, text: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """128-bit MD5 of each string as an (n, 2) uint64 array (hi, lo)."""
    arr = _select(con, "unhex(md5(t))", text)
    if len(arr) == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    fixed = arr.cast(pa.binary(16))
    buf = fixed.buffers()[1]
    return np.frombuffer(buf, dtype=">u8", count=2 * len(arr), offset=fixed.offset * 16).reshape(-1, 2).astype(np.uint64)
