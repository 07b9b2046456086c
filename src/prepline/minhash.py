"""Vectorised MinHash over Arrow string columns: Arrow kernels, DuckDB and numpy, no per-document Python.

The steps, each over a whole batch of documents at once:

1. **Units.** ``auto`` (the default) chooses per document: ``char`` for a document written
   mostly in a script without spaces between words (:data:`UNSEGMENTED`: Han, kana, Thai,
   Lao, Khmer, Myanmar, Tibetan; at least :data:`AUTO_CHAR_SHARE` of its characters),
   ``word`` for every other. ``word`` shingles: the text is lower-cased and split on white space
   (``pyarrow.compute.utf8_lower`` and ``utf8_split_whitespace``: the words of Python's
   ``str.lower().split()``); each word gets a 64-bit hash from DuckDB's ``hash()`` over the
   flat word column (once per batch, in a private single-threaded DuckDB). ``char``
   shingles: lower-cased text with white-space runs collapsed to one space and trimmed; each
   Unicode character is one unit, its UTF-8 bytes packed into an integer (numpy over the byte
   buffer).
2. **Shingles.** A shingle is ``k`` consecutive units of one document; its 32-bit hash
   combines the ``k`` unit hashes (random odd multipliers, then a finaliser). A document
   with fewer than ``k`` units (but at least one) is one shingle: the whole document. A
   document with no units (empty or white space only) has no shingles and no signature.
3. **Signatures.** For ``P`` permutations ``h_p(x) = (a_p * x + b_p) mod 2**32`` (random
   ``a_p`` odd and ``b_p``: a bijection of the 32-bit values, over shingle hashes that are
   already well mixed), the signature is the minimum of ``h_p`` over the document's
   shingles: ``np.minimum.reduceat`` per document over blocks of shingles, in uint32 so
   that a block of all permutations stays in cache. The estimate's error matches the
   binomial ``sqrt(J (1 - J) / P)`` (checked in the tests).
4. **Band keys.** ``bands`` × ``rows`` = ``P``: each band's ``rows`` values and the band
   number are hashed into one 64-bit bucket key; two documents share a bucket in some band
   with probability ``1 - (1 - J**rows)**bands`` for Jaccard similarity ``J``.

Everything depends only on the text and a fixed seed, so signatures are identical in every
process, worker and run (only integer arithmetic; word hashes come from the pinned DuckDB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline.hashing import SPACES, utf8_bytes

__all__ = [
    "Shingles",
    "shingle",
    "signatures",
    "band_keys",
    "estimated_jaccard",
    "lsh_probability",
    "lsh_shape",
    "unsegmented_share",
    "UNSEGMENTED",
    "permutations",
    "mix64",
]

_U64 = np.uint64
_SEED = 0x5EED_F022


def _splitmix(x: np.ndarray) -> np.ndarray:
    """The SplitMix64 finaliser, in place on a uint64 array (returns it)."""
    x ^= x >> _U64(30)
    x *= _U64(0xBF58476D1CE4E5B9)
    x ^= x >> _U64(27)
    x *= _U64(0x94D049BB133111EB)
    x ^= x >> _U64(31)
    return x


def mix64(x: np.ndarray) -> np.ndarray:
    """A well-mixed 64-bit hash of each uint64 (SplitMix64's finaliser), as a new array."""
    return _splitmix(np.array(x, dtype=np.uint64, copy=True))


def _random_u64(n: int, salt: int, odd: bool = False) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64([_SEED, salt]))
    v = rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)
    return v | _U64(1) if odd else v


_SHINGLE_MUL = _random_u64(64, 3, odd=True)  # one multiplier per position in a shingle (k <= 64)
_BAND_MUL = _random_u64(4096, 4, odd=True)  # one per row in a band
_BAND_SALT = _random_u64(4096, 5)  # one per band

MAX_SHINGLE = len(_SHINGLE_MUL)


