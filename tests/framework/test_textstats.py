"""prepline.textstats: the vectorised helpers against plain Python."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import dup_ngram_chars_ref
from prepline.textstats import repeated


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**64 - 1) | st.sampled_from([0, 1, 2, 2**64 - 1]), max_size=300))
def test_repeated_marks_every_occurrence_but_the_first(values):
    seen: set[int] = set()
    want = []
    for v in values:
        want.append(v in seen)
        seen.add(v)
    got = repeated(np.array(values, dtype=np.uint64))
    assert got.dtype == bool and got.tolist() == want


def _tokens(docs: list[list[int]], lengths: list[list[int]]):
    from prepline.textstats import Tokens

    counts = [len(d) for d in docs]
    starts = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    doc = np.repeat(np.arange(len(docs)), counts).astype(np.int64)
    ids = np.array([t for d in docs for t in d], dtype=np.int64)
    lens = np.array([x for ln in lengths for x in ln], dtype=np.int64)
    return ids, Tokens(ids, doc, starts, lens)


_docs = st.lists(st.lists(st.integers(min_value=0, max_value=3), max_size=40), min_size=1, max_size=8)  # few distinct tokens: n-grams recur


@settings(max_examples=150, deadline=None)
@given(_docs, st.randoms(use_true_random=False))
def test_ngram_measures_match_a_plain_python_count(docs, rnd):
    from prepline.textstats import dup_ngram_chars, top_ngrams

    size = {t: rnd.randint(1, 400) for t in range(4)}  # characters of each token (equal tokens, equal lengths)
    lengths = [[size[t] for t in d] for d in docs]
    ids, tokens = _tokens(docs, lengths)
    dup = dup_ngram_chars(ids, tokens, (2, 3, 5))
    top = top_ngrams(ids, tokens, (1, 2, 4))
    for d, (toks, lens) in enumerate(zip(docs, lengths)):
        for n in (2, 3, 5):  # characters of tokens under a later occurrence of an n-gram
            assert dup[n][d] == dup_ngram_chars_ref(toks, n, length=size.__getitem__), (n, d)
        for n in (1, 2, 4):  # the most frequent n-gram (ties: the longer), when it occurs at least twice
            count: dict[tuple, int] = {}
            chars: dict[tuple, int] = {}
            for i in range(len(toks) - n + 1):
                g = tuple(toks[i:i + n])
                count[g] = count.get(g, 0) + 1
                chars[g] = min(sum(lens[i:i + n]), 1023)
            best = max(((c, chars[g]) for g, c in count.items() if c >= 2), default=(0, 0))
            assert (top[n][0][d], top[n][1][d]) == best, (n, d)
