"""Pipelines run end to end on this machine: kfp.local + a real local Ray head per stage."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_parquet


def _run(args: list[str], env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prepline.cli", *args], capture_output=True, text=True, env=env, timeout=timeout)


def _clusters_left(state: Path) -> list[str]:
    return sorted(p.stem for p in state.glob("*.json")) if state.exists() else []


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ, PREPLINE_LOCAL_CLUSTERS=str(tmp_path / "clusters"), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    return e


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.integration
def test_simple_pipeline_runs_locally(tmp_path, corpus, env):
    timings = tmp_path / "timings.json"
    r = _run(["pipeline", "run", "doc_id", "--local", "--input", str(corpus), "--work-root", str(tmp_path / "w"),
              "--timings-json", str(timings)], env)
    assert r.returncode == 0, r.stderr[-3000:]
    metas = list((tmp_path / "w" / "stages").rglob("doc_id/metadata.json"))
    assert len(metas) == 1 and json.loads(metas[0].read_text())["totals"]["docs_out"] == 10
    assert _clusters_left(tmp_path / "clusters") == []
    # where the time went: one run of each task kind, the stage overhead summed from them
    t = json.loads(timings.read_text())
    kinds = t["by_kind"]
    assert set(kinds) == {"prepare-args", "start-ray-cluster", "execute-ray-job", "stop-ray-cluster"}
    assert all(k["n"] == 1 and 0 < k["total"] < t["seconds"] for k in kinds.values())
    assert t["stage_overhead_seconds"] == pytest.approx(
        sum(kinds[k]["mean"] for k in ("prepare-args", "start-ray-cluster", "stop-ray-cluster")))
    assert "per-stage overhead" in r.stdout + r.stderr and all(x["status"] == "SUCCESS" for x in t["tasks"])
    # and what happened to the documents, read back from the stage's metadata.json
    out = r.stdout + r.stderr
    assert "documents per stage" in out and re.search(r"│ doc_id\s*│\s*│\s*10 │\s*10 │", out), out[-2000:]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.integration
def test_failing_stage_still_stops_its_cluster_and_fails_the_run(tmp_path, env):
    bad = tmp_path / "in"
    write_parquet(bad, "ok.parquet", {"contents": ["fine"]})
    (bad / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    r = _run(["pipeline", "run", "doc_id", "--local", "--input", str(bad), "--work-root", str(tmp_path / "w")], env)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "broken.parquet" in out and "not a readable Parquet file" in out  # the stage's own error reaches the user
    assert "stop-ray-cluster" in out and "deleted" in out  # the exit task ran
    assert "doc_id (FAILED)" in out and "failed file(s):" in out  # the closing table says which (the cell may wrap)
    assert _clusters_left(tmp_path / "clusters") == []


def write_warcs(root: Path, docs: int = 240, files: int = 2) -> Path:
    """WARC files written by warcio: web pages around the bundled sample's real multilingual texts."""
    import html

    import pyarrow.parquet as pq
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    from prepline.sample import build_sample

    build_sample(str(root / "sample"), docs=docs, files=1)
    texts = [t for f in sorted((root / "sample").glob("*.parquet")) for t in pq.read_table(f).column("contents").to_pylist()]
    out = root / "warc"
    out.mkdir()
    for i in range(files):
        with open(out / f"crawl-{i}.warc.gz", "wb") as fh:
            w = WARCWriter(fh, gzip=True)
            for j, t in enumerate(texts[i::files]):
                body = (f"<html><head><meta charset='utf-8'><title>page {j}</title></head><body><nav><a href='/'>Home</a></nav>"
                        f"<main><article>{''.join(f'<p>{html.escape(p)}</p>' for p in t.splitlines() if p.strip())}</article></main>"
                        "</body></html>").encode()
                headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
                w.write_record(w.create_warc_record(f"https://example.org/{i}/{j}", "response", payload=io.BytesIO(body),
                                                    http_headers=headers))
    return out


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.integration
def test_a_users_spec_runs_end_to_end_from_warc_files(tmp_path, env):
    """A spec file with stages removed and one reordered (tests/pipelines/mine.yaml), from a folder of
    WARC files: ingest first (by the files' extensions), the text in `text`, one branch (en), the other
    languages kept aside and counted, every document accounted for."""
    src = write_warcs(tmp_path)
    spec = Path(__file__).parent / "mine.yaml"
    r = _run(["pipeline", "run", str(spec), "--local", "--input", str(src), "--work-root", str(tmp_path / "w")], env, timeout=1200)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    (run,) = [p for p in (tmp_path / "w" / "stages").iterdir() if p.is_dir()]
    plan = json.loads((run / "plan.json").read_text())
    assert plan["pipeline"] == "mine" and plan["input"]["format"] == "warc"
    assert [(e["stage"], e["branch"]) for e in plan["entries"]] == [("ingest", ""), ("doc_id", ""), ("lang_id", ""), ("filter", "en"),
                                                                   ("doc_quality", "en")]
    meta = {str(p.parent.relative_to(run)): json.loads(p.read_text()) for p in run.rglob("metadata.json") if "_prepline" not in p.parts}
    assert meta["ingest"]["totals"]["docs_in"] == 240 and meta["ingest"]["parameters"]["text_column"] == "text"
    assert meta["lang=en/doc_quality"]["totals"]["docs_in"] == meta["lang=en/filter"]["totals"]["docs_out"]  # reordered: filter first
    cons = json.loads((run / "conservation.json").read_text())
    assert cons["holds"] and cons["input"] == 240 and cons["sinks_total"] > 0 and cons["removed"]["filter (en)"]
    out = r.stdout + r.stderr
    assert "documents: 240 in = " in out and "✓" in out
    assert _clusters_left(tmp_path / "clusters") == []
