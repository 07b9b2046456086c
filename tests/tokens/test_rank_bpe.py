"""The tiktoken fast path gives the tokenizer's own ids: the guard, random vocabularies where the two
merge rules differ, and the split pattern on every Unicode code point."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prepline.tokens.rank_bpe import GPT2_SPLIT, byte_decoder, rank_bpe, refusal
from prepline.tokens.tokenizer import build_tokenizer, train_bpe
from prepline.transforms.tokenization import _Encoder

CHAR = {b: c for c, b in byte_decoder().items()}  # byte -> the character byte-level vocabularies write it as


def spell(bs: bytes) -> str:
    return "".join(CHAR[b] for b in bs)


def bpe_json(merges: list[tuple[bytes, bytes]]) -> str:
    """A byte-level BPE tokenizer.json: the 256 bytes, then one token per merge, in merge order."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {spell(bytes([b])): b for b in range(256)}
    pairs = []
    for a, b in merges:
        if spell(a + b) not in vocab:
            vocab[spell(a + b)] = len(vocab)
            pairs.append((spell(a), spell(b)))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok.to_str()


def library_ids(json_text: str, texts: list[str]) -> list[list[int]]:
    """tokenizers' ids, loaded as the stage loads it (special tokens in the text are text)."""
    tok = build_tokenizer("", "<|endoftext|>" if "<|endoftext|>" in json_text else "b", work_json=json_text).tokenizer
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def encoded(json_text: str, texts: list[str], threads: int = 1) -> tuple[list[list[int]], int]:
    """The stage's encoder with the fast path: (ids per text, texts given back to tokenizers)."""
    rb, why = rank_bpe(json_text)
    assert rb is not None, why
    tok = build_tokenizer("", "<|endoftext|>" if "<|endoftext|>" in json_text else "b", work_json=json_text).tokenizer
    values, counts, _, again = _Encoder(tok, 1_000_000, fast=rb, threads=threads).encode(pa.array(texts))
    return [v.tolist() for v in np.split(values, np.cumsum(counts)[:-1])], again


def test_a_merge_the_list_does_not_have_is_caught_and_the_library_decides():
    # 'bc' comes before 'ab', and 'abc' is made from 'ab' + 'c': tokenizers stops at [a, bc] (no rule
    # a + bc), tiktoken joins a + bc because 'abc' is in the vocabulary
    j = bpe_json([(b"b", b"c"), (b"a", b"b"), (b"ab", b"c")])
    rb, _ = rank_bpe(j)
    vocab = json.loads(j)["model"]["vocab"]
    texts = ["abc", "xx abc", "ab bc", "abab"]
    want = library_ids(j, texts)
    assert want[0] == [vocab["a"], vocab["bc"]]
    assert rb.encode("abc").tolist() == [vocab["abc"]]  # tiktoken alone would be wrong here
    assert rb.unsafe[vocab["abc"]] and not rb.unsafe[vocab["bc"]] and not rb.unsafe[vocab["ab"]]
    got, again = encoded(j, texts)
    assert got == want and again == 2  # the two texts where tiktoken made 'abc': encoded again by tokenizers


@st.composite
def vocabularies(draw):
    tokens = [b"a", b"b", b"c", b" "]
    merges = []
    for _ in range(draw(st.integers(1, 24))):
        a, b = draw(st.sampled_from(tokens)), draw(st.sampled_from(tokens))
        merges.append((a, b))
        if a + b not in tokens:
            tokens.append(a + b)
    return merges


@settings(max_examples=150, deadline=None)
@given(merges=vocabularies(), texts=st.lists(st.text(alphabet="abc ", max_size=30), min_size=1, max_size=8))
def test_random_vocabularies_give_the_library_ids(merges, texts):
    j = bpe_json(merges)
    assert encoded(j, texts)[0] == library_ids(j, texts)


