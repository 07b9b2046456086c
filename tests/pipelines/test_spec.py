"""Pipeline specs and their plans: the shape as data, overrides that merge, per-branch settings,
what the shape requires wired, and every document accounted for (no KFP run, no Ray: the plan's
stages run here through the engine, one local worker each)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import write_parquet
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, RunFailed
from prepline.pipelines import spec as specs
from prepline.pipelines.conservation import account, check
from prepline.pipelines.plan import detect_format, entry, make_plan, read_plan, write_plan
from prepline.stages import prepare

SHIPPED = specs.shipped()


def plan_of(tmp_path: Path, spec=SHIPPED, **kw) -> dict:
    args = dict(input_path=str(tmp_path / "in"), work_root=str(tmp_path / "w"), run_id="run-1", detected_format="parquet")
    return make_plan(spec, **{**args, **kw})


def params(plan: dict, stage: str, branch: str = "") -> dict:
    return entry(plan, stage, branch)["params"]


# ---------------------------------------------------------------------------------------------
# the spec


def test_the_shipped_spec_is_the_super_pipeline_and_round_trips():
    assert SHIPPED.order() == ["ingest", "doc_id", "exact_dedup", "fuzzy_dedup", "line_dedup", "lang_id", "doc_quality", "pii_redactor",
                               "hap", "filter", "tokenization"]
    assert SHIPPED.branches.languages == ("en", "ja", "fr") and SHIPPED.stage("hap").languages == ("en",)
    assert SHIPPED.shared_tokenizer and SHIPPED.train and "mixed_tokenizers" not in SHIPPED.train_params
    assert specs.load(SHIPPED.to_dict()) == SHIPPED
    assert specs.load(specs.shipped_path()) == SHIPPED


@pytest.mark.parametrize("change, match", [
    (lambda d: d["stages"].append("no_such"), "'no_such'.*is not a transform"),
    (lambda d: d["stages"].insert(0, "lang_id"), "appears twice"),
    (lambda d: d["stages"].insert(0, "ingest"), "put first by the plan"),
    (lambda d: d["stages"].remove("lang_id"), "need lang_id as the last global stage"),
    (lambda d: d["branches"]["stages"].pop(), "tokenization among the branch stages"),
    (lambda d: d.update(input={"format": "xml"}), "input.format"),
    (lambda d: d["branches"]["stages"][0].__class__ is str and d["branches"]["stages"].__setitem__(0, {"name": "doc_quality", "parms": {}}),
     "unknown key.*parms"),
    (lambda d: d.update(name="My Pipeline"), "snake_case"),
])
def test_a_bad_spec_fails_with_where_and_how(change, match):
    d = SHIPPED.to_dict()
    change(d)
    with pytest.raises(ConfigError, match=match):
        specs.load(d)


def test_a_spec_file_with_a_stage_removed_and_one_reordered(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(specs.shipped_path().read_text().replace("  - fuzzy_dedup\n", "").replace("name: super", "name: mine")
                 .replace("    - doc_quality\n    - pii_redactor\n", "    - pii_redactor\n    - doc_quality\n"))
    mine = specs.load(f)
    assert mine.order() == ["ingest", "doc_id", "exact_dedup", "line_dedup", "lang_id", "pii_redactor", "doc_quality", "hap", "filter",
                            "tokenization"]
    p = plan_of(tmp_path, mine)
    assert entry(p, "doc_quality", "ja")["input"].endswith("/lang=ja/pii_redactor")
    assert entry(p, "line_dedup")["input"].endswith("/exact_dedup")


# ---------------------------------------------------------------------------------------------
# overrides merge into the defaults; the shape is wired


def test_a_partial_override_gets_the_defaults_plus_the_override(tmp_path):
    plain = plan_of(tmp_path)
    over = plan_of(tmp_path, overrides={"lang_id": {"params": {"min_score": 0.5}}, "filter": {"params": {"columns_to_drop": ["url"]}},
                                        "fuzzy_dedup": {"cluster": {"workers": {"replicas": 4}}}},
                   cluster={"workers": {"cpu": "4", "memory": "16Gi"}})
    assert params(plain, "lang_id") == {"content_column": "contents", "split": True, "languages": ["en", "ja", "fr"]}
    assert params(over, "lang_id") == {**params(plain, "lang_id"), "min_score": 0.5}  # lang_id still splits
    for b in ("en", "ja"):
        assert params(over, "filter", b) == {**params(plain, "filter", b), "columns_to_drop": ["url"]}  # the criteria stay
    assert entry(over, "fuzzy_dedup")["cluster"] == {"workers": {"cpu": "4", "memory": "16Gi", "replicas": 4}}  # deep merge
    assert entry(over, "doc_id")["cluster"] == {"workers": {"cpu": "4", "memory": "16Gi"}}


def test_a_branch_override_reaches_only_its_branch(tmp_path):
    p = plan_of(tmp_path, overrides={"pii_redactor": {"params": {"mode": "mask"}, "branches": {"ja": {"params": {"mask_char": "#"}}}},
                                     "filter": {"branches": {"fr": {"cluster": {"workers": {"replicas": 2}}}}}})
    assert params(p, "pii_redactor", "ja")["mask_char"] == "#"
    assert all("mask_char" not in params(p, "pii_redactor", b) for b in ("en", "fr"))
    assert all(params(p, "pii_redactor", b)["mode"] == "mask" for b in ("en", "ja", "fr"))
    assert entry(p, "filter", "fr")["cluster"] == {"workers": {"replicas": 2}}
    assert entry(p, "filter", "en")["cluster"] == {} == entry(p, "filter", "ja")["cluster"]


def test_what_the_shape_requires_cannot_be_lost(tmp_path):
    with pytest.raises(ConfigError, match="lang_id.split=false conflicts with the pipeline's shape"):
        plan_of(tmp_path, overrides={"lang_id": {"params": {"split": False}}})
    with pytest.raises(ConfigError, match="lang_id.languages"):
        plan_of(tmp_path, overrides={"lang_id": {"params": {"languages": ["de"]}}})
    with pytest.raises(ConfigError, match="pii_redactor.*'branches'.*'ja'.*nope"):  # a typo fails in the first step
        plan_of(tmp_path, overrides={"pii_redactor": {"branches": {"ja": {"params": {"nope": 1}}}}})
    with pytest.raises(ConfigError, match="filter \\(branch en\\): filter criterion 1"):
        plan_of(tmp_path, overrides={"filter": {"branches": {"en": {"params": {"criteria": ["x; DROP TABLE docs"]}}}}})


def test_branch_aware_defaults(tmp_path):
    p = plan_of(tmp_path, languages=["en", "ja", "other"])
    assert params(p, "pii_redactor", "en") == {"content_column": "contents"}  # Presidio's English defaults
    assert params(p, "pii_redactor", "ja")["language"] == "ja" and "US_SSN" not in params(p, "pii_redactor", "ja")["entities"]
    assert params(p, "pii_redactor", "other")["language"] == "xx"  # many languages: spaCy's multi-language tokenizer
    assert params(p, "doc_quality", "ja")["default_lang"] == "ja" and "default_lang" not in params(p, "doc_quality", "other")
    # hap's model is English-only: it runs for en, and the other branches' filter reads pii_redactor's output
    assert entry(p, "hap", "en")["runs"] and not entry(p, "hap", "ja")["runs"]
    assert entry(p, "filter", "ja")["input"] == entry(p, "pii_redactor", "ja")["output"]
    assert "hap_score < 0.9" in params(p, "filter", "en")["criteria"] and not any("hap" in c for c in params(p, "filter", "ja")["criteria"])
    # with an `other` branch nothing is kept aside; without, lang_id's lang=other is the sink
    assert "sinks" not in p and params(p, "lang_id")["languages"] == ["en", "ja"]
    assert plan_of(tmp_path, languages=["en"])["sinks"][0]["part"] == "lang=other"


def test_text_column_and_input_format(tmp_path):
    p = plan_of(tmp_path, text_column="text", detected_format="jsonl")
    assert entry(p, "ingest")["runs"] and entry(p, "ingest")["params"] == {"text_column": "text"}
    assert entry(p, "doc_id")["input"] == entry(p, "ingest")["output"]
    assert all(e["params"].get("content_column", "text") == "text" for e in p["entries"] if e["runs"])
    assert params(p, "filter", "ja")["criteria"][0] == 'length(trim("text")) >= 20'
    assert p["tokenizer"]["params"]["content_column"] == "text" and p["tokenizer"]["input_stage"] == "filter"
    q = plan_of(tmp_path)
    assert not entry(q, "ingest")["runs"] and entry(q, "doc_id")["input"] == str(tmp_path / "in")
    # auto: by the files' extensions (hidden and _ files are not data)
    (tmp_path / "j").mkdir()
    with gzip.open(tmp_path / "j" / "a.jsonl.gz", "wt") as f:
        f.write('{"text": "x"}\n')
    write_parquet(tmp_path / "p", "x.parquet", {"contents": ["a"]})
    (tmp_path / "p" / "_truth").mkdir()
    (tmp_path / "p" / "_truth" / "summary.json").write_text("{}")
    assert detect_format(str(tmp_path / "j")) == "jsonl" and detect_format(str(tmp_path / "p")) == "parquet"
    assert detect_format(str(tmp_path / "j" / "a.jsonl.gz")) == "jsonl"


def test_prepare_takes_the_stage_from_the_plan(tmp_path):
    p = plan_of(tmp_path, overrides={"tokenization": {"branches": {"ja": {"params": {"vocab_size": 300}}}}})
    write_plan(p)
    assert read_plan(str(tmp_path / "w"), "run-1") == p
    r = prepare("tokenization", "{}", str(tmp_path / "w"), "kfp-job-9", "tokenization", "ja", run_id_override="run-1", from_plan=True)
    cfg = json.loads(r["config_json"])
    assert cfg["tokenizer"] == f"{tmp_path / 'w'}/run-1/tokenizer"  # run:tokenizer: this run's shared tokenizer
    assert cfg["vocab_size"] == 300 and cfg["tokens_column"] == "" and r["input_path"].endswith("run-1/lang=ja/filter")
    skipped = prepare("hap", "{}", str(tmp_path / "w"), "kfp-job-9", "hap", "ja", run_id_override="run-1", from_plan=True)
    assert skipped == {"run": False, "reason": "hap runs for en only (pipeline spec)", "stage": "hap", "branch": "ja"}


# ---------------------------------------------------------------------------------------------
# every document accounted for


MINI = {"name": "mini", "stages": ["doc_id", "lang_id"],
        "branches": {"languages": ["en", "ja"], "stages": [{"name": "filter", "params": {"criteria": ['length("${text_column}") >= 40']}}]}}


def run_plan(plan: dict, only=None) -> None:
    """The plan's stages, in order, through the engine (what the pipeline's stages do on their clusters)."""
    from prepline.stages import run_refs

    for e in plan["entries"]:
        if e["runs"] and (only is None or (e["stage"], e["branch"]) == only):
            run_transform(e["stage"], run_refs(e["params"], plan["work_root"], "run-1"),
                          RunOptions(input=e["input"], output=e["output"], workers=1, progress=False, overwrite=only is not None))


@pytest.fixture(scope="module")
def mini_run(tmp_path_factory):
    from prepline.sample import build_sample

    root = tmp_path_factory.mktemp("conservation")
    build_sample(str(root / "in"), docs=300, files=3)
    plan = make_plan(specs.load(MINI), input_path=str(root / "in"), work_root=str(root / "w"), run_id="run-1")
    run_plan(plan)
    return plan


def test_every_document_is_accounted_for(mini_run):
    r = check(mini_run)
    assert r["holds"] and r["input"] == 300 and r["sinks"][0]["part"] == "lang=other" and r["sinks"][0]["docs"] > 0
    assert r["input"] == r["outputs_total"] + r["removed_total"] + r["sinks_total"]
    assert set(r["removed"]) <= {"filter (en)", "filter (ja)"} and r["removed_total"] > 0
    assert json.loads((Path(mini_run["run"]) / "conservation.json").read_text()) == r


def test_the_check_fails_when_a_stage_loses_documents(mini_run, tmp_path):
    import shutil

    plan = json.loads(json.dumps(mini_run))
    lost = Path(entry(plan, "lang_id")["output"]) / "lang=ja"
    shutil.copytree(lost, tmp_path / "keep")
    try:
        victim = sorted(lost.rglob("*.parquet"))[0]
        victim.unlink()  # documents lang_id wrote that the ja branch never reads
        run_plan(plan, only=("filter", "ja"))
        with pytest.raises(RunFailed, match=r"filter \(ja\) read .* documents where the stage before it wrote .* lost"):
            check(plan, write=False)
        assert not account(plan)["holds"]
    finally:
        shutil.rmtree(lost)
        shutil.copytree(tmp_path / "keep", lost)
        run_plan(plan, only=("filter", "ja"))
    assert check(plan, write=False)["holds"]


def test_the_run_tokenizer_trains_on_the_branches_the_plan_names(mini_run):
    """train_tokenizer reads what the plan says: the branch folders before tokenization, and writes
    the folder that each branch's tokenization gets for ``run:tokenizer``."""
    from prepline.pipelines.steps import tokenizer_step
    from prepline.stages import run_refs

    d = json.loads(json.dumps(MINI))
    d["branches"]["stages"].append({"name": "tokenization", "params": {"tokenizer": "run:tokenizer"}})
    d["tokenizer"] = {"params": {"vocab_size": 300}}
    plan = make_plan(specs.load(d), input_path=mini_run["input"]["path"], work_root=mini_run["work_root"], run_id="run-1")
    t = plan["tokenizer"]
    assert t["inputs"] == [entry(plan, "filter", b)["output"] for b in ("en", "ja")] == [entry(mini_run, "filter", b)["output"] for b in ("en", "ja")]
    write_plan(plan)
    rec = tokenizer_step(plan["work_root"], "run-1")
    assert rec["output"] == t["output"] == run_refs(params(plan, "tokenization", "ja"), plan["work_root"], "run-1")["tokenizer"]
    assert Path(rec["output"], "tokenizer.json").is_file() and [r["input"] for r in rec["inputs"]] == t["inputs"]
    assert all(r["docs"] > 0 for r in rec["inputs"]) and rec["vocab_size"] == 300


