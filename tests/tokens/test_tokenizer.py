"""The tokenizer's training sample: drawn from a file read batch by batch, it is the same as from
the whole text column (the sample phase no longer holds a file's text: memory follows the batch)."""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from prepline.tokens.tokenizer import TRAIN_DOC_CHARS, sample_documents, sample_streamed


def whole_column_sample(arr: pa.Array, seed: int, key: str, chars: int) -> pa.Table:
    """The sample as the stage drew it from the whole column before it streamed (the reference)."""
    lens = np.minimum(pc.utf8_length(arr).to_numpy(zero_copy_only=False).astype(np.int64), TRAIN_DOC_CHARS)
    order = np.random.default_rng([seed, zlib.crc32(key.encode("utf-8"))]).permutation(len(arr))
    order = order[lens[order] > 0]
    k = min(int(np.searchsorted(np.cumsum(lens[order]), chars)) + 1, order.size) if chars > 0 else 0
    texts = pc.utf8_slice_codeunits(arr.take(pa.array(order[:k], pa.int64())), 0, TRAIN_DOC_CHARS)
    return pa.table({"text": texts, "chars": pa.array(lens[order[:k]], pa.int64())})


def in_batches(arr: pa.Array, sizes: list[int]):
    cuts = np.cumsum([0, *sizes])
    assert cuts[-1] == len(arr)
    return lambda: (pa.chunked_array([arr.slice(a, b - a)], arr.type) for a, b in zip(cuts, cuts[1:]))


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_the_sample_of_a_file_read_in_batches_is_the_whole_columns(kind):
    rng = np.random.default_rng(3)
    words = ["alpha", "βeta", "日本語", "", "x" * 150_000]  # empty documents are skipped; long ones cut
    texts = [" ".join(rng.choice(words, int(rng.integers(0, 6)))) for _ in range(997)]
    arr = pa.array(texts, kind)
    for chars in (0, 1, 2_000, 60_000, 10**9):
        ref = whole_column_sample(arr, 42, "a/b.parquet", chars)
        for sizes in ([997], [1] * 997, [500, 0, 497], [3, 300, 694]):
            got = sample_streamed(in_batches(arr, sizes), 42, "a/b.parquet", chars)
            assert got.equals(ref), (chars, sizes)
        assert sample_documents(arr, 42, "a/b.parquet", chars).equals(ref)
    assert sample_documents(arr, 42, "other.parquet", 2_000) != whole_column_sample(arr, 42, "a/b.parquet", 2_000)


def test_an_empty_file_gives_an_empty_sample():
    got = sample_streamed(lambda: iter([pa.chunked_array([], pa.string())]), 42, "e.parquet", 1000)
    assert got.num_rows == 0 and got.equals(whole_column_sample(pa.array([], pa.string()), 42, "e.parquet", 1000))
