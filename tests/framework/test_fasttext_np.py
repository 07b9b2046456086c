"""fasttext_np: fastText's supervised predictions, vectorised over a column, against fastText's own
predict on real text from the sample, for models trained here (softmax, one-vs-all, negative sampling;
word n-grams 1-3; two and four labels) and on the text fastText tokenises oddly (tabs, NUL, bytes
above 0x7f whose hashes are sign-extended, label-like tokens, words longer than the vectorised hash)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from prepline.fasttext_np import LONG_TOKEN, fnv1a, for_model
from prepline.hashing import utf8_bytes
from prepline.quality import Scorer, _fit_in_child, one_line

fasttext = pytest.importorskip("fasttext")

ODD = ["", " ", "\t\t", "hello", "a\tb\x00c  d", "__label__hq is not a word here", "__label__news", "naïve café 東京 🙂 ß",
       "x" * (LONG_TOKEN + 7) + " " + "é" * 50, "the the the the", "</s> inside", "\x0bvertical\x0ctab\rcr"]


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> dict[str, list[str]]:
    from prepline.sample import build_sample
    import pyarrow.parquet as pq

    out = tmp_path_factory.mktemp("ftnp") / "sample"
    build_sample(out, docs=1200, files=2)
    files = sorted(f for f in out.rglob("*.parquet") if not any(x.startswith("_") for x in f.relative_to(out).parts))
    t = pa.concat_tables([pq.read_table(f, columns=["contents", "source"]) for f in files])
    lines = one_line(t["contents"].combine_chunks()).to_pylist()
    by: dict[str, list[str]] = {}
    for line, source in zip(lines, t["source"].to_pylist()):
        if line:
            by.setdefault(source.split("/")[-1].split("_")[0], []).append(line)
    return by


def _train(texts, tmp_path, classes: int, **kw):
    """A small model, trained in a process of its own as `prepline quality train` does (fastText 0.9.2
    trained several times in one process reports NaN: prepline.quality._fit_in_child)."""
    names = sorted(texts, key=lambda k: -len(texts[k]))[:classes]
    path = tmp_path / "train.txt"
    with open(path, "w") as f:
        for name in names:
            for line in texts[name][:300]:
                f.write(f"__label__{name} {line}\n")
    args = {**dict(dim=16, epoch=5, lr=0.1, minCount=1, bucket=5000, thread=1, seed=1, verbose=0), **kw}
    _fit_in_child(str(path), str(tmp_path / "m.bin"), args, args["lr"])
    return fasttext.load_model(str(tmp_path / "m.bin"))


def _fasttext_proba(model, lines: list[str]) -> np.ndarray:
    labels = model.get_labels()
    out = np.zeros((len(lines), len(labels)))
    labs, probs = model.f.multilinePredict([x + "\n" for x in lines], len(labels), 0.0, "replace")
    for i, (ls, ps) in enumerate(zip(labs, probs)):
        for lab, pr in zip(ls, ps):
            out[i, labels.index(lab)] = pr
    return out


@pytest.mark.parametrize("kw,classes", [
    ({"wordNgrams": 1}, 2), ({"wordNgrams": 2}, 2), ({"wordNgrams": 3}, 4),
    ({"wordNgrams": 2, "loss": "ova"}, 4), ({"wordNgrams": 2, "loss": "ns"}, 2),
])
def test_the_same_probabilities_as_fastText(texts, tmp_path, kw, classes):
    model = _train(texts, tmp_path, classes, **kw)
    linear = for_model(model)
    assert linear is not None and linear.labels == model.get_labels()
    lines = [x for v in texts.values() for x in v[300:500]] + ODD[1:]
    mine = linear.proba(pa.array(lines))
    theirs = _fasttext_proba(model, lines)
    assert mine.shape == theirs.shape
    diff = np.abs(mine - theirs)
    if kw.get("loss") in ("ova", "ns"):  # a sigmoid table step (1/32 wide) can fall between float32 and float64 sums
        assert (diff < 1e-5).mean() > 0.999 and diff.max() < 0.01
    else:
        assert diff.max() < 1e-5
    assert (mine.argmax(axis=1) == theirs.argmax(axis=1)).mean() > 0.999  # ties aside, the same decisions


def test_words_hash_as_fastText_hashes_them():
    """FNV-1a over sign-extended bytes (dictionary.cc hash), checked on fastText's own subword ids:
    with minn = maxn = word length the only n-gram of a short word is its hash modulo bucket."""
    words = ["a", "hello", "naïve", "東京", "🙂", "x" * (LONG_TOKEN + 3)]
    arr = pa.array(words, pa.large_string())
    got = fnv1a(*utf8_bytes(arr))
    for w, h in zip(words, got):
        x = 2166136261
        for b in w.encode():
            x = ((x ^ (b | 0xFFFFFF00 if b > 127 else b)) * 16777619) & 0xFFFFFFFF
        assert int(h) == x, w


def test_an_empty_column_and_empty_lines(texts, tmp_path):
    model = _train(texts, tmp_path, 2, wordNgrams=2)
    linear = for_model(model)
    assert linear.proba(pa.array([], pa.string())).shape == (0, 2)
    p = linear.proba(pa.array(["", "  "]))
    assert np.abs(p - _fasttext_proba(model, ["", "  "])).max() < 1e-5  # only </s>: its own row


@pytest.mark.parametrize("kw", [{"minn": 2, "maxn": 4}, {"loss": "hs"}])
def test_models_it_does_not_reproduce_use_fastTexts_predict(texts, tmp_path, kw):
    model = _train(texts, tmp_path, 2, **kw)
    assert for_model(model) is None
    label = model.get_labels()[0]
    scorer = Scorer(model, label)
    lines = texts[sorted(texts)[0]][:50]
    assert scorer.linear is None
    got = scorer(pa.array(lines))
    assert np.abs(got - _fasttext_proba(model, lines)[:, 0].clip(0, 1)).max() < 1e-6


def test_a_quantized_model_uses_fastTexts_predict(texts, tmp_path):
    model = _train(texts, tmp_path, 2, wordNgrams=2)
    model.quantize(input=None, qnorm=False, retrain=False, cutoff=0)
    assert for_model(model) is None


def test_scoring_in_slices_gives_the_same_probabilities(texts, tmp_path, monkeypatch):
    from prepline import fasttext_np

    model = _train(texts, tmp_path, 2, wordNgrams=2)
    linear = for_model(model)
    lines = pa.array([x for v in texts.values() for x in v[:200]])
    whole = linear.proba(lines)
    monkeypatch.setattr(fasttext_np, "CHUNK_BYTES", 5000)
    sliced = linear.proba(lines)
    assert np.array_equal(whole, sliced)
