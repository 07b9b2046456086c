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
    for s in ("ingest", "doc_id", "exact_dedup", "fuzzy_dedup", "lang_id"):
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
