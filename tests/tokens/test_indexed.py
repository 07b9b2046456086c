"""The Megatron indexed dataset, checked with megatron-core's own reader, writer and GPT dataset.

megatron-core (0.16.1, installed --no-deps by scripts/setup.sh) is the reference: the stage's
.bin/.idx must read back with its ``IndexedDataset`` document by document as the ``tokenizers``
library encodes the text, its ``IndexedDatasetBuilder`` must write the same bytes as our writer, and
its ``GPTDataset`` + ``BlendedDataset`` (what Megatron-LM trains from) must take the branches'
prefixes together.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import tree_bytes
from prepline.data_access import open_location
from prepline.engine import RunOptions, run_transform
from prepline.tokens.indexed import Dataset, document_stream, index_bytes, token_dtype
from prepline.tokens.output import megatron_data_path, read_token_index

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def megatron():
    """megatron-core's dataset modules (importing them takes a few seconds: once per module)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed": expected on CPU
        from megatron.core.datasets import blended_megatron_dataset_builder, gpt_dataset, indexed_dataset
    return {"indexed": indexed_dataset, "gpt": gpt_dataset, "builder": blended_megatron_dataset_builder}


@pytest.fixture(scope="module")
def branches(tmp_path_factory) -> dict:
    """Two 'branches' of a real multilingual sample, tokenized by the stage with one shared tokenizer."""
    from prepline.sample import build_sample
    from prepline.tokens.shared import train_shared_tokenizer

    root = tmp_path_factory.mktemp("megatron")
    build_sample(str(root / "sample"), docs=400, files=4)
    for name, files in (("a", (0, 1, 2)), ("b", (3,))):
        (root / name).mkdir()
        for i in files:
            (root / name / f"part-{i:05d}.parquet").write_bytes((root / "sample" / f"part-{i:05d}.parquet").read_bytes())
    rec = train_shared_tokenizer([str(root / "a"), str(root / "b")], str(root / "tokenizer"), {"vocab_size": 700})
    for name in ("a", "b"):
        run_transform("tokenization", {"tokenizer": str(root / "tokenizer"), "tokens_column": ""},
                      RunOptions(str(root / name), str(root / f"tok_{name}"), workers=1, progress=False))
    return {"root": root, "record": rec, "outputs": [root / "tok_a", root / "tok_b"]}


def _texts(src: Path) -> list[str]:
    return [t for rel in sorted(tree_bytes(src)) for t in pq.read_table(src / rel, columns=["contents"]).column("contents").to_pylist()]


@pytest.mark.slow
def test_megatron_core_reads_every_document_as_the_tokenizer_encodes_it(branches, megatron):
    from tokenizers import Tokenizer

    root = branches["root"]
    tok = Tokenizer.from_file(str(root / "tokenizer" / "tokenizer.json"))
    tok.encode_special_tokens = True  # the stage's rule: text spelling a special token is text
    for name in ("a", "b"):
        out = root / f"tok_{name}"
        index = read_token_index(str(out))
        ds = megatron["indexed"].IndexedDataset(str(out / "tokens" / "text_document"))
        texts = _texts(out)
        want = [e.ids + [index["eos_id"]] for e in tok.encode_batch(texts, add_special_tokens=False) if e.ids]
        assert len(ds) == len(want) == index["num_documents"] and index["empty_documents"] == len(texts) - len(want)
        assert all(ds[i].tolist() == w for i, w in enumerate(want)), name
        assert ds.index.dtype == np.uint16 and ds.document_indices.tolist() == list(range(len(want) + 1))
        assert ds.sequence_lengths.tolist() == [len(w) for w in want]
        assert index["eos_id"] == tok.token_to_id("<|endoftext|>")