def test_random_vocabularies_do_differ_under_tiktoken_alone():
    """The property above is not vacuous: over many random vocabularies, tiktoken alone differs often."""
    rng = np.random.default_rng(7)
    differ = flagged = 0
    for _ in range(200):
        tokens = [b"a", b"b", b"c"]
        merges = []
        for _ in range(12):
            a, b = tokens[rng.integers(len(tokens))], tokens[rng.integers(len(tokens))]
            merges.append((a, b))
            if a + b not in tokens:
                tokens.append(a + b)
        j = bpe_json(merges)
        texts = ["".join(rng.choice(list("abc"), 12)) for _ in range(20)]
        rb, _ = rank_bpe(j)
        raw = [rb.encode(t).tolist() for t in texts]
        want = library_ids(j, texts)
        differ += raw != want
        got, again = encoded(j, texts)
        flagged += again > 0
        assert got == want
    assert differ > 20 and flagged >= differ


def test_gpt2_and_a_trained_bpe_are_covered_with_only_special_ids_unsafe():
    gpt2 = build_tokenizer("gpt2")
    rb, why = rank_bpe(gpt2.json_text)
    assert why == "" and np.flatnonzero(rb.unsafe).tolist() == [gpt2.eos_id]
    trained = build_tokenizer("", work_json=train_bpe(["the quick brown fox jumps over the lazy dog " * 50, "1234 ünïcödé ½"], 400).to_str())
    rb, why = rank_bpe(trained.json_text)
    assert why == "" and np.flatnonzero(rb.unsafe).tolist() == [trained.eos_id]


def test_text_spelling_special_tokens_and_odd_white_space_match_the_library():
    gpt2 = build_tokenizer("gpt2")
    texts = ["before <|endoftext|> after", "<|endoftext|>", "a  \n\n  b\t\t\u00a0c\u3000d  ", "it's you'll 'S 'LL", "x\u2028y\u0085z",
             "🙂👍🏽 e\u0301 ﬁ", "   ", "", "١٢٣ ٤٥ 一二三 Ⅻⅻ", "tab\tsep\rcr\r\nlf"]
    assert encoded(gpt2.json_text, texts, threads=2)[0] == library_ids(gpt2.json_text, texts)


def test_tokenizers_the_fast_path_does_not_cover_say_why():
    base = json.loads(bpe_json([(b"a", b"b")]))
    assert refusal(base) == ""
    cases = {
        "normalizer": ({"normalizer": {"type": "NFC"}}, "normalizer"),
        "prefix space": ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}}, "pre-tokenizer"),
        "whitespace": ({"pre_tokenizer": {"type": "Whitespace"}}, "pre-tokenizer"),
        "wordpiece": ({"model": {**base["model"], "type": "WordPiece"}}, "not BPE"),
        "dropout": ({"model": {**base["model"], "dropout": 0.1}}, "dropout"),
        "plain added": ({"added_tokens": [{"id": 256, "content": "ab", "special": False}]}, "not special"),
    }
    for name, (change, why) in cases.items():
        assert why in refusal({**base, **change}), name
    unordered = {**base, "model": {**base["model"], "merges": [["a", "b"], ["b", "a"]],
                                   "vocab": {**base["model"]["vocab"], "ba": 256, "ab": 257}}}
    assert rank_bpe(json.dumps(unordered)) == (None, "the merges' results are not in increasing id order")


@pytest.mark.slow
def test_split_pattern_cuts_every_code_point_as_tokenizers_does():
    """tiktoken's regex engine and tokenizers' (Oniguruma) agree on GPT-2's split pattern for every code
    point, in the contexts its classes decide (letter, number, white space, other).

    The vocabulary is the 256 bytes plus every piece tokenizers cut: tiktoken returns a piece that is a
    token as one id, so equal ids mean equal pieces.
    """
    from tokenizers import pre_tokenizers
    import tiktoken

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    dec = byte_decoder()
    points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for start in range(0, len(points), 1 << 15):
        # 'a' joins a letter, '1' joins a number, ' ' joins anything but white space, '\n' joins white space
        text = "".join(f"a{ch}1{ch} {ch}\n" for ch in map(chr, points[start : start + (1 << 15)]))
        pieces = [bytes(dec[c] for c in p) for p, _ in pre.pre_tokenize_str(text)]
        ranks = {bytes([b]): b for b in range(256)}
        for p in pieces:
            ranks.setdefault(p, len(ranks))
        enc = tiktoken.Encoding("split-check", pat_str=GPT2_SPLIT, mergeable_ranks=ranks, special_tokens={})
        assert enc.encode_ordinary(text) == [ranks[p] for p in pieces], f"code points from U+{points[start]:04X}"
