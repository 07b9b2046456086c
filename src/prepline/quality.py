"""A fastText quality classifier (the DCLM recipe): train it, load it, score with it.

``prepline quality train`` (:func:`train_quality_classifier`) learns a supervised fastText model
from a folder of positive documents (a high-quality reference set) and a folder of negative ones
(e.g. random web text), both Parquet (local or ``s3://``) with a named text column::

    prepline quality train --positive ref/ --negative web/ --output models/quality

A seeded, per-class share of the documents (``test_fraction``) is held out; the model is trained
on the rest and scored on it: precision and recall of the positive label at ``threshold`` and the
ROC AUC, computed here from the predicted probabilities. The output folder holds the model
(``quality.bin``) and its card (``quality_model.json``: data sizes, parameters, metrics, the
model's SHA-256; written last). Training is deterministic for a seed: fastText runs with one
thread (``threads=1``, the default; more threads are faster but make the model depend on
scheduling).

The ``quality_classifier`` transform (transforms/quality_classifier.py) scores documents with
such a model, or any supervised fastText classifier (:func:`load_classifier`).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline.config import TransformConfig, param
from prepline.context import FileTask, iter_checked
from prepline.data_access import open_location, scheme_of
from prepline.errors import ConfigError, InputError, PreplineError
from prepline.transform import Column

log = logging.getLogger("prepline")

MODEL_FILE = "quality.bin"
#: fresh processes tried when fastText reports NaN before the error reaches the user
NAN_ATTEMPTS = 3
CARD_FILE = "quality_model.json"
CARD_FORMAT = "prepline.quality_classifier"
LABEL_PREFIX = "__label__"
BATCH = 16384  # documents per fastText call
MODEL_FIX = ("pass model_path as a local path or s3:// URI of a supervised fastText classifier (.bin/.ftz), "
             "e.g. the quality.bin that `prepline quality train` wrote")


def label_name(label: str) -> str:
    """``hq`` or ``__label__hq`` -> ``__label__hq``."""
    return label if label.startswith(LABEL_PREFIX) else LABEL_PREFIX + label


@dataclass(frozen=True)
class QualityTrainConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text in both folders")
    positive_label: str = param("hq", "label of the positive (high-quality) class in the model")
    negative_label: str = param("lq", "label of the negative class in the model")
    test_fraction: float = param(0.2, "share of each class held out to measure the model", min=0.01, max=0.9)
    max_docs_per_class: int = param(0, "use at most this many documents of each class, a seeded sample (0: all)", min=0)
    max_chars: int = param(0, "train on the first N characters of each document (0: the whole text)", min=0)
    seed: int = param(42, "seed of the held-out split, the sample and fastText's training", min=0)
    epoch: int = param(10, "fastText epochs", min=1, max=1000)
    lr: float = param(0.1, "fastText learning rate", min=0.0001, max=10.0)
    dim: int = param(64, "fastText vector size", min=1, max=1000)
    word_ngrams: int = param(2, "fastText word n-grams (DCLM: 2)", min=1, max=5)
    min_count: int = param(2, "fastText: ignore words seen fewer times", min=1)
    bucket: int = param(100_000, "fastText hash buckets for n-grams (the model's size grows with bucket x dim)", min=0)
    threshold: float = param(0.5, "probability of the positive label from which a document counts as positive (precision, recall)", min=0.0, max=1.0)
    threads: int = param(1, "fastText threads; 1 makes training deterministic for a seed, more are faster but not reproducible", min=1, max=256)

    def validate(self) -> None:
        if not self.content_column.strip():
            raise ConfigError("content_column must not be empty", "name the text column, e.g. --content-column contents")
        pos, neg = label_name(self.positive_label), label_name(self.negative_label)
        for lab in (pos, neg):
            if len(lab) == len(LABEL_PREFIX) or any(ch.isspace() for ch in lab):
                raise ConfigError(f"label {lab!r} is not a fastText label", "pass a label without spaces, e.g. --positive-label hq")
        if pos == neg:
            raise ConfigError(f"positive_label and negative_label are both {pos!r}: a classifier needs two classes",
                              "pass two different labels, e.g. --positive-label hq --negative-label lq")


class _Reader:
    """The checked read of a folder's text column (the same checks as a stage's input)."""

    def __init__(self, column: str):
        self.column = column

    def input_columns(self) -> list[Column]:
        return [Column(self.column, "string", nullable=True)]

    def check_schema(self, schema: pa.Schema, where: str) -> None:
        self.input_columns()[0].check(schema, where, "content_column")


def one_line(text: pa.Array, max_chars: int = 0) -> pa.Array:
    """What fastText reads: one line per document (newlines and carriage returns to spaces), trimmed."""
    text = pc.utf8_trim_whitespace(pc.fill_null(text, ""))
    if max_chars:
        text = pc.utf8_slice_codeunits(text, 0, max_chars)
    return pc.replace_substring_regex(text, r"[\r\n\v\f\x{2028}\x{2029}\x{85}]+", " ")


def read_texts(uri: str, cfg: QualityTrainConfig, role: str) -> tuple[list[str], dict]:
    """The non-blank documents of a folder, one line each, in file order; and what was read."""
    loc = open_location(uri)
    if not loc.exists():
        raise InputError(f"{role} folder {loc.uri} does not exist", f"pass --{role} a folder (or s3:// URI) of Parquet files")
    files = loc.list_files()
    if not files:
        raise InputError(f"{role} folder {loc.uri} holds no Parquet files", f"pass --{role} a folder of Parquet files with a '{cfg.content_column}' column")
    reader = _Reader(cfg.content_column)
    texts: list[str] = []
    docs = blank = 0
    for f in files:
        task = FileTask(loc.path(f.rel), f.rel, f.size)
        for t in iter_checked(loc, task, reader, [cfg.content_column]):
            col = one_line(t.column(cfg.content_column).combine_chunks() if t.num_rows else pa.array([], pa.string()), cfg.max_chars)
            docs += len(col)
            keep = pc.greater(pc.utf8_length(col), 0)
            blank += len(col) - int(pc.sum(keep).as_py() or 0)
            texts.extend(col.filter(keep).to_pylist())
    if not texts:
        raise InputError(f"{role} folder {loc.uri}: no document has text ({docs} documents, all empty)",
                         f"pass --{role} a folder whose '{cfg.content_column}' column holds text")
    return texts, {"uri": loc.uri, "files": len(files), "docs": docs, "blank": blank}


def roc_auc(y: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC from scores (the Mann-Whitney U statistic; tied scores count one half)."""
    y = np.asarray(y, dtype=bool)
    score = np.asarray(score, dtype=np.float64)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("ROC AUC needs both classes")
    order = np.argsort(score, kind="mergesort")
    s = score[order]
    ranks = np.empty(len(s), dtype=np.float64)
    # average rank (1-based) of each run of equal scores
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def metrics(y: np.ndarray, p: np.ndarray, threshold: float) -> dict:
    """Precision, recall (of the positive class at ``threshold``), accuracy and ROC AUC."""
    y = np.asarray(y, dtype=bool)
    pred = np.asarray(p) >= threshold
    tp = int((pred & y).sum())
    fp = int((pred & ~y).sum())
    fn = int((~pred & y).sum())
    return {"docs": int(len(y)), "positive": int(y.sum()), "negative": int((~y).sum()), "threshold": threshold,
            "precision": round(tp / (tp + fp), 4) if tp + fp else 0.0, "recall": round(tp / (tp + fn), 4) if tp + fn else 0.0,
            "accuracy": round(float((pred == y).mean()), 4), "roc_auc": round(roc_auc(y, p), 4)}


