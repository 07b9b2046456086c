"""The Megatron indexed dataset: a ``.bin`` of token ids and an ``.idx`` that cuts it into documents.

This is the format Megatron-LM's ``--data-path`` and NeMo's ``data_prefix`` train from (a "prefix"
names the pair: ``<prefix>.bin`` + ``<prefix>.idx``). The layout, little-endian, as megatron-core
0.16's ``megatron/core/datasets/indexed_dataset.py`` (``_IndexReader``) reads it::

    .idx  magic b"MMIDIDX\\x00\\x00" (9 bytes) | version u64 = 1 | dtype code u8
          | sequence count u64 (S) | document count u64 (D, documents + 1)
          | sequence lengths int32[S] | sequence pointers int64[S] (byte offsets into .bin)
          | document indices int64[D] (0, then the sequence count at the end of each document)
    .bin  the ids of every sequence back to back, in the dtype of the code

prepline writes **one sequence per document**: its ids followed by one end-of-document id (what
Megatron's ``tools/preprocess_data.py --append-eod`` writes without sentence splitting), so the
document indices are ``0, 1, ..., S`` and the ``.bin`` read whole is the training token stream.
Documents with no ids are left out (they would hold nothing but the end-of-document id).
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from prepline.data_access import Location
from prepline.errors import InputError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
#: the dtype codes of megatron-core's ``DType`` enum
CODES = {np.dtype(t): c for t, c in ((np.uint8, 1), (np.int8, 2), (np.int16, 3), (np.int32, 4), (np.int64, 5),
                                     (np.float64, 6), (np.float32, 7), (np.uint16, 8))}
_DTYPES = {c: t for t, c in CODES.items()}
#: magic, version, dtype code, sequence count, document count
_HEADER = struct.Struct("<9sQBQQ")
_REFIX = "re-run the tokenization stage (the file is not what it wrote)"


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id of the vocabulary fits, else int32 (Megatron has no uint32 code)."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def bin_name(prefix: str) -> str:
    return f"{prefix}.bin"


def idx_name(prefix: str) -> str:
    return f"{prefix}.idx"


@dataclass(frozen=True)
class Index:
    """A parsed ``.idx``: one entry per sequence (= per document for prepline's files)."""

    dtype: np.dtype
    lengths: np.ndarray  # int32, tokens per sequence
    pointers: np.ndarray  # int64, byte offset of each sequence in the .bin
    documents: np.ndarray  # int64, document boundaries in sequences (D = documents + 1)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum(dtype=np.int64))

    @property
    def num_documents(self) -> int:
        return int(self.documents.size - 1)


def index_bytes(lengths: np.ndarray, dtype: np.dtype) -> bytes:
    """The ``.idx`` of sequences with these lengths, one document each, packed back to back."""
    buf = io.BytesIO()
    write_index(buf, lambda: iter([lengths]), len(lengths), dtype)
    return buf.getvalue()


def write_index(f, pieces: Callable[[], Iterator[np.ndarray]], count: int, dtype: np.dtype) -> str:
    """Write to ``f`` the ``.idx`` of :func:`index_bytes` for ``count`` sequences whose lengths
    ``pieces()`` gives piece by piece (it is called twice: the lengths, then the pointers), so memory
    follows a piece, not the dataset (20 bytes a document). Returns the SHA-256 of what it wrote."""
    h = hashlib.sha256()

    def put(b: bytes) -> None:
        f.write(b)
        h.update(b)

    put(_HEADER.pack(MAGIC, VERSION, CODES[np.dtype(dtype)], count, count + 1))
    for lengths in pieces():
        lengths = np.asarray(lengths, np.int64)
        if lengths.size and (int(lengths.min()) < 0 or int(lengths.max()) > np.iinfo(np.int32).max):
            raise InputError(f"a document of {int(lengths.max()):,} tokens does not fit the int32 length of a Megatron index",
                             "split such documents before tokenization")
        put(lengths.astype(np.int32).tobytes())
    offset = 0
    for lengths in pieces():
        ends = offset + np.cumsum(np.asarray(lengths, np.int64) * dtype.itemsize)
        put(np.r_[offset, ends[:-1]].astype(np.int64).tobytes() if len(ends) else b"")
        offset = int(ends[-1]) if len(ends) else offset
    for a in range(0, count + 1, 1 << 20):
        put(np.arange(a, min(count + 1, a + (1 << 20)), dtype=np.int64).tobytes())
    return h.hexdigest()


def parse_index(data, where: str) -> Index:
    """Parse and check an ``.idx`` (bytes or a buffer); ``where`` names it in errors."""
    buf = memoryview(data)
    if buf.nbytes < _HEADER.size:
        raise InputError(f"{where}: {buf.nbytes} bytes is too short for a Megatron index", _REFIX)
    magic, version, code, seqs, docs = _HEADER.unpack_from(buf)
    if magic != MAGIC or version != VERSION or code not in _DTYPES:
        raise InputError(f"{where}: not a Megatron index (magic {magic!r}, version {version}, dtype code {code})", _REFIX)
    want = _HEADER.size + seqs * 12 + docs * 8
    if buf.nbytes != want or docs < 1:
        raise InputError(f"{where}: {buf.nbytes} bytes, but {seqs} sequences and {docs} document indices need {want}"
                         " (multimodal indices are not supported)", _REFIX)
    off = _HEADER.size
    lengths = np.frombuffer(buf, np.int32, seqs, off)
    pointers = np.frombuffer(buf, np.int64, seqs, off + 4 * seqs)
    documents = np.frombuffer(buf, np.int64, docs, off + 12 * seqs)
    if documents[0] != 0 or documents[-1] != seqs or (docs > 1 and bool((np.diff(documents) < 0).any())):
        raise InputError(f"{where}: the document indices do not run from 0 to {seqs} in order", _REFIX)
    return Index(_DTYPES[code], lengths, pointers, documents)


def document_stream(values: np.ndarray, counts: np.ndarray, eos_id: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(the .bin's ids, the lengths): each document with at least one id, followed by ``eos_id``.

    ``values`` are the ids of all documents back to back, ``counts`` how many each has.
    """
    if values.size and (int(values.min()) < 0 or int(values.max()) > np.iinfo(dtype).max):
        raise InputError(f"token ids {int(values.min())}..{int(values.max())} do not fit {dtype.name}",
                         "the ids were not made by this tokenizer: rerun the stage with --overwrite")
    counts = np.asarray(counts, np.int64)
    keep = counts > 0
    ends = np.cumsum(counts)[keep]
    return np.insert(values.astype(dtype, copy=False), ends, eos_id), counts[keep] + 1


class Dataset:
    """One prefix (``<name>.bin`` + ``<name>.idx`` in ``loc``), checked; local data is memory-mapped.

    ``tokens`` is the whole ``.bin`` as one array (the stream); ``doc(i)`` a document's ids. With
    ``stream`` a remote ``.bin`` is a :class:`prepline.tokens.cache.RemoteStream` (read in ranges).
    """

    def __init__(self, loc: Location, name: str, mmap: bool = True, stream: bool = False):
        self.where = loc.path(name)
        try:
            self.index = parse_index(loc.read_bytes(idx_name(name)), loc.path(idx_name(name)))
            local = "://" not in loc.uri
            if not local and stream:  # read in ranges through the node's cache (prepline.tokens.cache)
                from prepline.tokens.cache import RemoteStream

                self.tokens = RemoteStream(loc, bin_name(name), self.index.dtype)
                size = self.tokens.nbytes
            elif local and mmap:
                size = os.path.getsize(loc.path(bin_name(name)))
                n = size // self.index.dtype.itemsize
                self.tokens = np.memmap(loc.path(bin_name(name)), self.index.dtype, "r", shape=(n,)) if n else np.zeros(0, self.index.dtype)
            else:
                data = loc.read_bytes(bin_name(name))
                size = len(data)
                self.tokens = np.frombuffer(data, self.index.dtype)
        except FileNotFoundError as e:
            raise InputError(f"{self.where}: the Megatron dataset is incomplete ({e.filename or e} is missing)", _REFIX) from None
        expected = self.index.num_tokens * self.index.dtype.itemsize
        if size != expected:
            raise InputError(f"{loc.path(bin_name(name))} has {size:,} bytes, its index says {expected:,}", _REFIX)
        starts = np.zeros(len(self.index.lengths), np.int64)
        if starts.size > 1:
            np.cumsum(self.index.lengths[:-1].astype(np.int64) * self.index.dtype.itemsize, out=starts[1:])
        if not np.array_equal(starts, self.index.pointers):
            raise InputError(f"{self.where}.idx: the sequences are not packed back to back in the .bin", _REFIX)
        self.starts = starts // self.index.dtype.itemsize

    def __len__(self) -> int:
        return len(self.index.lengths)

    def doc(self, i: int) -> np.ndarray:
        s = int(self.starts[i])
        return self.tokens[s : s + int(self.index.lengths[i])]

