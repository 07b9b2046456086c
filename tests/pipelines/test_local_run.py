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
def test_simple_pipeline_runs_locally(tmp_path, corpus, env):
    timings = tmp_path / "timings.json"
    r = _run(["pipeline", "run", "doc_id", "--local", "--input", str(corpus), "--work-root", str(tmp_path / "w"),
              "--timings-json", str(timings)], env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]  # the failing task's log tail is on stdout
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
    # prepline's lines (the job's progress too) and the tables; kfp's executor dumps and warnings only in each task's log
    assert "prepline.progress: doc_id final: 3/3 files, 10 docs" in out and "executor_input" not in out and "Warning" not in out
    assert len(out.splitlines()) < 45, out
    logs = sorted((tmp_path / "w" / "kfp").rglob("task.log"))
    assert len(logs) == 4 and all("executor_input" in p.read_text() for p in logs)
    report = re.search(r"^report: (\S+)$", out, re.M)
    assert report and "chart-funnel" in open(report.group(1)).read()


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
