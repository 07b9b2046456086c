"""The whole super pipeline on a small sample, on this machine: kfp.local, a local Ray head per stage,
per-language branches, and local fine-tuning at the end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.browser
def test_super_pipeline_end_to_end(tmp_path):
    env = dict(os.environ, PREPLINE_LOCAL_CLUSTERS=str(tmp_path / "clusters"), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    train = {"mixed_tokenizers": "separate", "steps": 8, "seq_len": 64, "batch_size": 4, "checkpoint_every": 0}
    r = subprocess.run(
        [sys.executable, "-m", "prepline.cli", "pipeline", "run", "super", "--local", "--work-root", str(tmp_path / "w"),
         "--sample-docs", "800", "--param", 'languages=["en","ja"]', "--param", f"train_params_json={json.dumps(train)}"],
        capture_output=True, text=True, env=env, timeout=1500,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    stages = tmp_path / "w" / "stages"
    (run,) = [p for p in stages.iterdir() if p.is_dir()]
    meta = {str(p.parent.relative_to(run)): json.loads(p.read_text()) for p in run.rglob("metadata.json")}
    for s in ("doc_id", "exact_dedup", "fuzzy_dedup", "lang_id"):
        assert meta[s]["status"] == "success", s
    for lang in ("en", "ja"):
        for s in ("doc_quality", "pii_redactor", "hap", "filter", "tokenization"):
            m = meta[f"lang={lang}/{s}"]
            assert m["status"] == "success" and m["totals"]["docs_in"] > 0, (lang, s)
    # documents flow: what a stage wrote is what the next one read
    assert meta["exact_dedup"]["totals"]["docs_in"] == meta["doc_id"]["totals"]["docs_out"] == 800
    assert meta["lang_id"]["totals"]["parts"]["lang=en"] == meta["lang=en/doc_quality"]["totals"]["docs_in"]
    assert meta["lang=en/filter"]["totals"]["docs_out"] == meta["lang=en/tokenization"]["totals"]["docs_in"]
    assert list((run / "fine_tune").rglob("metrics.json")), "fine_tune wrote no metrics"
    assert not list((tmp_path / "clusters").glob("*.json")), "a stage cluster was left running"
    # the run ends with the whole picture: 14 stage rows (4 global, 2 branches × 5) and the training result
    out = r.stdout + r.stderr
    assert "documents per stage" in out and "per-stage overhead" in out and "fine_tune: 8 steps, loss" in out
    assert sum(1 for line in out.splitlines() if line.startswith("│ ") and line.split("│")[1].strip() in meta_stages(meta)) == 14
    # ... and the report's path: the charts of the run's real numbers, the same the pipeline's last step made as its HTML artifact
    assert "executor_input" not in out
    assert "prepline.train: fine_tune (local): " in out  # the training step's own lines are prepline's lines too
    report = re.search(r"^report: (\S+)$", out, re.M)
    assert report and report.group(1) == str(run / "report.html")
    page = (run / "report.html").read_text()
    funnel = re.findall(r'<rect class="bar" data-series="out" data-row="([^"]*)" data-value="([^"]*)"', charts(page)["chart-funnel"])
    assert len(funnel) == 14 and dict(funnel)["filter (ja)"] == str(meta["lang=ja/filter"]["totals"]["docs_out"])
    assert 'data-series="loss" data-points="8"' in page
    (artifact,) = [p for p in (tmp_path / "w" / "kfp").rglob("report") if p.parent.name.startswith("run-report")]
    assert charts(artifact.read_text()) == charts(page)
    steps_carry_their_counters(tmp_path / "w" / "kfp", meta)
    opens_in_chromium(run / "report.html", tmp_path)


def steps_carry_their_counters(kfp_root, meta: dict) -> None:
    """Every execute step's Markdown and Metrics (as kfp.local wrote them) carry its transform's
    headline numbers from the stage's metadata.json: 14 steps, 9 transforms."""
    seen = set()
    for out in kfp_root.rglob("execute-ray-job*/executor_output.json"):
        arts = json.loads(out.read_text())["artifacts"]
        md = (out.parent / "summary").read_text()
        head = re.match(r"## (\w+)(?: \((\w+)\))?: success", md)
        key = f"lang={head.group(2)}/{head.group(1)}" if head.group(2) else head.group(1)
        metrics = arts["metrics"]["artifacts"][0]["metadata"]
        items = [h for h in meta[key]["headline"] if not h["key"].startswith("removed.")]
        assert items or meta[key]["totals"]["removed"], key
        for h in items:
            cell = h["label"].replace("|", "\\|").replace("`", "\\`")  # as a Markdown cell
            assert f"| {cell} | {h['value']:,} |" in md and metrics[h["label"]] == h["value"], (key, h)
        assert metrics["work_seconds"] == meta[key]["totals"]["work_seconds"] and "| work seconds |" in md
        seen.add(key)
    assert len(seen) == 14


def opens_in_chromium(page_file, tmp_path) -> None:
    """The run's report in headless Chromium: no error, the five charts drawn with the run's stages,
    branches and loss; its screenshot kept as test-artifacts/report-super.png."""
    from chromium import READ_CHARTS, keep, open_page

    with open_page(tmp_path / "profile") as (page, problems):
        page.goto(page_file.as_uri(), wait_until="load")
        drawn = {c["id"]: c for c in page.evaluate(READ_CHARTS)}
        page.screenshot(path=str(tmp_path / "report-super.png"), full_page=True)
    keep(tmp_path / "report-super.png", "report-super.png")
    assert problems == []
    assert set(drawn) == {"chart-funnel", "chart-removed", "chart-languages", "chart-time", "chart-loss"}
    assert all(c["marks"] > 0 and c["width"] > 300 and c["outside"] == [] for c in drawn.values()), drawn  # long SQL legends wrap
    rows = drawn["chart-funnel"]["rows"]
    assert len(rows) == 14 and {"doc_id", "lang_id", "filter (en)", "tokenization (ja)"} <= set(rows) and drawn["chart-time"]["rows"] == rows
    assert {"en", "ja"} <= set(drawn["chart-languages"]["rows"]) and drawn["chart-loss"]["series"] == ["loss"]


def charts(page: str) -> dict[str, str]:
    """Each chart's SVG by its id."""
    return {m.group(2): m.group(1) for m in re.finditer(r'(<svg class="chart" id="([^"]+)".*?</svg>)', page, re.S)}


def meta_stages(meta: dict) -> set[str]:
    return {k.split("/")[-1] for k in meta}
