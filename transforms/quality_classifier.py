"""quality_classifier: score documents with a fastText quality classifier (the DCLM recipe).

The model is a supervised fastText classifier: the one ``prepline quality train`` wrote
(:mod:`prepline.quality`; its folder or its ``quality.bin``), or any the user brings (DCLM's
``fasttext_oh_eli5``, a FineWeb-Edu distillation, ...), from a local path or an ``s3://`` URI,
loaded once per worker. ``positive_label`` names the label whose probability becomes the score
(``hq``, ``__label__hq``; the model's labels are checked when it loads).

Per file, each document is read as fastText reads one line (trimmed, line breaks as spaces),
optionally cut to ``max_chars``, and the whole column is scored in one compiled pass
(:mod:`prepline.fasttext_np`: fastText's linear model, the same probabilities to 1e-5;
fastText's own batch predict for models with character n-grams, hierarchical softmax or quantization). Adds
``score_column`` (default ``quality_score``): the probability of the positive label, 0..1;
documents with no text score 0.

Per language: ``lang_models`` (``en=s3://m/en.bin``, one entry per language) scores each
document with the model of its ``lang_column`` value (from lang_id); documents of other
languages use ``model_path`` when given, else get a null score (counted as
``quality_no_model``). Counters: ``quality_scored_<lang or all>`` per model, and
``quality_pass`` (documents scoring at least ``threshold``, for the log only).

Nothing is removed: remove with ``filter`` by SQL, e.g. ``quality_score >= 0.5`` (documents
with a null score fail a comparison; keep them with ``quality_score IS NULL OR quality_score >= 0.5``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline import textstats as ts
from prepline.config import TransformConfig, param
from prepline.errors import ConfigError
from prepline.quality import Scorer, check_model, label_name, load_classifier
from prepline.registry import register
from prepline.transform import Column, FileTask, Output, Transform

_CODE = re.compile(r"^[A-Za-z0-9_-]+$")
NO_MODEL = "quality_no_model"


@dataclass(frozen=True)
class QualityClassifierConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text")
    model_path: str = param("", "fastText classifier: a local path (or the folder `prepline quality train` wrote) or s3:// URI; "
                                "with lang_models, the model for the other languages ('' : they get a null score)")
    lang_models: list[str] = param([], "per-language models as lang=path entries (e.g. en=s3://m/en.bin); documents are routed by lang_column")
    lang_column: str = param("lang", "column with the language code (from lang_id); read only with lang_models")
    positive_label: str = param("hq", "the model's label whose probability is the score (hq or __label__hq)")
    score_column: str = param("quality_score", "column to add with the probability of the positive label (0..1)")
    max_chars: int = param(0, "score only the first N characters of each document (0: the whole text)", min=0)
    threshold: float = param(0.5, "counts documents scoring at least this as quality_pass (a log figure; remove with filter)", min=0.0, max=1.0)

    def validate(self) -> None:
        if not self.score_column or self.score_column in (self.content_column, self.lang_column):
            raise ConfigError("score_column must be a new, non-empty column name", "pass e.g. --score-column quality_score")
        if not self.model_path and not self.lang_models:
            raise ConfigError("quality_classifier needs a model: model_path or lang_models is empty",
                              "pass --model-path <folder or .bin of `prepline quality train`, local or s3://>, or --lang-models en=<path>")
        label = label_name(self.positive_label)
        if len(label) == len("__label__") or any(ch.isspace() for ch in label):
            raise ConfigError(f"positive_label {self.positive_label!r} is not a fastText label", "pass e.g. --positive-label hq")
        self.models()

    def models(self) -> dict[str, str]:
        """lang -> model path ('' for the default model_path, when given)."""
        out: dict[str, str] = {}
        for entry in self.lang_models:
            lang, sep, path = entry.partition("=")
            lang, path = lang.strip(), path.strip()
            if not sep or not _CODE.match(lang) or not path:
                raise ConfigError(f"lang_models entry {entry!r} is not lang=path", "pass entries like en=models/en.bin or de=s3://bucket/de.bin")
            if lang in out:
                raise ConfigError(f"lang_models gives language {lang!r} twice", "give one model per language")
            out[lang] = path
        if self.model_path:
            out[""] = self.model_path
        return out


@register
class QualityClassifier(Transform):
    name = "quality_classifier"
    Config = QualityClassifierConfig
    summary = "score documents with a fastText quality classifier (DCLM recipe), per language if given; filter by the score with SQL"
    extra = "langid"
    headline = ("quality_*",)

    @classmethod
    def warm(cls) -> None:
        from prepline.fasttext_np import warm

        warm()  # numba's first use in a process (~0.5 s: its lowering modules), overlapped with the driver's planning

    def input_columns(self) -> list[Column]:
        cols = [Column(self.config.content_column, "string", nullable=True)]
        if self.config.lang_models:
            cols.append(Column(self.config.lang_column, "string", nullable=True, fix="run lang_id before, or drop lang_models"))
        return cols

    def added_columns(self) -> list[str]:
        return [self.config.score_column]

    def check_on_driver(self, schema: pa.Schema, where: str) -> None:
        for lang, path in self.config.models().items():
            check_model(path, f"lang_models[{lang}]" if lang else "model_path")

    def check_resources(self) -> None:
        """Every model exists (the pipeline's plan step, before any cluster starts); ``run:<stage>``
        names a model the run makes itself."""
        for lang, path in self.config.models().items():
            if not path.startswith("run:"):
                check_model(path, f"lang_models[{lang}]" if lang else "model_path")

    def setup(self, ctx) -> None:
        c = self.config
        self._models = {lang: Scorer(load_classifier(path, c.positive_label, f"lang_models[{lang}]" if lang else "model_path"),
                                     label_name(c.positive_label))
                        for lang, path in c.models().items()}

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        c = self.config
        n = table.num_rows
        texts = ts.as_array(table.column(c.content_column))
        scores = np.zeros(n, dtype=np.float64)
        scored = np.zeros(n, dtype=bool)
        counters: dict[str, int] = {}
        routes: list[tuple[str, np.ndarray | None]] = []
        if c.lang_models:
            langs = pc.fill_null(ts.as_array(table.column(c.lang_column)), "").to_numpy(zero_copy_only=False)
            per = [lang for lang in self._models if lang]
            for lang in per:
                routes.append((lang, np.flatnonzero(langs == lang)))
            if "" in self._models:
                routes.append(("", np.flatnonzero(~np.isin(langs, per))))
        else:
            routes.append(("", None))  # every document
        for lang, rows in routes:
            counters[f"quality_scored_{lang or 'all'}"] = n if rows is None else int(len(rows))
            if rows is None:
                scored[:] = True
                scores[:] = self._models[lang](texts, c.max_chars)
            elif len(rows):
                scored[rows] = True
                scores[rows] = self._models[lang](texts.take(pa.array(rows)), c.max_chars)
        scores = np.round(scores, 6)
        counters[NO_MODEL] = int((~scored).sum())
        counters["quality_pass"] = int((scored & (scores >= c.threshold)).sum())
        col = pa.array(scores, pa.float64(), mask=~scored)
        return Output.of(table.append_column(c.score_column, col), None, counters)