def positive_proba(model, lines: list[str], positive: str) -> np.ndarray:
    """Probability of the ``positive`` label for each text (already one line each), by fastText's batch predict."""
    labels = model.get_labels()
    f = model.f
    out = np.zeros(len(lines), dtype=np.float64)
    for a in range(0, len(lines), BATCH):
        chunk = [x + "\n" for x in lines[a:a + BATCH]]  # fastText reads up to its end-of-line token
        labs, probs = f.multilinePredict(chunk, len(labels), 0.0, "replace")
        for i, (ls, ps) in enumerate(zip(labs, probs)):
            for lab, pr in zip(ls, ps):
                if lab == positive:
                    out[a + i] = pr
                    break
    return np.clip(out, 0.0, 1.0)


class Scorer:
    """The ``positive`` label's probability per document of an Arrow text column (0 for a document
    without text): in one compiled pass over the column (:mod:`prepline.fasttext_np`) for the linear
    models it reproduces, fastText's batch predict for the others (character n-grams, hierarchical
    softmax, quantized)."""

    def __init__(self, model, positive: str):
        from prepline.fasttext_np import for_model

        self.model, self.positive = model, positive
        self.linear = for_model(model)

    def __call__(self, texts: pa.Array, max_chars: int = 0) -> np.ndarray:
        """``max_chars``: only the first N characters of each (trimmed) text are read."""
        if max_chars:
            texts = pc.utf8_slice_codeunits(pc.utf8_trim_whitespace(pc.fill_null(texts, "")), 0, max_chars)
        if self.linear is None:
            lines = one_line(texts)
            has = np.asarray(pc.greater(pc.utf8_length(lines), 0).to_numpy(zero_copy_only=False), dtype=bool)
            out = np.zeros(len(texts), dtype=np.float64)
            if has.any():
                out[has] = positive_proba(self.model, lines.filter(pa.array(has)).to_pylist(), self.positive)
            return np.clip(out, 0.0, 1.0)
        p, empty = self.linear.positive(texts, self.positive)
        p[empty] = 0.0
        return np.clip(p, 0.0, 1.0)


