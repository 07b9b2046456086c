"""The vectorised text keys of exact dedup: normalise() against a per-string reference, md5_128 against hashlib."""

import hashlib
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from prepline import hashing

_WS = re.compile(r"[ \t\n\v\f\r]+")
texts = st.lists(st.one_of(st.none(), st.text(alphabet=st.sampled_from(list("aBz É日\t\n\r\v\f  \u00a0\u2003x.")), max_size=30)),
                 max_size=40)


def _reference(s: str | None) -> str | None:
    if s is None:
        return None
    lowered_trimmed = pc.utf8_trim_whitespace(pc.utf8_lower(pa.array([s]))).to_pylist()[0]
    return _WS.sub(" ", lowered_trimmed)


@settings(max_examples=400, deadline=None)
@given(texts, st.integers(0, 5), st.sampled_from([1, 2, 3, 5, 16, hashing._BLOCK]))
def test_normalise_matches_a_per_string_reference(values, cut, block):
    arr = pa.array(values, pa.string())
    want = [_reference(v) for v in values]
    default, hashing._BLOCK = hashing._BLOCK, block  # small blocks: runs and strings cross block edges
    try:
        assert hashing.normalise(arr).to_pylist() == want
        # chunked and sliced input (non-zero offsets) give the same
        chunked = pa.chunked_array([arr.slice(0, cut), arr.slice(cut)], pa.string())
        assert hashing.normalise(chunked).to_pylist() == want
        assert hashing.normalise(arr.slice(cut)).to_pylist() == want[cut:]
    finally:
        hashing._BLOCK = default


def test_normalise_examples_and_fast_paths():
    got = hashing.normalise(pa.array(["  Hello \t\n World  ", "a\tb", "plain text", "", None, "x  y"])).to_pylist()
    assert got == ["hello world", "a b", "plain text", "", None, "x y"]
    assert hashing.normalise(pa.array([], pa.string())).to_pylist() == []
    assert hashing.normalise(pa.array(["", None], pa.string())).to_pylist() == ["", None]


def test_md5_128_is_the_md5_of_the_utf8_bytes():
    values = ["", "a", "hello world", "日本語"]
    keys = hashing.md5_128(hashing.connect(), pa.array(values))
    for v, (hi, lo) in zip(values, keys):
        d = hashlib.md5(v.encode()).digest()
        assert (int(hi), int(lo)) == (int.from_bytes(d[:8], "big"), int.from_bytes(d[8:], "big"))
    assert keys.dtype == np.uint64 and keys.shape == (4, 2)
