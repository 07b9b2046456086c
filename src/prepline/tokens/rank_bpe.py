"""An exact fast path for byte-level BPE tokenizers: tiktoken's encoder, used only where its ids are
provably the tokenizer's own.

``tokenizers`` (the reference: its ids are what training sees) and tiktoken both run byte-level BPE
on the pieces that GPT-2's split pattern cuts the text into, but they choose merges differently:

* ``tokenizers`` merges the adjacent pair that comes first in the tokenizer's ``merges`` list;
* tiktoken merges the adjacent pair whose concatenation has the lowest id (rank) in the vocabulary,
  whether or not that pair is a merge of the list (and returns a piece that is a whole token as is).

When every merge tiktoken makes is a pair of the list, the two agree at every step (the guard below
checks that list order and result ids are in the same order), so they give the same ids. Which
merges tiktoken makes inside a token of its output depends only on that token's bytes: no merge
crosses the token's ends, and the lowest pair inside it is taken in the same order whatever lies
outside. So each token id gets a flag once, when the tokenizer is loaded: ``safe`` when tiktoken,
run on the token's own bytes, builds it from pairs of the list only. A document whose ids are all
safe is exact; any other document is encoded again with ``tokenizers``.

:func:`rank_bpe` returns ``None`` (and why) for a tokenizer this does not cover: another model or
pre-tokenizer, a normalizer, dropout, byte fallback, added tokens that are not special (they cut the
text before the split pattern), or merges whose results are not in id order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

#: GPT-2's split pattern, as tokenizers' ByteLevel pre-tokenizer (use_regex=True) writes it
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes-to-unicode table (the characters byte-level vocabularies are written in)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


@dataclass(frozen=True)
class RankBPE:
    """tiktoken's encoder for a tokenizer, with the ids it may not produce alone (``unsafe[id]``)."""

    encoding: Any  # tiktoken.Encoding
    unsafe: np.ndarray  # bool per id

    def encode(self, text: str) -> np.ndarray:
        """The ids of ``text`` (uint32); special tokens written in the text are plain text."""
        return np.frombuffer(self.encoding._core_bpe.encode_to_tiktoken_buffer(text, set()), np.uint32)


def _merge_trace(word: bytes, ranks: dict[bytes, int], rules: dict[bytes, tuple[bytes, bytes]]) -> tuple[list[bytes], bool]:
    """tiktoken's merges on ``word`` alone: (the parts it ends with, whether every merge was a rule)."""
    parts = [word[i : i + 1] for i in range(len(word))]
    only_rules = True
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        merged = parts[at] + parts[at + 1]
        if rules.get(merged) != (parts[at], parts[at + 1]):
            only_rules = False
        parts[at : at + 2] = [merged]
    return parts, only_rules


def refusal(j: dict) -> str:
    """Why the fast path does not cover the tokenizer whose ``tokenizer.json`` is ``j`` ('' when its shape fits)."""
    m = j.get("model") or {}
    pre = j.get("pre_tokenizer") or {}
    if m.get("type") != "BPE":
        return f"the model is {m.get('type')}, not BPE"
    if j.get("normalizer") is not None:
        return "the tokenizer has a normalizer"
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex", True):
        return "the pre-tokenizer is not ByteLevel(add_prefix_space=False, use_regex=True)"
    if m.get("dropout") or m.get("byte_fallback") or m.get("continuing_subword_prefix") or m.get("end_of_word_suffix"):
        return "the BPE model uses dropout, byte fallback or sub-word affixes"
    plain = [a["content"] for a in j.get("added_tokens") or [] if not a.get("special")]
    if plain:
        return f"added token {plain[0]!r} is not special (it would cut the text before the split pattern)"
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return "tiktoken is not installed"
    return ""


def rank_bpe(json_text: str) -> tuple[RankBPE | None, str]:
    """(encoder, '') when the fast path is exact for this ``tokenizer.json``, else (None, the reason)."""
    j = json.loads(json_text)
    why = refusal(j)
    if why:
        return None, why
    import tiktoken

    m = j["model"]
    added = j.get("added_tokens") or []
    dec = byte_decoder()
    added_ids = {int(a["id"]) for a in added}
    vocab: dict[str, int] = m.get("vocab") or {}
    ranks: dict[bytes, int] = {}
    for s, i in vocab.items():
        if i in added_ids:
            continue
        try:
            ranks[bytes(dec[c] for c in s)] = int(i)
        except KeyError:
            return None, f"vocabulary token {s!r} is not written in byte-level characters"
    if len(ranks) != len(vocab) - len([i for i in vocab.values() if i in added_ids]):
        return None, "two vocabulary tokens spell the same bytes"
    if any(bytes([b]) not in ranks for b in range(256)):
        return None, "the vocabulary lacks some of the 256 single bytes"
    rules: dict[bytes, tuple[bytes, bytes]] = {}
    last = -1
    for pair in m.get("merges") or []:
        a, b = pair if isinstance(pair, list) else pair.split(" ", 1)
        try:
            ab, bb = bytes(dec[c] for c in a), bytes(dec[c] for c in b)
        except KeyError:
            return None, f"merge {a!r} {b!r} is not written in byte-level characters"
        r = ranks.get(ab + bb)
        if ab not in ranks or bb not in ranks or r is None:
            return None, f"merge {a!r} {b!r} joins tokens that are not in the vocabulary"
        if r <= last or ab + bb in rules:
            return None, "the merges' results are not in increasing id order"
        rules[ab + bb] = (ab, bb)
        last = r
    size = max([*vocab.values(), *added_ids]) + 1
    unsafe = np.ones(size, bool)
    for word, i in ranks.items():
        if len(word) == 1:
            unsafe[i] = False
            continue
        parts, only_rules = _merge_trace(word, ranks, rules)
        unsafe[i] = not (only_rules and len(parts) == 1)
    enc = tiktoken.Encoding("prepline-rank-bpe", pat_str=GPT2_SPLIT, mergeable_ranks=ranks, special_tokens={})
    return RankBPE(enc, unsafe), ""
