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
    Python): after trimming, a white-space byte is kept only when the next byte is not white
    space, and kept ones become ' '. Nulls stay null.
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
    data = np.frombuffer(data_buf, dtype=np.uint8, count=hi - lo, offset=lo) if hi > lo else np.zeros(0, np.uint8)
    ws = (data == 32) | ((data >= 9) & (data <= 13))
    keep = ~ws
    keep[:-1] |= ~ws[1:]  # a white-space byte followed by a non-white-space one (the run's last)
    if len(keep):
        keep[-1] = not ws[-1]
    out = np.where(ws, np.uint8(32), data)[keep]
    dropped = np.flatnonzero(~keep)  # few: only the extra white space
    new_off = (offsets - lo) - np.searchsorted(dropped, offsets - lo)
    return pa.LargeStringArray.from_buffers(
        n, pa.py_buffer(new_off), pa.py_buffer(out), validity, arr.null_count
    )


def md5_128(con: duckdb.DuckDBPyConnection, text: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """128-bit MD5 of each string as an (n, 2) uint64 array (hi, lo)."""
    arr = _select(con, "unhex(md5(t))", text)
    if len(arr) == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    fixed = arr.cast(pa.binary(16))
    buf = fixed.buffers()[1]
    return np.frombuffer(buf, dtype=">u8", count=2 * len(arr), offset=fixed.offset * 16).reshape(-1, 2).astype(np.uint64)
