"""prepline.textstats: the vectorised helpers against plain Python."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

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
