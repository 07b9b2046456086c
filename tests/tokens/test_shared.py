"""One tokenizer for every branch: trained once on a sample of each input, deterministic, resumable;
the branches' tokenization stages then share one vocabulary."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import write_parquet
from prepline.cli import main as cli_main
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, InputError
from prepline.tokens.output import read_token_index
from prepline.tokens.shared import RECORD, shares, train_shared_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def langs(tmp_path_factory) -> dict[str, Path]:
    """Three language folders of real text (the sample's documents split by their true language)."""
    from prepline.sample import build_sample

    root = tmp_path_factory.mktemp("shared")
    build_sample(str(root / "sample"), docs=600, files=3)
    lang = dict(zip(*pq.read_table(root / "sample" / "_truth" / "docs.parquet", columns=["sample_id", "lang"]).to_pydict().values()))
    by_lang: dict[str, list[str]] = {}
    for f in sorted((root / "sample").glob("part-*.parquet")):
        for r in pq.read_table(f, columns=["sample_id", "contents"]).to_pylist():
            if lang[r["sample_id"]] in ("en", "ja", "fr") and r["contents"]:
                by_lang.setdefault(lang[r["sample_id"]], []).append(r["contents"])
    out = {}
    for code, docs in sorted(by_lang.items()):
        half = len(docs) // 2  # two files each
        write_parquet(root / code, "a.parquet", {"contents": docs[:half]})
        write_parquet(root / code, "b.parquet", {"contents": docs[half:]})
        out[code] = root / code
    return out


def test_shares_follow_size_to_the_power_alpha():
    assert shares([100, 400, 0], 1000, 1.0) == [200, 800, 0]
    assert shares([100, 400, 0], 1000, 0.0) == [500, 500, 0]
    assert shares([100, 400], 1000, 0.5) == [333, 666]
    assert shares([0, 0], 1000, 0.5) == [0, 0]


def test_one_tokenizer_from_every_input_deterministic_and_resumable(langs, tmp_path):
    inputs = [str(langs[k]) for k in ("en", "ja", "fr")]
    params = {"vocab_size": 600, "train_max_chars": 60_000}
    rec = train_shared_tokenizer(inputs, str(tmp_path / "t1"), params)
    assert [r["input"] for r in rec["inputs"]] == inputs and rec["vocab_size"] == 600
    assert all(r["docs"] > 0 and 0 < r["chars"] for r in rec["inputs"])  # every language is in the sample
    assert rec["train_chars"] == sum(r["chars"] for r in rec["inputs"]) <= 60_000 + 3 * 100_000
    for r in rec["inputs"]:  # each gives about its share (a sample ends with the document that crosses it)
        assert r["chars"] >= min(r["share_chars"], 1) and r["files_read"] <= r["files"] == 2
    data = (tmp_path / "t1" / "tokenizer.json").read_bytes()
    assert rec["tokenizer_sha256"] == hashlib.sha256(data).hexdigest()
    assert json.loads((tmp_path / "t1" / RECORD).read_text()) == rec
    # the same inputs and parameters: the same bytes, in another folder
    train_shared_tokenizer(inputs, str(tmp_path / "t2"), params)
    assert (tmp_path / "t2" / "tokenizer.json").read_bytes() == data
    # a rerun returns at once (a retried step), and retrains when tokenizer.json is damaged
    (tmp_path / "t1" / "tokenizer.json").write_text("{}")
    again = train_shared_tokenizer(inputs, str(tmp_path / "t1"), params)
    assert again == rec and (tmp_path / "t1" / "tokenizer.json").read_bytes() == data
    mtime = (tmp_path / "t1" / "tokenizer.json").stat().st_mtime_ns
    assert train_shared_tokenizer(inputs, str(tmp_path / "t1"), params) == rec
    assert (tmp_path / "t1" / "tokenizer.json").stat().st_mtime_ns == mtime
    # equal shares (alpha 0) give a small language more text than by size (alpha 1)
    by_size = train_shared_tokenizer(inputs, str(tmp_path / "t3"), {**params, "alpha": 1.0})
    equal = train_shared_tokenizer(inputs, str(tmp_path / "t4"), {**params, "alpha": 0.0})
    small = min(range(3), key=lambda i: by_size["inputs"][i]["share_chars"])
    assert equal["inputs"][small]["share_chars"] > by_size["inputs"][small]["share_chars"]


def test_branches_tokenized_with_it_share_one_vocabulary(langs, tmp_path):
    inputs = [str(langs[k]) for k in ("en", "ja")]
    train_shared_tokenizer(inputs, str(tmp_path / "tok"), {"vocab_size": 500, "train_max_chars": 40_000})
    outs = []
    for lang in ("en", "ja"):
        out = tmp_path / f"lang={lang}" / "tokenization"
        run_transform("tokenization", {"tokenizer": str(tmp_path / "tok"), "tokens_column": ""},
                      RunOptions(str(langs[lang]), str(out), workers=1, progress=False))
        outs.append(str(out))
    a, b = (read_token_index(o) for o in outs)
    assert a["tokenizer_sha256"] == b["tokenizer_sha256"] and a["tokenizer_source"] == f"{tmp_path / 'tok'}/tokenizer.json"
    from prepline.train.data import TokenData

    data = TokenData(outs, 32)  # mixed_tokenizers='error' by default: one vocabulary, no error
    assert len(data.vocabularies) == 1 and data.vocab_size == 500 and data.num_windows > 10


def test_the_command_line(langs, tmp_path, capsys):
    out = tmp_path / "tok"
    rc = cli_main(["tokens", "train-tokenizer", "--input", str(langs["en"]), "--input", str(langs["fr"]),
                   "--output", str(out), "--vocab-size", "400", "--params", '{"train_max_chars": 20000}'])
    text = capsys.readouterr().out
    assert rc == 0 and "tokenizer: 400 ids" in text and f"{langs['fr']}:" in text
    assert json.loads((out / RECORD).read_text())["config"]["train_max_chars"] == 20000
    run_transform("tokenization", {"tokenizer": str(out / "tokenizer.json")},
                  RunOptions(str(langs["fr"]), str(tmp_path / "t"), workers=1, progress=False))
    assert cli_main(["tokens", "data-path", str(tmp_path / "t")]) == 0
    n, prefix = capsys.readouterr().out.split()
    assert int(n) == read_token_index(str(tmp_path / "t"))["num_tokens"] and prefix == f"{tmp_path / 't'}/tokens/text_document"
    assert cli_main(["tokens", "train-tokenizer", "--input", str(langs["en"]), "--output", str(out), "--vocab-size", "10"]) == 2
    assert "vocab_size" in capsys.readouterr().err


def test_bad_inputs(langs, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        train_shared_tokenizer([str(langs["en"]), str(tmp_path / "nope")], str(tmp_path / "o"))
    with pytest.raises(ConfigError, match="given twice"):
        train_shared_tokenizer([str(langs["en"]), str(langs["en"])], str(tmp_path / "o"))
    with pytest.raises(ConfigError, match="no input"):
        train_shared_tokenizer([], str(tmp_path / "o"))
    empty = tmp_path / "empty"
    write_parquet(empty, "a.parquet", {"contents": ["", ""]})
    with pytest.raises(InputError, match="no text to train a tokenizer on"):
        train_shared_tokenizer([str(empty)], str(tmp_path / "o"))
    with pytest.raises(InputError, match="column 'text' is missing"):
        train_shared_tokenizer([str(langs["en"])], str(tmp_path / "o"), {"content_column": "text"})
    # an empty branch (e.g. everything filtered out) leaves the others to train on
    rec = train_shared_tokenizer([str(empty), str(langs["fr"])], str(tmp_path / "o"), {"vocab_size": 300})
    assert rec["inputs"][0]["docs"] == 0 and rec["inputs"][1]["docs"] > 0
    assert not (tmp_path / "o2").exists()
