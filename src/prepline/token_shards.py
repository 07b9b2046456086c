"""The token-shard format: the training-ready output of the tokenization stage, and its reader.

``<output>/tokens/`` holds fixed-length rows of the document stream (each document's ids, then the
end-of-document id) in ``.npy`` shards, an ``index.json`` naming every shard with its row count
and SHA-256, and the ``tokenizer.json`` used. The tokenization transform writes it
(:class:`ShardWriter`); the fine-tuning step reads it (:func:`load_token_shards`). Described in
``docs/transforms/tokenization.md``.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Iterator

import numpy as np

from prepline.data_access import open_location
from prepline.errors import InputError

#: where the training-ready output goes, relative to the stage's output folder
TOKENS_DIR = "tokens"
INDEX = "index.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "prepline.tokens"
FORMAT_VERSION = 1


def vocab_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def doc_stream(values: np.ndarray, offsets: np.ndarray, eos_id: int, dtype: np.dtype) -> np.ndarray:
    """The token stream of one file: each document with at least one token, followed by ``eos_id``.

    ``values`` are the ids of all documents back to back, ``offsets`` (from 0) where each starts.
    """
    if values.size and (int(values.min()) < 0 or int(values.max()) > np.iinfo(dtype).max):
        raise InputError(
            f"token ids {int(values.min())}..{int(values.max())} do not fit {dtype.name}",
            "the tokens column was not written by this tokenizer: rerun the stage with --overwrite",
        )
    lens = np.diff(offsets)
    ends = offsets[1:][lens > 0]
    return np.insert(values.astype(dtype), ends, eos_id)


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


class ShardWriter:
    """Cuts a token stream into rows ``stream[i*L : i*L + L + 1]`` and writes shards of rows."""

    def __init__(self, loc, seq_len: int, shard_sequences: int, dtype: np.dtype):
        self.loc, self.L, self.per, self.dtype = loc, seq_len, shard_sequences, dtype
        self.buf = np.zeros(0, dtype)  # stream from the first token not yet a row's start
        self.rows: list[np.ndarray] = []
        self.pending = 0
        self.shards: list[dict] = []
        self.tokens_in = 0

    def add(self, stream: np.ndarray) -> None:
        self.tokens_in += int(stream.size)
        self.buf = np.concatenate([self.buf, stream]) if self.buf.size else stream
        L = self.L
        k = (self.buf.size - 1) // L if self.buf.size > L else 0
        while k:
            take = min(k, self.per - self.pending)
            win = np.lib.stride_tricks.sliding_window_view(self.buf[: take * L + 1], L + 1)[::L]
            self.rows.append(np.array(win, copy=True))
            self.pending += take
            self.buf = self.buf[take * L :]
            k -= take
            if self.pending == self.per:
                self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        arr = np.concatenate(self.rows) if len(self.rows) > 1 else self.rows[0]
        name = f"shard-{len(self.shards):05d}.npy"
        data = _npy_bytes(arr)
        self.loc.write_bytes(name, data)
        self.shards.append({"file": name, "sequences": int(arr.shape[0]), "sha256": hashlib.sha256(data).hexdigest()})
        self.rows, self.pending = [], 0

    def close(self) -> dict:
        self._flush()
        n = sum(s["sequences"] for s in self.shards)
        used = n * self.L + 1 if n else 0
        return {"num_sequences": n, "tokens_used": used, "tokens_dropped": self.tokens_in - used}


# ----------------------------------------------------------------------------------------------
# reading the shards (what the fine-tuning step uses)


def read_token_index(path: str) -> dict:
    """The ``index.json`` of a token-shard folder (``<output>/tokens`` or the stage output itself)."""
    loc = _tokens_location(path)
    try:
        index = json.loads(loc.read_bytes(INDEX).decode("utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{loc.path(INDEX)} does not exist: not a token-shard folder",
            "point at the tokenization stage's output (or its tokens/ folder), written with write_shards=true",
        ) from None
    if index.get("format") != FORMAT or index.get("version") != FORMAT_VERSION:
        raise InputError(
            f"{loc.path(INDEX)}: format {index.get('format')!r} version {index.get('version')!r} is not {FORMAT} {FORMAT_VERSION}",
            "re-run the tokenization stage with this prepline version",
        )
    return index


def _tokens_location(path: str):
    loc = open_location(path)
    if loc.read_text(INDEX) is None and loc.read_text(f"{TOKENS_DIR}/{INDEX}") is not None:
        return loc.sub(TOKENS_DIR)
    return loc


def load_token_shards(path: str, mmap: bool = True) -> Iterator[np.ndarray]:
    """Yield each shard as an array of shape ``(rows, seq_len + 1)`` in order (see index.json).

    ``path`` is the tokenization output (local or ``s3://``) or its ``tokens/`` folder. Local
    shards are memory-mapped when ``mmap``. Yields nothing when the corpus was shorter than one
    sequence (``index['num_sequences'] == 0``). Every shard is checked against the index.
    """
    loc = _tokens_location(path)
    index = read_token_index(path)
    dtype, width = np.dtype(index["dtype"]), index["seq_len"] + 1
    local = not loc.uri.startswith("s3://")
    for s in index["shards"]:
        try:
            if local:
                arr = np.load(loc.path(s["file"]), mmap_mode="r" if mmap else None, allow_pickle=False)
            else:
                arr = np.load(io.BytesIO(loc.read_bytes(s["file"])), allow_pickle=False)
        except FileNotFoundError:
            raise InputError(f"token shard {loc.path(s['file'])} listed in index.json is missing", "re-run the tokenization stage") from None
        except ValueError as e:
            raise InputError(f"token shard {loc.path(s['file'])} is not a valid .npy file ({e})", "re-run the tokenization stage") from None
        if arr.dtype != dtype or arr.shape != (s["sequences"], width):
            raise InputError(
                f"token shard {loc.path(s['file'])} has shape {arr.shape} {arr.dtype}, index.json says ({s['sequences']}, {width}) {dtype}",
                "re-run the tokenization stage (the folder mixes outputs of different runs)",
            )
        yield arr


def stream_from_rows(rows: np.ndarray) -> np.ndarray:
    """Invert the row layout: the covered token stream (rows overlap by one token)."""
    if rows.shape[0] == 0:
        return rows.reshape(-1)
    return np.concatenate([rows[0], rows[1:, 1:].reshape(-1)])