def test_compile_a_spec_file_in_a_fresh_process(tmp_path):
    """prepline pipeline compile my.yaml: the nested and the chained pipeline (its stages' simple
    pipelines are made first: a fresh process has none yet) and the Elyra template."""
    import subprocess
    import sys

    import yaml

    mine = Path(__file__).parent / "mine.yaml"
    r = subprocess.run([sys.executable, "-m", "prepline.cli", "pipeline", "compile", str(mine), "--output", str(tmp_path),
                        "--elyra", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.pipeline", "mine.yaml", "mine_chained.yaml"]
    spec = next(yaml.safe_load_all((tmp_path / "mine.yaml").read_text()))
    assert spec["pipelineInfo"]["name"] == "prepline-mine"
    assert spec["root"]["inputDefinitions"]["parameters"]["text_column"]["defaultValue"] == "text"
    assert "fine_tune" not in spec["root"]["dag"]["tasks"] and "train_mode" not in spec["root"]["inputDefinitions"]["parameters"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(mine.read_text().replace("- doc_quality", "- doc_qualty"))
    r = subprocess.run([sys.executable, "-m", "prepline.cli", "pipeline", "compile", str(bad)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "stage 'doc_qualty': is not a transform" in r.stderr and "fix:" in r.stderr


def test_a_wrong_tokenizer_path_fails_the_plan_step_at_once(tmp_path):
    """Issue 30 finding 9: a bad `tokenizer` path in the super pipeline was found after 183 s (at the
    tokenization stage); the plan step, the run's first, now loads it (a quick check) and fails."""
    import time

    bad = str(tmp_path / "no" / "tokenizer.json")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="tokenization \\(branch en\\): tokenizer .*no such file") as e:
        plan_of(tmp_path, overrides={"tokenization": {"params": {"tokenizer": bad}}})
    assert "tokenizer.json" in e.value.fix
    assert time.perf_counter() - t0 < 60  # (generous: seconds, not a stage's minutes)
    broken = tmp_path / "broken.json"
    broken.write_text('{"not": "a tokenizer"}')
    with pytest.raises(ConfigError, match="tokenization \\(branch ja\\)"):
        plan_of(tmp_path, overrides={"tokenization": {"branches": {"ja": {"params": {"tokenizer": str(broken)}}}}})
    # the shipped spec's run:tokenizer (made by the run itself) and a trained one ('') still plan
    assert params(plan_of(tmp_path), "tokenization", "en")["tokenizer"] == "run:tokenizer"
    assert params(plan_of(tmp_path, overrides={"tokenization": {"params": {"tokenizer": ""}}}), "tokenization", "en")["tokenizer"] == ""
