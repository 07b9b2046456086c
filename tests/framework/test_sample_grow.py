"""prepline.sample.grow: a large corpus as tagged copies of a sample (the scale benchmarks' 3M and 10M)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prepline.engine import RunOptions, run_transform
from prepline.sample import SampleError, build_sample, normalize_for_dedup, shingle_jaccard
from prepline.sample.grow import grow_sample, tag_text


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    root = tmp_path_factory.mktemp("grow")
    base = root / "base"
    build_sample(base, docs=3000, seed=11, files=3)
    out = root / "grown"
    info = grow_sample(base, out, 7500)  # two whole copies and half of a third
    return {"root": root, "base": base, "out": out, "info": info}


def read(folder: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in sorted(folder.glob("part-*.parquet"))])


def test_exactly_the_documents_asked_for_with_unique_ids_and_the_base_as_copy_0(grown):
    base, out = read(grown["base"]), read(grown["out"])
    sizes = [pq.ParquetFile(p).metadata.num_rows for p in sorted(grown["base"].glob("part-*.parquet"))]
    third = next(i + 1 for i in range(3) if sum(sizes[: i + 1]) >= 1500)  # the files the last, half copy needs
    assert out.num_rows == 7500 and grown["info"]["files"] == len(list(grown["out"].glob("part-*.parquet"))) == 6 + third
    assert len(set(out.column("sample_id").to_pylist())) == 7500
    assert out.slice(0, 3000).equals(base)  # copy 0 is the base, byte for byte
    assert out.column("sample_id")[3000].as_py() == base.column("sample_id")[0].as_py() + "-g1"
    s = json.loads((grown["out"] / "_truth" / "summary.json").read_text())
    assert s["docs"] == 7500 and s["grown_from"]["copies"] == 3 and sum(s["langs"].values()) == pytest.approx(7500, abs=5)


def test_inside_a_copy_the_planted_duplicates_stay_duplicates(grown):
    truth = pq.read_table(grown["base"] / "_truth" / "docs.parquet").to_pylist()
    base = read(grown["base"]).column("contents").to_pylist()
    index = {r["sample_id"]: i for i, r in enumerate(truth)}
    copy2 = read(grown["out"]).slice(6000, 1500).column("contents").to_pylist()  # copy 2's first half
    exact = near = 0
    for i, r in enumerate(truth[:1500]):
        j = index.get(r["dup_of"]) if r["dup_of"] else None
        if j is None or j >= 1500:
            continue
        if r["kind"].startswith("exact"):
            assert (copy2[i] == copy2[j]) == (base[i] == base[j])
            assert normalize_for_dedup(copy2[i]) == normalize_for_dedup(copy2[j])  # what exact_dedup compares
            exact += 1
        elif r["kind"].startswith("near"):  # the tag is the same on both sides: the Jaccard is the base's
            assert shingle_jaccard(copy2[i], copy2[j]) == pytest.approx(shingle_jaccard(base[i], base[j]), abs=0.02)
            near += 1
    assert exact >= 20 and near >= 20


def test_between_copies_a_document_is_not_a_near_duplicate_of_itself(grown):
    out = read(grown["out"]).column("contents").to_pylist()
    long_docs = [i for i in range(1500) if len(out[i].split()) >= 30]  # in all three copies
    assert len(long_docs) > 500
    worst = max(max(shingle_jaccard(out[i], out[i + 3000]), shingle_jaccard(out[i + 3000], out[i + 6000])) for i in long_docs)
    assert worst < 0.5  # fuzzy_dedup's threshold is 0.8
    assert sum(len(out[i + 3000]) for i in long_docs) / sum(len(out[i]) for i in long_docs) < 1.2  # a few % longer


def test_tagging_keeps_nulls_and_is_a_function_of_the_lowercased_word():
    a = tag_text(pa.array(["The cat, the CAT.", None, "", "日本語のテキスト"]), 5)
    assert a[1].as_py() is None and a[2].as_py() == ""
    words = a[0].as_py().lower().replace(",", " ").replace(".", " ").split()
    assert words[0] == words[2] and words[1] == words[3]
    assert tag_text(pa.array(["x"]), 0)[0].as_py() == "x"
    assert tag_text(pa.array(["日本語のテキスト" * 20]), 3)[0].as_py() != "日本語のテキスト" * 20


def test_the_dedup_stages_find_per_copy_what_they_find_in_the_base(grown, tmp_path):
    """The copies add no duplicates of their own beyond the short documents that come out equal."""
    two = tmp_path / "two"
    grow_sample(grown["base"], two, 6000)  # two whole copies
    removed = {}
    for name, src in (("base", grown["base"]), ("grown", two)):
        ids = tmp_path / f"{name}-ids"
        run_transform("doc_id", {}, RunOptions(str(src), str(ids), workers=1, progress=False))
        ex = tmp_path / f"{name}-exact"
        m1 = run_transform("exact_dedup", {}, RunOptions(str(ids), str(ex), workers=1, progress=False)).metadata
        m2 = run_transform("fuzzy_dedup", {}, RunOptions(str(ex), str(tmp_path / f"{name}-fuzzy"), workers=1, progress=False)).metadata
        removed[name] = (m1["totals"]["removed_total"], m2["totals"]["removed_total"])
    (be, bf), (ge, gf) = removed["base"], removed["grown"]
    assert 2 * be <= ge <= 2 * be + 0.03 * 6000, removed
    assert 2 * bf * 0.9 <= gf <= 2 * bf * 1.1 + 0.01 * 6000, removed


def test_cli_grows_from_a_base_and_refuses_a_missing_one(grown, tmp_path):
    cmd = [sys.executable, "-m", "prepline.cli", "sample", "--output", str(tmp_path / "g"), "--docs", "3500", "--grow-from", str(grown["base"])]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "3,500 docs in 4 files" in r.stdout.replace("\n", " ")
    assert read(tmp_path / "g").num_rows == 3500
    with pytest.raises(SampleError, match="not a finished sample"):
        grow_sample(tmp_path / "nothing", tmp_path / "g2", 10)


def test_cli_above_the_builders_size_builds_a_base_grows_it_and_removes_it(tmp_path, monkeypatch, capsys):
    from prepline.cli import main as cli_main
    from prepline.sample import grow

    monkeypatch.setattr(grow, "GROW_ABOVE", 300)
    monkeypatch.setattr(grow, "BASE_DOCS", 200)
    assert cli_main(["sample", "--output", str(tmp_path / "big"), "--docs", "500", "--files", "2"]) == 0
    assert "500 docs in" in capsys.readouterr().out.replace("\n", " ")
    assert read(tmp_path / "big").num_rows == 500
    s = json.loads((tmp_path / "big" / "_truth" / "summary.json").read_text())
    assert s["grown_from"]["docs"] == 200 and s["grown_from"]["copies"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big"]  # the base was built beside it and removed
