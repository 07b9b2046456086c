"""Growing a sample past what the builder holds in memory (the scale benchmarks' 3M and 10M corpora).

The builder plans every document in memory (about 5 KB a document), so a corpus of ten million is
made from a base sample instead: copy 0 is the base as it is, and copy ``k`` is the base with a
quarter of its word types (and, in scripts written without spaces, a quarter of its characters)
marked with a tag of that copy. The choice of types depends on the lowercased word and on ``k``
only, so inside a copy the base's planted duplicates stay what they were: exact copies stay exact,
case and space variants stay variants, and a near copy keeps its shingle Jaccard (the tag is the same
on both sides). Between copies a 5-shingle is shared only when none of its words is tagged in
either copy (about (9/16)**5, 6 %), so the copies are not near duplicates of each other, and the
language mix, the planted PII and the document lengths (a few % longer) stay the base's.

What does not hold between copies: a document with few words (a short tweet) can come out the same
in two copies and is then an exact (or near) duplicate across them; the benchmark's removed counts
show it. The per-document truth is the base's (``_truth/summary.json`` says ``grown_from``).

One pass over a copy's text bytes, compiled with numba; each base file is read once and written
as one file per copy (the same documents per file at every size).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prepline.data_access import LocalLocation
from prepline.sample.corpora import SampleError

#: ``prepline sample --docs N`` above this builds a base sample of BASE_DOCS and grows it
GROW_ABOVE = 1_000_000
BASE_DOCS = 1_000_000
#: one word type (or character) in TAG_ONE_IN is tagged in each copy after the first
TAG_ONE_IN = 4

_kernel = None


def _compiled():
    """The tagging pass, compiled on first use (numba is a core dependency; the registry never imports it)."""
    global _kernel
    if _kernel is not None:
        return _kernel
    import numba

    @numba.njit(cache=True, nogil=True)
    def word_byte(b):  # pragma: no cover - compiled
        """Part of a word: not white space, not ASCII punctuation, not the lead byte of a CJK unit."""
        return b > 0x20 and not (0xE3 <= b <= 0xED) and (b >= 0x80 or 0x30 <= b <= 0x39 or 0x41 <= b <= 0x5A or 0x61 <= b <= 0x7A)

    @numba.njit(cache=True, nogil=True)
    def tag_copy(data, offsets, seed, one_in, word_tag, char_tag, out, out_offsets):  # pragma: no cover - compiled
        o = 0
        n = len(offsets) - 1
        for d in range(n):
            out_offsets[d] = o
            i, end = offsets[d], offsets[d + 1]
            while i < end:
                b = data[i]
                # a unit: a CJK character (3 bytes from U+3040, kana, to U+D7AF, the Hangul block's end),
                # or a word (bytes up to white space, ASCII punctuation or a CJK unit)
                cjk = 0xE3 <= b <= 0xED and i + 2 < end
                if not cjk and not word_byte(b):
                    out[o] = b
                    o += 1
                    i += 1
                    continue
                stop = i + 3 if cjk else end
                h = np.uint64(14695981039346656037) ^ np.uint64(seed)
                while i < stop and (cjk or word_byte(data[i])):
                    b = data[i]
                    lb = b + 32 if 0x41 <= b <= 0x5A else b  # the type is the lowercased word
                    h = (h ^ np.uint64(lb)) * np.uint64(1099511628211)
                    out[o] = b
                    o += 1
                    i += 1
                if (h >> np.uint64(17)) % np.uint64(one_in) == 0:
                    tag = char_tag if cjk else word_tag
                    for j in range(len(tag)):
                        out[o + j] = tag[j]
                    o += len(tag)
        out_offsets[n] = o
        return o

    _kernel = tag_copy
    return tag_copy


def copy_tags(k: int) -> tuple[bytes, bytes]:
    """Copy ``k``'s tags: two lowercase letters after a word, one CJK ideograph after a character."""
    return (chr(97 + k % 26) + chr(97 + (k // 26) % 26)).encode(), chr(0x4E00 + (k * 97) % 20000).encode()


def tag_text(text: pa.Array | pa.ChunkedArray, k: int) -> pa.Array:
    """Copy ``k``'s version of a string column (copy 0: the text as it is). Nulls stay null."""
    arr = text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text
    if k == 0:
        return arr
    arr = arr.cast(pa.large_string()) if arr.type == pa.string() else arr
    offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset: arr.offset + len(arr) + 1]
    data = np.frombuffer(arr.buffers()[2], np.uint8) if arr.buffers()[2] is not None else np.zeros(0, np.uint8)
    word_tag, char_tag = copy_tags(k)
    # worst case: a one-byte word gets a two-byte tag (3×); a 3-byte character a 3-byte tag (2×)
    out = np.empty(max(1, 3 * int(offsets[-1] - offsets[0])), np.uint8)
    out_offsets = np.empty(len(arr) + 1, np.int64)
    used = _compiled()(data, offsets, k, TAG_ONE_IN, np.frombuffer(word_tag, np.uint8), np.frombuffer(char_tag, np.uint8),
                       out, out_offsets)
    res = pa.LargeStringArray.from_buffers(len(arr), pa.py_buffer(out_offsets), pa.py_buffer(out[:used]),
                                           arr.buffers()[0], arr.null_count)
    return res.cast(pa.string())


def _base_summary(base: Path) -> dict:
    f = base / "_truth" / "summary.json"
    if not f.is_file():
        raise SampleError(f"{base} is not a finished sample (no _truth/summary.json)",
                          f"build one first: prepline sample --output {base} --docs {BASE_DOCS}")
    return json.loads(f.read_text(encoding="utf-8"))


def grow_sample(base: str | os.PathLike, output: str | os.PathLike, docs: int, progress=None) -> dict:
    """Write ``docs`` documents under ``output``: copies of the sample at ``base`` (see the module's
    docstring), each base file once per copy, the last copy cut to make ``docs`` exactly."""
    from prepline.sample.build import DATA_SCHEMA, _prepare_output

    base, out = Path(base), Path(output)
    s = _base_summary(base)
    if isinstance(docs, bool) or not isinstance(docs, int) or docs < 1:
        raise SampleError(f"docs must be a positive integer, got {docs!r}", "pass e.g. docs=10000000")
    files = sorted(base.glob("part-*.parquet"))
    if not files or s["docs"] < 1:
        raise SampleError(f"{base} holds no sample files", f"build one: prepline sample --output {base}")
    if out.resolve() == base.resolve():
        raise SampleError(f"{out} is the base sample", "grow into another folder")
    _prepare_output(out)
    loc = LocalLocation(str(out))
    copies = -(-docs // s["docs"])
    left, written, n_out, t0 = docs, 0, 0, time.perf_counter()
    plan = [(f, pq.ParquetFile(f).metadata.num_rows) for f in files]
    for k in range(copies):
        for f, rows in plan:
            if left <= 0:
                break
            t = pq.read_table(f).slice(0, min(rows, left))
            ids = t.column("sample_id") if k == 0 else pc.binary_join_element_wise(t.column("sample_id"), pa.scalar(f"-g{k}"), "")
            table = pa.table([ids, tag_text(t.column("contents"), k), t.column("source")], schema=DATA_SCHEMA)
            written += loc.write_parquet(f"part-{n_out:05d}.parquet", table)
            n_out += 1
            left -= t.num_rows
            if progress:
                progress(docs - left, docs)
    full = docs / s["docs"]
    summary = {
        "docs": docs, "files": n_out, "bytes": written, "output": str(out), "seed": s.get("seed"),
        "grown_from": {"path": str(base), "docs": s["docs"], "copies": copies, "tag_one_in": TAG_ONE_IN},
        # the base's counts times the copies (the last one cut: its share is approximate)
        "langs": {k: round(v * full) for k, v in s.get("langs", {}).items()},
        "kinds": {k: round(v * full) for k, v in s.get("kinds", {}).items()},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "_truth" / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
