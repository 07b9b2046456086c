"""Text measures of the sample builder: the dedup key as prepline computes it, word shingles and
their Jaccard similarity, near-duplicate pairs of a pool (vectorised), groups of similar texts,
sentences."""

from __future__ import annotations

import hashlib
import random
import re
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline.graph import component_roots


_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[¿¡\"“‘'(\[]?[A-ZÀ-ÖØ-Þ])")
_BOUNDARY = re.compile(r"(?<=[.!?])\s")


def normalize_for_dedup(text: str) -> str:
    """The text as prepline's exact dedup compares it (``prepline.hashing.normalise``)."""
    from prepline import hashing

    return hashing.normalise(pa.array([text], pa.large_string()))[0].as_py()


def _pynorm(text: str) -> str:
    """Lowercase and collapse whitespace in Python: the fast key used while composing.

    It merges at least what prepline's normalisation merges, except for a few letters that
    Python and Arrow lowercase differently; ``_verify_with_prepline`` checks the result with
    prepline's own normalisation.
    """
    return " ".join(text.lower().split())


def _key(text: str) -> bytes:
    return hashlib.blake2b(_pynorm(text).encode("utf-8"), digest_size=16).digest()


def _shingles(text: str, k: int = 5) -> set:
    words = text.lower().split()
    if len(words) < k:
        return {tuple(words)} if words else set()
    return {tuple(words[i : i + k]) for i in range(len(words) - k + 1)}


_UNSEGMENTED: re.Pattern | None = None


def by_chars(text: str) -> bool:
    """fuzzy_dedup's default unit choice, in plain Python: characters when at least
    ``minhash.AUTO_CHAR_SHARE`` of the text's characters are in ``minhash.UNSEGMENTED``."""
    global _UNSEGMENTED
    from prepline import minhash

    if _UNSEGMENTED is None:
        _UNSEGMENTED = re.compile("[" + "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in minhash.UNSEGMENTED) + "]")
    return bool(text) and len(_UNSEGMENTED.findall(text.lower())) >= minhash.AUTO_CHAR_SHARE * len(text)


def auto_shingles(text: str, k: int = 5) -> set:
    """The k-shingles fuzzy_dedup compares by default (``shingle_type=auto``), in plain Python (a
    reference for tests and benchmarks): character k-grams of the lower-cased text with white
    space collapsed for text in scripts without spaces, word k-shingles otherwise."""
    if not by_chars(text):
        return _shingles(text, k)
    s = " ".join(text.lower().split())
    return {s[i : i + k] for i in range(len(s) - k + 1)} if len(s) >= k else ({s} if s else set())


def near_copy(text: str, target: float, pool: list[str], rng: random.Random) -> tuple[str, float]:
    """A near copy of ``text`` and its Jaccard similarity with it (of :func:`auto_shingles`): as many
    units as keep that similarity at or above ``target`` (characters for text in scripts without
    spaces, words otherwise; at random positions) are replaced by units drawn from ``pool``."""
    chars = by_chars(text)
    units = list(text) if chars else text.split(" ")
    order = [i for i in range(len(units)) if not units[i].isspace()]
    rng.shuffle(order)
    best, ref = (text, 1.0), auto_shingles(text)
    lo, hi = 1, len(order)
    while lo <= hi:  # the most replacements that keep J >= target (J falls as they add up)
        m = (lo + hi) // 2
        edited = list(units)
        for i in order[:m]:
            edited[i] = rng.choice(pool)
        cand = ("" if chars else " ").join(edited)
        sc = auto_shingles(cand)
        j = len(ref & sc) / len(ref | sc)
        if j >= target:
            best, lo = (cand, j), m + 1
        else:
            hi = m - 1
    return best


def shingle_jaccard(a: str, b: str, k: int = 5) -> float:
    """Jaccard similarity of the word k-shingles (lowercased, split on whitespace)."""
    sa, sb = _shingles(a, k), _shingles(b, k)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


def _group_roots(n: int, edges: Iterable[tuple[int, int]]) -> list[int]:
    """The smallest member of each text's group of similar texts (itself when alone)."""
    e = np.array(list(edges), dtype=np.int64).reshape(-1, 2)
    return component_roots(n, e[:, 0], e[:, 1]).tolist()


_MIX_MUL = np.uint64(0x9E3779B97F4A7C15)


def near_pairs(texts: list[str], threshold: float, max_df: int = 200) -> list[tuple[int, int, float]]:
    """Pairs ``(i, j, jaccard)`` (i < j) of texts whose word 5-shingle Jaccard is >= threshold.

    Vectorised with pyarrow and numpy (hashed shingles), for cleaning the source pools.
    Shingles shared by more than ``max_df`` texts are not used to find candidates (the
    Jaccard values of the pairs found are still exact up to hash collisions). Texts with
    fewer than 5 words are ignored.
    """
    n = len(texts)
    if n < 2:
        return []
    words = pc.utf8_split_whitespace(pc.utf8_lower(pa.array(texts, pa.large_string())))
    offsets = words.offsets.to_numpy().astype(np.int64)
    flat = words.flatten()
    if len(flat) == 0:
        return []
    ids = pc.dictionary_encode(flat).indices.to_numpy().astype(np.uint64) + np.uint64(1)
    lens = np.diff(offsets)
    doc = np.repeat(np.arange(n, dtype=np.int64), lens)
    end = np.repeat(offsets[1:], lens)
    valid = (end - np.arange(len(ids))) >= 5
    total = len(ids)
    h = np.zeros(total, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(5):
            shifted = np.zeros(total, dtype=np.uint64)
            shifted[: total - k] = ids[k:]
            h = h * _MIX_MUL + shifted
        h ^= h >> np.uint64(31)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(29)
    h, doc = h[valid], doc[valid]
    if len(h) == 0:
        return []
    order = np.argsort(h, kind="stable")  # doc order is kept within equal hashes
    h, doc = h[order], doc[order]
    keep = np.ones(len(h), dtype=bool)
    keep[1:] = (h[1:] != h[:-1]) | (doc[1:] != doc[:-1])
    h, doc = h[keep], doc[keep]
    count = np.bincount(doc, minlength=n)
    starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
    run = np.diff(np.r_[starts, len(h)])
    keys = []
    for length in np.unique(run):
        if length < 2 or length > max_df:
            continue
        s = starts[run == length]
        members = doc[s[:, None] + np.arange(length)[None, :]]
        a, b = np.triu_indices(int(length), 1)
        keys.append(members[:, a].ravel() * n + members[:, b].ravel())
    if not keys:
        return []
    uniq, shared = np.unique(np.concatenate(keys), return_counts=True)
    a, b = uniq // n, uniq % n
    jac = shared / (count[a] + count[b] - shared)
    hit = jac >= threshold
    return list(zip(a[hit].tolist(), b[hit].tolist(), jac[hit].tolist()))


def _split_sentences(text: str) -> list[str]:
    out: list[str] = []
    for piece in _SENT_SPLIT.split(text):
        piece = piece.strip()
        if not piece:
            continue
        if out and len(piece.split()) < 3:
            out[-1] = out[-1] + " " + piece
        else:
            out.append(piece)
    return out
