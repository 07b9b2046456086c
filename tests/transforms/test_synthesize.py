"""synthesize: a tiny causal LM made here (a byte-level BPE trained on the bundled sample, a one-layer
prepline CausalLM) rephrases sample documents on CPU: counts conserved with the generated documents,
provenance complete, the same text on a rerun, partitions checkpointed so that a killed run resumes
losing at most the partition in flight and ends identical, bad models and templates fail clearly."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError
from tiny_lm import make_model

torch = pytest.importorskip("torch")

TEMPLATES = ["wiki=Rewrite as an encyclopedia paragraph: {text} Paragraph:", "qa=Questions and answers about: {text} Q:"]
SMALL = {"max_new_tokens": 12, "max_prompt_tokens": 24, "templates": TEMPLATES, "partition_docs": 8}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from prepline.sample import build_sample

    root = tmp_path_factory.mktemp("synth")
    build_sample(root / "sample", docs=120, files=2)
    files = sorted(glob.glob(str(root / "sample" / "part-*.parquet")))
    texts = [t for f in files for t in pq.read_table(f, columns=["contents"]).column(0).to_pylist() if t]
    run_transform("doc_id", {}, RunOptions(input=str(root / "sample"), output=str(root / "in"), workers=1, progress=False))
    # a document without text: skipped, counted
    first = sorted(glob.glob(str(root / "in" / "part-*.parquet")))[0]
    t = pq.read_table(first)
    col = t.schema.get_field_index("contents")
    t = t.set_column(col, t.schema.field(col), pa.array([""] + t.column(col).to_pylist()[1:], t.schema.field(col).type))
    pq.write_table(t, first)
    make_model(root / "model", texts)
    return root


def _run(corpus, out: Path, **params):
    p = {"model_path": str(corpus / "model"), **SMALL, **params}
    return run_transform("synthesize", p, RunOptions(input=str(corpus / "in"), output=str(out), workers=1, progress=False, overwrite=True)).metadata


def _read(folder: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(f) for f in sorted(glob.glob(str(folder / "part-*.parquet"))))


def test_rephrasings_with_provenance_and_counts(corpus, tmp_path):
    meta = _run(corpus, tmp_path / "out")
    t = meta["totals"]
    src = _read(corpus / "in")
    n, with_text = src.num_rows, int(pc.sum(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(src["contents"])), 0)).as_py())
    assert t["docs_in"] == n and t["docs_in"] + sum(t["generated"].values()) == t["docs_out"] + sum(t["removed"].values())
    assert t["counters"]["synth_skipped_no_text"] == n - with_text >= 1
    empty = sum(v for k, v in t["counters"].items() if k.startswith("synth_empty_"))
    assert sum(t["generated"].values()) + empty == 2 * with_text and set(t["generated"]) == {"wiki", "qa"}
    out = _read(tmp_path / "out")
    synth = out.filter(pc.is_valid(out["synth_template"]))
    originals = out.filter(pc.is_null(out["synth_template"]))
    assert originals.num_rows == n and synth.num_rows == sum(t["generated"].values())
    for name in ("synth_source_id", "synth_model", "synth_model_sha256", "synth_engine", "synth_sampling", "synth_seed",
                 "synth_prompt_tokens", "synth_new_tokens"):
        assert synth[name].null_count == 0, name
    assert set(synth["synth_engine"].to_pylist()) == {"torch"} and len(set(synth["synth_model_sha256"].to_pylist())) == 1
    assert json.loads(synth["synth_sampling"][0].as_py()) == {"max_new_tokens": 12, "temperature": 0.8, "top_k": 50}
    assert max(synth["synth_new_tokens"].to_pylist()) <= 12 and min(synth["synth_prompt_tokens"].to_pylist()) > 0
    ids = out["doc_id"].to_pylist()
    assert len(set(ids)) == len(ids)  # new ids never collide with doc_id's
    assert set(synth["synth_source_id"].to_pylist()) <= set(src["doc_id"].to_pylist())
    assert all(s.strip() for s in synth["contents"].to_pylist())
    # a new document keeps its source's other columns (lang, source)
    by_id = {r["doc_id"]: r for r in src.select(["doc_id", "source"]).to_pylist()}
    assert all(by_id[s]["source"] == x for s, x in zip(synth["synth_source_id"].to_pylist(), synth["source"].to_pylist()))


def test_a_rerun_writes_the_same_text(corpus, tmp_path):
    _run(corpus, tmp_path / "a")
    _run(corpus, tmp_path / "b", batch_tokens=64)  # other batches: each request has its own seed
    a, b = _read(tmp_path / "a"), _read(tmp_path / "b")
    assert a.sort_by("doc_id").equals(b.sort_by("doc_id"))


def test_without_originals_they_are_removed_as_rephrased(corpus, tmp_path):
    meta = _run(corpus, tmp_path / "out", keep_originals=False, temperature=0.0)
    t = meta["totals"]
    assert t["removed"]["no_text"] >= 1 and t["removed"]["rephrased"] == t["docs_in"] - t["removed"]["no_text"]
    assert t["docs_out"] == sum(t["generated"].values()) and _read(tmp_path / "out")["synth_template"].null_count == 0


def test_a_killed_run_resumes_losing_at_most_the_partition_in_flight(corpus, tmp_path):
    whole = tmp_path / "whole"
    _run(corpus, whole)
    out = tmp_path / "killed"
    cli = ["run", "synthesize", "--input", str(corpus / "in"), "--output", str(out), "--workers", "1", "--no-progress",
           "--params", json.dumps({"model_path": str(corpus / "model"), **SMALL})]
    killed = subprocess.run([sys.executable, str(Path(__file__).with_name("kill_at_partition.py")), "3", "--", *cli],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    work = next(out.glob("_*/work/synthesize"))
    before = {p: p.stat().st_mtime_ns for p in work.rglob("*.json")}
    assert len(before) == 3
    done = subprocess.run([sys.executable, "-m", "prepline.cli", *cli], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    after = {p: p.stat().st_mtime_ns for p in work.rglob("*.json")} if work.exists() else before
    assert all(after.get(p) == m for p, m in before.items())  # the finished partitions were not made again
    assert _read(out).sort_by("doc_id").equals(_read(whole).sort_by("doc_id"))
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["totals"]["generated"] == json.loads((whole / "metadata.json").read_text())["totals"]["generated"]


@pytest.mark.parametrize("params,says", [
    ({"model_path": ""}, "model_path is empty"),
    ({"templates": ["wiki=no placeholder"]}, "{text}"),
    ({"templates": ["Bad Name=x {text}"]}, "name=prompt"),
    ({"templates": ["a=x {text}", "a=y {text}"]}, "twice"),
])
def test_bad_parameters_are_clear_errors(corpus, tmp_path, params, says):
    with pytest.raises(ConfigError, match=r"(?i)" + says.replace("{", r"\{").replace("}", r"\}")):
        _run(corpus, tmp_path / "out", **params)


def test_a_folder_that_is_not_a_model(corpus, tmp_path):
    (tmp_path / "nomodel").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        _run(corpus, tmp_path / "out", model_path=str(tmp_path / "nomodel"))


def test_vllm_where_it_cannot_run_says_why(corpus, tmp_path):
    from prepline.generation import vllm_missing

    if not vllm_missing():
        pytest.skip("vLLM and a GPU are here: scripts/bench.py --synthesize measures it")
    with pytest.raises(ConfigError, match="engine=vllm cannot run"):
        _run(corpus, tmp_path / "out", engine="vllm")


def test_the_super_synthetic_recipe_asks_for_the_model_and_rephrases_en_only(corpus, tmp_path):
    """specs/super_synthetic.yaml: without a model the plan step stops and says how to give one; with
    it, synthesize runs in the en branch between filter and tokenization, and in no other branch."""
    from prepline.pipelines import spec as specs
    from prepline.pipelines.plan import entry, make_plan

    spec = specs.load(specs.shipped_path("super_synthetic"))
    where = dict(input_path=str(corpus / "in"), work_root=str(tmp_path / "w"), run_id="r", detected_format="parquet")
    with pytest.raises(ConfigError, match="model_path is not set") as e:
        make_plan(spec, **where)
    assert "overrides_json" in e.value.fix
    p = make_plan(spec, **where, overrides={"synthesize": {"params": {"model_path": str(corpus / "model")}}})
    syn = entry(p, "synthesize", "en")
    assert syn["input"] == entry(p, "filter", "en")["output"] and entry(p, "tokenization", "en")["input"] == syn["output"]
    assert not [e for e in p["entries"] if e["stage"] == "synthesize" and e["branch"] != "en" and e["runs"]]
