"""decontaminate: evaluation sets made in the test from real sentences of the bundled sample are
planted into other documents (changed in case, punctuation and spacing); every planted document is
found, with its set and n-gram, and no other."""

from __future__ import annotations

import csv
import glob
import json
import random
import re
import unicodedata

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError


def _read(folder):
    return pa.concat_tables(pq.read_table(f) for f in sorted(glob.glob(str(folder / "part-*.parquet"))))


def _norm(s: str) -> str:
    s = "".join(c for c in unicodedata.normalize("NFD", s.lower()) if unicodedata.category(c) != "Mn")
    return " ".join(re.sub(r"[\W_]+", " ", s).split())


def _garble(words: list[str]) -> str:
    """The same words as a reader would not spot: other case, punctuation and spacing."""
    return "  ".join(w.upper() if i % 2 else w + ("," if i % 3 == 0 else "") for i, w in enumerate(words))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    from prepline.sample import build_sample

    root = tmp_path_factory.mktemp("decont")
    build_sample(root / "sample", docs=400, files=3)
    truth = {r["sample_id"]: r for r in pq.read_table(root / "sample" / "_truth" / "docs.parquet").to_pylist()}
    files = sorted(glob.glob(str(root / "sample" / "part-*.parquet")))
    tables = [pq.read_table(f) for f in files]
    rows = [r for t in tables for r in t.to_pylist()]
    # held out: long originals in word-separated languages; their text (and copies) leave the corpus.
    # The sample composes some documents from pieces of others: an excerpt is taken only when no
    # other document holds 8 of its words in a row (a crude check of our own), so the truth is known.
    rng = random.Random(7)
    others = " | ".join(_norm(r["contents"] or "") for r in rows)
    held, excerpts = [], []
    for r in rows:
        t = truth[r["sample_id"]]
        if len(held) == 9:
            break
        w = r["contents"].split()
        if t["kind"] != "original" or t["lang"] not in ("en", "de", "fr", "es") or len(w) < 60:
            continue
        at = rng.randrange(0, len(w) - 40)
        q, a = w[at:at + 20], w[at + 20:at + 40]
        words = _norm(" ".join(q + a)).split()
        if any(others.count(" ".join(words[i:i + 8])) > 1 for i in range(len(words) - 7)):
            continue
        held.append(r)
        excerpts.append((q, a))
    held_ids = {r["sample_id"] for r in held}
    gone = held_ids | {s for s, t in truth.items() if t["dup_of"] in held_ids}
    # three sets in three formats: JSONL with two fields, CSV, Parquet
    with open(root / "qa.jsonl", "w") as f:
        for q, a in excerpts[:3]:
            f.write(json.dumps({"question": " ".join(q), "answer": " ".join(a), "id": 1}) + "\n")
    with open(root / "cloze.csv", "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["text", "label"])
        for q, _ in excerpts[3:6]:
            wr.writerow([" ".join(q), "x"])
    pq.write_table(pa.table({"passage": [" ".join(q) for q, _ in excerpts[6:]]}), root / "para.parquet")
    names = ["qa"] * 3 + ["cloze"] * 3 + ["para"] * 3
    # plant: each excerpt (the qa answers too) into two other documents, garbled; its first 12 tokens (n - 1) into a third
    corpus_idx = [i for i, r in enumerate(rows) if r["sample_id"] not in gone and (r["contents"] or "").strip()]
    targets = rng.sample(corpus_idx, 3 * 12)
    expected = {}
    pieces = [(q, names[i]) for i, (q, _) in enumerate(excerpts)] + [(a, "qa") for _, a in excerpts[:3]]
    for k, (words, name) in enumerate(pieces):
        for j in range(2):
            r = rows[targets[3 * k + j]]
            w = r["contents"].split(" ")
            cut = len(w) // 2
            r["contents"] = " ".join(w[:cut] + [_garble(words)] + w[cut:])
            expected[r["sample_id"]] = name
        r = rows[targets[3 * k + 2]]
        r["contents"] = r["contents"] + " " + " ".join(_norm(" ".join(words)).split()[:12])
    out = root / "in"
    out.mkdir()
    pos = 0
    for i, t in enumerate(tables):
        part = [r for r in rows[pos:pos + t.num_rows] if r["sample_id"] not in gone]
        pos += t.num_rows
        pq.write_table(pa.Table.from_pylist(part, schema=t.schema), out / f"part-{i}.parquet")
    sets = [f"qa={root}/qa.jsonl:question,answer", f"cloze={root}/cloze.csv:text", f"para={root}/para.parquet:passage"]
    return root, out, sets, expected


def test_every_planted_document_is_found_and_no_other(tmp_path, planted):
    root, src, sets, expected = planted
    m = run_transform("decontaminate", {"eval_sets": sets}, RunOptions(str(src), str(tmp_path / "o"), progress=False)).metadata
    out = _read(tmp_path / "o")
    got = {r["sample_id"]: r["decont_set"] for r in out.to_pylist() if r["decont_set"] is not None}
    assert got == expected
    assert len(expected) == 24
    for r in out.to_pylist():
        if r["decont_set"]:
            assert len(r["decont_ngram"].split()) == 13 and r["decont_ngram"] == r["decont_ngram"].lower()
    c = m["totals"]["counters"]
    assert (c["decont_qa"], c["decont_cloze"], c["decont_para"]) == (12, 6, 6)
    assert m["totals"]["docs_out"] == m["totals"]["docs_in"]


def test_remove_counts_per_set_and_conserves(tmp_path, planted):
    root, src, sets, expected = planted
    m = run_transform("decontaminate", {"eval_sets": sets, "action": "remove", "removed_sample": 3},
                      RunOptions(str(src), str(tmp_path / "o"), progress=False, workers=2)).metadata
    tot = m["totals"]
    assert tot["removed"] == {"contaminated_qa": 12, "contaminated_cloze": 6, "contaminated_para": 6}
    assert tot["docs_in"] == tot["docs_out"] + 24
    out = _read(tmp_path / "o")
    assert not set(out.column("sample_id").to_pylist()) & set(expected)
    assert "decont_set" not in out.column_names
    sample = pa.concat_tables(pq.read_table(f) for f in glob.glob(str(tmp_path / "o" / "_removed" / "contaminated_qa" / "*.parquet")))
    assert set(sample.column("decont_set").to_pylist()) == {"qa"}


def test_eval_sets_from_s3(tmp_path, planted, s3_bucket):
    from prepline.data_access import s3_client

    root, src, sets, expected = planted
    s3_client().put_object(Bucket=s3_bucket, Key="evals/qa.jsonl", Body=(root / "qa.jsonl").read_bytes())
    m = run_transform("decontaminate", {"eval_sets": [f"qa=s3://{s3_bucket}/evals/qa.jsonl:question,answer"]},
                      RunOptions(str(src), str(tmp_path / "o"), progress=False)).metadata
    assert m["totals"]["counters"]["decont_qa"] == 12


def test_characters_for_japanese(tmp_path):
    from prepline.sample import build_sample

    build_sample(tmp_path / "sample", docs=300, files=1)
    t = pq.read_table(glob.glob(str(tmp_path / "sample" / "part-*.parquet"))[0])
    truth = {r["sample_id"]: r["lang"] for r in pq.read_table(tmp_path / "sample" / "_truth" / "docs.parquet").to_pylist()}
    ja = [r for r in t.to_pylist() if truth[r["sample_id"]] == "ja" and len(r["contents"]) > 60]
    source, target = ja[0], ja[1]
    excerpt = source["contents"][10:40]
    docs = [target["contents"][:20] + "\n" + " ".join(excerpt) + "。" + target["contents"][20:], target["contents"]]
    pq.write_table(pa.table({"contents": docs}), tmp_path / "in.parquet")
    (tmp_path / "in").mkdir()
    (tmp_path / "in.parquet").rename(tmp_path / "in" / "a.parquet")
    (tmp_path / "ev.jsonl").write_text(json.dumps({"q": excerpt}, ensure_ascii=False) + "\n")
    run_transform("decontaminate", {"eval_sets": [f"jq={tmp_path}/ev.jsonl:q"], "unit": "characters"},
                  RunOptions(str(tmp_path / "in"), str(tmp_path / "o"), progress=False))
    got = pq.read_table(tmp_path / "o" / "a.parquet").column("decont_set").to_pylist()
    assert got[0] == "jq" and (got[1] is None or excerpt[:13] in target["contents"])
    from prepline.transforms.decontaminate import Decontaminate
    assert Decontaminate.branch_params("ja") == {"unit": "characters"} and Decontaminate.branch_params("en") == {}


@pytest.mark.parametrize("spec, says", [
    ("qa", "is not name=path:field"),
    ("qa=/x/qa.jsonl", "is not name=path:field"),
    ("q a=/x/qa.jsonl:question", "may hold only letters"),
    ("qa=/x/qa.txt:question", "is not .jsonl, .json, .ndjson, .parquet or .csv"),
    ("qa=/nonexistent/qa.jsonl:question", r"eval_sets \(qa\): /nonexistent/qa.jsonl is not a file"),
])
def test_bad_eval_sets_are_clear_errors(tmp_path, planted, spec, says):
    root, src, _, _ = planted
    with pytest.raises(ConfigError, match=says) as e:
        run_transform("decontaminate", {"eval_sets": [spec]}, RunOptions(str(src), str(tmp_path / "o"), progress=False))
    assert e.value.fix


def test_missing_field_names_the_file_and_its_fields(tmp_path, planted):
    root, src, _, _ = planted
    with pytest.raises(ConfigError, match=r"qa.jsonl has no field 'prompt' \(fields: question, answer, id\)") as e:
        run_transform("decontaminate", {"eval_sets": [f"qa={root}/qa.jsonl:prompt"]}, RunOptions(str(src), str(tmp_path / "o"), progress=False))
    assert "qa=" in e.value.fix and not (tmp_path / "o").exists() or not glob.glob(str(tmp_path / "o" / "*.parquet"))
    with pytest.raises(ConfigError, match="at least one evaluation set"):
        run_transform("decontaminate", {}, RunOptions(str(src), str(tmp_path / "o3"), progress=False))


def test_a_pipeline_spec_with_url_filter_and_decontaminate(tmp_path, planted):
    """Both stages in a user's spec: params checked in the plan, ja's branch gets characters."""
    from prepline.pipelines import spec as specs
    from prepline.pipelines.plan import entry, make_plan

    root, _, sets, _ = planted
    f = tmp_path / "web.yaml"
    f.write_text(specs.shipped_path().read_text().replace("name: super", "name: web")
                 .replace("  - lang_id ", "  - url_filter\n  - lang_id ")
                 .replace("    - doc_quality\n", "    - name: decontaminate\n      params: {eval_sets: ['%s']}\n    - doc_quality\n" % sets[0]))
    spec = specs.load(f)
    assert spec.order()[:7] == ["ingest", "doc_id", "exact_dedup", "fuzzy_dedup", "line_dedup", "url_filter", "lang_id"]
    p = make_plan(spec, input_path=str(tmp_path / "in"), work_root=str(tmp_path / "w"), run_id="run-1", detected_format="parquet")
    assert entry(p, "decontaminate", "ja")["params"]["unit"] == "characters"
    assert "unit" not in entry(p, "decontaminate", "en")["params"]
    assert entry(p, "doc_quality", "en")["input"] == entry(p, "decontaminate", "en")["output"]
    bad = f.read_text().replace(sets[0], "qa=/nonexistent/qa.jsonl:question")
    f.write_text(bad)
    with pytest.raises(ConfigError, match="qa.jsonl"):
        make_plan(specs.load(f), input_path=str(tmp_path / "in"), work_root=str(tmp_path / "w"), run_id="run-1", detected_format="parquet")


def test_word_ids_from_distinct_pieces_equal_normalising_the_whole_text(planted):
    """The fast path (split on white space, normalise each distinct piece once) gives the same token ids
    as normalising whole texts, on the sample's 20 languages and on text that normalisation reshapes."""
    import numpy as np

    from prepline.transforms.decontaminate import Index, parse_eval_set, tokens

    root, folder, sets, _ = planted
    index = Index([parse_eval_set(s) for s in sets], 13, "words")
    odd = ["", None, "  ", "1,000.5 dollars", "naïve CAFÉ, déjà-vu!", "a\u00a0b\u2003c", "\u0301alone", "x\x00y\x1fz", "«quoted» — dash",
           "東京タワー 2024年", "ÅNGSTRÖM\tﬁne", "end."]
    arr = pa.concat_arrays([_read(folder)["contents"].combine_chunks().cast(pa.string()), pa.array(odd, pa.string())])
    whole = tokens(arr, "words")
    ids, doc = index.token_ids(arr, "words")
    assert np.array_equal(ids, index._ids(whole.flatten()))
    assert np.array_equal(doc, np.repeat(np.arange(len(arr)), np.diff(whole.offsets.to_numpy())))
    assert (ids > 0).any() and (ids == 0).any()


def test_the_words_pass_finds_what_the_token_arrays_find(planted):
    """The compiled words pass (a piece cache, windows matched while reading) against the Arrow and
    NumPy path over whole token arrays: the same sets and n-grams, also when the cache is emptied
    between calls and has to grow from its smallest size."""
    import numpy as np

    from prepline.transforms import decontaminate as dc

    root, folder, sets, _ = planted
    index = dc.Index([dc.parse_eval_set(s) for s in sets], 13, "words")
    arr = _read(folder)["contents"].combine_chunks()
    odd = pa.array(["", None, "x\u3000y\u00a0z " * 40, "\u2028\u2029\x85 a"], pa.string())
    arr = pa.concat_arrays([arr.cast(pa.string()), odd])
    want = index.match_arrays(arr, "words")
    assert (want[0] >= 0).sum() >= 12
    got = index.match(arr, "words")
    assert np.array_equal(got[0], want[0]) and got[1] == want[1]
    index._piece_cache().max_pieces = 10  # emptied before every call: each slice starts from an empty cache
    parts = [index.match(arr.slice(a, 50), "words") for a in range(0, len(arr), 50)]
    assert np.array_equal(np.concatenate([f for f, _ in parts]), want[0]) and [g for _, gs in parts for g in gs] == want[1]


def test_matching_characters_in_slices_finds_the_same(tmp_path, monkeypatch):
    import numpy as np

    from prepline.transforms import decontaminate as dc

    (tmp_path / "e.jsonl").write_text(json.dumps({"t": "東京タワーは日本の電波塔です"}) + "\n")
    index = dc.Index([dc.parse_eval_set(f"e={tmp_path}/e.jsonl:t")], 6, "characters")
    arr = pa.array(["今日は東京タワーは日本の電波塔ですね" if i % 7 == 0 else "関係のない文章です。" * 5 for i in range(300)])
    whole = index.match(arr, "characters")
    monkeypatch.setattr(dc, "MATCH_BYTES", 3000)
    sliced = index.match(arr, "characters")
    assert np.array_equal(whole[0], sliced[0]) and whole[1] == sliced[1] and (whole[0] >= 0).sum() == 43
