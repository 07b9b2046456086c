"""doc_quality: Gopher/C4-style quality annotations, language-aware, computed over whole columns.

Adds one column per measure (prefix ``dq_`` by default) and a summary of the Gopher rules
(``dq_gopher_pass``, ``dq_gopher_reasons``), so that ``filter`` can remove documents later with
SQL, e.g. ``--criteria "dq_gopher_pass"`` or ``"dq_words >= 100 AND dq_bad_words = 0"``. Nothing
is removed here: annotate and filter are separate steps, so thresholds can change without
recomputing the measures.

Rule sets, chosen per document from the ``lang`` column (``lang_column``; ``default_lang`` when
the column is missing, null, empty or ``und``):

* word rules (``en``, ``fr``, ``de``, ``es``, ``nl``, ``it``, ``pt``; ``other`` for any other
  language): measures on whitespace-separated words, with the language's stop-word list
  (``other`` has none and skips the stop-word rule).
* character rules (``ja``, ``zh``): text without spaces between words is measured in
  characters: the length rule counts non-space characters, the symbol ratio is per character,
  the alphabetic ratio is the share of letters (kana, kanji, Latin) among characters, the
  stop words are particles (``の に は を が で と た て も`` for ja), the repetition measures use
  character n-grams, and ja adds the hiragana ratio and the mean sentence length (sentences
  end with 。！？!? or a line break).

Every measure is computed with Arrow compute kernels over the whole column (split on white
space, split lines, regex counts, dictionary encoding) and NumPy over the flattened tokens
(bincount, sorting hashed n-grams per document): no Python loop over documents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline import textstats as ts
from prepline.config import TransformConfig, param
from prepline.errors import ConfigError, InputError
from prepline.registry import register
from prepline.transform import Column, FileTask, Output, Transform

# Stop words: the Gopher list for English; for the other languages ten of the most frequent
# function words (chosen for this module).
STOP_WORDS: dict[str, tuple[str, ...]] = {
    "en": ("the", "be", "to", "of", "and", "that", "have", "with"),
    "fr": ("le", "la", "les", "de", "des", "et", "est", "un", "une", "que", "pas", "pour", "je", "tu", "vous", "il", "ce"),
    "de": ("der", "die", "das", "und", "ist", "nicht", "zu", "ein", "eine", "mit", "den", "ich", "sie"),
    "es": ("el", "la", "de", "que", "y", "en", "los", "las", "se", "del", "por", "un", "una"),
    "nl": ("de", "het", "een", "en", "van", "is", "dat", "niet", "op", "te", "ik", "je"),
    "it": ("il", "di", "che", "e", "la", "un", "una", "non", "per", "in", "sono", "è"),
    "pt": ("o", "a", "de", "que", "e", "do", "da", "em", "um", "uma", "não", "é"),
}
# Particles / function characters of languages written without spaces.
PARTICLES: dict[str, tuple[str, ...]] = {
    "ja": ("の", "に", "は", "を", "が", "で", "と", "た", "て", "も"),
    "zh": ("的", "了", "是", "在", "我", "有", "和", "不", "这", "你"),
}
CHAR_LANGS = tuple(PARTICLES)
WORD_LANGS = tuple(STOP_WORDS)
RULE_SETS = WORD_LANGS + CHAR_LANGS + ("other",)

# A small list of obscene words (C4 drops pages with any word of its much longer list). Matched as
# whole words (lower-cased, punctuation trimmed); the CJK ones as substrings.
BAD_WORDS = (
    "fuck", "fucking", "fucked", "fucker", "motherfucker", "shit", "shitty", "bullshit", "cunt", "asshole",
    "bitch", "bastard", "dickhead", "jackass", "porn", "porno", "xxx", "nigger", "faggot", "whore", "slut",
    "merde", "putain", "connard", "connasse", "salope", "enculé", "pute", "bordel",
    "scheiße", "scheisse", "arschloch", "fotze", "hure", "mierda", "puta", "cabrón", "gilipollas", "coño",
)
BAD_SUBSTRINGS_CJK = ("ちんこ", "まんこ", "セックス", "エロ動画", "肏", "屄", "傻逼", "操你妈")

# Trimmed from words before stop-word and bad-word matching.
PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~«»“”‘’„‚¿¡…–—·•"

BULLET_RE = r"^(?:[•‣⁃◦▪▫●○■□►▶▸➢➤✓✔✗✘☐☑*·]|-(?:\s|$)|–\s)"
ELLIPSIS_LINE_RE = r"(?:\.\.\.|…|・・・)$"
SYMBOL_RE = r"#|\.\.\.|…|・・・"
SENTENCE_END_RE = r"[。！？!?．]+|\n+"

# Gopher thresholds (Rae et al. 2021, appendix A) for the word rules; ours for the character rules.
MEAN_WORD_LENGTH = (3.0, 10.0)
MAX_SYMBOL_RATIO = 0.1  # '#' and ellipses per word
MAX_SYMBOL_RATIO_CHARS = 0.05  # per character (character rules)
MAX_BULLET_LINES = 0.9
MAX_ELLIPSIS_LINES = 0.3
MIN_ALPHA_WORDS = 0.8  # words with a letter; for the character rules: letters among characters
MIN_ALPHA_CHARS = 0.6
MIN_STOP_WORDS = 2
MAX_DUP_LINES = 0.3
MAX_DUP_LINE_CHARS = 0.2
TOP_NGRAMS = (2, 3, 4)  # word n-grams
TOP_NGRAM_CHARS = (4, 6, 8)  # character n-grams of the character rules, in the same columns
MAX_TOP_NGRAM = (0.20, 0.18, 0.16)
MAX_DUP_PARAS = 0.3
MAX_DUP_PARA_CHARS = 0.2
DUP_NGRAMS = (5, 6, 7, 8, 9, 10)  # word n-grams; ja/zh: character 2n-grams
MAX_DUP_NGRAM = (0.15, 0.14, 0.13, 0.12, 0.11, 0.10)
PARAGRAPH_SEP_RE = r"\n[ \t\r\f\v]*\n\s*"  # a blank line (white space only) between paragraphs
MIN_HIRAGANA = 0.1  # ja only
MAX_SENTENCE_CHARS = 200.0  # ja/zh: mean characters per sentence

# FineWeb (Penedo et al. 2024, as datatrove's FineWebQualityFilter)
FW_LINE_PUNCT_MIN = 0.12
FW_SHORT_LINE_CHARS = 30
FW_SHORT_LINE_MAX = 0.67
FW_DUP_CHAR_MAX = 0.01
FW_NEWLINE_WORD_MAX = 0.3
# Lines ending with a sentence terminal (Unicode Sentence_Terminal marks of the common scripts).
TERMINAL_CHARS = ".!?‼‽⁇⁈⁉。！？．｡։؟؞۔।॥።፧፨။၊។៕᠃᠉﹒﹖﹗܀܁܂߹"
FW_LINE_END_RE = "[" + TERMINAL_CHARS.replace("?", "\\?").replace(".", "\\.").replace("!", "\\!") + "]$"
FW_REASONS = ("line_punct", "short_lines", "dup_line_chars", "newline_ratio")

CHUNK_BYTES = 8 << 20  # text per chunk: bounds the flattened token arrays (~250 MB peak)
CHUNK_ROWS = 65536

# reason name -> bit
REASONS = (
    "too_short", "too_long", "mean_word_length", "symbol_ratio", "bullet_lines", "ellipsis_lines",
    "alpha_ratio", "stop_words", "dup_lines", "dup_line_chars", "top_2gram", "top_3gram", "top_4gram",
    "hiragana_ratio", "sentence_length", "dup_paras", "dup_para_chars",
    *(f"dup_{k}gram" for k in DUP_NGRAMS),
)

MEASURES: list[tuple[str, str, str]] = [
    ("rules", "string", "rule set applied: en, fr, de, es, nl, it, pt, ja, zh or other"),
    ("chars", "int64", "non-white-space characters"),
    ("words", "int64", "white-space-separated words"),
    ("mean_word_length", "float64", "chars / words"),
    ("symbol_ratio", "float64", "('#' + '...' + '…' + '・・・') per word (per character for ja/zh)"),
    ("bullet_lines_ratio", "float64", "share of non-empty lines starting with a bullet (•, -, *, ▪, ...)"),
    ("ellipsis_lines_ratio", "float64", "share of non-empty lines ending with ... or …"),
    ("alpha_ratio", "float64", "share of words with a letter (ja/zh: share of characters that are letters)"),
    ("stop_words", "int64", "distinct stop words of the language present (ja/zh: particles)"),
    ("dup_lines_frac", "float64", "share of non-empty lines that repeat an earlier line of the document"),
    ("dup_lines_char_frac", "float64", "share of line characters in such repeated lines"),
    ("top_2gram_frac", "float64", "characters in the most frequent word 2-gram's occurrences / chars (ja/zh: character 4-gram); 0 if none repeats"),
    ("top_3gram_frac", "float64", "same for word 3-grams (ja/zh: character 6-grams)"),
    ("top_4gram_frac", "float64", "same for word 4-grams (ja/zh: character 8-grams)"),
    ("dup_paras_frac", "float64", "share of paragraphs (separated by a blank line) that repeat an earlier paragraph"),
    ("dup_paras_char_frac", "float64", "share of paragraph characters in such repeated paragraphs"),
    *((f"dup_{k}gram_char_frac", "float64", f"characters of words covered by a repeated word {k}-gram / chars (ja/zh: character {2 * k}-grams)") for k in DUP_NGRAMS),
    ("hiragana_ratio", "float64", "share of characters that are hiragana (null unless the ja rules apply)"),
    ("mean_sentence_chars", "float64", "characters per sentence (null unless the ja/zh rules apply)"),
    ("bad_words", "int64", "obscene words from a short built-in list (not part of the Gopher rules)"),
    ("gopher_pass", "bool", "true when every rule of the document's rule set passes"),
    ("gopher_reasons", "string", "comma-separated names of the failed rules ('' when it passes)"),
    ("fw_line_punct_ratio", "float64", "FineWeb: share of non-empty lines ending with a sentence terminal (. ! ? 。 ！ ？ ...)"),
    ("fw_short_line_ratio", "float64", f"FineWeb: share of non-empty lines of at most {FW_SHORT_LINE_CHARS} characters"),
    ("fw_dup_line_char_ratio", "float64", "FineWeb: characters of repeated lines / characters of the text without newlines"),
    ("fw_newline_word_ratio", "float64", "FineWeb: newlines per word (ja/zh: per 2 non-space characters)"),
    ("fineweb_pass", "bool", "true when every FineWeb rule passes"),
    ("fineweb_reasons", "string", "comma-separated names of the failed FineWeb rules ('' when it passes)"),
]


@dataclass(frozen=True)
class DocQualityConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text")
    lang_column: str = param("lang", "column with the language code (e.g. from lang_id); '' or missing column: use default_lang for all")
    default_lang: str = param("en", "language when the lang column is missing, null, empty or 'und'")
    prefix: str = param("dq_", "prefix of the added columns")
    min_words: int = param(50, "Gopher: fewer words fail 'too_short' (word rules)", min=0)
    max_words: int = param(100_000, "Gopher: more words fail 'too_long' (word rules)", min=1)
    cjk_min_chars: int = param(100, "fewer non-space characters fail 'too_short' (ja/zh rules)", min=0)
    cjk_max_chars: int = param(500_000, "more non-space characters fail 'too_long' (ja/zh rules)", min=1)

    def validate(self) -> None:
        if not self.prefix or not (self.prefix.replace("_", "a").isalnum() and not self.prefix[0].isdigit()):
            raise ConfigError(f"prefix={self.prefix!r} must be a non-empty identifier prefix", "pass e.g. --prefix dq_")
        if self.min_words > self.max_words:
            raise ConfigError(f"min_words={self.min_words} > max_words={self.max_words}", "make min_words <= max_words")
        if self.cjk_min_chars > self.cjk_max_chars:
            raise ConfigError(f"cjk_min_chars={self.cjk_min_chars} > cjk_max_chars={self.cjk_max_chars}", "make cjk_min_chars <= cjk_max_chars")
        if not self.default_lang or not self.default_lang.replace("-", "").isalnum():
            raise ConfigError(f"default_lang={self.default_lang!r} is not a language code", "pass e.g. --default-lang en")
        if self.content_column == self.lang_column:
            raise ConfigError("content_column and lang_column are the same", "name the text column and the language column")


# Union of the stop words of all languages and which languages each belongs to.
_STOP_UNION = sorted({w for ws in STOP_WORDS.values() for w in ws})
_STOP_MEMBER = np.zeros((len(RULE_SETS), len(_STOP_UNION)), dtype=bool)
for _lang, _ws in STOP_WORDS.items():
    for _w in _ws:
        _STOP_MEMBER[RULE_SETS.index(_lang), _STOP_UNION.index(_w)] = True


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.zeros(len(num), dtype=np.float64)
    np.divide(num, den, out=out, where=den > 0)
    return out


def measure(text: pa.Array, rules: np.ndarray, config: DocQualityConfig) -> dict[str, np.ndarray]:
    """All measures (unprefixed names) for one chunk of documents; ``rules`` indexes RULE_SETS."""
    text = ts.as_array(text)
    n = len(text)
    lower = pc.utf8_lower(text)
    w = ts.words(lower)
    words = w.counts
    chars = ts.per_doc(w, weights=w.lengths).astype(np.int64)
    alpha = ts.per_doc(w, pc.match_substring_regex(w.values, r"\pL"))
    trimmed = pc.utf8_trim(w.values, characters=PUNCT)

    # stop words: distinct members of the document's language list
    idx = pc.index_in(trimmed, value_set=pa.array(_STOP_UNION)).to_numpy(zero_copy_only=False)
    hit = np.flatnonzero(~np.isnan(idx)) if idx.dtype.kind == "f" else np.flatnonzero(idx >= 0)
    stop = np.zeros(n, dtype=np.int64)
    if len(hit):
        u = len(_STOP_UNION)
        key = np.unique(w.doc[hit] * u + idx[hit].astype(np.int64))
        kd, kw = key // u, key % u
        ok = _STOP_MEMBER[rules[kd], kw]
        stop = np.bincount(kd[ok], minlength=n).astype(np.int64)
    bad = ts.per_doc(w, pc.is_in(trimmed, value_set=pa.array(BAD_WORDS)))

    ids = pc.dictionary_encode(w.values).indices.to_numpy()
    top = {k: np.minimum(_ratio(np.where(cnt >= 2, cnt * ln, 0), chars), 1.0) for k, (cnt, ln) in ts.top_ngrams(ids, w, TOP_NGRAMS).items()}

    ln_ = ts.lines(text)
    n_lines = ln_.counts
    bullets = ts.per_doc(ln_, pc.match_substring_regex(ln_.values, BULLET_RE))
    ellipsis = ts.per_doc(ln_, pc.match_substring_regex(ln_.values, ELLIPSIS_LINE_RE))
    dup = ts.duplicates(pc.dictionary_encode(ln_.values).indices.to_numpy(), ln_)
    dup_lines = ts.per_doc(ln_, dup)
    dup_chars = ts.per_doc(ln_, dup, weights=ln_.lengths)
    line_chars = ts.per_doc(ln_, weights=ln_.lengths)

    # paragraphs (Gopher): blocks separated by a blank line, trimmed, dictionary-encoded
    pa_lists = pc.split_pattern_regex(text, PARAGRAPH_SEP_RE)
    paras = ts._flatten(pc.utf8_trim_whitespace(pa_lists.flatten()), pc.list_parent_indices(pa_lists).to_numpy().astype(np.int64), n)
    pdup = ts.duplicates(pc.dictionary_encode(paras.values).indices.to_numpy(), paras)
    dup_paras = ts.per_doc(paras, pdup)
    dup_para_chars = ts.per_doc(paras, pdup, weights=paras.lengths)
    para_chars = ts.per_doc(paras, weights=paras.lengths)
    dupng = ts.dup_ngram_chars(ids, w, DUP_NGRAMS)

    # FineWeb line measures (on the trimmed non-empty lines)
    fw_punct = ts.per_doc(ln_, pc.match_substring_regex(ln_.values, FW_LINE_END_RE))
    fw_short = ts.per_doc(ln_, ln_.lengths <= FW_SHORT_LINE_CHARS)
    newlines = pc.count_substring(text, "\n").to_numpy(zero_copy_only=False).astype(np.int64)
    text_chars = pc.utf8_length(text).to_numpy(zero_copy_only=False).astype(np.int64) - newlines

    symbols = pc.count_substring_regex(text, SYMBOL_RE).to_numpy(zero_copy_only=False).astype(np.int64)

    out: dict[str, np.ndarray] = {
        "chars": chars,
        "words": words.astype(np.int64),
        "mean_word_length": _ratio(chars, words),
        "symbol_ratio": _ratio(symbols, words),
        "bullet_lines_ratio": _ratio(bullets, n_lines),
        "ellipsis_lines_ratio": _ratio(ellipsis, n_lines),
        "alpha_ratio": _ratio(alpha, words),
        "stop_words": stop,
        "dup_lines_frac": _ratio(dup_lines, n_lines),
        "dup_lines_char_frac": _ratio(dup_chars, line_chars),
        "top_2gram_frac": top[2],
        "top_3gram_frac": top[3],
        "top_4gram_frac": top[4],
        "dup_paras_frac": _ratio(dup_paras, paras.counts),
        "dup_paras_char_frac": _ratio(dup_para_chars, para_chars),
        **{f"dup_{k}gram_char_frac": np.minimum(_ratio(dupng[k], chars), 1.0) for k in DUP_NGRAMS},
        "fw_line_punct_ratio": _ratio(fw_punct, n_lines),
        "fw_short_line_ratio": _ratio(fw_short, n_lines),
        "fw_dup_line_char_ratio": _ratio(dup_chars, text_chars),
        "fw_newline_word_ratio": _ratio(newlines, words),
        "hiragana_ratio": np.full(n, np.nan),
        "mean_sentence_chars": np.full(n, np.nan),
        "bad_words": bad,
    }

    # languages without spaces: character measures for their rows
    char_rule = np.isin(rules, [RULE_SETS.index(c) for c in CHAR_LANGS])
    rows = np.flatnonzero(char_rule)
    if len(rows):
        sub = text.take(pa.array(rows))
        c = ts.codepoints(sub)
        nchar = c.counts
        cp = c.values
        out["chars"][rows] = nchar
        out["symbol_ratio"][rows] = _ratio(symbols[rows], nchar)
        letters = pc.count_substring_regex(sub, r"\pL").to_numpy(zero_copy_only=False)
        out["alpha_ratio"][rows] = _ratio(letters, nchar)
        sub_rules = rules[rows]
        part = np.zeros(len(rows), dtype=np.int64)
        for lang, plist in PARTICLES.items():
            mine = sub_rules == RULE_SETS.index(lang)
            if mine.any():
                present = sum((pc.count_substring(sub, p).to_numpy(zero_copy_only=False) > 0).astype(np.int64) for p in plist)
                part[mine] = present[mine]
        out["stop_words"][rows] = part
        char_top = ts.top_ngrams(cp, c, TOP_NGRAM_CHARS)
        for k, kc in zip(TOP_NGRAMS, TOP_NGRAM_CHARS):
            cnt, ln = char_top[kc]
            out[f"top_{k}gram_frac"][rows] = np.minimum(_ratio(np.where(cnt >= 2, cnt * ln, 0), nchar), 1.0)
        char_dup = ts.dup_ngram_chars(cp, c, tuple(2 * k for k in DUP_NGRAMS))
        for k in DUP_NGRAMS:
            out[f"dup_{k}gram_char_frac"][rows] = np.minimum(_ratio(char_dup[2 * k], nchar), 1.0)
        out["fw_newline_word_ratio"][rows] = _ratio(newlines[rows] * 2, nchar)
        hira = ts.per_doc(c, (cp >= 0x3041) & (cp <= 0x309F))
        is_ja = sub_rules == RULE_SETS.index("ja")
        out["hiragana_ratio"][rows[is_ja]] = _ratio(hira, nchar)[is_ja]
        ends = pc.count_substring_regex(pc.utf8_trim_whitespace(sub), SENTENCE_END_RE).to_numpy(zero_copy_only=False)
        out["mean_sentence_chars"][rows] = nchar / np.maximum(ends + 1, 1)
        bad_cjk = sum(pc.count_substring(sub, s).to_numpy(zero_copy_only=False).astype(np.int64) for s in BAD_SUBSTRINGS_CJK)
        out["bad_words"][rows] += bad_cjk
    for k, v in out.items():
        if v.dtype.kind == "f":
            out[k] = np.round(v, 4)
    out["_fails"] = _rules(out, rules, char_rule, config)
    out["_fw_fails"] = _fineweb_rules(out)
    return out


def _fineweb_rules(m: dict[str, np.ndarray]) -> np.ndarray:
    """Bit mask of failed FineWeb rules per document (bit i = FW_REASONS[i])."""
    fails = {
        "line_punct": m["fw_line_punct_ratio"] < FW_LINE_PUNCT_MIN,
        "short_lines": m["fw_short_line_ratio"] > FW_SHORT_LINE_MAX,
        "dup_line_chars": m["fw_dup_line_char_ratio"] > FW_DUP_CHAR_MAX,
        "newline_ratio": m["fw_newline_word_ratio"] > FW_NEWLINE_WORD_MAX,
    }
    mask = np.zeros(len(m["fw_line_punct_ratio"]), dtype=np.int64)
    for i, r in enumerate(FW_REASONS):
        mask |= fails[r].astype(np.int64) << i
    return mask


def _rules(m: dict[str, np.ndarray], rules: np.ndarray, char_rule: np.ndarray, c: DocQualityConfig) -> np.ndarray:
    """Bit mask of failed rules per document (bit i = REASONS[i])."""
    known_word = np.isin(rules, [RULE_SETS.index(x) for x in WORD_LANGS])
    has_stop = np.isin(rules, [RULE_SETS.index(x) for x in WORD_LANGS + CHAR_LANGS])
    ja = rules == RULE_SETS.index("ja")
    size = np.where(char_rule, m["chars"], m["words"])
    lo = np.where(char_rule, c.cjk_min_chars, c.min_words)
    hi = np.where(char_rule, c.cjk_max_chars, c.max_words)
    fails = {
        "too_short": size < lo,
        "too_long": size > hi,
        "mean_word_length": known_word & ((m["mean_word_length"] < MEAN_WORD_LENGTH[0]) | (m["mean_word_length"] > MEAN_WORD_LENGTH[1])),
        "symbol_ratio": m["symbol_ratio"] > np.where(char_rule, MAX_SYMBOL_RATIO_CHARS, MAX_SYMBOL_RATIO),
        "bullet_lines": m["bullet_lines_ratio"] > MAX_BULLET_LINES,
        "ellipsis_lines": m["ellipsis_lines_ratio"] > MAX_ELLIPSIS_LINES,
        "alpha_ratio": m["alpha_ratio"] < np.where(char_rule, MIN_ALPHA_CHARS, MIN_ALPHA_WORDS),
        "stop_words": has_stop & (m["stop_words"] < MIN_STOP_WORDS),
        "dup_lines": m["dup_lines_frac"] > MAX_DUP_LINES,
        "dup_line_chars": m["dup_lines_char_frac"] > MAX_DUP_LINE_CHARS,
        "top_2gram": m["top_2gram_frac"] > MAX_TOP_NGRAM[0],
        "top_3gram": m["top_3gram_frac"] > MAX_TOP_NGRAM[1],
        "top_4gram": m["top_4gram_frac"] > MAX_TOP_NGRAM[2],
        "hiragana_ratio": ja & (np.nan_to_num(m["hiragana_ratio"], nan=1.0) < MIN_HIRAGANA),
        "sentence_length": char_rule & (np.nan_to_num(m["mean_sentence_chars"]) > MAX_SENTENCE_CHARS),
        "dup_paras": m["dup_paras_frac"] > MAX_DUP_PARAS,
        "dup_para_chars": m["dup_paras_char_frac"] > MAX_DUP_PARA_CHARS,
        **{f"dup_{k}gram": m[f"dup_{k}gram_char_frac"] > t for k, t in zip(DUP_NGRAMS, MAX_DUP_NGRAM)},
    }
    mask = np.zeros(len(rules), dtype=np.int64)
    for i, r in enumerate(REASONS):
        mask |= fails[r].astype(np.int64) << i
    return mask


def reasons_array(mask: np.ndarray, reasons: tuple[str, ...] = REASONS) -> pa.Array:
    """Comma-separated failed rule names per document, built once per distinct mask."""
    uniq, inv = np.unique(mask, return_inverse=True)
    names = [",".join(r for i, r in enumerate(reasons) if (int(u) >> i) & 1) for u in uniq]
    return pa.array(names, pa.string()).take(pa.array(inv.astype(np.int32)))


def _chunks(text: pa.Array) -> list[tuple[int, int]]:
    """Row ranges of at most CHUNK_BYTES of text and CHUNK_ROWS rows (a longer document is alone)."""
    n = len(text)
    if n == 0:
        return []
    size = np.cumsum(pc.binary_length(text).to_numpy(zero_copy_only=False).astype(np.int64))
    out, start = [], 0
    while start < n:
        base = size[start - 1] if start else 0
        end = int(np.searchsorted(size, base + CHUNK_BYTES, side="right"))
        end = min(max(end, start + 1), start + CHUNK_ROWS, n)
        out.append((start, end))
        start = end
    return out


@register
class DocQuality(Transform):
    name = "doc_quality"
    Config = DocQualityConfig
    summary = "annotate Gopher/C4-style quality measures (language-aware: word rules, ja/zh character rules) and a pass flag"
    headline = ("dq_pass", "dq_fail", "dq_fail_*")

    @classmethod
    def branch_params(cls, branch: str) -> dict:
        """In a language's branch, documents without a usable lang value are judged by that language's rules."""
        return {} if branch in ("other", "und") else {"default_lang": branch}

    def input_columns(self) -> list[Column]:
        return [Column(self.config.content_column, "string")]

    def added_columns(self) -> list[str]:
        return [self.config.prefix + m for m, _, _ in MEASURES]

    def check_schema(self, schema: pa.Schema, where: str) -> None:
        super().check_schema(schema, where)
        lc = self.config.lang_column
        if not lc:
            return
        if lc not in schema.names:
            if lc != "lang":
                raise InputError(
                    f"{where}: lang_column '{lc}' is missing (columns: {', '.join(schema.names)})",
                    "set lang_column to the column with language codes, or '' to use default_lang for every document",
                )
            return
        t = schema.field(lc).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t)):
            raise InputError(f"{where}: lang_column '{lc}' has type {t}, expected string", "point lang_column at a string column of codes such as 'en'")

    def _rules_for(self, table: pa.Table) -> tuple[np.ndarray, int]:
        c = self.config
        base, unset = ts.base_lang(table, c.lang_column, c.default_lang)
        idx = pc.index_in(base, value_set=pa.array(RULE_SETS[:-1])).to_numpy(zero_copy_only=False)
        idx = np.where(np.isnan(idx), -1, idx).astype(np.int64) if idx.dtype.kind == "f" else idx.astype(np.int64)
        rules = np.where(idx >= 0, idx, RULE_SETS.index("other"))
        return rules.astype(np.int64), int(unset.sum())

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        c = self.config
        text = ts.as_array(table.column(c.content_column))
        rules, defaulted = self._rules_for(table)
        parts: list[dict[str, np.ndarray]] = []
        for a, b in _chunks(text):
            parts.append(measure(text.slice(a, b - a), rules[a:b], c))
        if parts:
            m = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        else:
            m = measure(text, rules, c)
        fails = m.pop("_fails")
        fw_fails = m.pop("_fw_fails")
        for name, typ, _ in MEASURES:
            if name == "rules":
                col = pa.array(RULE_SETS, pa.string()).take(pa.array(rules))
            elif name == "gopher_pass":
                col = pa.array(fails == 0, pa.bool_())
            elif name == "gopher_reasons":
                col = reasons_array(fails) if len(fails) else pa.array([], pa.string())
            elif name == "fineweb_pass":
                col = pa.array(fw_fails == 0, pa.bool_())
            elif name == "fineweb_reasons":
                col = reasons_array(fw_fails, FW_REASONS) if len(fw_fails) else pa.array([], pa.string())
            elif typ == "float64":
                v = m[name]
                col = pa.array(v, pa.float64(), mask=np.isnan(v)) if np.isnan(v).any() else pa.array(v, pa.float64())
            else:
                col = pa.array(m[name], pa.int64())
            table = table.append_column(c.prefix + name, col)
        counters = {"dq_pass": int((fails == 0).sum()), "dq_fail": int((fails != 0).sum()), "dq_lang_default": defaulted}
        for i, r in enumerate(REASONS):
            counters[f"dq_fail_{r}"] = int(((fails >> i) & 1).sum())
        counters["dq_fineweb_pass"] = int((fw_fails == 0).sum())
        counters["dq_fineweb_fail"] = int((fw_fails != 0).sum())
        for i, r in enumerate(FW_REASONS):
            counters[f"dq_fineweb_fail_{r}"] = int(((fw_fails >> i) & 1).sum())
        for i, r in enumerate(RULE_SETS):
            k = int((rules == i).sum())
            if k:
                counters[f"dq_rules_{r}"] = k
        return Output.of(table, counters=counters)
