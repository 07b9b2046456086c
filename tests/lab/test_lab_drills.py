"""Fault drills in the lab (docs/reliability.md, "Lab drills"): a Ray worker host dies (every
process SIGKILLed, its link down) while exact_dedup runs on the 3-host cluster; the S3 host is cut
off for 20 s, and for good. Allowed outcomes:
the job finishes on the surviving hosts with the local run's output, or it fails with a clear
error and a rerun into the same output resumes to the local run's output. Never a success with
documents lost or duplicated."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from labkit import PRE, ROOT, Lab, _get, local_env, ray_lab, require_lab, run_on_lab, s3_tree

pytestmark = [pytest.mark.lab, pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_lab()
    yield from ray_lab("drill", tmp_path_factory.mktemp("labdrill"))


def running_job(lab: Lab, deadline: float) -> tuple[str, str]:
    """(submission id, Ray job id) of the job that runs now."""
    dash = lab.state["ray"]["dashboard"]
    while time.time() < deadline:
        for j in _get(f"{dash}/api/jobs/"):
            if j.get("status") == "RUNNING" and j.get("job_id"):
                return j["submission_id"], j["job_id"]
        time.sleep(0.2)
    pytest.fail("no running job")


def tasks_on(lab: Lab, job_id: str, host: str) -> int:
    dash = lab.state["ray"]["dashboard"]
    node = {n["node_ip"]: n["node_id"] for n in lab.ray_nodes()}.get(lab.ip(host))
    tasks = _get(f"{dash}/api/v0/tasks?limit=10000&filter_keys=job_id&filter_predicates=%3D&filter_values={job_id}"
                 )["data"]["result"]["result"]
    return sum(1 for t in tasks if t.get("node_id") == node and t.get("type") != "DRIVER_TASK")


def test_worker_host_killed_mid_exact_dedup(cluster, tmp_path):
    lab, endpoint, d = cluster
    local = tmp_path / "local"
    subprocess.run([PRE, "run", "exact_dedup", "--input", str(d / "in"), "--output", str(local)], check=True,
                   capture_output=True, env=local_env())
    want = {str(p.relative_to(local)): p.read_bytes() for p in sorted(local.rglob("*.parquet")) if "_prepline" not in p.parts}

    log = open(tmp_path / "job.log", "w")
    t0 = time.time()
    proc = lab.popen("launcher", ["python", str(ROOT / "tests" / "lab" / "submit_stage.py"), "http://ray-0:8265", "exact_dedup",
                                  "s3://lab/in", "s3://lab/drill", "3"], env=Lab.s3_env(endpoint),
                     stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        deadline = time.time() + 300
        sid, job_id = running_job(lab, deadline)
        while tasks_on(lab, job_id, "ray-2") == 0:  # kill it once it works for the stage
            assert proc.poll() is None, "the job ended before ray-2 had a task: no drill"
            assert time.time() < deadline, "ray-2 never got a task"
            time.sleep(0.2)
        t_kill = time.time()
        lab.kill_host("ray-2")
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    t_end = time.time()
    assert out.strip(), (tmp_path / "job.log").read_text()[-4000:]
    result = json.loads(out.strip().splitlines()[-1])
    outcome = {"killed_after_s": round(t_kill - t0, 1), "job_end_after_kill_s": round(t_end - t_kill, 1),
               "status": result["status"], "message": result["message"][:300]}
    if result["status"] == "SUCCEEDED":
        got = s3_tree(endpoint, "drill")
        outcome["rerun"] = None
    else:
        # a clear error, then a rerun on the surviving hosts into the same output resumes
        assert result["message"], "a failed job says why"
        rerun, seconds = run_on_lab(lab, endpoint, "exact_dedup", "drill")
        outcome["rerun"] = {"status": rerun["status"], "seconds": round(seconds, 1),
                            "resumed": (rerun["meta"] or {}).get("resume")}
        got = s3_tree(endpoint, "drill")
    deadline = time.time() + 300  # Ray marks a vanished node dead after missed health checks (~60 s)
    while lab.ip("ray-2") not in {n["node_ip"] for n in lab.ray_nodes() if n.get("state") == "DEAD"}:
        assert time.time() < deadline, "Ray's records do not show the killed host dead"
        time.sleep(1)
    print(f"drill ray worker host killed mid exact_dedup: {json.dumps(outcome)}")
    assert sorted(got) == sorted(want)
    assert got == want, "documents lost or duplicated"


def _submit_and_wait_running(lab: Lab, endpoint: str, out: str, log_path):
    log = open(log_path, "w")
    proc = lab.popen("launcher", ["python", str(ROOT / "tests" / "lab" / "submit_stage.py"), "http://ray-0:8265", "exact_dedup",
                                  "s3://lab/in", f"s3://lab/{out}", "3"], env=Lab.s3_env(endpoint),
                     stdout=subprocess.PIPE, stderr=log, text=True)
    running_job(lab, time.time() + 300)
    return proc, log


def test_s3_host_cut_off_for_20_s_mid_stage_is_ridden_out(cluster, tmp_path):
    """The S3 host's link goes down for 20 s while exact_dedup reads and writes (no TCP reset: every
    request times out) and comes back: inside PREPLINE_S3_RETRY_SECONDS (60 s, docs/storage.md) every
    request is retried, so the stage succeeds with the local run's output."""
    lab, endpoint, d = cluster
    local = tmp_path / "local"
    subprocess.run([PRE, "run", "exact_dedup", "--input", str(d / "in"), "--output", str(local)], check=True,
                   capture_output=True, env=local_env())
    want = {str(p.relative_to(local)): p.read_bytes() for p in sorted(local.rglob("*.parquet")) if "_prepline" not in p.parts}
    proc, log = _submit_and_wait_running(lab, endpoint, "cut20", tmp_path / "job.log")
    try:
        time.sleep(3)
        t_cut = time.time()
        lab.cut("s3")
        time.sleep(20)
        lab.restore("s3")
        out, _ = proc.communicate(timeout=900)
    finally:
        lab.restore("s3")
        if proc.poll() is None:
            proc.kill()
        log.close()
    result = json.loads(out.strip().splitlines()[-1])
    print(f"drill s3 host cut 20 s mid exact_dedup: {result['status']} {time.time() - t_cut:.0f}s after the cut")
    assert result["status"] == "SUCCEEDED", (result, (tmp_path / "job.log").read_text()[-4000:])
    got = s3_tree(endpoint, "cut20")
    assert got == want, "documents lost or duplicated"