@pytest.mark.slow
def test_megatron_gpt_dataset_trains_from_the_branches_together(branches, megatron):
    """Megatron-LM's own training dataset over the two prefixes, weighted as `prepline tokens data-path` prints."""
    outputs = [str(p) for p in branches["outputs"]]
    words = megatron_data_path(outputs).split()
    weights, prefixes = [float(w) for w in words[::2]], words[1::2]
    assert prefixes == [f"{p}/tokens/text_document" for p in outputs]
    assert weights == [float(read_token_index(p)["num_tokens"]) for p in outputs]

    eod = read_token_index(outputs[0])["eos_id"]

    class Tok:  # what GPTDataset asks of a tokenizer: the end-of-document and pad ids
        eod, pad, vocab_size, unique_identifiers = 0, -1, 700, {"class": "prepline-test"}

    L = 32
    cfg = megatron["gpt"].GPTDatasetConfig(
        random_seed=1, sequence_length=L, blend=(prefixes, weights), split="1,0,0", tokenizer=Tok(), reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=False, path_to_cache=None, mmap_bin_files=True)
    train, _, _ = megatron["builder"].BlendedMegatronDatasetBuilder(megatron["gpt"].GPTDataset, [200, 0, 0], lambda: True, cfg).build()
    assert len(train) >= 200  # (megatron-core rounds the blend up)
    docs = set()
    for p in outputs:
        ds = Dataset(open_location(f"{p}/tokens"), "text_document")
        docs |= {tuple(ds.doc(i).tolist()) for i in range(len(ds))}
    used = set()
    for k in range(0, 200, 7):
        s = train[k]
        used.add(int(s["dataset_id"]))
        window = s["tokens"].tolist() + s["labels"].tolist()[-1:]
        assert len(window) == L + 1
        # between two end-of-document ids lies a whole document of one of the branches
        cuts = [i for i, t in enumerate(window) if t == eod]
        for a, b in zip(cuts, cuts[1:]):
            assert tuple(window[a + 1 : b + 1]) in docs
    assert used == {0, 1}  # both branches feed the samples


def test_our_writer_and_megatron_cores_write_the_same_bytes(tmp_path, megatron):
    rng = np.random.default_rng(5)
    for vocab in (50_000, 100_000):  # uint16, and int32 past 65,536 ids
        dtype = token_dtype(vocab)
        counts = rng.integers(0, 40, 60)
        counts[[3, 17]] = 0  # empty documents are left out
        values = rng.integers(0, vocab - 1, int(counts.sum()))
        stream, lengths = document_stream(values, counts, vocab - 1, dtype)
        prefix = str(tmp_path / f"mc{vocab}")
        builder = megatron["indexed"].IndexedDatasetBuilder(prefix + ".bin", dtype=dtype.type)
        start = 0
        for n in lengths:
            doc = stream[start : start + n]
            builder.add_document(doc.astype(np.int64), [len(doc)])
            start += n
        builder.finalize(prefix + ".idx")
        assert Path(prefix + ".bin").read_bytes() == stream.tobytes()
        assert Path(prefix + ".idx").read_bytes() == index_bytes(lengths, dtype)
        ours = Dataset(open_location(str(tmp_path)), f"mc{vocab}")  # and our reader reads what megatron-core wrote
        assert len(ours) == len(lengths) and np.array_equal(ours.tokens, stream) and ours.index.dtype == dtype


def test_the_index_written_piece_by_piece_is_the_same_bytes():
    """write_tokens_dir streams the merged .idx part by part (memory follows a part): the same bytes
    as index_bytes of every length at once (which megatron-core's builder writes, test above)."""
    import hashlib
    import io

    from prepline.tokens.indexed import write_index

    rng = np.random.default_rng(7)
    for dtype in (np.dtype(np.uint16), np.dtype(np.int32)):
        pieces = [rng.integers(1, 5000, int(n)).astype(np.int32) for n in (3, 0, 1, 40, 0, 17)]
        lengths = np.concatenate(pieces)
        f = io.BytesIO()
        sha = write_index(f, lambda: iter(pieces), len(lengths), dtype)
        assert f.getvalue() == index_bytes(lengths, dtype) and sha == hashlib.sha256(f.getvalue()).hexdigest()
    f = io.BytesIO()
    write_index(f, lambda: iter([]), 0, np.dtype(np.uint16))
    assert f.getvalue() == index_bytes(np.zeros(0, np.int32), np.dtype(np.uint16))
