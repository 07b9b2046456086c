"""The local provider starts real, isolated Ray heads and stops exactly them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from prepline.cli import main
from prepline.clusters import ClusterSpec, cluster_name
from prepline.clusters.base import TERMINAL
from prepline.clusters.local import LocalProvider, state_dir


def _real_job_api(p: LocalProvider, name: str) -> None:
    """What the fake dashboards mirror, on Ray's real job_head.py: the tail websocket streams the
    log (the whole log is read once, at the end), a duplicate submission id is refused and read back, an unknown job 404s."""
    import io

    from prepline.clusters.http import Conflict, NotFound

    c = p.job_client(name)
    calls = []
    real = c.request
    c.request = lambda m, path, *a, **kw: calls.append(f"{m} {path}") or real(m, path, *a, **kw)
    ep = "python -c \"import time; [print('line', i, flush=True) or time.sleep(0.4) for i in range(6)]\""
    sid = c.submit(ep, submission_id=f"follow-{name}")
    out = io.StringIO()
    assert c.follow(sid, out, timeout=120, poll=0.5).status == "SUCCEEDED"
    assert all(f"line {i}" in out.getvalue() for i in range(6)), out.getvalue()
    assert calls.count(f"GET /api/jobs/{sid}/logs") == 1, calls  # streamed; the whole log read once, at the end
    assert c.submit(ep, submission_id=sid) == sid  # Ray refuses the duplicate (a 500 traceback); read back: ours
    with pytest.raises(Conflict):
        c.submit("python -c 'pass'", submission_id=sid)
    with pytest.raises(NotFound):
        c.info("no-such-job")


def _ray_pids(temp_dirs: list[str]) -> set[int]:
    """The raylet and GCS processes of the heads whose Ray temp dirs are given (their command lines
    name them): not those of other tests' or other checkouts' heads on the same machine."""
    pids = set()
    for temp in temp_dirs:
        out = subprocess.run(["pgrep", "-f", f"{sys.prefix}/.*(raylet|gcs_server).*{temp}"], capture_output=True, text=True).stdout
        pids |= {int(p) for p in out.split()}
    return pids


def _wait(p, name, job_id, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        j = p.job(name, "default", job_id)
        if j.status in TERMINAL:
            return j
        time.sleep(0.5)
    raise AssertionError("job did not finish")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.integration
def test_two_heads_at_once_each_run_a_job_and_stop_cleanly(tmp_path, monkeypatch):
    monkeypatch.setenv("PREPLINE_LOCAL_CLUSTERS", str(tmp_path / "state"))
    p = LocalProvider(num_cpus=1)
    names = [cluster_name("run-1", "doc_id", "en"), cluster_name("run-1", "doc_id", "ja")]
    temps: list[str] = []
    try:
        for n in names:
            p.create(ClusterSpec(name=n, labels={"prepline.dev/run": "run-1", "prepline.dev/managed": "true"}))
        infos = [p.wait_ready(n) for n in names]
        temps = [p._load(n)["temp_dir"] for n in names]
        assert all(_ray_pids([t]) for t in temps)  # each head's raylet and GCS are found by its temp dir
        assert len({i.job_address for i in infos}) == 2 and all(i.job_address.startswith("http://127.0.0.1:") for i in infos)
        jobs = [p.submit_job(n, "default", f"python -c \"import sys; print('hello from', sys.executable)\"") for n in names]
        for n, j in zip(names, jobs):
            assert _wait(p, n, j).status == "SUCCEEDED"
            assert "hello from " + sys.executable in p.job_logs(n, "default", j)
        failing = p.submit_job(names[0], "default", "python -c 'raise SystemExit(3)'")
        assert _wait(p, names[0], failing).status == "FAILED"
        _real_job_api(p, names[1])
        assert [c.name for c in p.list(labels={"prepline.dev/run": "run-1"})] == sorted(names)
        # every listener of these heads is on loopback
        ss = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
        ours = [l for l in ss.splitlines() if any(f"pid={pid}," in l for pid in _ray_pids(temps))]
        loopback = re.compile(r"^(127\.0\.0\.1|\[::ffff:127\.0\.0\.1\]|\[::1\]):\d+$")
        assert ours and all(loopback.match(l.split()[3]) for l in ours), ours
        # the sweep (for runs killed before their exit task) finds them by label and deletes them
        assert main(["clusters", "sweep", "--older-than", "0", "--run", "run-2"]) == 0 and len(p.list()) == 2
        assert main(["clusters", "sweep", "--older-than", "0", "--run", "run-1"]) == 0
        assert p.list() == []
    finally:
        for n in names:
            p.delete(n)
    deadline = time.time() + 20
    while _ray_pids(temps) and time.time() < deadline:
        time.sleep(0.5)
    assert not _ray_pids(temps), "a Ray process was left behind"
    assert p.list() == [] and not p.delete(names[0])


def test_a_local_head_offers_the_gpus_a_spec_asks_for_or_refuses_before_starting(tmp_path, monkeypatch):
    """gpu_workers on the local provider: more GPUs than Ray detects here fail before any process starts
    (this machine has none); with provider_json num_gpus the head offers them (Ray's --num-gpus), and an
    actor that reserves one is placed (Ray sets its CUDA_VISIBLE_DEVICES)."""
    from prepline.clusters.base import ClusterError, NodeGroup

    monkeypatch.setenv("PREPLINE_LOCAL_CLUSTERS", str(tmp_path / "state"))
    spec = ClusterSpec(name=cluster_name("gpu-run", "synthesize"), gpu_workers=NodeGroup(gpu=1, replicas=1))
    p = LocalProvider()
    if p.gpus_here() == 0:
        with pytest.raises(ClusterError, match=r"asks for 1 GPU\(s\) .* this machine has 0"):
            p.create(spec)
        assert not list((tmp_path / "state").glob("*.json"))
    p = LocalProvider(num_gpus=1)
    p.create(spec)
    try:
        p.wait_ready(spec.name, timeout=120)
        c = p.job_client(spec.name)
        code = ("import ray; ray.init(); print('GPU', ray.cluster_resources().get('GPU')); "
                "f = ray.remote(num_gpus=1)(lambda: ray.get_gpu_ids()); print('ids', ray.get(f.remote()))")
        sid = c.submit(f'python -c "{code}"')
        import io

        out = io.StringIO()
        assert c.follow(sid, out, timeout=120, poll=0.5).status == "SUCCEEDED", out.getvalue()
        assert "GPU 1.0" in out.getvalue() and "ids [0]" in out.getvalue(), out.getvalue()
    finally:
        p.delete(spec.name)
