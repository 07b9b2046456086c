"""Ray jobs through our own job client (prepline.clusters.ray_jobs) against the fake dashboards
(tests/clusters/fake_ray_dashboard.py, mirroring Ray's job_head.py); the same client against a real
local head is in test_local.py."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import pytest

from prepline.clusters.http import Conflict, NotFound
from prepline.clusters.ray_jobs import RayJobClient
from prepline.errors import RunFailed

sys.path.insert(0, str(Path(__file__).parent))
from fake_kuberay import FakeKubeRay  # noqa: E402
from test_kuberay import NS, make_provider, make_spec  # noqa: E402


@pytest.fixture
def head():
    """A ready cluster of the fake and its direct dashboard client."""
    with FakeKubeRay(dashboard_lag=0, job_steps=6, proxy_create=True) as f:
        p = make_provider(f)
        p.create(make_spec())
        p.wait_ready("pl-doc-id-en-1", timeout=10)
        yield f, p


class Counting(RayJobClient):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls: list[str] = []

    def request(self, method, path, *a, **kw):
        self.calls.append(f"{method} {path}")
        return super().request(method, path, *a, **kw)


def test_follow_streams_the_log_through_the_tail_websocket(head):
    f, p = head
    c = Counting(p.job_address(NS, "pl-doc-id-en-1"), retries=0)
    sid = c.submit("python chatty_job.py")
    out = io.StringIO()
    info = c.follow(sid, out, timeout=10, poll=0.05)
    assert info.status == "SUCCEEDED"
    text = out.getvalue()
    assert text == f.jobs[(NS, "pl-doc-id-en-1", sid)]["logs"] and "step 3" in text and text.endswith("done: python chatty_job.py\n")
    assert c.calls.count(f"GET /api/jobs/{sid}/logs") == 1, c.calls  # the whole log once, at the end (to reconcile)
    assert ("GET", f"/heads/{NS}/pl-doc-id-en-1/api/jobs/{sid}/logs/tail") in f.dashboards.requests


def test_follow_falls_back_to_polling_where_no_websocket_is_served(head):
    """The fake API server's service proxy (like a plain HTTP proxy) does not upgrade to a websocket."""
    f, p = head
    c = Counting(f"{f.url}/api/v1/namespaces/{NS}/services/pl-doc-id-en-1-head-svc:8265/proxy", retries=0)
    sid = c.submit("python chatty_job.py")
    out = io.StringIO()
    assert c.follow(sid, out, timeout=10, poll=0.01).status == "SUCCEEDED"
    assert out.getvalue() == f.jobs[(NS, "pl-doc-id-en-1", sid)]["logs"]
    reads, polls = c.calls.count(f"GET /api/jobs/{sid}/logs"), c.calls.count(f"GET /api/jobs/{sid}")
    assert 1 <= reads <= polls


def test_a_job_that_runs_too_long_is_stopped(head):
    f, p = head
    jobs = p.job_client("pl-doc-id-en-1")
    sid = jobs.submit("python hang_forever.py")
    with pytest.raises(RunFailed, match="too long"):
        jobs.follow(sid, io.StringIO(), timeout=0.3, poll=0.05, on_timeout=lambda: RunFailed("ran too long", "raise it"))
    assert f.jobs[(NS, "pl-doc-id-en-1", sid)]["status"] == "STOPPED"


def test_submit_waits_for_the_job_agent_and_is_safe_to_retry():
    with FakeKubeRay(dashboard_lag=0, agent_lag=2) as f:
        p = make_provider(f)
        p.create(make_spec())
        p.wait_ready("pl-doc-id-en-1", timeout=10)
        c = p.job_client("pl-doc-id-en-1")
        c.agent_wait = 10
        t = time.monotonic()
        assert c.submit("python job.py", submission_id="s-1") == "s-1"  # 500 "No available agent" twice, then accepted
        assert time.monotonic() - t >= 1.5
        # a duplicate id: Ray answers 500 with a traceback; the job is read back: ours -> success, another -> conflict
        assert c.submit("python job.py", submission_id="s-1") == "s-1"
        with pytest.raises(Conflict, match="another entrypoint"):
            c.submit("python other.py", submission_id="s-1")
        with pytest.raises(NotFound, match="does not exist"):
            c.info("no-such-job")
