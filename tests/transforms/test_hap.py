"""hap on the real-text sample: planted profanity scores high, news/speech text low; the
vectorised features equal the model's own; flags, long documents, bad input and parameters."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import write_parquet
from prepline import registry
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, InputError
from prepline.sample import build_sample

ABUSE = "Shut the fuck up, you moron."


def read_dir(root: Path, columns: list[str]) -> pa.Table:
    files = sorted(p for p in Path(root).rglob("*.parquet") if not any(x.startswith("_") for x in p.relative_to(root).parts))
    return pa.concat_tables([pq.read_table(f, columns=columns) for f in files])


def _hap(**params):
    t = registry.build("hap", params)
    t.setup(None)
    return t


def _scores(t, texts: list[str]) -> np.ndarray:
    out = t.transform(pa.table({"contents": pa.array(texts, pa.string())}), None)
    return out.parts[""]["hap_score"].to_numpy()


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Probability that a random positive outscores a random negative (ties count half)."""
    pos, neg = scores[labels], scores[~labels]
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    allv = np.concatenate([pos, neg])[order]
    # average ranks for ties
    _, start, counts = np.unique(allv, return_index=True, return_counts=True)
    avg = start + (counts - 1) / 2.0 + 1
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hap") / "sample"
    build_sample(root, docs=3000, seed=5, files=4)
    return root


@pytest.fixture(scope="module")
def scored(sample) -> dict:
    out = sample.parent / "w1"
    meta = run_transform("hap", {}, RunOptions(str(sample), str(out), workers=1, progress=False)).metadata
    table = read_dir(out, ["sample_id", "contents", "hap_score", "hap_flag"])
    truth = {r["sample_id"]: r for r in pq.read_table(sample / "_truth" / "docs.parquet").to_pylist()}
    ids = table["sample_id"].to_pylist()
    return {
        "out": out,
        "meta": meta,
        "table": table,
        "score": table["hap_score"].to_numpy(),
        "flag": table["hap_flag"].to_numpy(zero_copy_only=False),
        "planted": np.array([truth[i]["profanity"] for i in ids]),
        "en": np.array([truth[i]["lang"] == "en" for i in ids]),
    }


@pytest.mark.slow
def test_planted_profanity_scores_high_and_clean_text_low(scored):
    s, y, en = scored["score"], scored["planted"], scored["en"]
    assert y.sum() >= 15
    assert auc(y[en], s[en]) >= 0.98  # measured 0.997 on the 4,000-document sample
    assert np.median(s[y]) > 0.95
    assert np.median(s[en & ~y]) < 0.2
    flagged = scored["flag"]
    assert np.array_equal(flagged, s >= 0.5)
    recall = (flagged & y).sum() / y.sum()
    assert recall >= 0.95  # at the default threshold (measured 1.0)
    assert ((s >= 0) & (s <= 1)).all()


@pytest.mark.slow
def test_features_equal_the_models_own_vectorizer(sample):
    """The Arrow/scipy features give the probabilities of vectorizer.transform + predict_proba."""
    from prepline.transforms.hap import SentenceScorer, load_model

    vec, clf = load_model()
    scorer = SentenceScorer(vec, clf, max_sentence_words=10**9)  # one feature row per sentence
    docs = read_dir(sample, ["contents"])["contents"].combine_chunks()
    sentences, _ = scorer.sentences(docs)
    texts = [x for x in sentences.to_pylist() if x][:20000]
    x, row_sentence = scorer.features(pa.array(texts, pa.string()))
    assert np.array_equal(row_sentence, np.arange(len(texts))) and len(texts) > 10000
    ours = clf.predict_proba(x)[:, 1]
    theirs = clf.predict_proba(vec.transform(texts))[:, 1]
    assert np.abs(ours - theirs).max() < 1e-9


@pytest.mark.slow
def test_document_score_is_the_maximum_over_sentences():
    from profanity_check import predict_prob

    t = _hap()
    sentences = ["The council met on Tuesday to discuss the budget.", ABUSE, "Rain is expected later this week."]
    doc = " ".join(sentences)
    s = _scores(t, [doc, sentences[0], "", "   ", "...", "ok"])
    expected = predict_prob(sentences).max()
    assert s[0] == pytest.approx(expected, abs=1e-12) and s[0] > 0.9
    assert s[1] == pytest.approx(predict_prob(sentences[:1])[0], abs=1e-12) and s[1] < 0.5
    assert list(s[2:5]) == [0.0, 0.0, 0.0]  # no word: score 0