def permutations(num: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``(a, b)`` uint32 vectors of ``num`` permutations, ``a`` odd (fixed seed: same everywhere)."""
    a = (_random_u64(num, 6) >> _U64(32)).astype(np.uint32) | np.uint32(1)
    b = (_random_u64(num, 7) >> _U64(32)).astype(np.uint32)
    return a, b


_CON = None


def _duckdb():
    global _CON
    if _CON is None:
        from prepline import hashing

        _CON = hashing.connect()
    return _CON


def _word_units(low: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of the words (white-space separated) of lower-cased text, and word offsets."""
    # trimmed first: pyarrow's utf8_split_whitespace (26.0.1) sometimes leaves the trailing white
    # space of an array's last string on its last word (it depends on the bytes after the string,
    # so on the process's memory): that document then got another last shingle, and an exact
    # duplicate of it could be kept. Without trailing white space the words are the same every time
    # (leading and trailing white space only make empty words, dropped below anyway).
    words = pc.utf8_split_whitespace(pc.utf8_trim_whitespace(low))
    offsets = words.offsets.to_numpy().astype(np.int64)
    offsets -= offsets[0]
    flat = words.flatten()
    if len(flat) == 0:
        return np.zeros(0, dtype=np.uint64), offsets
    con = _duckdb()
    con.register("__prepline_words", pa.table({"w": flat}))
    try:
        h = con.sql("SELECT hash(w) AS h FROM __prepline_words").to_arrow_table().column("h")
    finally:
        con.unregister("__prepline_words")
    h = np.ascontiguousarray(h.to_numpy()).astype(np.uint64, copy=False)
    # leading and trailing white space give empty "words": drop them
    nonempty = pc.binary_length(flat).to_numpy() > 0
    if not nonempty.all():
        kept = np.zeros(len(nonempty) + 1, dtype=np.int64)
        np.cumsum(nonempty, out=kept[1:])
        h, offsets = h[nonempty], kept[offsets]
    return h, offsets


# the UTF-8 bytes of the Unicode white-space characters (as Python's str.isspace), packed
# little-endian into one integer as _char_units packs every character
_WS_CODES = np.array(sorted(int.from_bytes(c.encode(), "little") for c in SPACES), dtype=np.uint64)
_SPACE = _U64(32)
_ASCII_WS = np.zeros(256, dtype=bool)
_ASCII_WS[[*range(9, 14), *range(28, 33)]] = True


def _char_units(low: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The characters of lower-cased text, white-space runs collapsed to one space and trimmed.

    Each character is its UTF-8 bytes packed into an integer (unique per character)."""
    data, offsets = utf8_bytes(low)
    n = len(offsets) - 1
    if len(data) == 0:
        return np.zeros(0, dtype=np.uint64), np.zeros(n + 1, dtype=np.int64)
    is_start = (data & 0xC0) != 0x80  # the first byte of a character
    cstart = np.flatnonzero(is_start)
    nchar = len(cstart)
    # characters per document, and each character's document
    before = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum(is_start, out=before[1:])
    coff = before[offsets]
    cdoc = np.repeat(np.arange(n), np.diff(coff))
    # pack the (1 to 4) bytes of each character into one integer
    padded = np.concatenate([data, np.zeros(3, dtype=np.uint8)])
    clen = np.empty(nchar, dtype=np.int64)
    clen[:-1] = np.diff(cstart)
    clen[-1] = len(data) - cstart[-1]
    val = padded[cstart].astype(np.uint64)
    multi = np.flatnonzero(clen > 1)
    if len(multi):
        ms, ml = cstart[multi], clen[multi]
        v = val[multi]
        for j in (1, 2, 3):
            v |= np.where(ml > j, padded[ms + j], 0).astype(np.uint64) << _U64(8 * j)
        val[multi] = v
    # white space (as Python's str.isspace): ASCII by table, the rest among the multi-byte ones
    ws = _ASCII_WS[np.minimum(val, 255)] & (val < 128)
    if len(multi):
        v = val[multi]
        i = np.minimum(np.searchsorted(_WS_CODES, v), len(_WS_CODES) - 1)
        ws[multi] = _WS_CODES[i] == v
    # a white-space run becomes one space when it has a character of the same document on
    # both sides; leading and trailing runs are dropped
    same_next = np.zeros(nchar, dtype=bool)
    same_next[:-1] = cdoc[1:] == cdoc[:-1]
    ws_next = np.zeros(nchar, dtype=bool)
    ws_next[:-1] = ws[1:] & same_next[:-1]
    ws_prev = np.zeros(nchar, dtype=bool)
    ws_prev[1:] = ws[:-1] & same_next[:-1]
    first = np.flatnonzero(ws & ~ws_prev)  # runs, in order
    last = np.flatnonzero(ws & ~ws_next)
    inner = (first > coff[cdoc[first]]) & same_next[last]  # not at the start, not at the end
    keep = ~ws
    keep[first[inner]] = True
    val[ws] = _SPACE
    val, cdoc = val[keep], cdoc[keep]
    counts = np.bincount(cdoc, minlength=n)
    unit_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=unit_offsets[1:])
    return val, unit_offsets


@dataclass
class Shingles:
    """32-bit shingle hashes (in uint64) of a batch, grouped by document.

    ``doc_offsets[i]:doc_offsets[i+1]`` are document i's shingles (none for an empty document).
    Duplicates within a document are kept (MinHash is the same over a multiset).
    """

    hashes: np.ndarray
    doc_offsets: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.doc_offsets)

    def of(self, i: int) -> np.ndarray:
        return self.hashes[self.doc_offsets[i] : self.doc_offsets[i + 1]]


# Unicode blocks of scripts written without spaces between words (code point ranges, inclusive):
# a document mostly in these is shingled by characters under ``auto``. Hangul is not among them:
# Korean separates words by spaces, and word shingles measure its near duplicates as they do
# for English (docs/transforms/fuzzy_dedup.md has the measurement).
UNSEGMENTED = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x0F00, 0x0FFF),  # Tibetan
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x19E0, 0x19FF),  # Khmer symbols
    (0x2E80, 0x2FDF),  # CJK radicals, Kangxi radicals
    (0x3040, 0x312F),  # Hiragana, Katakana, Bopomofo
    (0x31A0, 0x31FF),  # Bopomofo extended, CJK strokes, Katakana phonetic extensions
    (0x3400, 0x4DBF),  # CJK unified ideographs extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFF9F),  # half-width Katakana
    (0x20000, 0x3FFFF),  # CJK extensions B and later
)
#: ``auto`` shingles a document by characters when at least this share of its characters is in
#: :data:`UNSEGMENTED` (Japanese, Chinese and Thai text: 0.6 to 1.0; other text: 0)
AUTO_CHAR_SHARE = 0.3
_UNSEG_BOUNDS = np.array([x for lo, hi in UNSEGMENTED for x in (lo, hi + 1)], dtype=np.uint32)


def unsegmented_share(text: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per document, the share of its characters that are in :data:`UNSEGMENTED` (0 when empty).

    Only 3- and 4-byte UTF-8 sequences can be in those blocks: their code points are decoded
    with numpy over the byte buffer, the rest is never looked at."""
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks() if text.num_chunks != 1 else text.chunk(0)
    n = len(text)
    data, offsets = utf8_bytes(text)
    out = np.zeros(n, dtype=np.float64)
    lead = np.flatnonzero(data >= 0xE0)
    if len(lead) == 0:
        return out
    padded = np.concatenate([data, np.zeros(3, dtype=np.uint8)]).astype(np.uint32)
    b0, b1, b2, b3 = padded[lead], padded[lead + 1] & 0x3F, padded[lead + 2] & 0x3F, padded[lead + 3] & 0x3F
    four = b0 >= 0xF0
    cp = np.where(four, ((b0 & 0x07) << 18) | (b1 << 12) | (b2 << 6) | b3, ((b0 & 0x0F) << 12) | (b1 << 6) | b2)
    hit = (np.searchsorted(_UNSEG_BOUNDS, cp, side="right") & 1).astype(bool)
    if not hit.any():
        return out
    doc = np.searchsorted(offsets, lead[hit], side="right") - 1
    docs, count = np.unique(doc, return_counts=True)
    chars = pc.utf8_length(text.take(pa.array(docs))).to_numpy(zero_copy_only=False)  # only where there are hits
    out[docs] = count / chars
    return out


def shingle(text: pa.Array | pa.ChunkedArray, k: int = 5, kind: str = "auto") -> Shingles:
    """Shingle hashes of every document of ``text`` (k units each; see the module docstring)."""
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks() if text.num_chunks != 1 else text.chunk(0)
    if not 1 <= k <= MAX_SHINGLE:
        raise ValueError(f"shingle size {k} outside 1..{MAX_SHINGLE}")
    if kind not in ("auto", "word", "char"):
        raise ValueError(f"unknown shingle kind {kind!r}")
    low = pc.utf8_lower(text)
    if kind == "auto":
        by_char = unsegmented_share(low) >= AUTO_CHAR_SHARE
        if by_char.all() or not by_char.any():
            kind = "char" if by_char.all() and len(by_char) else "word"
        else:
            rows = (np.flatnonzero(~by_char), np.flatnonzero(by_char))
            parts = [_windows(*units(low.take(pa.array(r))), k) for units, r in zip((_word_units, _char_units), rows)]
            return _interleave(len(low), rows, parts)
    units, uoff = (_word_units if kind == "word" else _char_units)(low)
    return _windows(units, uoff, k)


def _interleave(n: int, rows: tuple[np.ndarray, ...], parts: list[Shingles]) -> Shingles:
    """One Shingles of ``n`` documents from parts that hold the documents ``rows[i]`` (in order)."""
    counts = np.zeros(n, dtype=np.int64)
    for r, part in zip(rows, parts):
        counts[r] = part.counts
    soff = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=soff[1:])
    hashes = np.empty(int(soff[-1]), dtype=np.uint64)
    for r, part in zip(rows, parts):
        # each of the part's shingles moves by where its document starts now minus where it started
        shift = np.repeat(soff[r] - part.doc_offsets[:-1], part.counts)
        hashes[np.arange(len(part.hashes)) + shift] = part.hashes
    return Shingles(hashes, soff)


def _windows(units: np.ndarray, uoff: np.ndarray, k: int) -> Shingles:
    """32-bit hashes of the k-unit windows of each document's units (one shingle when shorter)."""
    n = len(uoff) - 1
    counts = np.diff(uoff)
    nsh = np.where(counts >= k, counts - k + 1, np.minimum(counts, 1))
    soff = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(nsh, out=soff[1:])
    total, w = int(soff[-1]), len(units)
    if total == 0:
        return Shingles(np.zeros(0, dtype=np.uint64), soff)
    with np.errstate(over="ignore"):
        # every unit position starts a k-window (windows that run past their document are dropped)
        h = units * _SHINGLE_MUL[0]
        for j in range(1, min(k, w)):
            h[: w - j] += units[j:] * _SHINGLE_MUL[j]
        h += _U64(k)
        # a full window starts at uoff[d] .. uoff[d+1]-k of each document with >= k units
        full = counts >= k
        mark = np.zeros(w + 1, dtype=np.int32)
        np.add.at(mark, uoff[:-1][full], 1)
        np.add.at(mark, uoff[1:][full] - k + 1, -1)
        valid = np.cumsum(mark[:-1]).astype(bool)
        short = np.flatnonzero((counts > 0) & ~full)
        if len(short):
            # a document shorter than k units is one shingle: all of its units
            s0, ln = uoff[short], counts[short]
            hs = np.zeros(len(short), dtype=np.uint64)
            for j in range(int(ln.max())):
                m = ln > j
                hs[m] += units[s0[m] + j] * _SHINGLE_MUL[j]
            hs += ln.astype(np.uint64)
            h[s0] = hs
            valid[s0] = True
        h = h[valid]
    _splitmix(h)
    h >>= _U64(32)
    return Shingles(h, soff)


def signatures(sh: Shingles, num_perm: int, block: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """MinHash signatures ``(m, num_perm)`` uint32 of the documents that have shingles.

    Returns ``(sig, docs)``: ``docs`` are the indices (into the batch) of those documents.
    The shingles are taken in blocks of ``block`` (the ``num_perm × block`` temporary stays
    in cache); a document may span blocks, its minimum is combined across them.
    """
    a, b = permutations(num_perm)
    counts = sh.counts
    docs = np.flatnonzero(counts > 0)
    m = len(docs)
    sig = np.full((m, num_perm), np.iinfo(np.uint32).max, dtype=np.uint32)
    if m == 0:
        return sig, docs
    starts = sh.doc_offsets[docs]  # document docs[i] has shingles starts[i] .. starts[i] + counts
    x = sh.hashes.astype(np.uint32)
    total = len(x)
    a_col, b_col = a[:, None], b[:, None]
    buf = np.empty((num_perm, min(block, total)), dtype=np.uint32)
    for lo in range(0, total, block):
        hi = min(lo + block, total)
        # documents overlapping [lo, hi): the one holding shingle lo, up to the last starting before hi
        d0 = int(np.searchsorted(starts, lo, side="right")) - 1
        d1 = int(np.searchsorted(starts, hi, side="left"))
        v = buf[:, : hi - lo]
        np.multiply(a_col, x[None, lo:hi], out=v)  # (a * x + b) mod 2**32
        v += b_col
        part = np.minimum.reduceat(v, np.maximum(starts[d0:d1], lo) - lo, axis=1)
        np.minimum(sig[d0:d1], part.T, out=sig[d0:d1])
    return sig, docs


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """``(m, bands)`` uint64 bucket keys: each band's ``rows`` values and its number, hashed."""
    m, p = sig.shape
    if bands * rows != p:
        raise ValueError(f"bands × rows = {bands * rows} != {p} permutations")
    v = sig.reshape(m, bands, rows).astype(np.uint64)
    with np.errstate(over="ignore"):
        v *= _BAND_MUL[:rows]
        key = v.sum(axis=2, dtype=np.uint64)
        key += _BAND_SALT[:bands]
    return _splitmix(key)


def estimated_jaccard(sa: np.ndarray, sb: np.ndarray) -> np.ndarray:
    """Row-wise share of equal signature values: the MinHash estimate of Jaccard similarity."""
    return (sa == sb).mean(axis=-1)


def lsh_probability(j: float | np.ndarray, bands: int, rows: int):
    """Probability that two documents with Jaccard ``j`` share a bucket in at least one band."""
    return 1.0 - (1.0 - np.asarray(j, dtype=float) ** rows) ** bands


def _bands_needed(threshold: float, rows: int, target: float) -> float:
    """Fewest bands of ``rows`` rows with candidate probability >= target at ``threshold`` (inf: none)."""
    q = threshold**rows
    if q >= 1.0:
        return 1
    if q <= 0.0 or target >= 1.0:
        return math.inf
    return max(1, math.ceil(math.log1p(-target) / math.log1p(-q) - 1e-9))


def _false_candidate_area(threshold: float, bands: int, rows: int) -> float:
    """Area under the S-curve below the threshold: how many pairs under it become candidates."""
    j = np.linspace(0.0, threshold, 257)
    p = lsh_probability(j, bands, rows)
    return float(((p[1:] + p[:-1]) * np.diff(j)).sum() / 2)


def lsh_shape(threshold: float, target_recall: float, max_permutations: int) -> tuple[int, int]:
    """``(bands, rows)`` for LSH at ``threshold``: a pair with Jaccard exactly ``threshold`` (hence
    any pair above it: the S-curve rises) shares a bucket with probability >= ``target_recall``,
    using at most ``max_permutations`` signature values; among the shapes that do, the steepest
    (the least area under the curve below the threshold: fewest candidates to verify).

    Raises ValueError naming the fewest permutations that reach the target when none does."""
    best = None
    for rows in range(1, max_permutations + 1):
        bands = _bands_needed(threshold, rows, target_recall)
        if bands * rows <= max_permutations:
            key = (_false_candidate_area(threshold, bands, rows), bands * rows)
            if best is None or key < best[0]:
                best = (key, bands, rows)
    if best is None:
        need = min(_bands_needed(threshold, r, target_recall) * r for r in range(1, 65))
        more = f"at least {int(need)} permutations" if math.isfinite(need) else "a lower target recall"
        raise ValueError(f"no LSH shape with at most {max_permutations} permutations reaches recall {target_recall} "
                         f"at Jaccard {threshold}: it needs {more}")
    return best[1], best[2]
