"""New documents made from real text when a set has fewer documents than asked for: several
dialogue pieces per document (no two documents share more than one), or runs of real sentences
from different documents."""

from __future__ import annotations

import hashlib
import random

from prepline.sample.corpora import SampleError
from prepline.sample.text import _key, _pynorm


def _pick(rng: random.Random, n: int) -> int:
    """A uniform index below ``n`` (faster than ``randrange`` for the hot loops)."""
    return int(rng.random() * n)


def _compose_units(
    units: list[str], n: int, rng: random.Random, keys: set[bytes], *, min_chars: int, max_chars: int,
    min_units: int, max_share: float, max_units: int = 16, max_fill: float = 0.75,
) -> list[tuple[str, bytes]]:
    """Documents ``(text, key)`` of several units; no two documents share more than one unit.

    No unit is more than ``max_share`` of its document. Stops early when the pool is used
    up (more than ``max_fill`` of the unit pairs taken, or no new document can be found), so
    it may return fewer than ``n``.
    """
    out: list[tuple[str, bytes]] = []
    u_count = len(units)
    if u_count < min_units:
        return out
    together: list[set[int]] = [set() for _ in range(u_count)]  # units already in a doc with u
    pairs_used = 0
    pair_limit = max_fill * u_count * (u_count - 1) / 2
    lens = [len(u) for u in units]
    fails = 0
    while len(out) < n and fails < 200 and pairs_used < pair_limit:
        target = rng.randint(min_chars, max_chars)
        chosen: list[int] = []
        chars = longest = 0
        ok = True
        while chars < target or len(chosen) < min_units or longest > max_share * chars:
            if len(chosen) >= max_units:
                ok = False
                break
            for _ in range(30):
                u = _pick(rng, u_count)
                if u not in chosen and together[u].isdisjoint(chosen):
                    break
            else:
                ok = False
                break
            chosen.append(u)
            chars += lens[u] + 1
            longest = max(longest, lens[u])
        if not ok:
            fails += 1
            continue
        text = "\n".join([units[c] for c in chosen])
        k = _key(text)
        if k in keys:
            fails += 1
            continue
        keys.add(k)
        for a in chosen:
            together[a].update(chosen)
        pairs_used += len(chosen) * (len(chosen) - 1) // 2
        out.append((text, k))
        fails = 0
    return out


def _compose_chunks(
    sents: list[list[str]], n: int, rng: random.Random, keys: set[bytes],
    kmin: int = 3, kmax: int = 6, lmax: int = 4,
) -> list[tuple[str, bytes]]:
    """Documents ``(text, key)`` of 3-6 paragraphs, each a run of consecutive real sentences.

    Each run comes from another real document; it is at most half of that document and at
    most ``lmax`` sentences long. The key is built from the sentences' normalised forms
    (joining normalised pieces with a space is normalising the joined text).
    """
    out: list[tuple[str, bytes]] = []
    normed = [[_pynorm(x) for x in doc] for doc in sents]
    d_count = len(sents)
    if d_count < kmin:
        raise SampleError("a text pool is too small to compose documents from")
    fails = 0
    while len(out) < n:
        if fails > 1000:
            raise SampleError("could not compose enough unique documents (pool too small)")
        k = kmin + _pick(rng, kmax - kmin + 1)
        picked: list[int] = []
        while len(picked) < k:
            d = _pick(rng, d_count)
            if d not in picked:
                picked.append(d)
        parts = []
        norm_parts = []
        for d in picked:
            s = sents[d]
            length = 1 + _pick(rng, max(1, min(lmax, len(s) // 2)))
            start = _pick(rng, len(s) - length + 1)
            parts.append(" ".join(s[start : start + length]))
            norm_parts.append(" ".join(normed[d][start : start + length]))
        text = "\n\n".join(parts)
        norm = " ".join(norm_parts)
        if norm.count(" ") < 19:  # fewer than 20 words
            fails += 1
            continue
        key = hashlib.blake2b(norm.encode("utf-8"), digest_size=16).digest()
        if key in keys:
            fails += 1
            continue
        keys.add(key)
        out.append((text, key))
        fails = 0
    return out
