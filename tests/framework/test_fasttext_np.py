"""fasttext_np: fastText's supervised predictions, in one compiled pass over a column, against
fastText's own predict on real text from the sample, for models trained here (softmax, one-vs-all,
negative sampling; word n-grams 1-3; two and four labels) and on the text fastText tokenises oddly
(tabs, NUL, bytes above 0x7f whose hashes are sign-extended, label-like tokens, long words, line
breaks and white space that one_line trims or turns into spaces)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from prepline.fasttext_np import _fnv, for_model
from prepline.quality import Scorer, _fit_in_child, one_line

fasttext = pytest.importorskip("fasttext")

ODD = ["", " ", "\t\t", "hello", "a\tb\x00c  d", "__label__hq is not a word here", "__label__news", "naïve café 東京 🙂 ß",
       "x" * 300 + " " + "é" * 50, "the the the the", "</s> inside", "\x0bvertical\x0ctab\rcr"]
#: what one_line changes: trimmed Unicode white space (also inside words at the ends), line breaks to spaces
RAW = ["\u3000the news\u00a0", "the\u2028news\u2029today\x85now", "\x1cthe news\x1f", "the\x1cnews", "\u2003\u2003", "a\r\nb\n\nc",
       "news \u3000", "\u00a0\u00a0the", "the news\u200a\u3000\u00a0"]


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
    """FNV-1a over sign-extended bytes (dictionary.cc hash)."""
    for w in ["a", "hello", "naïve", "東京", "🙂", "x" * 300]:
        data = np.frombuffer(w.encode(), np.uint8)
        x = 2166136261
        for b in w.encode():
            x = ((x ^ (b | 0xFFFFFF00 if b > 127 else b)) * 16777619) & 0xFFFFFFFF
        assert int(_fnv(data, 0, len(data))) == x, w


def test_raw_text_is_read_as_one_line_reads_it(texts, tmp_path):
    """The pass trims and splits the raw text itself: the same probabilities as on one_line's output,
    and a text that one_line empties has no text (score 0)."""
    model = _train(texts, tmp_path, 2, wordNgrams=2)
    linear = for_model(model)
    raw = RAW + [x.replace(" ", "\n", 3) for x in texts[sorted(texts)[0]][:50]]
    assert np.abs(linear.proba(pa.array(raw)) - linear.proba(one_line(pa.array(raw)))).max() < 1e-12
    label = model.get_labels()[0]
    got = Scorer(model, label)(pa.array(raw + [None]))
    lines = one_line(pa.array(raw + [None])).to_pylist()
    want = np.array([_fasttext_proba(model, [x])[0, 0] if x else 0.0 for x in lines]).clip(0, 1)
    assert np.abs(got - want).max() < 1e-5
    assert got[RAW.index("\u2003\u2003")] == 0.0 and got[-1] == 0.0


@pytest.mark.parametrize("kw,classes", [({"wordNgrams": 2}, 2), ({"wordNgrams": 3, "loss": "ova"}, 4), ({"wordNgrams": 2}, 4)])
def test_one_labels_probability_alone_is_the_same(texts, tmp_path, kw, classes):
    """positive() sums one column of P when one is enough (ova, ns, a two-label softmax): the same
    probabilities as the whole matrix gives."""
    model = _train(texts, tmp_path, classes, **kw)
    linear = for_model(model)
    lines = pa.array([x for v in texts.values() for x in v[300:400]] + ODD)
    whole = linear.proba(lines)
    for j, label in enumerate(linear.labels):
        p, empty = linear.positive(lines, label)
        assert np.abs(p - whole[:, j]).max() < 1e-6
        assert empty.tolist() == [not x.strip() for x in lines.to_pylist()]


def test_max_chars_reads_the_start_of_the_trimmed_text(texts, tmp_path):
    model = _train(texts, tmp_path, 2, wordNgrams=2)
    label = model.get_labels()[0]
    scorer = Scorer(model, label)
    docs = texts[sorted(texts)[0]][:40]
    cut = ["  " + x for x in docs]
    assert np.abs(scorer(pa.array(cut), max_chars=60) - scorer(pa.array([x[:60] for x in docs]))).max() < 1e-12


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
