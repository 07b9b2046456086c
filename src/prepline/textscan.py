"""Compiled (numba) helpers for passes that read a string column's UTF-8 bytes once.

Arrow's string kernels make a new array per step (split, lower, encode ...); a pass that splits,
hashes and looks words up while it reads the bytes does the same work without the intermediate
arrays. These helpers are what such passes share: Arrow's white space (so that a pass splits and
trims exactly as ``pc.utf8_split_whitespace`` and ``pc.utf8_trim_whitespace`` do) and a 64-bit
hash of a byte range. Used by :mod:`prepline.fasttext_np` and ``transforms/decontaminate.py``.

Compiled functions are cached on disk (numba's ``cache=True``: next to this file, or under
``NUMBA_CACHE_DIR``); the first process compiles them (a few seconds), later ones load them.
"""

from __future__ import annotations

import numba
import numpy as np

#: per byte: 1 an ASCII white-space byte in Arrow's set, 2 the lead byte of a multi-byte one, else 0
SPACE_CLASS = np.zeros(256, dtype=np.uint8)
SPACE_CLASS[[9, 10, 11, 12, 13, 0x1C, 0x1D, 0x1E, 0x1F, 0x20]] = 1
SPACE_CLASS[[0xC2, 0xE1, 0xE2, 0xE3]] = 2
FNV64_OFFSET, FNV64_PRIME = 0xCBF29CE484222325, 0x100000001B3


@numba.njit(cache=True, nogil=True)
def is_space(cp):
    """Arrow's Unicode white space (``utf8_split_whitespace``, ``utf8_trim_whitespace``; measured
    over every code point with pyarrow 26)."""
    return (9 <= cp <= 13 or 0x1C <= cp <= 0x20 or cp == 0x85 or cp == 0xA0 or cp == 0x1680 or 0x2000 <= cp <= 0x200A
            or cp == 0x2028 or cp == 0x2029 or cp == 0x202F or cp == 0x205F or cp == 0x3000)


@numba.njit(cache=True, nogil=True, inline="always")
def space_len(data, i, end):
    """Bytes of the white-space character at ``data[i]`` (Arrow's set), 0 if it is none."""
    k = SPACE_CLASS[data[i]]
    if k == 0:
        return 0
    if k == 1:
        return 1
    c = data[i]
    if c == 0xC2:  # U+0085, U+00A0
        return 2 if i + 1 < end and (data[i + 1] == 0x85 or data[i + 1] == 0xA0) else 0
    if i + 2 >= end:
        return 0
    b1, b2 = data[i + 1], data[i + 2]
    if c == 0xE1:  # U+1680
        return 3 if b1 == 0x9A and b2 == 0x80 else 0
    if c == 0xE3:  # U+3000
        return 3 if b1 == 0x80 and b2 == 0x80 else 0
    # 0xE2: U+2000..U+200A, U+2028, U+2029, U+202F, U+205F
    if b1 == 0x80 and (0x80 <= b2 <= 0x8A or b2 == 0xA8 or b2 == 0xA9 or b2 == 0xAF):
        return 3
    return 3 if b1 == 0x81 and b2 == 0x9F else 0


@numba.njit(cache=True, nogil=True)
def trim(data, a, b):
    """``[a, b)`` without leading and trailing white space (Arrow's set)."""
    while a < b:
        n = space_len(data, a, b)
        if n == 0:
            break
        a += n
    while b > a:
        c = data[b - 1]
        if c < 0x80:
            if SPACE_CLASS[c] != 1:
                break
            b -= 1
        elif b - 2 >= a and data[b - 2] == 0xC2:
            if space_len(data, b - 2, b) != 2:
                break
            b -= 2
        elif b - 3 >= a and space_len(data, b - 3, b) == 3:
            b -= 3
        else:
            break
    return a, b


@numba.njit(cache=True, nogil=True, inline="always")
def fnv64(data, a, b):
    """64-bit FNV-1a of ``data[a:b]``."""
    h = np.uint64(FNV64_OFFSET)
    for k in range(a, b):
        h = (h ^ np.uint64(data[k])) * np.uint64(FNV64_PRIME)
    return h