def test_s3_host_cut_off_for_good_fails_the_stage_with_a_clear_error_not_a_hang(cluster, tmp_path):
    """The S3 host never comes back: each request is retried for its budget, then the stage fails with
    an error naming the store and what to do, within a bounded time; never a success, never a hang."""
    lab, endpoint, d = cluster
    proc, log = _submit_and_wait_running(lab, endpoint, "cutgood", tmp_path / "job.log")
    try:
        time.sleep(3)
        t_cut = time.time()
        lab.cut("s3")
        out, _ = proc.communicate(timeout=900)
        t_end = time.time()
    finally:
        lab.restore("s3")
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / "job.log").read_text()
    result = json.loads(out.strip().splitlines()[-1])
    errors = [line for line in text.splitlines() if line.startswith("error:") or "fix:" in line]
    print(f"drill s3 host cut for good mid exact_dedup: {result['status']} {t_end - t_cut:.0f}s after the cut; "
          f"message: {result['message'][:300]!r}; said: {errors[-2:]}")
    assert result["status"] != "SUCCEEDED"
    assert "did not answer in time" in text + result["message"], text[-4000:]
    assert t_end - t_cut < 600
    # the store back, the same command resumes into the same output
    local = tmp_path / "local"
    subprocess.run([PRE, "run", "exact_dedup", "--input", str(d / "in"), "--output", str(local)], check=True,
                   capture_output=True, env=local_env())
    rerun, seconds = run_on_lab(lab, endpoint, "exact_dedup", "cutgood")
    print(f"drill s3 host cut for good: rerun after the store is back {rerun['status']} in {seconds:.0f}s, "
          f"resume {(rerun['meta'] or {}).get('resume')}")
    want = {str(p.relative_to(local)): p.read_bytes() for p in sorted(local.rglob("*.parquet")) if "_prepline" not in p.parts}
    assert s3_tree(endpoint, "cutgood") == want, "documents lost or duplicated after the rerun"
