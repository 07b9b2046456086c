"""hap: a hate/abuse/profanity score per document, from an offline model, sentence by sentence.

The model is the one ``alt-profanity-check`` ships (a word TF-IDF vectorizer and a calibrated
linear SVM, English, loaded with joblib from the package's ``data`` folder or from
``model_path``). A document's ``hap_score`` is the highest probability of any of its sentences:
one offensive sentence in a long article is what matters, and scoring the whole document at
once dilutes it (doc-level AUC on the sample is ~0.5, sentence-level ~0.99).

Vectorised end to end, per batch of ``batch_size`` documents:

1. sentences: an Arrow regex split of the whole column (``.``/``!``/``?`` + space, or line
   breaks); sentences longer than ``max_sentence_words`` words are scored in windows of that
   many words (so a 1 MB document without punctuation still gets a meaningful maximum);
2. features: the vectorizer's own analysis rebuilt with Arrow compute, lower-casing, splitting
   into word tokens, vocabulary lookup with ``index_in``, then TF-IDF weights and L2
   normalisation with scipy. This gives the same matrix as ``vectorizer.transform`` (a test
   compares them) without one Python string per token;
3. one ``predict_proba`` call for all sentences of the batch;
4. document score = ``np.maximum.reduceat`` over each document's sentences (0.0 when it has no
   word).

Adds ``score_column`` (float64 in [0, 1]) and, when ``flag_column`` is set, a boolean
``score >= threshold``. Nothing is removed: the filter stage drops rows
(``--criteria "hap_score < 0.9"``), so thresholds change without rescoring. The model is English:
on other languages it is unreliable (common words such as Dutch "hoe" score high); run it on the
English branch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline.config import TransformConfig, param
from prepline.errors import ConfigError
from prepline.registry import register
from prepline.transform import Column, FileTask, Output, Transform

INSTALL_FIX = "install the hap extra: pip install 'prepline[hap]'"
# A sentence ends at . ! ? (also CJK full stops), optionally followed by closing quotes or
# brackets, then white space; a line break always ends one.
SENTENCE_SPLIT = r"[.!?\x{3002}\x{FF01}\x{FF1F}]+[\"'\x{201D}\x{2019})\]]*\s+|\n+"
# The complement of Python's Unicode \w (letters, digits, underscore): what separates tokens
# for the vectorizer's token_pattern (?u)\b\w\w+\b.
NON_WORD = r"[^\pL\pN_]+"


@dataclass(frozen=True)
class HapConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text")
    score_column: str = param("hap_score", "column to add: highest probability of abusive/profane language over the document's sentences, 0..1")
    threshold: float = param(0.5, "score at or above which flag_column is true", min=0.0, max=1.0)
    flag_column: str = param("hap_flag", "boolean column to add (score >= threshold); '' to add none")
    model_path: str = param(
        "",
        "folder with vectorizer.joblib and model.joblib (a TfidfVectorizer and a classifier with predict_proba); "
        "'' = the model alt-profanity-check ships. Only load files you trust (joblib is pickle)",
    )
    batch_size: int = param(20000, "documents whose sentences are scored in one predict call", min=1)
    max_sentence_words: int = param(30, "longer sentences are scored in half-overlapping windows of this many words", min=1)

    def validate(self) -> None:
        if not self.score_column:
            raise ConfigError("score_column is empty", "name the column to add, e.g. hap_score")
        cols = [self.content_column, self.score_column] + ([self.flag_column] if self.flag_column else [])
        if len(set(cols)) != len(cols):
            raise ConfigError(
                f"content_column, score_column and flag_column must differ (got {', '.join(cols)})", "give each column its own name"
            )
        if self.model_path and not Path(self.model_path).is_dir():
            raise ConfigError(
                f"model_path={self.model_path!r} is not a folder", "pass a folder holding vectorizer.joblib and model.joblib, or '' for the packaged model"
            )


def model_folder(model_path: str = "") -> Path:
    """The folder holding vectorizer.joblib and model.joblib."""
    if model_path:
        return Path(model_path)
    import importlib.util

    spec = importlib.util.find_spec("profanity_check")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("hap needs alt-profanity-check (its model files), which is not installed", INSTALL_FIX)
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def load_model(model_path: str = ""):
    """(vectorizer, classifier) from the folder; clear errors for missing or unusable files."""
    folder = model_folder(model_path)
    missing = [f for f in ("vectorizer.joblib", "model.joblib") if not (folder / f).is_file()]
    if missing:
        raise ConfigError(
            f"hap model file(s) {', '.join(missing)} missing in {folder}",
            "pass --model-path with a folder holding vectorizer.joblib and model.joblib, or reinstall alt-profanity-check",
        )
    try:
        import joblib
    except ImportError:
        raise ConfigError("hap needs joblib and scikit-learn", INSTALL_FIX) from None
    try:
        vec = joblib.load(folder / "vectorizer.joblib")
        clf = joblib.load(folder / "model.joblib")
    except Exception as e:
        raise ConfigError(f"hap model in {folder} cannot be loaded: {type(e).__name__}: {str(e)[:200]}", "check the files (joblib dumps)") from None
    if not hasattr(vec, "vocabulary_") or not hasattr(vec, "idf_") or not hasattr(clf, "predict_proba"):
        raise ConfigError(f"hap model in {folder} is not a fitted TfidfVectorizer + classifier with predict_proba", "use alt-profanity-check's files or the same kind of model")
    p = vec.get_params()
    supported = (
        p.get("analyzer") == "word" and p.get("ngram_range") == (1, 1) and p.get("lowercase") and p.get("norm") == "l2"
        and not p.get("sublinear_tf") and not p.get("binary") and p.get("tokenizer") is None and p.get("preprocessor") is None
        and p.get("token_pattern") == r"(?u)\b\w\w+\b" and p.get("strip_accents") is None
    )
    if not supported:
        raise ConfigError(
            "hap's vectorised features support word-unigram TfidfVectorizers with the default token pattern, lowercase, l2 norm",
            "refit the vectorizer with those settings (stop words, min_df, max_df and vocabulary may differ)",
        )
    return vec, clf


class SentenceScorer:
    """Score Arrow string arrays sentence by sentence with a TF-IDF model, vectorised."""

    def __init__(self, vectorizer, classifier, max_sentence_words: int = 30):
        import scipy.sparse  # noqa: F401  (a scikit-learn dependency)

        vocab = vectorizer.vocabulary_
        terms = sorted(vocab, key=vocab.get)
        if [vocab[t] for t in terms] != list(range(len(terms))):
            raise ConfigError("the vectorizer's vocabulary is not a dense 0..n-1 index", "refit it with scikit-learn")
        self.vocab = pa.array(terms, pa.string())
        self.lookup = pc.SetLookupOptions(value_set=self.vocab)
        self.idf = np.asarray(vectorizer.idf_, dtype=np.float64)
        self.clf = classifier
        self.max_words = max_sentence_words
        self.rows_scored = 0  # sentence windows scored so far (a counter for metadata)

    def sentences(self, arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
        """Flattened sentences and, per document, its number of sentences."""
        parts = pc.split_pattern_regex(arr, SENTENCE_SPLIT)
        counts = np.diff(parts.offsets.to_numpy())
        return parts.flatten(), counts

    def features(self, sentences: pa.Array) -> tuple["object", np.ndarray]:
        """TF-IDF rows (one per sentence window) and the sentence of each row."""
        import scipy.sparse as sp

        n = len(sentences)
        toks = pc.split_pattern_regex(pc.utf8_lower(sentences), NON_WORD)
        per_sentence = np.diff(toks.offsets.to_numpy()).astype(np.int64)
        flat = toks.flatten()
        ids = pc.index_in(flat, options=self.lookup)
        known = pc.is_valid(ids).to_numpy(zero_copy_only=False)
        col = ids.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        sent = np.repeat(np.arange(n, dtype=np.int64), per_sentence)
        # Sentences over max_words words: windows of max_words words every ceil(max_words / 2) words
        # (half overlapping, so any passage of up to max_words // 2 words lies whole inside one).
        w = self.max_words
        stride = (w + 1) // 2  # 2 * stride >= w: a token lies in at most two windows
        pos = np.arange(len(flat), dtype=np.int64) - np.repeat(np.cumsum(per_sentence) - per_sentence, per_sentence)
        windows = np.where(per_sentence > w, -(-np.maximum(per_sentence - w, 0) // stride) + 1, 1)
        first_row = np.cumsum(windows) - windows
        n_rows = int(windows.sum())
        long_tok = per_sentence[sent] > w
        j = np.where(long_tok, np.minimum(pos // stride, windows[sent] - 1), 0)
        row = first_row[sent] + j
        # the token's second window (the one before), where it exists and still covers it
        prev = long_tok & (j >= 1) & (pos < (j - 1) * stride + w)
        row = np.concatenate([row, row[prev] - 1])
        col = np.concatenate([col, col[prev]])
        known = np.concatenate([known, known[prev]])
        x = sp.csr_matrix(
            (self.idf[col[known]], (row[known], col[known])), shape=(n_rows, len(self.idf)), dtype=np.float64
        )
        x.sum_duplicates()  # counts * idf, per (row, term)
        norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
        norms[norms == 0] = 1.0
        x = sp.diags(1.0 / norms) @ x
        row_sentence = np.repeat(np.arange(n, dtype=np.int64), windows)
        return x.tocsr(), row_sentence

    def score(self, arr: pa.Array) -> np.ndarray:
        """Per document: the highest sentence probability (0.0 for documents without words)."""
        ndocs = len(arr)
        out = np.zeros(ndocs, dtype=np.float64)
        if ndocs == 0:
            return out
        sentences, counts = self.sentences(arr)
        if len(sentences) == 0:
            return out
        x, row_sentence = self.features(sentences)
        has_words = np.asarray(x.getnnz(axis=1)) > 0
        self.rows_scored += int(has_words.sum())
        prob = np.zeros(x.shape[0], dtype=np.float64)
        if has_words.any():
            prob[has_words] = self.clf.predict_proba(x[has_words])[:, 1]
        doc_of_sentence = np.repeat(np.arange(ndocs, dtype=np.int64), counts)
        doc_of_row = doc_of_sentence[row_sentence]
        row_counts = np.bincount(doc_of_row, minlength=ndocs)
        nz = row_counts > 0
        starts = (np.cumsum(row_counts) - row_counts)[nz]
        out[nz] = np.maximum.reduceat(prob, starts)
        return out


@register
class Hap(Transform):
    name = "hap"
    Config = HapConfig
    summary = "score hate/abuse/profanity per document (max over sentences, offline sklearn model); optional flag column"
    headline = ("hap_flagged", "hap_windows")
    extra = "hap"

    def input_columns(self) -> list[Column]:
        return [Column(self.config.content_column, "string")]

    def added_columns(self) -> list[str]:
        c = self.config
        return [c.score_column] + ([c.flag_column] if c.flag_column else [])

    def check_on_driver(self, schema: pa.Schema, where: str) -> None:
        model_folder(self.config.model_path)  # a missing package or folder fails before any batch
        load_model(self.config.model_path)

    def setup(self, ctx) -> None:
        vec, clf = load_model(self.config.model_path)
        self._scorer = SentenceScorer(vec, clf, self.config.max_sentence_words)

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        c = self.config
        col = table.column(c.content_column)
        scores = np.zeros(table.num_rows, dtype=np.float64)
        pos, rows_before = 0, self._scorer.rows_scored
        for arr in col.chunks:
            for start in range(0, len(arr), c.batch_size):
                part = arr.slice(start, c.batch_size)
                scores[pos : pos + len(part)] = self._scorer.score(part)
                pos += len(part)
        table = table.append_column(c.score_column, pa.array(scores, pa.float64()))
        counters = {"hap_windows": self._scorer.rows_scored - rows_before}
        if c.flag_column:
            flag = scores >= c.threshold
            table = table.append_column(c.flag_column, pa.array(flag, pa.bool_()))
            counters["hap_flagged"] = int(flag.sum())
        return Output.of(table, counters=counters)