def _split(n: int, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    order = rng.permutation(n)
    k = max(1, int(round(n * fraction)))
    return np.sort(order[k:]), np.sort(order[:k])


def train_quality_classifier(positive: str, negative: str, output: str, params: dict | None = None) -> dict:
    """Train a fastText quality classifier on ``positive`` against ``negative`` (Parquet folders);
    write ``<output>/quality.bin`` and ``<output>/quality_model.json``; return the card."""
    import fasttext

    cfg = QualityTrainConfig.from_params(params or {})
    if open_location(positive).uri == open_location(negative).uri:
        raise ConfigError(f"--positive and --negative are the same folder ({positive}): a classifier needs two classes",
                          "pass a folder of high-quality documents as --positive and one of other documents as --negative")
    pos, neg = label_name(cfg.positive_label), label_name(cfg.negative_label)
    data = {}
    rng = np.random.default_rng(cfg.seed)
    train_lines: list[str] = []
    held: list[tuple[str, bool]] = []
    for role, label, is_pos in (("positive", pos, True), ("negative", neg, False)):
        texts, info = read_texts(positive if is_pos else negative, cfg, role)
        if cfg.max_docs_per_class and len(texts) > cfg.max_docs_per_class:
            pick = np.sort(rng.choice(len(texts), cfg.max_docs_per_class, replace=False))
            texts = [texts[i] for i in pick]
        if len(texts) < 2:
            raise InputError(f"{role} folder {info['uri']} has {len(texts)} document with text: too few to train and hold out",
                             f"pass at least 2 documents (some hundreds for a useful model) in --{role}")
        tr, te = _split(len(texts), cfg.test_fraction, rng)
        train_lines += [f"{label} {texts[i]}" for i in tr]
        held += [(texts[i], is_pos) for i in te]
        data[role] = {**info, "label": label, "used": len(texts), "train": int(len(tr)), "test": int(len(te))}
    rng.shuffle(train_lines)  # fastText learns online: classes interleaved
    kwargs = dict(lr=cfg.lr, dim=cfg.dim, epoch=cfg.epoch, wordNgrams=cfg.word_ngrams, minCount=cfg.min_count, bucket=cfg.bucket,
                  thread=cfg.threads, seed=cfg.seed, loss="softmax", verbose=0)
    work = tempfile.mkdtemp(prefix="prepline-quality-")
    try:
        train_file, model_file = os.path.join(work, "train.txt"), os.path.join(work, MODEL_FILE)
        with open(train_file, "w", encoding="utf-8") as fh:
            fh.write("\n".join(train_lines) + "\n")
        del train_lines
        train_s = _fit_in_child(train_file, model_file, kwargs, cfg.lr)
        with open(model_file, "rb") as fh:
            blob = fh.read()
        model = fasttext.load_model(model_file)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    y = np.array([b for _, b in held], dtype=bool)
    t0 = time.perf_counter()
    p = Scorer(model, pos)(pa.array([x for x, _ in held], pa.large_string()))
    predict_s = time.perf_counter() - t0
    out = open_location(output)
    out.write_bytes(MODEL_FILE, blob)
    card = {"format": CARD_FORMAT, "version": 1, "model": MODEL_FILE, "model_sha256": hashlib.sha256(blob).hexdigest(),
            "model_bytes": len(blob), "labels": {"positive": pos, "negative": neg}, "data": data,
            "held_out": metrics(y, p, cfg.threshold), "train_seconds": round(train_s, 3), "predict_seconds": round(predict_s, 3),
            "deterministic": cfg.threads == 1, "fasttext": _fasttext_version(), "config": cfg.to_dict()}
    out.write_bytes(CARD_FILE, (json.dumps(card, indent=2) + "\n").encode("utf-8"))
    return card


def _fit_main() -> None:
    """The child process of :func:`_fit_in_child`: train and save a supervised fastText model; print
    the seconds it took (or fastText's error) as JSON."""
    import sys

    import fasttext

    job = json.loads(sys.stdin.read())
    t0 = time.perf_counter()
    try:
        model = fasttext.train_supervised(input=job["train_file"], **job["kwargs"])
    except RuntimeError as e:
        print(json.dumps({"error": str(e)}))
        return
    seconds = time.perf_counter() - t0
    model.save_model(job["model_file"])
    print(json.dumps({"seconds": seconds}))


def _fit_in_child(train_file: str, model_file: str, kwargs: dict, lr: float) -> float:
    """Train in a fresh interpreter (``python -c``, so that no caller's main module runs again); the
    seconds training took. fastText 0.9.2 trained several times in one process is not reproducible
    (measured with fasttext-numpy2-wheel 0.9.2: the same data, seed and thread=1 gave the same model
    twice, then "Encountered NaN" on the third call), so each training gets a process of its own, as
    the CLI's would be. Even a fresh process reports NaN now and then on a tiny set (3 of 12 on 18
    lines), so a NaN is retried in a new process up to NAN_ATTEMPTS times; a diverging lr fails all."""
    import subprocess
    import sys

    job = json.dumps({"train_file": train_file, "model_file": model_file, "kwargs": kwargs})
    for attempt in range(1, NAN_ATTEMPTS + 1):
        proc = subprocess.run([sys.executable, "-c", "from prepline.quality import _fit_main; _fit_main()"], input=job,
                              capture_output=True, text=True, check=False)
        try:
            answer = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
        except (IndexError, json.JSONDecodeError):
            answer = None
        if answer is None:
            raise InputError(f"fastText training ended its process (exit code {proc.returncode}; {proc.stderr.strip()[-300:] or 'no message'})",
                             "if it ran out of memory: lower bucket, dim or max_docs_per_class, or give the machine more memory")
        if "NaN" not in answer.get("error", "") or attempt == NAN_ATTEMPTS:
            break
        log.warning("fastText reported NaN on attempt %d of %d (on a small training set it does so at random, measured: "
                    "3 of 12 fresh processes on the same 18 lines); training again", attempt, NAN_ATTEMPTS)
    if "error" in answer:  # fastText's own check: "Encountered NaN." (training diverged)
        raise ConfigError(f"fastText training failed: {answer['error']}",
                          f"lower lr (now {lr}, e.g. --lr {lr / 2:g}), or raise bucket or dim (fewer shared hash rows)")
    return float(answer["seconds"])


def _fasttext_version() -> str:
    from importlib import metadata as md

    for dist in ("fasttext-numpy2-wheel", "fasttext-wheel", "fasttext"):
        try:
            return f"{dist} {md.version(dist)}"
        except md.PackageNotFoundError:
            continue
    return "unknown"


# ----------------------------------------------------------------------------------------- loading

def check_model(model_path: str, what: str = "model_path") -> None:
    """Fail fast (on the driver) when the model file cannot be found."""
    if not model_path:
        raise ConfigError(f"{what} is empty: quality_classifier needs a fastText classifier", MODEL_FIX)
    if scheme_of(model_path):
        try:
            size = open_location(model_path).file_size()
        except PreplineError as e:
            raise ConfigError(f"{what} {model_path} cannot be read ({e.message})", MODEL_FIX) from None
        if size is None:
            raise ConfigError(f"{what} {model_path} does not exist", MODEL_FIX)
        return
    if os.path.isdir(model_path) and os.path.isfile(os.path.join(model_path, MODEL_FILE)):
        return
    if not os.path.isfile(model_path):
        raise ConfigError(f"{what} {model_path} is not a file", MODEL_FIX)


def load_classifier(model_path: str, positive_label: str, what: str = "model_path"):
    """A fastText classifier from a local path (or the folder `quality train` wrote) or an s3:// URI,
    checked to be a supervised model that knows ``positive_label``."""
    import fasttext

    check_model(model_path, what)
    tmp = None
    if scheme_of(model_path):
        head, _, name = model_path.rstrip("/").rpartition("/")
        fd, tmp = tempfile.mkstemp(prefix="prepline-model-", suffix="-" + name)
        atexit.register(lambda p=tmp: os.path.exists(p) and os.unlink(p))
        with os.fdopen(fd, "wb") as f:
            f.write(open_location(head).read_bytes(name))
        path = tmp
    elif os.path.isdir(model_path):
        path = os.path.join(model_path, MODEL_FILE)
    else:
        path = model_path
    try:
        model = fasttext.load_model(path)
    except ValueError as e:
        raise ConfigError(f"{what} {model_path}: not a fastText model ({e})", MODEL_FIX) from None
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)  # fastText holds the model in memory
    if not hasattr(getattr(model, "f", None), "multilinePredict"):
        raise ConfigError("the installed fasttext module has no batch predict (multilinePredict)",
                          "install the full binding: pip install 'prepline[langid]' (fasttext-numpy2-wheel==0.9.2), not fasttext-predict")
    labels = [str(x) for x in model.get_labels()]
    if not labels or not all(x.startswith(LABEL_PREFIX) for x in labels[:5]):
        raise ConfigError(f"{what} {model_path}: not a supervised fastText classifier (labels {labels[:3]})", MODEL_FIX)
    pos = label_name(positive_label)
    if pos not in labels:
        raise ConfigError(f"{what} {model_path}: the model has no label {pos} (its labels: {', '.join(labels[:10])})",
                          f"pass positive_label as one of the model's labels, e.g. --positive-label {labels[0][len(LABEL_PREFIX):]}")
    return model
