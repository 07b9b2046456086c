"""c4_clean: each line and document rule pinned on hand-made text, real text from the sample,
counts conserved (documents and lines), parameters validated."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import write_parquet
from prepline import registry
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError
from prepline.transform import FileTask

GOOD = [
    "The council met on Tuesday evening to vote on the budget for next year.",
    "Most members agreed that the library needs a new roof before the winter.",
    "A long debate followed about the bus routes to the two new schools.",
    "The mayor said the plans would be published on the town's website.",
    "Residents can comment on them at a public meeting next month!",
]
BODY = "\n".join(GOOD)


def _clean(texts: list[str | None], lang: str | list = "en", **params) -> tuple[list[dict], dict, dict, int]:
    tf = registry.build("c4_clean", params)
    table = pa.table({"contents": pa.array(texts, pa.string()), "lang": lang if isinstance(lang, list) else [lang] * len(texts)})
    out = tf.transform(table, FileTask("m", "m", 0))
    rows = out.parts[""].to_pylist()
    assert table.num_rows == len(rows) + sum(out.removed.values())  # conservation of documents
    c = out.counters
    removed_lines = sum(v for k, v in c.items() if k.startswith("lines_removed_"))
    assert c["lines_in"] == c["lines_kept"] + removed_lines + c["lines_dropped_with_doc"]  # conservation of lines
    return rows, out.removed, c, len(texts)


def test_a_clean_page_is_kept_unchanged():
    rows, removed, c, _ = _clean([BODY])
    assert rows[0]["contents"] == BODY and removed == {} and c["lines_kept"] == 5


@pytest.mark.parametrize("line,reason", [
    ("Home", "no_terminal_punct"),
    ("Read more about the meeting and the vote", "no_terminal_punct"),
    ("And the story goes on and on...", "no_terminal_punct"),
    ("Thank you!", "too_few_words"),
    ("Please enable JavaScript to view the comments.", "javascript"),
    ("By using this site you agree to our Terms of Use.", "policy"),
    ("This website uses cookies to improve your experience.", "policy"),
    ("A line with a word of " + "x" * 1001 + " characters.", "long_word"),
])
def test_each_line_rule_drops_its_line(line, reason):
    rows, removed, c, _ = _clean([line + "\n" + BODY, BODY + "\n" + line])
    assert [r["contents"] for r in rows] == [BODY, BODY]
    assert c[f"lines_removed_{reason}"] == 2 and removed == {}
    assert sum(v for k, v in c.items() if k.startswith("lines_removed_")) == 2


def test_citation_markers_are_cut_out_of_lines():
    text = BODY.replace("next year.", "next year.[1]").replace("winter.", "winter.[edit]").replace("schools.", "schools.[citation needed]")
    rows, _, c, _ = _clean([text])
    assert rows[0]["contents"] == BODY and c["citations_removed"] == 3


@pytest.mark.parametrize("extra,reason", [
    ("Lorem ipsum dolor sit amet, consectetur adipiscing elit.", "lorem_ipsum"),
    ("The function returns {a: 1} as expected.", "curly_bracket"),
    ("He called the plan total bullshit in the meeting.", "bad_words"),
])
def test_each_document_rule_removes_the_document(extra, reason):
    rows, removed, c, _ = _clean([BODY + "\n" + extra, BODY])
    assert len(rows) == 1 and rows[0]["contents"] == BODY and removed == {reason: 1}
    assert c["lines_dropped_with_doc"] >= 5


def test_too_few_sentences_and_empty():
    four = "\n".join(GOOD[:4])
    rows, removed, _, _ = _clean([four, BODY, "Home\nMenu\nContact", "", None])
    assert [r["contents"] for r in rows] == [BODY] and removed == {"too_few_sentences": 4}
    # two sentences on one line count as two
    rows, removed, _, _ = _clean([GOOD[0] + " " + GOOD[1] + "\n" + "\n".join(GOOD[2:5])])  # 5 sentences on 4 lines
    assert len(rows) == 1 and removed == {}
    rows, removed, _, _ = _clean([four, "Home\nMenu", ""], min_sentences=3)
    assert [r["contents"] for r in rows] == [four] and removed == {"too_few_sentences": 2}
    rows, removed, _, _ = _clean([four, "Home\nMenu", ""], min_sentences=0)
    assert [r["contents"] for r in rows] == [four] and removed == {"empty": 2}


def test_bad_words_per_language_and_user_lists(tmp_path):
    fr = BODY + "\nIl a dit que c'était de la merde."
    # 'merde' is on the fr list, not on the en one
    rows, removed, _, _ = _clean([fr, fr], lang=["fr", "en"])
    assert len(rows) == 1 and rows[0]["lang"] == "en" and removed == {"bad_words": 1}
    # a word inside another word is not a match (whole words only)
    rows, removed, _, _ = _clean([BODY + "\nShe works as a Scunthorpe shitake grower, they said."])
    assert removed == {}
    darn = BODY + "\nOh darn, the bus was late again today."
    rows, removed, _, _ = _clean([darn, darn], lang=["en", "sv"], extra_bad_words=["en:darn"])
    assert removed == {"bad_words": 1} and rows[0]["lang"] == "sv"
    f = tmp_path / "words.txt"
    f.write_text("# my list\ndarn\nsv:fan\n", encoding="utf-8")
    rows, removed, c, _ = _clean([darn, darn, BODY + "\nFan vad bussen var sen idag igen."], lang=["en", "sv", "sv"], bad_words_file=str(f))
    assert removed == {"bad_words": 3}
    rows, removed, c, _ = _clean([darn], lang="ko", filter_bad_words=True)
    assert removed == {} and c["docs_without_bad_word_list"] == 1
    rows, removed, _, _ = _clean([BODY + "\n彼はセックスの話をした、と言っていました。"], lang="en")
    assert removed == {}  # the ja list applies to ja documents
    ja = "\n".join(["今日は町の会議で来年の予算が決まりました。", "図書館の屋根を冬の前に直すことになりました。",
                    "バスの路線についても長い議論がありました。", "計画は町のサイトで公開されます。",
                    "来月の説明会で意見を言うことができます！"])
    rows, removed, _, _ = _clean([ja, ja + "\n彼はセックスの話をした、と言っていました。"], lang="ja")
    assert [r["contents"] for r in rows] == [ja] and removed == {"bad_words": 1}


def test_japanese_lines_are_measured_in_characters():
    ja = "\n".join(["今日は町の会議で来年の予算が決まりました。", "図書館の屋根を冬の前に直すことになりました。",
                    "バスの路線についても長い議論がありました。", "計画は町のサイトで公開されます。",
                    "来月の説明会で意見を言うことができます！"])
    rows, removed, c, _ = _clean([ja + "\nはい。\nメニュー"], lang="ja")
    assert rows[0]["contents"] == ja and removed == {}
    assert c["lines_removed_too_few_words"] == 1 and c["lines_removed_no_terminal_punct"] == 1


def test_removed_lines_sample_column():
    rows, _, _, _ = _clean(["Home\nMenu\nContact\n" + BODY + "\nThank you!"], removed_lines_sample=2)
    assert rows[0]["c4_removed_lines"] == ["no_terminal_punct: Home", "no_terminal_punct: Menu"]
    rows, _, _, _ = _clean([BODY])
    assert "c4_removed_lines" not in rows[0]


def test_real_text_of_the_sample_counts_conserved(tmp_path):
    from prepline.sample import build_sample

    src = tmp_path / "sample"
    build_sample(src, docs=600, files=3)
    out = tmp_path / "o"
    meta = run_transform("c4_clean", {"removed_sample": 2}, RunOptions(str(src), str(out), workers=1, progress=False)).metadata
    tot = meta["totals"]
    assert tot["docs_in"] == 600 and tot["docs_in"] == tot["docs_out"] + sum(tot["removed"].values())
    c = tot["counters"]
    assert c["lines_in"] == c["lines_kept"] + c["lines_dropped_with_doc"] + sum(v for k, v in c.items() if k.startswith("lines_removed_"))
    files = [p for p in out.rglob("*.parquet") if "_removed" not in p.parts]
    t = pa.concat_tables([pq.read_table(p) for p in files])
    assert t.num_rows == tot["docs_out"] > 0
    # every kept line ends in terminal punctuation and has at least 3 words
    for text in t["contents"].to_pylist():
        for line in text.split("\n"):
            assert line.rstrip().endswith((".", "?", "!", '"', "'", "。", "？", "！", "」", "』")), line
    assert tot["removed"].get("too_few_sentences", 0) > 0
    assert (out / "_removed").is_dir()


def test_bad_parameters(tmp_path):
    for params, word in [({"bad_words_file": str(tmp_path / "nope.txt")}, "bad_words_file"),
                         ({"extra_bad_words": ["en:"]}, "extra_bad_words"), ({"default_lang": ""}, "default_lang"),
                         ({"min_sentences": -1}, "min_sentences"), ({"lang_column": "contents"}, "lang_column")]:
        with pytest.raises(ConfigError, match=word):
            registry.build("c4_clean", params)
    src = tmp_path / "in"
    write_parquet(src, "a.parquet", {"contents": [BODY]})
    r = subprocess.run([sys.executable, "-m", "prepline.cli", "run", "c4_clean", "--input", str(src), "--output", str(tmp_path / "o"),
                        "--bad-words-file", str(tmp_path / "nope.txt")], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 2, r.stderr
    assert "error: " in r.stderr and "fix: " in r.stderr and "Traceback" not in r.stderr
