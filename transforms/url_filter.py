"""url_filter: flag or remove documents by their URL: blocked domains and URLs, banned words.

Reads the ``url`` column that WARC/WET ingest writes (any string column via ``url_column``;
nulls allowed). A document is caught, under the first reason that applies, in this order:

1. ``blocked_domain``: its host, or any parent domain of it, is in a domain list
   (``example.com`` listed catches ``example.com``, ``www.example.com``, ``a.b.example.com``);
2. ``blocked_url``: the URL, exactly as written, is in a URL list;
3. ``banned_word``: a token of the URL is a banned word (tokens: the lower-cased URL split at
   every character that is not an ASCII letter or digit);
4. ``soft_banned_words``: at least ``soft_word_threshold`` distinct soft-banned words are tokens
   of the URL;
5. ``banned_subword``: a banned sub-word occurs anywhere in the normalised URL (lower-cased, every
   character other than a-z and 0-9 removed).

Documents without a URL (null or empty) pass and are counted (``url_missing``). Words and
sub-words are normalised as the URL is (lower case, only a-z and 0-9). List files (one entry a line,
``#`` starts a comment line) are local paths or ``s3://`` URIs, read once per worker.

``action=flag`` adds ``reason_column`` (the reason, or null for a document that passes) and
removes nothing, so ``filter`` can drop rows by SQL; ``action=remove`` drops the caught documents,
counted as ``removed.<reason>`` (``docs_in = docs_out + Σ removed``). Either way the counters
``url_<reason>`` say how many documents each reason caught.

Everything is Arrow compute over the column: host extraction by regex, ``is_in`` against the
lists for the host and each of its parent domains, one split into tokens for the word rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline.config import TransformConfig, param, removed_sample_param
from prepline.errors import ConfigError
from prepline.registry import register
from prepline.transform import Column, FileTask, Output, Transform
from prepline.userfiles import check_file, read_lines

REASONS = ("blocked_domain", "blocked_url", "banned_word", "soft_banned_words", "banned_subword")

#: a small default list of URL tokens that mark adult sites (written for prepline; extend with
#: banned_words, or turn off with use_default_words=false)
DEFAULT_BANNED_WORDS = (
    "porn", "porno", "pornhub", "xxx", "xvideos", "xhamster", "xnxx", "redtube", "youporn", "hentai",
    "camgirl", "camgirls", "sexcam", "livesex", "nsfw", "bdsm", "fetish", "escorts", "milf", "gangbang",
    "blowjob", "handjob", "threesome", "orgy", "stripper", "playboy", "onlyfans",
)
#: words harmless alone that, several together in one URL, mark adult sites
DEFAULT_SOFT_BANNED_WORDS = (
    "sex", "sexy", "nude", "nudes", "naked", "adult", "adults", "erotic", "erotica", "escort", "hot", "babes",
    "girls", "teen", "teens", "cam", "cams", "live", "dating", "hookup", "lingerie", "webcam", "strip", "amateur",
    "mature", "video", "videos", "free",
)

_NON_ALNUM = re.compile(r"[^a-z0-9]+")
# scheme (optional), user info (optional), then the host up to a port, path, query or fragment
_HOST = r"^(?:[a-z][a-z0-9+.\-]*://)?(?:[^@/?#]*@)?(?P<host>[^:/?#]*)"
LIST_FIX = "give a text file (local path or s3:// URI) with one entry a line"


def normalise_word(w: str) -> str:
    """A list word as URL tokens are compared: lower case, only a-z and 0-9 kept."""
    return _NON_ALNUM.sub("", w.lower())


def normalise_domain(d: str) -> str:
    d = d.strip().lower()
    d = re.sub(r"^[a-z][a-z0-9+.\-]*://", "", d)  # a pasted URL: keep its host
    d = re.split(r"[/:?#]", d, maxsplit=1)[0]
    return d.strip(".").removeprefix("*.")


@dataclass(frozen=True)
class UrlFilterConfig(TransformConfig):
    url_column: str = param("url", "column holding the document's URL (WARC/WET ingest writes url); nulls pass")
    domain_lists: list[str] = param([], "files of blocked domains, one a line (local or s3://); a domain blocks its subdomains too")
    url_lists: list[str] = param([], "files of blocked URLs, one a line, matched exactly (local or s3://)")
    banned_words: list[str] = param([], "words that block a URL holding one as a token (added to the default list)")
    soft_banned_words: list[str] = param([], "words that block a URL holding soft_word_threshold of them (added to the default list)")
    banned_subwords: list[str] = param([], "strings that block a URL containing them anywhere (after normalisation)")
    soft_word_threshold: int = param(2, "distinct soft-banned words in a URL that block it", min=1)
    use_default_words: bool = param(True, "include prepline's small default banned and soft-banned word lists")
    action: str = param("flag", "flag: add reason_column and keep every document; remove: drop the caught documents", choices=("flag", "remove"))
    reason_column: str = param("url_filter_reason", "column to add with action=flag: why the URL is caught, null when it passes")
    removed_sample: int = removed_sample_param()

    def validate(self) -> None:
        if not self.url_column:
            raise ConfigError("url_column is empty", "name the column holding the URL, e.g. url")
        if self.action == "flag":
            if not self.reason_column:
                raise ConfigError("reason_column is empty with action=flag", "name the column to add, e.g. url_filter_reason")
            if self.reason_column == self.url_column:
                raise ConfigError(f"reason_column and url_column are both {self.url_column!r}", "give the reason column another name")
        for name in ("banned_words", "soft_banned_words", "banned_subwords"):
            bad = [w for w in getattr(self, name) if not normalise_word(w)]
            if bad:
                raise ConfigError(f"{name} has {bad[0]!r}, which has no letter or digit (URL words are compared on a-z and 0-9 only)",
                                  f"remove it from {name}")
        for name in ("domain_lists", "url_lists"):
            for f in getattr(self, name):
                if not f.strip():
                    raise ConfigError(f"{name} has an empty file name", f"remove it, or {LIST_FIX}")


@register
class UrlFilter(Transform):
    name = "url_filter"
    Config = UrlFilterConfig
    summary = "flag or remove documents by URL: blocked domains (and subdomains) and URLs from lists, banned and soft-banned words"
    headline = ("url_*", "removed.*")

    def input_columns(self) -> list[Column]:
        return [Column(self.config.url_column, "string", nullable=True)]

    def added_columns(self) -> list[str]:
        return [self.config.reason_column] if self.config.action == "flag" else []

    def check_resources(self) -> None:
        for name in ("domain_lists", "url_lists"):
            for f in getattr(self.config, name):
                check_file(f, name, LIST_FIX)

    def check_on_driver(self, schema: pa.Schema, where: str) -> None:
        self.check_resources()

    def setup(self, ctx) -> None:
        self._load()

    def _load(self) -> None:
        c = self.config
        domains = {normalise_domain(d) for f in c.domain_lists for d in read_lines(f, "domain_lists", LIST_FIX)}
        urls = {u for f in c.url_lists for u in read_lines(f, "url_lists", LIST_FIX)}
        banned = {normalise_word(w) for w in (DEFAULT_BANNED_WORDS if c.use_default_words else ()) + tuple(c.banned_words)}
        soft = {normalise_word(w) for w in (DEFAULT_SOFT_BANNED_WORDS if c.use_default_words else ()) + tuple(c.soft_banned_words)}
        self._domains = pa.array(sorted(domains - {""}), pa.string())
        self._urls = pa.array(sorted(urls), pa.string())
        self._banned = pa.array(sorted(banned - {""}), pa.string())
        self._soft = pa.array(sorted(soft - {""}), pa.string())
        subs = sorted({normalise_word(w) for w in c.banned_subwords} - {""})
        self._subword_re = "|".join(re.escape(s) for s in subs) if subs else None

    def reasons(self, urls: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Per URL: the index into REASONS of the first rule that catches it (-1: passes), and
        whether the URL is missing (null or empty)."""
        if not hasattr(self, "_domains"):
            self._load()
        n = len(urls)
        if isinstance(urls, pa.ChunkedArray):
            urls = urls.combine_chunks() if urls.num_chunks != 1 else urls.chunk(0)
        if pa.types.is_large_string(urls.type):
            urls = urls.cast(pa.string())
        missing = pc.fill_null(pc.equal(pc.utf8_length(urls), 0), True).to_numpy(zero_copy_only=False)
        hit = np.zeros((len(REASONS), n), dtype=bool)
        lower = pc.utf8_lower(pc.utf8_trim_whitespace(urls))
        if len(self._domains):
            host = pc.struct_field(pc.extract_regex(lower, _HOST), "host")
            host = pc.utf8_rtrim(host, characters=".")
            hit[0] = _any_suffix_in(host, self._domains)
        if len(self._urls):
            hit[1] = pc.fill_null(pc.is_in(urls, value_set=self._urls), False).to_numpy(zero_copy_only=False)
        if len(self._banned) or len(self._soft):
            toks = pc.split_pattern_regex(pc.fill_null(lower, ""), "[^a-z0-9]+")
            flat = toks.flatten()
            doc = np.repeat(np.arange(n, dtype=np.int64), np.diff(toks.offsets.to_numpy()))
            if len(self._banned):
                b = pc.is_in(flat, value_set=self._banned).to_numpy(zero_copy_only=False)
                hit[2] = np.bincount(doc[b], minlength=n) > 0
            if len(self._soft):
                idx = pc.index_in(flat, value_set=self._soft)
                s = pc.is_valid(idx).to_numpy(zero_copy_only=False)
                pairs = np.unique(doc[s] * len(self._soft) + idx.filter(pc.is_valid(idx)).to_numpy().astype(np.int64))
                hit[3] = np.bincount(pairs // len(self._soft), minlength=n) >= self.config.soft_word_threshold
        if self._subword_re is not None:
            norm = pc.replace_substring_regex(pc.fill_null(lower, ""), "[^a-z0-9]+", "")
            hit[4] = pc.match_substring_regex(norm, self._subword_re).to_numpy(zero_copy_only=False)
        hit[:, missing] = False
        first = np.where(hit.any(axis=0), hit.argmax(axis=0), -1)
        return first, missing

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        c = self.config
        first, missing = self.reasons(table.column(c.url_column))
        counters = {f"url_{r}": int((first == i).sum()) for i, r in enumerate(REASONS)}
        counters["url_missing"] = int(missing.sum())
        if c.action == "flag":
            names = pa.array(list(REASONS), pa.string())
            reason = pc.take(names, pa.array(np.where(first >= 0, first, 0), pa.int64()))
            reason = pc.if_else(pa.array(first >= 0), reason, pa.scalar(None, pa.string()))
            return Output.of(table.append_column(c.reason_column, reason), counters=counters)
        masks = {r: first == i for i, r in enumerate(REASONS) if (first == i).any()}
        removed = {r: int(m.sum()) for r, m in masks.items()}
        if removed:
            table = table.filter(pa.array(first < 0))
        return Output.of(table, removed=removed, counters=counters, removed_rows=masks)

    def empty_output_fix(self, reason: str) -> str:
        return (f"every document was caught by {reason}: check the lists and words (or use action=flag and look at "
                f"{self.config.reason_column})")


def _any_suffix_in(host: pa.Array, domains: pa.Array) -> np.ndarray:
    """True where the host or one of its parent domains (dropping labels from the left) is listed."""
    out = np.zeros(len(host), dtype=bool)
    cur = pc.fill_null(host, "")
    while True:
        out |= pc.fill_null(pc.is_in(cur, value_set=domains), False).to_numpy(zero_copy_only=False)
        has_dot = pc.match_substring(cur, ".").to_numpy(zero_copy_only=False)
        if not has_dot.any():
            return out
        cur = pc.replace_substring_regex(cur, r"^[^.]*\.", "", max_replacements=1)
        cur = pc.if_else(pa.array(has_dot), cur, "")  # hosts without a dot are done