@pytest.mark.slow
def test_long_document_is_scored_in_windows(scored):
    """A 1 MB document without sentence punctuation (real English text, punctuation removed):
    windows of max_sentence_words words still find the one abusive passage."""
    import re

    t = _hap()
    calm = scored["en"] & (scored["score"] < 0.3)  # English documents without any offensive sentence
    english = [d for d, keep in zip(scored["table"]["contents"].to_pylist(), calm) if keep]
    words = re.sub(r"[.!?\n]+", " ", " ".join(english)).split()
    filler = " ".join((words * (1 + 200_000 // len(words)))[:200_000])
    assert len(filler.encode()) >= 1_000_000
    cut = filler.find(" ", len(filler) // 2)
    doc = filler[:cut] + " Shut the fuck up you moron " + filler[cut:]
    s = _scores(t, [doc, filler])
    assert s[0] > 0.9 and s[0] - s[1] > 0.3, s
    whole = _scores(_hap(max_sentence_words=10**9), [doc])
    assert whole[0] < 0.5  # one huge 'sentence' would drown it


@pytest.mark.slow
def test_batch_size_does_not_change_scores(scored):
    texts = scored["table"]["contents"].to_pylist()[:500]
    a = _scores(_hap(batch_size=7), texts)
    b = _scores(_hap(), texts)
    assert np.array_equal(a, b)
    assert np.array_equal(b, scored["score"][:500])


@pytest.mark.slow
def test_counters_and_nothing_removed(scored):
    t = scored["meta"]["totals"]
    assert t["docs_in"] == t["docs_out"] == scored["table"].num_rows and not t["removed"]
    assert t["counters"]["hap_flagged"] == int(scored["flag"].sum())
    assert t["counters"]["hap_windows"] > t["docs_in"]


@pytest.mark.slow
def test_no_flag_column_and_custom_names(tmp_path):
    write_parquet(tmp_path / "in", "a.parquet", {"text": ["hello there", ABUSE]})
    run_transform("hap", {"content_column": "text", "flag_column": "", "score_column": "abuse"}, RunOptions(str(tmp_path / "in"), str(tmp_path / "out"), progress=False))
    t = pq.read_table(tmp_path / "out" / "a.parquet")
    assert t.column_names == ["text", "abuse"]
    assert t["abuse"][1].as_py() > 0.9 > t["abuse"][0].as_py()


@pytest.mark.slow
def test_model_from_a_path_and_missing_files(tmp_path):
    from prepline.transforms.hap import model_folder

    folder = tmp_path / "model"
    shutil.copytree(model_folder(), folder)
    s = _scores(_hap(model_path=str(folder)), [ABUSE, "good morning"])
    assert s[0] > 0.9 > s[1]
    (folder / "model.joblib").unlink()
    write_parquet(tmp_path / "in", "a.parquet", {"contents": ["x"]})
    with pytest.raises(ConfigError) as e:
        run_transform("hap", {"model_path": str(folder)}, RunOptions(str(tmp_path / "in"), str(tmp_path / "out"), progress=False))
    assert "model.joblib" in e.value.message and not (tmp_path / "out" / "a.parquet").exists()
    (folder / "model.joblib").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError) as e:
        _hap(model_path=str(folder))
    assert "cannot be loaded" in e.value.message


@pytest.mark.slow
def test_bad_input_is_reported(tmp_path):
    write_parquet(tmp_path / "nulls", "a.parquet", {"contents": pa.array(["fine", None], pa.string())})
    with pytest.raises(Exception) as e:
        run_transform("hap", {}, RunOptions(str(tmp_path / "nulls"), str(tmp_path / "o1"), progress=False))
    assert "null" in str(e.value)
    write_parquet(tmp_path / "nocol", "a.parquet", {"body": ["x"]})
    with pytest.raises(InputError) as e:
        run_transform("hap", {}, RunOptions(str(tmp_path / "nocol"), str(tmp_path / "o2"), progress=False))
    assert "content_column" in e.value.fix
    write_parquet(tmp_path / "dup", "a.parquet", {"contents": ["x"], "hap_score": [1.0]})
    with pytest.raises(InputError):
        run_transform("hap", {}, RunOptions(str(tmp_path / "dup"), str(tmp_path / "o3"), progress=False))


@pytest.mark.parametrize(
    "params, word",
    [
        ({"threshold": 1.5}, "threshold"),
        ({"threshold": -0.1}, "threshold"),
        ({"score_column": ""}, "score_column"),
        ({"flag_column": "hap_score"}, "differ"),
        ({"score_column": "contents"}, "differ"),
        ({"batch_size": 0}, "batch_size"),
        ({"max_sentence_words": 0}, "max_sentence_words"),
        ({"model_path": "/nonexistent/model"}, "model_path"),
    ],
)
def test_invalid_parameters(params, word):
    with pytest.raises(ConfigError) as e:
        registry.build("hap", params)
    assert word in str(e.value)
