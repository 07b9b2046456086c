"""c4_clean: C4's line and page cleaning (Raffel et al. 2020, section 2.2). Changes the text.

Line level (a line is dropped, counted as ``lines_removed_<reason>``):

* ``long_word``: a word longer than ``max_word_length`` characters;
* ``no_terminal_punct``: the line does not end with ``.`` ``?`` ``!`` ``"`` ``'`` (ja/zh lines
  also with ``。`` ``？`` ``！`` ``」`` ``』``), or ends with ``...``;
* ``too_few_words``: fewer than ``min_words_per_line`` words (ja/zh lines: fewer than
  ``cjk_min_chars_per_line`` non-space characters);
* ``javascript``: the line mentions "javascript" (any case);
* ``policy``: terms of use, privacy / cookie policy, use(s) of cookies.

Citation markers (``[1]``, ``[edit]``, ``[citation needed]``) are cut out of the lines first
(``citations_removed`` counts them). Document level (the document is removed, counted per
reason; the first that applies in this order): ``lorem_ipsum`` and ``curly_bracket`` (in a
line that passed the line rules), ``too_few_sentences`` (fewer than ``min_sentences`` in the
kept lines), ``bad_words`` (a word of the document language's list in the cleaned text),
``empty`` (nothing left). Every step is an Arrow kernel over all lines of the file or NumPy
over per-line arrays; the bad-word lists are one regular expression per language.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline import textstats as ts
from prepline.config import TransformConfig, param, removed_sample_param
from prepline.errors import ConfigError, InputError
from prepline.registry import register
from prepline.transform import Column, FileTask, Output, Transform

LINE_REASONS = ("long_word", "no_terminal_punct", "too_few_words", "javascript", "policy")
DOC_REASONS = ("lorem_ipsum", "curly_bracket", "too_few_sentences", "bad_words", "empty")
CITATION_RE = r"\[\d*\]|\[edit\]|\[citation needed\]"
END_RE = r"[.?!\"']$"
END_RE_CJK = r"[.?!\"'。？！」』]$"
ELLIPSIS_RE = r"(?:\.\.\.|…)$"
POLICY_RE = r"terms of use|privacy policy|cookie policy|uses cookies|use of cookies|use cookies"
# sentence ends inside a kept line: a run of . ! ? (CJK 。！？) followed by closing quotes or
# brackets, then white space or the end of the line
SENTENCE_RE = r"[.!?。！？]+[\"'”’)\]」』]*(?:\s|$)"
# Python's str.splitlines() boundaries
LINE_SPLIT_RE = "\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]"
CHAR_LANGS = ("ja", "zh")

# Small built-in bad-word lists (C4 uses the much longer LDNOOBW lists, which this project does not
# ship or download). Word languages match whole words; ja/zh match substrings. Extend them with
# ``extra_bad_words`` or ``bad_words_file``.
BAD_WORDS: dict[str, tuple[str, ...]] = {
    "en": ("fuck", "fucking", "fucked", "fucker", "motherfucker", "shit", "shitty", "bullshit", "cunt", "asshole",
           "bitch", "dickhead", "jackass", "porn", "porno", "xxx", "nigger", "faggot", "whore", "slut", "blowjob",
           "handjob", "cumshot", "dildo", "milf", "gangbang"),
    "fr": ("merde", "putain", "connard", "connasse", "salope", "enculé", "pute", "niquer", "bite", "couille"),
    "de": ("scheiße", "scheisse", "arschloch", "fotze", "hure", "wichser", "ficken", "schlampe"),
    "es": ("mierda", "puta", "cabrón", "gilipollas", "coño", "joder", "pendejo", "polla"),
    "nl": ("kut", "klootzak", "hoer", "neuken", "lul"),
    "it": ("cazzo", "stronzo", "puttana", "vaffanculo", "troia", "minchia"),
    "pt": ("caralho", "porra", "puta", "foder", "buceta", "merda"),
    "ja": ("ちんこ", "まんこ", "セックス", "エロ動画", "フェラ"),
    "zh": ("肏", "屄", "傻逼", "操你妈", "鸡巴"),
}


@dataclass(frozen=True)
class C4CleanConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text (rewritten)")
    lang_column: str = param("lang", "column with the language code (bad-word list, ja/zh line rules); '' or missing column: default_lang")
    default_lang: str = param("en", "language when the lang column is missing, null, empty or 'und'")
    min_words_per_line: int = param(3, "lines with fewer words are dropped (0: off)", min=0)
    cjk_min_chars_per_line: int = param(6, "ja/zh lines with fewer non-space characters are dropped (0: off)", min=0)
    max_word_length: int = param(1000, "lines with a longer word are dropped (0: off)", min=0)
    min_sentences: int = param(5, "documents with fewer sentences in their kept lines are removed (0: off)", min=0)
    terminal_punct: bool = param(True, "drop lines not ending in terminal punctuation (or ending in '...')")
    remove_citations: bool = param(True, "cut [1], [edit], [citation needed] out of lines")
    filter_javascript: bool = param(True, "drop lines mentioning javascript")
    filter_policy: bool = param(True, "drop terms-of-use, privacy-policy and cookie lines")
    filter_lorem_ipsum: bool = param(True, "remove documents with 'lorem ipsum'")
    filter_curly_bracket: bool = param(True, "remove documents with a '{'")
    filter_bad_words: bool = param(True, "remove documents with a word of their language's bad-word list")
    extra_bad_words: list[str] = param([], "more bad words: 'word' (every language) or 'lang:word'")
    bad_words_file: str = param("", "local file of more bad words, one a line ('word' or 'lang:word'; '#' comments)")
    removed_lines_sample: int = param(0, "keep up to N removed lines per document in a list column c4_removed_lines ('reason: line')", min=0)
    removed_sample: int = removed_sample_param()

    def validate(self) -> None:
        if not self.default_lang or not self.default_lang.replace("-", "").isalnum():
            raise ConfigError(f"default_lang={self.default_lang!r} is not a language code", "pass e.g. --default-lang en")
        if self.content_column == self.lang_column:
            raise ConfigError("content_column and lang_column are the same", "name the text column and the language column")
        for w in self.extra_bad_words:
            if not isinstance(w, str) or not w.split(":", 1)[-1].strip():
                raise ConfigError(f"extra_bad_words entry {w!r} is empty", "give words as 'word' or 'lang:word', e.g. --extra-bad-words en:darn")
        if self.bad_words_file and not Path(self.bad_words_file).is_file():
            raise ConfigError(f"bad_words_file {self.bad_words_file!r} is not a readable file",
                              "give the path of a local text file with one word a line ('word' or 'lang:word')")


def _entries(items: list[str]) -> list[tuple[str, str]]:
    out = []
    for raw in items:
        s = raw.split("#", 1)[0].strip().lower() if not raw.lstrip().startswith("#") else ""
        if not s:
            continue
        lang, _, word = s.rpartition(":") if re.match(r"^[a-z]{2,3}(?:[-_][a-z0-9]+)?:", s) else ("", "", s)
        out.append((lang.split("-")[0].split("_")[0], word.strip()))
    return out


@register
class C4Clean(Transform):
    name = "c4_clean"
    Config = C4CleanConfig
    summary = "C4 cleaning: drop lines (no terminal punctuation, < 3 words, javascript, policy) and documents (lorem ipsum, '{', < 5 sentences, bad words)"
    headline = ("lines_kept", "lines_removed_*")

    def __init__(self, config: C4CleanConfig) -> None:
        super().__init__(config)
        words = {k: set(v) for k, v in BAD_WORDS.items()}
        extra = list(config.extra_bad_words)
        if config.bad_words_file:
            extra += Path(config.bad_words_file).read_text(encoding="utf-8").splitlines()
        self._all_langs: set[str] = set()
        for lang, w in _entries(extra):
            if lang:
                words.setdefault(lang, set()).add(w)
            else:
                self._all_langs.add(w)
        self._bad = words

    @classmethod
    def branch_params(cls, branch: str) -> dict:
        return {} if branch in ("other", "und") else {"default_lang": branch}

    def input_columns(self) -> list[Column]:
        return [Column(self.config.content_column, "string")]

    def added_columns(self) -> list[str]:
        return ["c4_removed_lines"] if self.config.removed_lines_sample else []

    def check_schema(self, schema: pa.Schema, where: str) -> None:
        super().check_schema(schema, where)
        lc = self.config.lang_column
        if lc and lc not in schema.names and lc != "lang":
            raise InputError(f"{where}: lang_column '{lc}' is missing (columns: {', '.join(schema.names)})",
                             "set lang_column to the column with language codes, or '' to use default_lang for every document")

    def _pattern(self, lang: str) -> str | None:
        words = sorted(self._bad.get(lang, set()) | self._all_langs)
        if not words:
            return None
        alt = "|".join(re.escape(w) for w in words)
        return alt if lang in CHAR_LANGS else rf"(?:\W|^)(?:{alt})(?:\W|$)"

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        c = self.config
        n = table.num_rows
        text = ts.as_array(table.column(c.content_column))
        lang, _ = ts.base_lang(table, c.lang_column, c.default_lang)
        is_cjk = np.asarray(pc.fill_null(pc.is_in(lang, value_set=pa.array(CHAR_LANGS)), False).to_numpy(zero_copy_only=False), dtype=bool)

        lists = pc.split_pattern_regex(pc.fill_null(text, ""), LINE_SPLIT_RE)
        raw = pc.utf8_trim_whitespace(lists.flatten())
        ldoc = pc.list_parent_indices(lists).to_numpy().astype(np.int64)
        nonblank = np.asarray(pc.greater(pc.utf8_length(raw), 0).to_numpy(zero_copy_only=False), dtype=bool)
        raw, ldoc = raw.filter(pa.array(nonblank)), ldoc[nonblank]
        nl = len(raw)
        lcjk = is_cjk[ldoc] if nl else np.zeros(0, dtype=bool)

        # words per line (split before the citations are cut, as C4's reference code does)
        wl = ts.words(raw)
        nwords = wl.counts
        longest = np.zeros(nl, dtype=np.int64)
        if len(wl.doc):
            np.maximum.at(longest, wl.doc, wl.lengths)

        line = raw
        cites = 0
        if c.remove_citations and nl:
            cites = int(pc.sum(pc.count_substring_regex(line, CITATION_RE)).as_py() or 0)
            line = pc.replace_substring_regex(line, CITATION_RE, "")
        low = pc.utf8_lower(line)

        def match(arr: pa.Array, pattern: str) -> np.ndarray:
            return np.asarray(pc.fill_null(pc.match_substring_regex(arr, pattern), False).to_numpy(zero_copy_only=False), dtype=bool) if nl else np.zeros(0, bool)

        reason = np.full(nl, -1, dtype=np.int64)  # first line rule failed, -1: kept

        def fail(i: int, mask: np.ndarray) -> None:
            reason[(reason < 0) & mask] = i

        if c.max_word_length:
            fail(0, longest > c.max_word_length)
        if c.terminal_punct:
            ends = np.where(lcjk, match(line, END_RE_CJK), match(line, END_RE))
            fail(1, ~ends | match(line, ELLIPSIS_RE))
        cjk_chars = np.zeros(nl, dtype=np.int64)
        if lcjk.any():
            cjk_chars[lcjk] = pc.utf8_length(pc.replace_substring_regex(line.filter(pa.array(lcjk)), r"\s+", "")).to_numpy(zero_copy_only=False)
        fail(2, np.where(lcjk, cjk_chars < c.cjk_min_chars_per_line, nwords < c.min_words_per_line))
        # document-level findings in lines that passed so far (C4's reference code stops there)
        alive = reason < 0
        lorem = alive & match(low, "lorem ipsum") if c.filter_lorem_ipsum else np.zeros(nl, bool)
        curly = alive & match(line, r"\{") if c.filter_curly_bracket else np.zeros(nl, bool)
        if c.filter_javascript:
            fail(3, match(low, "javascript"))
        if c.filter_policy:
            fail(4, match(low, POLICY_RE))
        kept = reason < 0

        # the cleaned text: kept lines joined by newlines
        kept_lines = line.filter(pa.array(kept)) if nl else line
        kdoc = ldoc[kept]
        counts = np.bincount(kdoc, minlength=n)
        joined = pc.utf8_trim_whitespace(pc.binary_join(ts.regroup(kept_lines, kdoc, n), "\n"))
        if c.min_sentences:
            sent = pc.count_substring_regex(kept_lines, SENTENCE_RE).to_numpy(zero_copy_only=False).astype(np.int64)
            sentences = np.bincount(kdoc, weights=np.maximum(sent, 1), minlength=n).astype(np.int64)
        else:
            sentences = np.zeros(n, dtype=np.int64)

        doc_reason = np.full(n, -1, dtype=np.int64)

        def dfail(i: int, mask: np.ndarray) -> None:
            doc_reason[(doc_reason < 0) & mask] = i

        dfail(0, np.bincount(ldoc[lorem], minlength=n) > 0)
        dfail(1, np.bincount(ldoc[curly], minlength=n) > 0)
        dfail(2, sentences < c.min_sentences)
        no_list = 0
        if c.filter_bad_words:
            lowdoc = pc.utf8_lower(joined)
            langs = [x for x in pc.unique(lang).to_pylist() if x is not None]
            for lg in langs:
                pat = self._pattern(lg)
                rows = np.flatnonzero(np.asarray(pc.equal(lang, lg).to_numpy(zero_copy_only=False), dtype=bool) & (doc_reason < 0))
                if pat is None:
                    no_list += len(rows)
                    continue
                if len(rows):
                    hit = np.asarray(pc.match_substring_regex(lowdoc.take(pa.array(rows)), pat).to_numpy(zero_copy_only=False), dtype=bool)
                    doc_reason[rows[hit]] = 3
        dfail(4, counts == 0)
        keep = doc_reason < 0

        out = table.set_column(table.column_names.index(c.content_column), c.content_column, joined)
        if c.removed_lines_sample:
            out = out.append_column("c4_removed_lines", self._removed_lines(raw, ldoc, reason, n))
        masks = {r: doc_reason == i for i, r in enumerate(DOC_REASONS)}
        removed = {r: int(m.sum()) for r, m in masks.items() if m.any()}
        masks = {r: m for r, m in masks.items() if m.any()}
        if not keep.all():
            out = out.filter(pa.array(keep))
        removed_with_doc = int((~keep[ldoc] & kept).sum()) if nl else 0
        counters = {"lines_in": nl, "lines_kept": int(kept.sum()) - removed_with_doc, "lines_dropped_with_doc": removed_with_doc,
                    "citations_removed": cites}
        for i, r in enumerate(LINE_REASONS):
            counters[f"lines_removed_{r}"] = int((reason == i).sum())
        counters["docs_without_bad_word_list"] = no_list
        return Output(parts={"": out}, removed=removed, counters=counters, removed_rows=masks)

    def _removed_lines(self, raw: pa.Array, ldoc: np.ndarray, reason: np.ndarray, n: int) -> pa.Array:
        """Up to removed_lines_sample removed lines per document, as 'reason: line'."""
        gone = ts.first_per_doc(np.flatnonzero(reason >= 0), ldoc, self.config.removed_lines_sample)
        names = pa.array([r + ": " for r in LINE_REASONS]).take(pa.array(reason[gone]))
        vals = pc.binary_join_element_wise(names, raw.take(pa.array(gone)), "")
        return ts.regroup(vals, ldoc[gone], n)
