"""The ``tokens/`` folder of a tokenization output: one Megatron dataset, its tokenizer, ``index.json``.

::

    <output>/tokens/
        text_document.bin, text_document.idx   the Megatron indexed dataset (prefix tokens/text_document)
        tokenizer.json                         the tokenizer that made it
        index.json                             what it holds (format prepline.tokens, version 2)

The stage's workers write one part (a ``.bin`` + ``.idx``) per batch of an input file into the
stage's work folder; :func:`write_tokens_dir` merges the parts (files in sorted path order, batches
in file order) into the branch's one prefix, streaming the ``.bin`` (memory: one part). Several branches are *not* merged: a training run reads several prefixes (the trainer
here, Megatron's ``--data-path w1 p1 w2 p2``, NeMo's ``data_prefix``), so no copy of the data is
made and the mix of languages stays a training-time choice (:func:`megatron_data_path`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from prepline.data_access import Location, open_location
from prepline.errors import InputError
from prepline.tokens.indexed import Dataset, bin_name, idx_name, parse_index, token_dtype, write_index
from prepline.tokens.tokenizer import TOKENIZER_FILE, LoadedTokenizer, tokenizers_version

TOKENS_DIR = "tokens"
INDEX = "index.json"
PREFIX = "text_document"
FORMAT = "prepline.tokens"
FORMAT_VERSION = 2
#: where the workers put their parts, under the stage's work folder
PARTS_DIR = "tokens"


def part_dir(rel: str) -> str:
    """The folder of the parts of input file ``rel`` (under the work folder)."""
    return f"{PARTS_DIR}/{rel}"


def part_name(rel: str, first_row: int) -> str:
    """The prefix of the part of input file ``rel`` whose batch starts at row ``first_row``."""
    return f"{part_dir(rel)}/{first_row:012d}"


def list_parts(work: Location, rel: str) -> list[str]:
    """The parts of input file ``rel``, in file order."""
    prefix = part_dir(rel)
    return [f.rel[: -len(".idx")] for f in work.list_all(prefix)
            if f.rel.startswith(prefix + "/") and f.rel.endswith(".idx") and "/." not in f.rel]


@dataclass(frozen=True)
class Source:
    """One output Parquet file and the parts its documents went into."""

    file: str  # the output file (relative to the stage output)
    parts: list[str]  # the parts' prefixes in the work folder, in file order
    documents: int  # documents of the file, empty ones included


def write_tokens_dir(work: Location, out: Location, sources: list[Source], lt: LoadedTokenizer) -> dict:
    """Merge the parts of ``sources`` (in this order) into ``out``'s one prefix; write the tokenizer
    and ``index.json``; return the summary for metadata.json. The ``.bin`` is streamed part by part,
    and so is the ``.idx`` (each part's index is read again where it is needed: memory follows a
    part, not the dataset)."""
    vocab_size = lt.vocab_size
    dtype = token_dtype(vocab_size)
    parts = [p for s in sources for p in s.parts]
    sizes = {}  # part -> (documents, tokens, sequences)
    for p in parts:
        i = _part_index(work, p, dtype)
        sizes[p] = (i.num_documents, i.num_tokens, len(i.lengths))
    out.delete("")  # idempotent: a rerun rewrites everything
    h = hashlib.sha256()
    with out.open_output(bin_name(PREFIX)) as f:
        for p in parts:
            data = work.read_bytes(bin_name(p))
            if len(data) != sizes[p][1] * dtype.itemsize:
                raise InputError(f"{work.path(bin_name(p))} has {len(data):,} bytes, its index says "
                                 f"{sizes[p][1] * dtype.itemsize:,}", "rerun the stage with --overwrite")
            f.write(data)
            h.update(data)
            del data
    num_documents = sum(n for _, _, n in sizes.values())  # one sequence per document
    with out.open_output(idx_name(PREFIX)) as f:
        idx_sha = write_index(f, lambda: (_part_index(work, p, dtype).lengths for p in parts), num_documents, dtype)
    tok_bytes = lt.json_text.encode("utf-8")
    out.write_bytes(TOKENIZER_FILE, tok_bytes)
    listing, first = [], 0
    for s in sources:
        docs, tokens = sum(sizes[p][0] for p in s.parts), sum(sizes[p][1] for p in s.parts)
        listing.append({"file": s.file, "documents": s.documents, "empty_documents": s.documents - docs,
                        "first_document": first, "tokens": tokens})
        first += docs
    warnings = [] if num_documents else ["no document has any token: the dataset is empty"]
    index = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "prefix": PREFIX,
        "dtype": dtype.name,
        "vocab_size": vocab_size,
        "eos_id": lt.eos_id,
        "eos_token": lt.eos_token,
        "tokenizer": TOKENIZER_FILE,
        "tokenizer_source": lt.source,
        "tokenizer_sha256": hashlib.sha256(tok_bytes).hexdigest(),
        "tokenizers_version": tokenizers_version(),
        "num_documents": int(num_documents),
        "empty_documents": sum(r["empty_documents"] for r in listing),
        "num_tokens": int(sum(t for _, t, _ in sizes.values())),
        "bin_sha256": h.hexdigest(),
        "idx_sha256": idx_sha,
        "sources": listing,
        "warnings": warnings,
    }
    out.write_bytes(INDEX, (json.dumps(index, indent=2) + "\n").encode("utf-8"))
    return {"tokens_dir": TOKENS_DIR, "prefix": f"{TOKENS_DIR}/{PREFIX}", "documents": index["num_documents"],
            "empty_documents": index["empty_documents"],
            # the .bin's tokens: the documents' own (counters.document_tokens) + one end-of-document token each
            "tokens_with_eod": index["num_tokens"], "eod_tokens": index["num_documents"], "dtype": dtype.name,
            "vocab_size": vocab_size, "eos_id": lt.eos_id, "warnings": warnings}


def _part_index(work: Location, part: str, dtype: np.dtype):
    i = parse_index(work.read_bytes(idx_name(part)), work.path(idx_name(part)))
    if i.dtype != dtype:
        raise InputError(f"{work.path(idx_name(part))} holds {i.dtype.name} ids, this run writes {dtype.name}",
                         "rerun the stage with --overwrite")
    return i


# ----------------------------------------------------------------------------------------------
# reading


def tokens_location(path: str) -> Location:
    """The ``tokens/`` folder of a tokenization output (``path`` is the output or that folder)."""
    loc = open_location(path)
    if loc.read_text(INDEX) is None and loc.read_text(f"{TOKENS_DIR}/{INDEX}") is not None:
        return loc.sub(TOKENS_DIR)
    return loc


def read_token_index(path: str) -> dict:
    """The ``index.json`` of a tokenization output (or of its ``tokens/`` folder), checked."""
    loc = tokens_location(path)
    text = loc.read_text(INDEX)
    if text is None:
        raise InputError(f"{loc.path(INDEX)} does not exist: not a tokenization output",
                         "point at the tokenization stage's output (or its tokens/ folder), written with write_tokens=true")
    index = json.loads(text)
    if index.get("format") != FORMAT or index.get("version") != FORMAT_VERSION:
        raise InputError(
            f"{loc.path(INDEX)}: format {index.get('format')!r} version {index.get('version')!r} is not {FORMAT} {FORMAT_VERSION}",
            "re-run the tokenization stage with this prepline version",
        )
    return index


def open_tokens(path: str, mmap: bool = True, stream: bool = False) -> tuple[dict, Dataset]:
    """(index.json, the dataset) of a tokenization output, checked against each other; with ``stream``
    a remote one's ids are read in ranges through the node's cache (prepline.tokens.cache)."""
    index = read_token_index(path)
    loc = tokens_location(path)
    ds = Dataset(loc, index["prefix"], mmap, stream)
    if (len(ds), ds.index.num_tokens, ds.index.dtype.name) != (index["num_documents"], index["num_tokens"], index["dtype"]):
        raise InputError(f"{loc.path(index['prefix'])}: {len(ds)} documents, {ds.index.num_tokens} tokens, {ds.index.dtype.name}; "
                         f"index.json says {index['num_documents']}, {index['num_tokens']}, {index['dtype']}",
                         "re-run the tokenization stage (the folder mixes outputs of different runs)")
    return index, ds


def megatron_data_path(outputs: list[str]) -> str:
    """Megatron-LM's ``--data-path`` for these tokenization outputs: ``<tokens> <prefix> ...``,
    each prefix weighted by its token count (the same mix as reading them one after the other)."""
    parts = []
    for path in outputs:
        index = read_token_index(path)
        parts += [str(index["num_tokens"]), tokens_location(path).path(index["prefix"])]
    return " ".join(parts)
