"""The vectorised text keys of exact dedup: normalise() against a per-string Python reference
(``" ".join(s.lower().split())``, NFKC first on request), and dedup_keys() equal exactly when the
normalised texts are."""

import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from prepline import hashing

# ASCII, Latin-1, CJK, every kind of white space (ASCII, C0 \x1c-\x1f, NEL, NBSP, Ogham, en/em
# spaces, line/paragraph separators, ideographic space), control characters that are not white
# space, characters that NFKC changes (full-width letters, ligature, ½, e + combining acute) and
# their look-alikes
ALPHABET = list("aBz É日ぁ、x.“\t\n\r\v\f \x1c\x1f\x85\u00a0\u1680\u2003\u200a\u2028\u2029\u202f\u205f\u3000\x00\x07"
                "\u200bＡｂﬁ½e\u0301\u00e9")
texts = st.lists(st.one_of(st.none(), st.text(alphabet=st.sampled_from(ALPHABET), max_size=30)), max_size=40)


def _lower(s: str) -> str:
    return pc.utf8_lower(pa.array([s])).to_pylist()[0]


def reference(s: str | None, nfkc: bool = False) -> str | None:
    if s is None:
        return None
    return " ".join(_lower(unicodedata.normalize("NFKC", s) if nfkc else s).split())


def test_spaces_are_pythons_white_space():
    assert hashing.SPACES == "".join(c for c in map(chr, range(0x110000)) if c.isspace())


@settings(max_examples=300, deadline=None)
@given(texts, st.integers(0, 5), st.sampled_from([1, 2, 3, 5, 16, hashing._BLOCK]), st.booleans(), st.booleans())
def test_normalise_matches_a_per_string_reference(values, cut, block, ascii_only, nfkc):
    if ascii_only:
        values = [v.encode("ascii", "ignore").decode() if v else v for v in values]
    arr = pa.array(values, pa.string())
    want = [reference(v, nfkc) for v in values]
    default, hashing._BLOCK = hashing._BLOCK, block  # small blocks: a block per string or a few
    try:
        assert hashing.normalise(arr, nfkc).to_pylist() == want
        # chunked and sliced input (non-zero offsets) give the same
        chunked = pa.chunked_array([arr.slice(0, cut), arr.slice(cut)], pa.string())
        assert hashing.normalise(chunked, nfkc).to_pylist() == want
        assert hashing.normalise(arr.slice(cut), nfkc).to_pylist() == want[cut:]
    finally:
        hashing._BLOCK = default


def test_normalise_examples_and_fast_paths():
    got = hashing.normalise(pa.array(["  Hello \t\n World  ", "a\tb", "plain text", "", None, "x  y"])).to_pylist()
    assert got == ["hello world", "a b", "plain text", "", None, "x y"]
    got = hashing.normalise(pa.array(["\u3000日本\u3000\u3000語\u00a0", "a\u2028\u2029b", "ＡＢＣ\u3000ｄ", "ﬁne"])).to_pylist()
    assert got == ["日本 語", "a b", "ａｂｃ ｄ", "ﬁne"]
    assert hashing.normalise(pa.array(["ＡＢＣ\u3000ｄ", "ﬁne", "e\u0301"]), nfkc=True).to_pylist() == ["abc d", "fine", "é"]
    assert hashing.normalise(pa.array([], pa.string())).to_pylist() == []
    assert hashing.normalise(pa.array(["", None], pa.string())).to_pylist() == ["", None]


def test_nfkc_only_where_it_changes_something():
    values = ["plain", "é composed", "ＡＢＣ", "e\u0301", "한국어", "\u1100\u1161", None, "日本語"]
    got = hashing.nfkc_normalise(pa.array(values, pa.large_string())).to_pylist()
    assert got == [None if v is None else unicodedata.normalize("NFKC", v) for v in values]


def test_dedup_keys_equal_exactly_when_normalised_texts_are():
    values = ["Hello  World", "hello world", "HELLO\u00a0WORLD", " hello\u3000world ", "hello worlds", "Ｈello world",
              "日本語 テキスト", "日本語\u3000テキスト", "", "  "]
    con = hashing.connect()
    for nfkc in (False, True):
        keys = hashing.dedup_keys(con, pa.array(values), nfkc=nfkc)
        assert keys.shape == (len(values), 2) and keys.dtype == np.uint64
        norm = [reference(v, nfkc) for v in values]
        for i in range(len(values)):
            for j in range(len(values)):
                assert ((keys[i] == keys[j]).all()) == (norm[i] == norm[j]), (values[i], values[j], nfkc)
    # mixed ASCII and non-ASCII batches give each string the key it has alone
    alone = np.concatenate([hashing.dedup_keys(con, pa.array([v])) for v in values])
    assert (hashing.dedup_keys(con, pa.array(values)) == alone).all()
    raw = hashing.dedup_keys(con, pa.array(values), normalize=False)
    assert (raw == hashing.hash_128(con, pa.array(values))).all() and len({tuple(k) for k in raw.tolist()}) == len(values)


def test_hash_128_halves_are_independent_hashes():
    con = hashing.connect()
    values = [f"document number {i}" for i in range(20000)]
    k = hashing.hash_128(con, pa.array(values))
    assert len(np.unique(k[:, 0])) == len(np.unique(k[:, 1])) == len(values)
    assert not (k[:, 0] == k[:, 1]).any()
    # stable: the same strings give the same keys in another connection (work files are shared between workers)
    assert (hashing.hash_128(hashing.connect(), pa.array(values[:10])) == k[:10]).all()
