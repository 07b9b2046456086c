"""The plan's shard shape on lab hosts with a pod's memory limit (benchmarks/nodes.py, Lab.limit_memory):
the hosts' memory cgroups limit and count what runs there, and go with the lab; the benchmark's run
on a small corpus holds the plan's memory and conserves every document, and a host limit below a
worker's need fails the job and the benchmark, never a success."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from labkit import PRE, ROOT, Lab, lab_name, local_env, require_lab

pytestmark = [pytest.mark.lab, pytest.mark.ray, pytest.mark.slow]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_host_memory_limit_kills_past_it_and_goes_with_the_lab():
    require_lab()
    lab = Lab(lab_name("mem"))
    try:
        lab.up(["pod"])
        cg = lab.limit_memory("pod", 100 * 2**20)
        fits = lab.run("pod", ["python", "-c", "x = bytearray(40 * 2**20); x[::4096] = b'1' * len(x[::4096]); print('ok')"])
        assert fits.returncode == 0 and fits.stdout.strip() == "ok", fits.stderr
        assert lab.memory("pod")["oom_kills"] == 0
        over = lab.run("pod", ["python", "-c", "x = bytearray(300 * 2**20); x[::4096] = b'1' * len(x[::4096]); print('ok')"])
        assert over.returncode != 0 and "ok" not in over.stdout
        m = lab.memory("pod")
        assert m["oom_kills"] == 1 and m["limit_bytes"] == 100 * 2**20 and m["peak_bytes"] <= 100 * 2**20, m
        lab.limit_memory("pod", None)  # lifted: the same allocation runs
        assert lab.run("pod", ["python", "-c", "x = bytearray(300 * 2**20); x[::4096] = b'1' * len(x[::4096])"]).returncode == 0
        assert lab.memory("pod")["limit_bytes"] is None
    finally:
        lab.down()
    assert not cg.exists()


@pytest.fixture(scope="module")
def corpus():
    """The bundled sample outside /tmp (each lab host has its own /tmp; the hosts share this disk)."""
    d = Path(tempfile.mkdtemp(prefix="prepline-nodes-", dir="/var/tmp"))
    try:
        subprocess.run([PRE, "sample", "--output", str(d / "sample")], check=True, capture_output=True, env=local_env())
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_plan_shape_on_three_hosts_holds_the_plans_memory(corpus, capsys):
    require_lab()
    import nodes

    res = nodes.run(str(corpus / "sample"), str(corpus / "ok"), nodes=3, lab_name=lab_name("nodes"))
    table = nodes.table(res)
    print(table)
    assert res["violations"] == [], table
    by = {r["stage"]: r for r in res["stages"]}
    assert list(by) == ["doc_id", "exact_dedup", "fuzzy_dedup"] and all(r["status"] == "SUCCEEDED" for r in by.values())
    # 4,000 documents: a plan shard at 10 billion holds millions, so each dedup stage gets one shard
    assert by["exact_dedup"]["shards"] == 1 and by["exact_dedup"]["plan_shards"] >= 1024
    assert by["doc_id"]["docs_out"] == by["exact_dedup"]["docs_in"] and by["exact_dedup"]["docs_out"] == by["fuzzy_dedup"]["docs_in"]
    for r in by.values():
        assert set(r["hosts"]) == {"node-0", "node-1", "node-2"}
        assert 0 < r["worker_peak_mib"] <= r["limit_mib"]
        assert r["bound_mib"] is None  # the sample's ~500-document files: outside the memory model's range, no bound claimed
        assert all(m["limit_bytes"] == r["limit_bytes"] and m["oom_kills"] == 0 for m in r["hosts"].values())
    assert 100 < res["node_idle_mib"] < 600  # raylet and its agents, measured
    assert "within the plan's memory" in table
    assert not list(Path("/sys/fs/cgroup/memory").glob(f"pl-{lab_name('nodes')}-*"))  # the lab is gone, cgroups too


def test_a_host_limit_below_the_worker_fails_the_job(corpus):
    require_lab()
    import nodes

    res = nodes.run(str(corpus / "sample"), str(corpus / "small"), nodes=2, lab_name=lab_name("small"),
                    limits_mib={"doc_id": 260},  # the node's own processes (~200 MiB) fit, a worker does not
                    job_env={"PREPLINE_RAY_WORKER_WAIT": "20"})  # a worker that dies starting is not waited for 5 min
    by = {r["stage"]: r for r in res["stages"]}
    assert list(by) == ["doc_id"] and by["doc_id"]["status"] != "SUCCEEDED"  # the job failed: the later stages never ran
    assert sum(m["oom_kills"] for m in by["doc_id"]["hosts"].values()) >= 1
    assert any("doc_id: the job ended" in v for v in res["violations"])
    assert not (corpus / "small" / "doc_id" / "metadata.json").exists() or '"success"' not in (corpus / "small" / "doc_id" / "metadata.json").read_text()
