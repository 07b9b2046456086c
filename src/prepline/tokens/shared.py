"""One tokenizer for every branch of a run: a byte-level BPE trained once on a sample of each input.

In the super pipeline the language branches run in parallel, each its own stage; a tokenizer each
branch trained for itself would give the fine-tuning step as many vocabularies as branches. This
trains one, before the branches tokenize, on a sample drawn from every branch's folder (e.g. each
branch's filter output), and every branch's tokenization stage then loads it (its ``tokenizer``
parameter names the output folder or its ``tokenizer.json``)::

    prepline tokens train-tokenizer --input <work>/<run>/lang=en/filter --input <work>/<run>/lang=ja/filter \\
        --output <work>/<run>/tokenizer

How much text each input gives: ``train_max_chars`` shared in proportion to ``size ** alpha``
(the size is the bytes of its Parquet files, known from the listing): ``alpha = 1`` follows the
sizes, ``alpha = 0`` gives every input the same share, and the default 0.5 lifts small languages
without letting them dominate. An input gives at most what it has. Within an input, files are
read in a seeded order, each giving a seeded random sample of at most ``chars_per_file``
characters, until the input's share is reached: the files read do not grow with the data.

The output folder holds ``tokenizer.json`` and ``tokenizer_train.json`` (what trained it; written
last). Training is deterministic: the same inputs and parameters give the same bytes, and a rerun
with the same fingerprint (parameters + every input's file listing) returns at once (a retried
KFP step does not train again).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from prepline.config import TransformConfig, param
from prepline.context import FileTask, iter_checked
from prepline.data_access import FileInfo, Location, open_location
from prepline.errors import ConfigError, InputError
from prepline.tokens.tokenizer import (TOKENIZER_FILE, no_text, sample_streamed, texts_in_batches, tokenizers_version,
                                       train_bpe)
from prepline.transform import Column

RECORD = "tokenizer_train.json"
RECORD_FORMAT = "prepline.shared_tokenizer"


@dataclass(frozen=True)
class SharedTokenizerConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text in every input")
    vocab_size: int = param(8192, "vocabulary size of the BPE", min=260, max=1_000_000)
    train_max_chars: int = param(5_000_000, "characters that train the tokenizer, shared by the inputs", min=1_000)
    alpha: float = param(0.5, "input i's share of train_max_chars is proportional to its size ** alpha "
                              "(1: by size; 0: equal shares)", min=0.0, max=1.0)
    chars_per_file: int = param(500_000, "at most this many characters sampled from one file", min=1_000)
    seed: int = param(42, "seed of the file order and of the document sample", min=0)

    def validate(self) -> None:
        if not self.content_column.strip():
            raise ConfigError("content_column must not be empty", "name the text column, e.g. contents")


class _Reader:
    """The checked read of an input file (the same checks as a stage's), of the text column only."""

    def __init__(self, column: str):
        self.column = column

    def input_columns(self) -> list[Column]:
        return [Column(self.column, "string")]

    def check_schema(self, schema: pa.Schema, where: str) -> None:
        self.input_columns()[0].check(schema, where, "content_column")

    def batches(self, loc: Location, f: FileInfo) -> Callable[[], Iterator[pa.ChunkedArray]]:
        """The file's text column, batch by batch (for :func:`sample_streamed`, which reads it twice)."""
        task = FileTask(loc.path(f.rel), f.rel, f.size)
        return lambda: (t.column(self.column) for t in iter_checked(loc, task, self, [self.column]))


def _listings(inputs: list[str]) -> list[tuple[Location, list[FileInfo]]]:
    if not inputs:
        raise ConfigError("no input given", "pass one folder (or s3:// URI) of Parquet files per branch")
    if len(set(inputs)) != len(inputs):
        raise ConfigError(f"an input is given twice ({inputs})", "pass each branch's folder once")
    out = []
    for uri in inputs:
        loc = open_location(uri)
        if not loc.exists():
            raise InputError(f"input folder {loc.uri} does not exist", "pass the folder of each branch (e.g. its filter output)")
        out.append((loc, loc.list_files()))
    return out


def _fingerprint(cfg: SharedTokenizerConfig, listings) -> str:
    files = [[loc.uri, [[f.rel, f.size] for f in files]] for loc, files in listings]
    return hashlib.sha256(json.dumps({"config": cfg.to_dict(), "inputs": files}, sort_keys=True).encode()).hexdigest()


def shares(sizes: list[int], total: int, alpha: float) -> list[int]:
    """``total`` characters shared in proportion to ``size ** alpha`` (an empty input gets nothing)."""
    w = np.array([float(s) ** alpha if s > 0 else 0.0 for s in sizes])
    if w.sum() == 0:
        return [0] * len(sizes)
    return [int(x) for x in np.floor(total * w / w.sum())]


def _sample_input(i: int, loc: Location, files: list[FileInfo], quota: int, cfg: SharedTokenizerConfig,
                  reader: _Reader) -> tuple[list[pa.Table], dict]:
    """Samples of the files of one input, in a seeded file order, until ``quota`` characters."""
    order = np.random.default_rng([cfg.seed, i]).permutation(len(files)) if files else []
    tables, left, read = [], quota, 0
    for j in order:
        if left <= 0:
            break
        f = files[int(j)]
        sample = sample_streamed(reader.batches(loc, f), cfg.seed, f"{i}/{f.rel}", min(cfg.chars_per_file, left))
        read += 1
        if sample.num_rows:
            tables.append(sample)
            left -= int(np.sum(sample.column("chars").to_numpy()))
    chars = int(sum(int(np.sum(t.column("chars").to_numpy())) for t in tables))
    return tables, {"input": loc.uri, "files": len(files), "files_read": read, "share_chars": quota,
                    "docs": int(sum(t.num_rows for t in tables)), "chars": chars}


def train_shared_tokenizer(inputs: list[str], output: str, params: dict | None = None) -> dict:
    """Train one tokenizer on a sample of every input; write ``<output>/tokenizer.json`` and the record.

    Returns the record (``tokenizer_train.json``): per input the files listed and read, the
    documents and characters taken; the vocabulary size and the tokenizer's SHA-256.
    """
    cfg = SharedTokenizerConfig.from_params(params or {})
    listings = _listings(list(inputs))
    fingerprint = _fingerprint(cfg, listings)
    out = open_location(output)
    prior = _finished(out, fingerprint)
    if prior is not None:
        return prior
    sizes = [sum(f.size for f in files) for _, files in listings]
    quotas = shares(sizes, cfg.train_max_chars, cfg.alpha)
    reader = _Reader(cfg.content_column)
    samples, per_input = [], []
    for i, ((loc, files), quota) in enumerate(zip(listings, quotas)):
        tables, info = _sample_input(i, loc, files, quota, cfg, reader)
        samples += tables
        per_input.append(info)
    if not samples:
        raise no_text(f"the {sum(len(f) for _, f in listings)} file(s) of the {len(inputs)} input(s)")
    used: dict = {}
    tok = train_bpe(texts_in_batches(samples, used), cfg.vocab_size)
    data = tok.to_str().encode("utf-8")
    out.write_bytes(TOKENIZER_FILE, data)
    record = {"format": RECORD_FORMAT, "version": 1, "fingerprint": fingerprint, "tokenizer": TOKENIZER_FILE,
              "tokenizer_sha256": hashlib.sha256(data).hexdigest(), "vocab_size": tok.get_vocab_size(with_added_tokens=True),
              "train_docs": used["docs"], "train_chars": used["chars"], "inputs": per_input,
              "tokenizers_version": tokenizers_version(), "config": cfg.to_dict()}
    out.write_bytes(RECORD, (json.dumps(record, indent=2) + "\n").encode("utf-8"))
    return record


def _finished(out: Location, fingerprint: str) -> dict | None:
    """The record of an earlier run with the same fingerprint whose tokenizer.json is intact, else None."""
    text = out.read_text(RECORD)
    if text is None:
        return None
    record = json.loads(text)
    try:
        data = out.read_bytes(TOKENIZER_FILE)
    except FileNotFoundError:
        return None
    if record.get("fingerprint") != fingerprint or hashlib.sha256(data).hexdigest() != record.get("tokenizer_sha256"):
        return None
    return record
