"""Pipelines run end to end on this machine: kfp.local + a real local Ray head per stage."""

from __future__ import annotations

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
def test_failing_stage_still_stops_its_cluster_and_fails_the_run(tmp_path, env):
    bad = tmp_path / "in"
    write_parquet(bad, "ok.parquet", {"contents": ["fine"]})
    (bad / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    r = _run(["pipeline", "run", "doc_id", "--local", "--input", str(bad), "--work-root", str(tmp_path / "w")], env)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "broken.parquet" in out and "not a readable Parquet file" in out  # the stage's own error reaches the user
    assert re.search(r"prepline: cluster \S+ deleted", out)  # the exit task ran
    assert "doc_id (FAILED)" in out and "failed file(s):" in out  # the closing table says which (the cell may wrap)
    assert _clusters_left(tmp_path / "clusters") == []


def text_sample(root: Path, docs: int) -> Path:
    """The bundled sample with its text in a `text` column (one Parquet file)."""
    import pyarrow.parquet as pq

    from prepline.sample import build_sample

    build_sample(str(root / "sample"), docs=docs, files=1)
    (f,) = sorted((root / "sample").glob("*.parquet"))
    out = root / "in"
    out.mkdir()
    t = pq.read_table(f)
    pq.write_table(t.rename_columns(["text" if c == "contents" else c for c in t.column_names]), out / "part-0.parquet")
    return out


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.integration
def test_a_users_spec_runs_end_to_end(tmp_path, env):
    """A spec file with stages removed and one reordered (tests/pipelines/mine.yaml: lang_id, then
    filter before doc_quality for English), text in `text`: the plan skips ingest (Parquet), the other
    languages are kept aside and counted, every document is accounted for; the run says where its
    time went. Each stage is its simple pipeline (prepare → start → run, stop as the exit task).
    (Formats other than Parquet run end to end in test_super_local.py.)"""
    src = text_sample(tmp_path, 80)
    spec = Path(__file__).parent / "mine.yaml"
    timings = tmp_path / "timings.json"
    r = _run(["pipeline", "run", str(spec), "--local", "--input", str(src), "--work-root", str(tmp_path / "w"),
              "--timings-json", str(timings)], env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    (run,) = [p for p in (tmp_path / "w" / "stages").iterdir() if p.is_dir()]
    plan = json.loads((run / "plan.json").read_text())
    assert plan["pipeline"] == "mine" and plan["input"]["format"] == "parquet"
    assert [(e["stage"], e["branch"], e["runs"]) for e in plan["entries"]] == [
        ("ingest", "", False), ("lang_id", "", True), ("filter", "en", True), ("doc_quality", "en", True)]
    meta = {str(p.parent.relative_to(run)): json.loads(p.read_text()) for p in run.rglob("metadata.json") if "_prepline" not in p.parts}
    assert sorted(meta) == ["lang=en/doc_quality", "lang=en/filter", "lang_id"]
    assert meta["lang_id"]["totals"]["docs_in"] == 80 and meta["lang_id"]["parameters"]["content_column"] == "text"
    assert meta["lang=en/doc_quality"]["totals"]["docs_in"] == meta["lang=en/filter"]["totals"]["docs_out"]  # reordered: filter first
    cons = json.loads((run / "conservation.json").read_text())
    assert cons["holds"] and cons["input"] == 80 and cons["sinks_total"] > 0 and cons["removed"]["filter (en)"]
    assert cons["input"] == cons["outputs_total"] + cons["removed_total"] + cons["sinks_total"]
    out = r.stdout + r.stderr
    # a header first (pipeline, input, where it writes), then the run id and its folder (issue 25 item 7)
    assert r.stdout.splitlines()[0] == f"pipeline mine (local): input {src}", r.stdout[:500]
    assert f"run {run.name}: {run}/" in r.stdout.splitlines() and "already gone" not in out
    assert "documents: 80 in = " in out and "✓" in out
    assert "documents per stage" in out and re.search(r"│ lang_id\s*│\s*│\s*80 │\s*80 │", out), out[-2000:]
    assert _clusters_left(tmp_path / "clusters") == []
    # where the time went: every task, by kind (ingest was prepared and stopped, never started)
    t = json.loads(timings.read_text())
    kinds = t["by_kind"]
    assert {k: v["n"] for k, v in kinds.items()} == {"plan-run": 1, "prepare-args": 4, "start-ray-cluster": 3, "execute-ray-job": 3,
                                                     "stop-ray-cluster": 4, "check-documents": 1, "run-report": 1}
    assert all(0 < k["total"] < t["seconds"] for k in kinds.values()) and all(x["status"] == "SUCCESS" for x in t["tasks"])
    assert t["stage_overhead_seconds"] == pytest.approx(
        sum(kinds[k]["mean"] for k in ("prepare-args", "start-ray-cluster", "stop-ray-cluster")))
    assert "per-stage overhead" in out
    # prepline's lines (the jobs' progress too) and the tables; kfp's executor dumps and warnings only in each task's log
    assert "prepline.progress: lang_id final: 1/1 files, 80 docs" in out and "executor_input" not in out and "Warning" not in out
    assert len(out.splitlines()) < 90, out
    logs = sorted((tmp_path / "w" / "kfp").rglob("task.log"))
    assert len(logs) == len(t["tasks"]) == 17 and all("executor_input" in p.read_text() for p in logs)
    # the run's report: written by its last step, and again by the command, which ends with its path
    report = re.search(r"^report: (\S+)$", out, re.M)
    assert report and report.group(1) == str(run / "report.html")
    page = (run / "report.html").read_text()
    assert "chart-funnel" in page and "documents: 80 in = " in page  # the accounting too
