"""Fault drills in the lab (docs/reliability.md, "Lab drills"): a Ray worker host dies (every
process SIGKILLed, its link down) while exact_dedup, then fuzzy_dedup, runs on the 3-host cluster;
a worker host's wall clock is 10 minutes ahead; the S3 host is cut off for 20 s, and for good. Allowed outcomes:
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
    nodes = {n["node_id"] for n in lab.ray_nodes() if n["node_ip"] == lab.ip(host)}  # (a host that came back: two nodes)
    tasks = _get(f"{dash}/api/v0/tasks?limit=10000&filter_keys=job_id&filter_predicates=%3D&filter_values={job_id}"
                 )["data"]["result"]["result"]
    return sum(1 for t in tasks if t.get("node_id") in nodes and t.get("type") != "DRIVER_TASK")


def ensure_worker(lab: Lab, endpoint: str, host: str = "ray-2", clock_offset_s: int = 0) -> None:
    """``host`` a live Ray worker of the cluster again (a killed host comes back as a new node; with
    ``clock_offset_s``, a node whose wall clock is that far from the others')."""
    alive = {n["node_ip"] for n in lab.ray_nodes() if n.get("state") == "ALIVE"}
    if lab.ip(host) in alive and not clock_offset_s:
        return
    if lab.ip(host) in alive:
        lab.stop_host(host)
        deadline = time.time() + 180  # the head sees it go (at once when it left cleanly; else after missed health checks)
        while lab.ip(host) in {n["node_ip"] for n in lab.ray_nodes() if n.get("state") == "ALIVE"}:
            assert time.time() < deadline, f"{host} still alive after ray stop"
            time.sleep(0.5)
    lab.join_ray(host, env=Lab.s3_env(endpoint), clock_offset_s=clock_offset_s)


def local_reference(d, tmp_path, transform: str) -> dict[str, bytes]:
    local = tmp_path / "local"
    subprocess.run([PRE, "run", transform, "--input", str(d / "in"), "--output", str(local)], check=True,
                   capture_output=True, env=local_env())
    return {str(p.relative_to(local)): p.read_bytes() for p in sorted(local.rglob("*.parquet")) if "_prepline" not in p.parts}


@pytest.mark.parametrize("transform", ["exact_dedup", "fuzzy_dedup"])
def test_worker_host_killed_mid_stage(cluster, tmp_path, transform):
    lab, endpoint, d = cluster
    ensure_worker(lab, endpoint, "ray-2")  # (the previous drill killed it)
    want = local_reference(d, tmp_path, transform)
    out_prefix = f"drill-{transform}"

    log = open(tmp_path / "job.log", "w")
    t0 = time.time()
    proc = lab.popen("launcher", ["python", str(ROOT / "tests" / "lab" / "submit_stage.py"), "http://ray-0:8265", transform,
                                  "s3://lab/in", f"s3://lab/{out_prefix}", "3"], env=Lab.s3_env(endpoint),
                     stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        deadline = time.time() + 300
        sid, job_id = running_job(lab, deadline)
        while tasks_on(lab, job_id, "ray-2") == 0:  # kill it once it works for the stage
            assert proc.poll() is None, "the job ended before ray-2 had a task: no drill"
            assert time.time() < deadline, "ray-2 never got a task"
            time.sleep(0.2)
        killed = {n["node_id"] for n in lab.ray_nodes() if n["node_ip"] == lab.ip("ray-2") and n.get("state") == "ALIVE"}
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
    outcome["retried"] = [line.strip()[:200] for line in (tmp_path / "job.log").read_text().splitlines() if "running it again" in line]
    if result["status"] == "SUCCEEDED":
        got = s3_tree(endpoint, out_prefix)
        outcome["rerun"] = None
    else:
        # a clear error, then a rerun on the surviving hosts into the same output resumes
        assert result["message"], "a failed job says why"
        rerun, seconds = run_on_lab(lab, endpoint, transform, out_prefix)
        outcome["rerun"] = {"status": rerun["status"], "seconds": round(seconds, 1),
                            "resumed": (rerun["meta"] or {}).get("resume")}
        got = s3_tree(endpoint, out_prefix)
    deadline = time.time() + 300  # Ray marks a vanished node dead after missed health checks (~60 s)
    while not killed <= {n["node_id"] for n in lab.ray_nodes() if n.get("state") == "DEAD"}:
        assert time.time() < deadline, "Ray's records do not show the killed host dead"
        time.sleep(1)
    print(f"drill ray worker host killed mid {transform}: {json.dumps(outcome)}")
    assert sorted(got) == sorted(want)
    assert got == want, "documents lost or duplicated"


def test_worker_host_with_its_clock_apart(cluster, tmp_path):
    """ray-2's wall clock 10 minutes ahead of the other hosts' (every process of the node, through
    libfaketime; inside the 15 minutes S3 allows a request's signature, which moto does not check),
    and, as on every lab host, its own /tmp: exact_dedup (whose S3 lease ages by the store's clock)
    and fuzzy_dedup run with tasks on ray-2 and give the local run's output."""
    lab, endpoint, d = cluster
    offset = 600
    ensure_worker(lab, endpoint, "ray-2", clock_offset_s=offset)
    from lab import faketime_env

    seen = lab.run("ray-2", ["python", "-c", "import time; print(time.time())"], env=faketime_env(offset), check=True)
    skew = float(seen.stdout.strip()) - time.time()
    assert abs(skew - offset) < 30, f"ray-2's clock is {skew:.0f}s off, not {offset}s: no drill"
    outcome = {"clock_offset_s": round(skew)}
    for transform in ("exact_dedup", "fuzzy_dedup"):
        want = local_reference(d, tmp_path / transform, transform)
        result, seconds = run_on_lab(lab, endpoint, transform, f"clock-{transform}")
        job_id = _get(f"{lab.state['ray']['dashboard']}/api/jobs/{result['submission_id']}")["job_id"]
        on_skewed = tasks_on(lab, job_id, "ray-2")
        outcome[transform] = {"status": result["status"], "seconds": round(seconds, 1), "tasks_on_ray_2": on_skewed}
        assert on_skewed > 0, f"{transform}: no task ran on the host whose clock is apart: no drill"
        assert s3_tree(endpoint, f"clock-{transform}") == want, f"{transform}: documents lost or duplicated"
    print(f"drill worker host clock apart: {json.dumps(outcome)}")


def _submit_and_wait_running(lab: Lab, endpoint: str, out: str, log_path, job_env: dict | None = None):
    log = open(log_path, "w")
    env = {**Lab.s3_env(endpoint), **({"LAB_JOB_ENV": json.dumps(job_env)} if job_env else {})}
    proc = lab.popen("launcher", ["python", str(ROOT / "tests" / "lab" / "submit_stage.py"), "http://ray-0:8265", "exact_dedup",
                                  "s3://lab/in", f"s3://lab/{out}", "3"], env=env,
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
    an error naming the store and what to do, within a bounded time; never a success, never a hang.
    The job gets a 15 s budget (PREPLINE_S3_RETRY_SECONDS, through its runtime env, as a user sets it):
    the default 60 s gave the same error 174-183 s after the cut, 2 minutes of the lab's time."""
    lab, endpoint, d = cluster
    proc, log = _submit_and_wait_running(lab, endpoint, "cutgood", tmp_path / "job.log", job_env={"PREPLINE_S3_RETRY_SECONDS": "15"})
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
    assert t_end - t_cut < 300, "the 15 s budget was not honoured"
    # the store back, the same command resumes into the same output
    local = tmp_path / "local"
    subprocess.run([PRE, "run", "exact_dedup", "--input", str(d / "in"), "--output", str(local)], check=True,
                   capture_output=True, env=local_env())
    rerun, seconds = run_on_lab(lab, endpoint, "exact_dedup", "cutgood")
    print(f"drill s3 host cut for good: rerun after the store is back {rerun['status']} in {seconds:.0f}s, "
          f"resume {(rerun['meta'] or {}).get('resume')}")
    want = {str(p.relative_to(local)): p.read_bytes() for p in sorted(local.rglob("*.parquet")) if "_prepline" not in p.parts}
    assert s3_tree(endpoint, "cutgood") == want, "documents lost or duplicated after the rerun"
