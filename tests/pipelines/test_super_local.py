"""The whole super pipeline on a small sample, on this machine: kfp.local, a local Ray head per stage,
from a folder of JSONL.gz files whose text is in a `text` field and a WARC file of web pages (ingest
first, each file by its extension; text_column=text), per-language branches, one tokenizer for every
branch, every document accounted for, and local fine-tuning on the Megatron token output (which
megatron-core reads). The one multi-minute run of the suite: other pipeline runs use a few stages."""

from __future__ import annotations

import gzip
import html
import io
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest


def _texts(root: Path, docs: int, files: int, seed: int) -> list[list[str]]:
    """The bundled sample's texts, per file."""
    from prepline.sample import build_sample

    build_sample(str(root), docs=docs, files=files, seed=seed)
    return [pq.read_table(f, columns=["contents"]).column("contents").to_pylist() for f in sorted(root.glob("*.parquet"))]


def mixed_input(root: Path, jsonl_docs: int, warc_docs: int) -> Path:
    """Documents as users have them: JSONL.gz (the text in `text`) and a WARC file of web pages."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    out = root / "raw"
    out.mkdir()
    for i, texts in enumerate(_texts(root / "jsonl_sample", jsonl_docs, 3, 42)):
        with gzip.open(out / f"part-{i}.jsonl.gz", "wt", encoding="utf-8") as w:
            for t in texts:
                w.write(json.dumps({"text": t, "url": f"https://example.org/{i}"}, ensure_ascii=False) + "\n")
    with open(out / "crawl-0.warc.gz", "wb") as fh:
        w = WARCWriter(fh, gzip=True)
        for j, t in enumerate(_texts(root / "warc_sample", warc_docs, 1, 7)[0]):
            body = (f"<html><head><meta charset='utf-8'><title>page {j}</title></head><body><nav><a href='/'>Home</a></nav>"
                    f"<main><article>{''.join(f'<p>{html.escape(p)}</p>' for p in t.splitlines() if p.strip())}</article></main>"
                    "</body></html>").encode()
            headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(f"https://example.org/page/{j}", "response", payload=io.BytesIO(body),
                                                http_headers=headers))
    return out


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.browser
def test_super_pipeline_end_to_end(tmp_path):
    env = dict(os.environ, PREPLINE_LOCAL_CLUSTERS=str(tmp_path / "clusters"), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    src = mixed_input(tmp_path, 550, 50)
    train = {"steps": 8, "seq_len": 64, "batch_size": 4, "checkpoint_every": 0}  # merged into the spec's (no mixed_tokenizers)
    r = subprocess.run(
        [sys.executable, "-m", "prepline.cli", "pipeline", "run", "super", "--local", "--work-root", str(tmp_path / "w"),
         "--input", str(src), "--param", "text_column=text", "--param", 'languages=["en","ja"]',
         "--param", 'overrides_json={"tokenizer": {"params": {"vocab_size": 2000}}}', "--param", f"train_params_json={json.dumps(train)}"],
        capture_output=True, text=True, env=env, timeout=1500,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    stages = tmp_path / "w" / "stages"
    (run,) = [p for p in stages.iterdir() if p.is_dir()]
    meta = {str(p.parent.relative_to(run)): json.loads(p.read_text()) for p in run.rglob("metadata.json") if "_prepline" not in p.parts}
    plan = json.loads((run / "plan.json").read_text())
    assert plan["input"] == {"path": str(src), "format": "mixed", "ingest": True} and plan["text_column"] == "text"
    for s in ("ingest", "doc_id", "exact_dedup", "fuzzy_dedup", "line_dedup", "lang_id"):
        assert meta[s]["status"] == "success", s
    assert meta["ingest"]["totals"]["docs_in"] == 600 and meta["doc_id"]["parameters"]["content_column"] == "text"
    assert {f.split("/")[-1] for f in meta["ingest"]["files"]} >= {"crawl-0.warc.gz", "part-0.jsonl.gz"}  # each by its extension
    for lang in ("en", "ja"):
        for s in ("doc_quality", "pii_redactor", "filter", "tokenization"):
            m = meta[f"lang={lang}/{s}"]
            assert m["status"] == "success" and m["totals"]["docs_in"] > 0, (lang, s)
    assert "lang=en/hap" in meta and "lang=ja/hap" not in meta  # hap's model is English-only
    assert meta["lang=ja/pii_redactor"]["parameters"]["language"] == "ja"
    # every document accounted for: branch outputs + removed by stage and reason + languages without a branch
    cons = json.loads((run / "conservation.json").read_text())
    assert cons["holds"] and cons["input"] == 600 and cons["sinks"][0]["part"] == "lang=other" and cons["sinks_total"] > 0
    assert cons["input"] == cons["outputs_total"] + cons["removed_total"] + cons["sinks_total"]
    # one tokenizer for every branch: the tokenization outputs name the run's; fine-tuning saw one vocabulary
    shas = {json.loads((run / f"lang={lg}" / "tokenization" / "tokens" / "index.json").read_text())["tokenizer_sha256"]
            for lg in ("en", "ja")}
    assert shas == {json.loads((run / "tokenizer" / "tokenizer_train.json").read_text())["tokenizer_sha256"]}
    metrics = json.loads(next((run / "fine_tune").rglob("metrics.json")).read_text())
    assert metrics["steps"] == 8 and metrics["tokenizer_sha256"] in shas
    # megatron-core reads the super pipeline's token output
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed": expected on CPU
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    for lg in ("en", "ja"):
        tok = run / f"lang={lg}" / "tokenization"
        ds = IndexedDataset(str(tok / "tokens" / "text_document"))
        assert len(ds) == json.loads((tok / "tokens" / "index.json").read_text())["num_documents"] > 0
    assert not list((tmp_path / "clusters").glob("*.json")), "a stage cluster was left running"
    # the run ends with the whole picture: the stages, the accounting, the training result
    out = r.stdout + r.stderr
    assert "documents per stage" in out and "per-stage overhead" in out and "fine_tune: 8 steps, loss" in out
    assert f"documents: 600 in = {cons['outputs_total']:,} out" in out and "kept aside (lang=other" in out
    n = len(meta)  # a row per stage and branch: ingest and 5 global stages, 5 for en, 4 for ja (no hap)
    assert n == 15 and sum(1 for line in out.splitlines() if line.startswith("│ ") and line.split("│")[1].strip() in meta_stages(meta)) == n
    # ... and the report's path: the charts of the run's real numbers, the same the pipeline's last step made as its HTML artifact
    assert "executor_input" not in out
    assert "prepline.train: fine_tune (local): " in out  # the training step's own lines are prepline's lines too
    report = re.search(r"^report: (\S+)$", out, re.M)
    assert report and report.group(1) == str(run / "report.html")
    page = (run / "report.html").read_text()
    funnel = re.findall(r'<rect class="bar" data-series="out" data-row="([^"]*)" data-value="([^"]*)"', charts(page)["chart-funnel"])
    assert len(funnel) == n and dict(funnel)["filter (ja)"] == str(meta["lang=ja/filter"]["totals"]["docs_out"])
    assert 'data-series="loss" data-points="8"' in page
    (artifact,) = [p for p in (tmp_path / "w" / "kfp").rglob("report") if p.parent.name.startswith("run-report")]
    assert charts(artifact.read_text()) == charts(page)
    assert f"documents: 600 in = {cons['outputs_total']:,} out" in html.unescape(page)  # the accounting too
    steps_carry_their_counters(tmp_path / "w" / "kfp", meta)
    opens_in_chromium(run / "report.html", tmp_path, n)


def steps_carry_their_counters(kfp_root, meta: dict) -> None:
    """Every execute step's Markdown and Metrics (as kfp.local wrote them) carry its transform's
    headline numbers from the stage's metadata.json: one step per stage and branch, 10 transforms."""
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
    assert seen == set(meta)


def opens_in_chromium(page_file, tmp_path, stages: int) -> None:
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
    assert len(rows) == stages and {"ingest", "lang_id", "hap (en)", "tokenization (ja)"} <= set(rows) and drawn["chart-time"]["rows"] == rows
    assert {"en", "ja"} <= set(drawn["chart-languages"]["rows"]) and drawn["chart-loss"]["series"] == ["loss"]


def charts(page: str) -> dict[str, str]:
    """Each chart's SVG by its id."""
    return {m.group(2): m.group(1) for m in re.finditer(r'(<svg class="chart" id="([^"]+)".*?</svg>)', page, re.S)}


def meta_stages(meta: dict) -> set[str]:
    return {k.split("/")[-1] for k in meta}
