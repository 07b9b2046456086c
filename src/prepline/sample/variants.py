"""Duplicate variants of a document: a case variant and a white-space variant (exact duplicates
for prepline's normalised key), and a near duplicate (a few words replaced or deleted, word
5-shingle Jaccard at least ``PLANTED_NEAR_MIN_JACCARD``)."""

from __future__ import annotations

import random
import re

from prepline.sample.text import _pynorm, _shingles


PLANTED_NEAR_MIN_JACCARD = 0.8


def _case_variant(text: str) -> str | None:
    low = text.lower()
    if low != text and _pynorm(low) == _pynorm(text):
        return low
    return None


def _space_variant(text: str, rng: random.Random) -> str | None:
    """Some inner ASCII white space replaced by other ASCII white space (what prepline collapses)."""
    spots = [m.start() for m in re.finditer(r"[ \t\n\r]", text.strip())]
    if not spots:
        return None
    offset = len(text) - len(text.lstrip())
    out = list(text)
    for at in sorted(rng.sample(spots, min(len(spots), rng.randint(1, 4)))):
        out[offset + at] = rng.choice(["  ", "\n", "\t", " \n ", "\n\n"])
    variant = "".join(out)
    if variant != text and _pynorm(variant) == _pynorm(text):
        return variant
    return None


def _near_variant(text: str, rng: random.Random) -> tuple[str, float] | None:
    """A copy with a few words replaced or deleted, Jaccard in [0.8, 1)."""
    tokens = re.split(r"(\s+)", text)  # words at even positions, whitespace at odd ones
    word_pos = [i for i in range(0, len(tokens), 2) if tokens[i]]
    if len(word_pos) < 60:
        return None
    vocab = sorted({tokens[i] for i in word_pos if len(tokens[i]) > 2})
    base = _shingles(text)
    n_sh = len(word_pos) - 4
    target = rng.uniform(0.82, 0.95)
    edits = max(1, min(12, round(n_sh * (1 - target) / (1 + target) / 5)))
    for k in range(edits, 0, -1):
        sub = random.Random(rng.random())
        chosen = sorted(sub.sample(word_pos[5:-5], k)) if len(word_pos) > 10 + k else []
        if not chosen:
            return None
        new = list(tokens)
        for i in chosen:
            if sub.random() < 0.5:
                new[i] = ""
                if i + 1 < len(new):
                    new[i + 1] = ""
            else:
                repl = sub.choice(vocab) if vocab else "the"
                if repl.lower() == tokens[i].lower():
                    repl = repl + "s"
                new[i] = repl
        variant = "".join(new)
        other = _shingles(variant)
        j = len(base & other) / len(base | other)
        if PLANTED_NEAR_MIN_JACCARD <= j < 1.0 and _pynorm(variant) != _pynorm(text):
            return variant, j
    return None
