"""The kuberay provider and its HTTP client, against a local fake API server (real HTTP on
127.0.0.1) that validates every body against the RayCluster CRD / V1 swagger schemas, a fake
Kubernetes API for the pods, and fake Ray dashboards (tests/clusters/fake_ray_dashboard.py).

Verified against the published specs, the upstream sources the fakes name, and these fakes only,
not against a live KubeRay."""

from __future__ import annotations

import re
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prepline.clusters import get_provider
from prepline.clusters.base import LABEL_MANAGED, LABEL_RUN, LABEL_STAGE, ClusterError, ClusterSpec, cluster_name
from prepline.clusters.kuberay import (
    ENV_TOKEN,
    ClusterFailed,
    KubeRayAuthError,
    KubeRayClient,
    KubeRayNotFound,
    KubeRayProvider,
    KubeRayRequestError,
    KubeRayTimeout,
    KubeRayUnavailable,
)
from prepline.clusters.kuberay_bodies import check_name, cluster_v1_body, compute_template_bodies, raycluster_body
from prepline.errors import ConfigError

sys.path.insert(0, str(Path(__file__).parent))
from fake_kuberay import FakeKubeRay  # noqa: E402

IMAGE = "registry.example.com/prepline-ray:0.1.0"
#: tests run in a namespace other than `default`, so that a path that ignores the namespace shows
NS = "team-a"
VERSIONS = ["v2", "v1"]


@pytest.fixture
def fake():
    with FakeKubeRay() as f:
        yield f


def make_provider(fake: FakeKubeRay, api_version: str = "v2", **kw) -> KubeRayProvider:
    """A provider as a KFP step in the cluster has it: jobs straight to the head Service (here: the
    fake dashboards), the pods readable through the Kubernetes API (here: the fake's)."""
    opts = {"poll_interval": 0.01, "backoff": 0.01, "backoff_max": 0.05, "timeout": 5, "connect_timeout": 2,
            "head_url": fake.head_url, "kube": {"server": fake.kube_url}, "namespace": NS, **kw}
    return KubeRayProvider(fake.url, api_version=api_version, **opts)


def make_spec(name: str = "pl-doc-id-en-1", **kw) -> ClusterSpec:
    kw.setdefault("image", IMAGE)
    kw.setdefault("namespace", NS)
    kw.setdefault("labels", {LABEL_RUN: "run-1", LABEL_STAGE: "doc_id"})
    return ClusterSpec(name=name, **kw)


def wait_job(p: KubeRayProvider, name: str, job_id: str, limit: int = 50) -> list[str]:
    seen = []
    for _ in range(limit):
        s = p.job(name, None, job_id).status
        if not seen or seen[-1] != s:
            seen.append(s)
        if s in ("SUCCEEDED", "FAILED", "STOPPED"):
            return seen
    raise AssertionError(f"job never finished: {seen}")


# -- the whole life of a cluster -------------------------------------------------------------------
ACCESS = [("v2", "direct"), ("v1", "direct"), ("v2", "apiserver"), ("v1", "apiserver")]


@pytest.mark.parametrize("version,access", ACCESS)
def test_lifecycle_create_wait_submit_logs_delete(version, access):
    with FakeKubeRay(proxy_create=access == "apiserver") as fake:
        _lifecycle(fake, version, access)


def _lifecycle(fake, version, access):
    p = make_provider(fake, version, job_access=access)
    spec = make_spec()
    info = p.create(spec)
    assert (info.name, info.namespace, info.state) == (spec.name, NS, "pending")
    direct = fake.head_url.format(namespace=NS, name=spec.name)
    proxy = f"{fake.url}/api/v1/namespaces/{NS}/services/{spec.name}-head-svc:8265/proxy"
    assert info.job_address == (direct if access == "direct" else proxy)

    ready = p.wait_ready(spec.name, NS, timeout=10)
    assert ready.state == "ready" and ready.labels[LABEL_RUN] == "run-1" and ready.labels[LABEL_MANAGED] == "true"
    # the dashboard lagged: it was probed until it answered, and only once the state was ready
    polls = [r for r in fake.requests if r.method == "GET" and r.path.endswith(f"/{spec.name}") and "jobsub" not in r.path]
    assert len(polls) == fake.ready_after + 1
    if access == "direct":
        probes = [r for r in fake.dashboards.requests if r == ("GET", f"/heads/{NS}/{spec.name}/api/version")]
    else:
        probe = "/proxy/api/version" if version == "v2" else f"/jobsubmissions/{spec.name}"
        probes = [r for r in fake.requests if r.method == "GET" and r.path.endswith(probe)]
    assert len(probes) == fake.dashboard_lag + 1

    job_id = p.submit_job(spec.name, NS, "python -m prepline.runtime.ray --stage doc_id",
                          runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}}, entrypoint_num_cpus=0.5)
    assert job_id.startswith("prepline-")
    job = fake.jobs[(NS, spec.name, job_id)]
    assert job["runtime_env"] == {"env_vars": {"HF_HUB_OFFLINE": "1"}} and job["entrypoint_num_cpus"] == 0.5
    if access == "apiserver" and version == "v1":  # V1: the runtime env travels as a YAML string
        sent = fake.calls("POST", "/jobsubmissions/")[-1].body
        assert isinstance(sent["runtimeEnv"], str) and yaml.safe_load(sent["runtimeEnv"]) == {"env_vars": {"HF_HUB_OFFLINE": "1"}}
        assert sent["entrypointNumCpus"] == 0.5 and sent["submissionId"] == job_id
    if access == "direct":  # nothing about jobs went through the API server
        assert not [r for r in fake.requests if "/api/jobs" in r.path or "jobsubmissions" in r.path]

    assert wait_job(p, spec.name, job_id) == ["PENDING", "RUNNING", "SUCCEEDED"]
    assert "done: python -m prepline.runtime.ray" in p.job_logs(spec.name, NS, job_id)
    assert [c.name for c in p.list(NS, {LABEL_RUN: "run-1"})] == [spec.name]

    assert p.delete(spec.name, NS) is True
    assert (NS, spec.name) not in fake.clusters
    assert not fake.templates  # V1: the cluster's compute templates went with it
    assert p.delete(spec.name, NS) is False
    with pytest.raises(ClusterError, match="does not exist"):
        p.wait_ready(spec.name, timeout=1)


@pytest.mark.parametrize("version", VERSIONS)
def test_create_is_idempotent_and_refuses_foreign_objects(fake, version):
    p = make_provider(fake, version)
    a = p.create(make_spec())
    b = p.create(make_spec())  # a retried start step
    assert a.name == b.name and len(fake.clusters) == 1
    if version == "v2":
        assert [r.status for r in fake.calls("POST", "/rayclusters")] == [201, 409]
    else:  # V1 answers 500 for an existing cluster (an AlreadyExists wrapped in an internal error): read back, ours, reused
        assert [r.status for r in fake.calls("POST", "/compute_templates")] == [200, 200, 409, 409]
        assert [r.status for r in fake.calls("POST", "/clusters")] == [200, 500]

    # someone else's cluster of that name, or ours of another run, is never adopted: the server's message is kept
    for name, edit in (("pl-foreign", lambda lab: lab.pop(LABEL_MANAGED)), ("pl-other-run", lambda lab: lab.update({LABEL_RUN: "run-0"}))):
        spec = make_spec(name)
        if version == "v2":
            body = raycluster_body(spec)
            edit(body["metadata"]["labels"])
            p.client.create_raycluster(body)
        else:
            body = cluster_v1_body(spec)
            edit(body["annotations"])
            for t in compute_template_bodies(spec):
                p.client.create_compute_template(t)
            p.client.create_cluster_v1(body)
        with pytest.raises(ClusterError, match="not created by prepline for this run and stage") as e:
            p.create(spec)
        assert "already exists" in str(e.value)
    if version == "v1":  # a stale compute template with other resources is not silently reused
        t = compute_template_bodies(make_spec("pl-stale"))[0]
        p.client.create_compute_template({**t, "cpu": 7})
        with pytest.raises(ClusterError, match="exists with other resources"):
            p.create(make_spec("pl-stale"))
        assert (NS, "pl-stale") not in fake.clusters


def test_a_spec_without_namespace_goes_to_the_providers_namespace(fake, tmp_path, monkeypatch):
    """ClusterSpec.namespace '' = the provider's: its ``namespace`` option, else the namespace the
    step's pod runs in (its service account's namespace file), never a silent ``default``."""
    from prepline.clusters import diagnose

    (tmp_path / "namespace").write_text("team-a")
    monkeypatch.setattr(diagnose, "SA_DIR", str(tmp_path))
    for version in VERSIONS:
        for opts, ns in (({"namespace": ""}, "team-a"), ({"namespace": "team-b"}, "team-b")):
            p = make_provider(fake, version, **opts)
            name = f"pl-ns-{version}-{ns}"
            info = p.create(make_spec(name, namespace=""))
            assert info.namespace == ns and (ns, name) in fake.clusters
            assert p.wait_ready(name, timeout=10).namespace == ns
            assert [c.name for c in p.list()] == [name]
            assert p.delete(name) is True and (ns, name) not in fake.clusters
    with pytest.raises(ConfigError, match="namespace 'Team_A'"):
        make_spec(namespace="Team_A")


FAILURES = {"broken": "ImagePullBackOff", "oom": "OOMKilled", "quota": "exceeded quota", "unsched": "Unschedulable"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_a_cluster_that_cannot_start_fails_fast_with_the_reason(fake, version, kind):
    """The operator never says "failed": conditions, events and the pods do. Container errors fail
    on the second poll that shows them; Unschedulable and ReplicaFailure after the grace period."""
    p = make_provider(fake, version, pending_grace_seconds=0.05)
    name = f"pl-{kind}-1"
    p.create(make_spec(name))
    t = time.monotonic()
    with pytest.raises(ClusterFailed) as e:
        p.wait_ready(name, timeout=30)
    assert time.monotonic() - t < 5
    assert FAILURES[kind] in str(e.value) and name in str(e.value) and e.value.fix
    assert all(c.obj.get("status", {}).get("state") != "failed" for c in fake.clusters.values())


def gpu_pool() -> list:
    """Two CPU nodes and one GPU node (tainted and labelled as GKE/NVIDIA GPU pools are)."""
    from fake_scheduler import Node

    cpu = [Node(f"cpu-{i}", {"cpu": "8", "memory": "32Gi"}, {"pool": "cpu"}) for i in range(2)]
    gpu = Node("gpu-0", {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "1"}, {"pool": "gpu", "gpu": "l4"},
               [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    return cpu + [gpu]


def test_a_gpu_group_is_placed_on_the_gpu_node_or_fails_fast_naming_the_group():
    """cluster_json gpu_workers next to the CPU workers: with the node pool's label as selector and the
    default toleration of its taint, the scheduler places the GPU pod and the cluster gets ready; asking for
    more GPUs per pod than any node has keeps it pending (KubeRay's state never says why), and the wait ends
    after the grace period with the scheduler's message and a fix about the GPU group."""
    from prepline.clusters.base import NodeGroup

    with FakeKubeRay(nodes=gpu_pool(), ready_after=1) as f:
        p = make_provider(f, pending_grace_seconds=0.05)
        gpu = dict(cpu="4", memory="16Gi", replicas=1, node_selector={"gpu": "l4"})
        p.create(make_spec("pl-gpu-ok-1", gpu_workers=NodeGroup(gpu=1, **gpu)))
        assert p.wait_ready("pl-gpu-ok-1", timeout=10).state == "ready"
        assert [v for k, v in sorted(f.clusters[(NS, "pl-gpu-ok-1")].placement.items()) if "gpu-workers" in k] == ["gpu-0"]
        p.delete("pl-gpu-ok-1")

        p.create(make_spec("pl-gpu-big-1", gpu_workers=NodeGroup(gpu=2, **gpu)))
        t = time.monotonic()
        with pytest.raises(ClusterFailed) as e:
            p.wait_ready("pl-gpu-big-1", timeout=30)
        assert time.monotonic() - t < 5
        msg = str(e.value)
        assert "(group gpu-workers) Unschedulable: 0/3 nodes are available: 1 Insufficient nvidia.com/gpu, " \
               "2 node(s) didn't match Pod's node affinity/selector." in msg, msg
        assert "gpu_workers" in e.value.fix and "node_selector" in e.value.fix
        p.delete("pl-gpu-big-1")

        # without the default toleration (a toleration of that key given with another effect) the taint keeps it off
        bad = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}]
        p.create(make_spec("pl-gpu-taint-1", gpu_workers=NodeGroup(gpu=1, tolerations=bad, **gpu)))
        with pytest.raises(ClusterFailed, match=r"1 node\(s\) had untolerated taint\(s\)"):
            p.wait_ready("pl-gpu-taint-1", timeout=30)
        p.delete("pl-gpu-taint-1")
        assert all(not n.used.get("pods") for n in f.nodes)  # every pod's room was given back


def test_without_pod_access_the_conditions_still_tell_and_the_timeout_says_what_it_saw():
    with FakeKubeRay(pods_forbidden=True) as f:
        p = make_provider(f)
        p.create(make_spec("pl-broken-2"))
        with pytest.raises(ClusterFailed, match="HeadPodReady: ImagePullBackOff"):  # V2 conditions alone
            p.wait_ready("pl-broken-2", timeout=10)
        assert p.pods is None  # 403 on pods: asked once, then no more
        p.create(make_spec("pl-unsched-2"))
        with pytest.raises(KubeRayTimeout, match="last seen: HeadPodReady: Unknown") as e:
            p.wait_ready("pl-unsched-2", timeout=0.3)
        assert "get/list on pods" in e.value.fix


@pytest.mark.parametrize("version", VERSIONS)
def test_failing_job_is_failed_with_its_logs(fake, version):
    p = make_provider(fake, version)
    p.create(make_spec())
    p.wait_ready("pl-doc-id-en-1", timeout=10)
    jid = p.submit_job("pl-doc-id-en-1", None, "python fail_on_purpose.py")
    assert wait_job(p, "pl-doc-id-en-1", jid)[-1] == "FAILED"
    info = p.job("pl-doc-id-en-1", None, jid)
    assert "exit code 1" in info.message
    assert "RuntimeError: boom" in p.job_logs("pl-doc-id-en-1", None, jid)


@pytest.mark.parametrize("version", VERSIONS)
def test_stop_job(fake, version):
    p = make_provider(fake, version)
    p.create(make_spec())
    p.wait_ready("pl-doc-id-en-1", timeout=10)
    jid = p.submit_job("pl-doc-id-en-1", None, "python hang_forever.py", submission_id="my-job-1")
    assert jid == "my-job-1"
    for _ in range(3):
        p.job("pl-doc-id-en-1", None, jid)
    assert p.job("pl-doc-id-en-1", None, jid).status == "RUNNING"
    p.stop_job("pl-doc-id-en-1", None, jid)
    assert p.job("pl-doc-id-en-1", None, jid).status == "STOPPED"
    with pytest.raises(KubeRayNotFound):
        p.job("pl-doc-id-en-1", None, "no-such-job")


def test_a_post_through_the_service_proxy_needs_create_rbac():
    """kube-apiserver maps POST to 'create' on services/proxy; the API server's ClusterRole lacks it."""
    with FakeKubeRay() as f:
        p = make_provider(f, job_access="apiserver")
        p.create(make_spec())
        p.wait_ready("pl-doc-id-en-1", timeout=10)  # the readiness GETs pass
        with pytest.raises(KubeRayAuthError) as e:
            p.submit_job("pl-doc-id-en-1", None, "python job.py")
        assert e.value.status == 403 and "services/proxy" in e.value.fix and "deploy/" in e.value.fix
        assert "job_access='direct'" in e.value.fix
        assert make_provider(f).submit_job("pl-doc-id-en-1", None, "python job.py")  # directly: no RBAC involved


def test_cut_short_error_bodies_still_give_the_message(fake):
    """kuberay #4060: the V2 proxy may cut a non-2xx body short."""
    body = raycluster_body(make_spec())
    body["spec"]["bogus"] = 1
    with pytest.raises(KubeRayRequestError) as e:
        make_provider(fake).client.create_raycluster(body)
    assert len(fake.requests) == 1 and e.value.status == 422 and len(e.value.body) == fake.cut_short
    assert 'HTTP 422: RayCluster.ray.io "pl-doc-id-en-1" is invalid: spec' in str(e.value) and "answer cut short" in str(e.value)


def test_job_address_works_with_rays_job_submission_client():
    from ray.job_submission import JobStatus, JobSubmissionClient

    with FakeKubeRay(token="t0k", proxy_create=True) as f:
        p = make_provider(f, token="t0k", job_access="apiserver")
        info = p.create(make_spec())
        info = p.wait_ready(info.name, timeout=10)
        client = JobSubmissionClient(info.job_address, headers=p.client.auth_headers())
        sid = client.submit_job(entrypoint="python -c 'print(1)'", submission_id="via-ray-client")
        assert sid == "via-ray-client"
        for _ in range(10):
            if client.get_job_status(sid) == JobStatus.SUCCEEDED:
                break
        assert client.get_job_status(sid) == JobStatus.SUCCEEDED
        assert "done: python" in client.get_job_logs(sid)
        assert p.job(info.name, None, sid).status == "SUCCEEDED"  # and our provider sees the same job


# -- retries, errors, auth -------------------------------------------------------------------------
def test_retries_transient_503_then_succeeds(fake):
    fake.fail_next(503, count=2, method="POST", path="/rayclusters")
    p = make_provider(fake)
    assert p.create(make_spec()).name == "pl-doc-id-en-1"
    assert len(fake.calls("POST", "/rayclusters")) == 3 and len(fake.clusters) == 1
    with FakeKubeRay(fail_first=1) as f:
        assert make_provider(f, "v1").list() == []
        assert [r.status for r in f.requests] == [503, 200]


def test_honours_retry_after_on_429(fake):
    p = make_provider(fake, backoff_max=1.0)
    p.create(make_spec())
    fake.fail_next(429, count=1, method="GET", retry_after="0.3")
    t = time.monotonic()
    p.get("pl-doc-id-en-1")
    assert time.monotonic() - t >= 0.2


@pytest.mark.parametrize("version", VERSIONS)
def test_retry_after_a_lost_answer_does_not_duplicate(version):
    with FakeKubeRay(proxy_create=True) as fake:
        _lost_answers(fake, version)


def _lost_answers(fake, version):
    p = make_provider(fake, version, job_access="apiserver")
    fake.fail_next(503, method="POST", path="/clusters" if version == "v1" else "/rayclusters", after=True)
    p.create(make_spec())  # created, answer lost: read back, ours -> reused
    assert len(fake.clusters) == 1
    p.wait_ready("pl-doc-id-en-1", timeout=10)
    fake.fail_next(503, method="POST", path="/api/jobs/" if version == "v2" else "/jobsubmissions/", after=True)
    jid = p.submit_job("pl-doc-id-en-1", None, "python job.py")
    assert [k[2] for k in fake.jobs] == [jid]
    assert wait_job(p, "pl-doc-id-en-1", jid)[-1] == "SUCCEEDED"


def test_bounded_retries_end_in_a_clear_error(fake):
    fake.fail_next(503, count=100, message="apiserver overloaded")
    p = make_provider(fake, retries=3)
    t = time.monotonic()
    with pytest.raises(KubeRayUnavailable) as e:
        p.create(make_spec())
    # each of the 4 attempts: one POST, then a read-back GET (is it there after all?)
    assert [r.method for r in fake.requests] == ["POST", "GET"] * 4 and time.monotonic() - t < 2
    msg = str(e.value)
    assert "after 4 attempt(s)" in msg and "HTTP 503" in msg and "apiserver overloaded" in msg
    assert "PREPLINE_KUBERAY_SERVER" in e.value.fix and e.value.status == 503
    t = time.monotonic()
    with pytest.raises(KubeRayUnavailable) as e:
        p.get("pl-x")
    assert "after 4 attempt(s)" in str(e.value)


def test_auth_header_from_param_env_and_rotating_file(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    with FakeKubeRay(token="abc") as f:
        make_provider(f, token="abc").create(make_spec("pl-a"))
        monkeypatch.setenv(ENV_TOKEN, "abc")
        make_provider(f).create(make_spec("pl-b"))
        monkeypatch.delenv(ENV_TOKEN)
        tok = tmp_path / "token"
        tok.write_text("abc\n")
        p = make_provider(f, token_file=str(tok))
        p.create(make_spec("pl-c"))
        f.token = "rotated"  # the service-account token rotates: the file is re-read
        tok.write_text("rotated")
        assert p.get("pl-c").name == "pl-c"
        assert {r.headers["authorization"] for r in f.requests[:-1]} == {"Bearer abc"}
        assert f.requests[-1].headers["authorization"] == "Bearer rotated"
        assert "rotated" not in repr(p.client)


def test_401_and_403_are_clear_and_not_retried(monkeypatch):
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    with FakeKubeRay(token="right", forbid=("locked",)) as f:
        with pytest.raises(KubeRayAuthError) as e:
            make_provider(f).create(make_spec())
        assert e.value.status == 401 and "no token was sent" in e.value.fix and ENV_TOKEN in e.value.fix
        assert [r.method for r in f.requests] == ["POST", "GET"]  # the read-back is refused too: the create's error stands
        with pytest.raises(KubeRayAuthError, match="HTTP 401") as e:
            make_provider(f, token="wrong").get("pl-x")
        assert "token was rejected" in e.value.fix
        with pytest.raises(KubeRayAuthError) as e:
            make_provider(f, token="right").delete("pl-x", "locked")
        assert e.value.status == 403 and "RBAC" in e.value.fix


def test_unreachable_server_fails_fast_with_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    p = KubeRayProvider(f"http://127.0.0.1:{port}", retries=2, backoff=0.05, connect_timeout=1)
    t = time.monotonic()
    with pytest.raises(KubeRayUnavailable) as e:
        p.create(make_spec())
    assert time.monotonic() - t < 3
    assert f"127.0.0.1:{port}" in str(e.value) and "after 3 attempt(s)" in str(e.value)
    assert re.search(r"refused|NewConnectionError", str(e.value)) and e.value.status is None


def test_a_server_that_never_answers_times_out():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)  # accepts connections (backlog) but never answers
    try:
        p = KubeRayProvider(f"http://127.0.0.1:{srv.getsockname()[1]}", retries=1, backoff=0.01, timeout=0.3)
        t = time.monotonic()
        with pytest.raises(KubeRayUnavailable, match="(?i)timeout|timed out"):
            p.get("pl-x")
        assert time.monotonic() - t < 3
    finally:
        srv.close()


def test_delete_missing_is_false_other_failures_raise(fake):
    p = make_provider(fake, retries=2)
    assert p.delete("pl-never-created") is False
    p.create(make_spec())
    fake.fail_next(500, count=3, method="DELETE", message="etcd timeout")
    with pytest.raises(KubeRayUnavailable, match="etcd timeout"):
        p.delete("pl-doc-id-en-1")
    assert (NS, "pl-doc-id-en-1") in fake.clusters
    assert p.delete("pl-doc-id-en-1") is True


def test_the_server_rejects_invalid_bodies_and_we_show_its_message():
    with FakeKubeRay(cut_short=None) as fake:  # whole error bodies here (cut short: the test above)
        _rejected(fake)


def _rejected(fake):
    client = make_provider(fake).client
    body = raycluster_body(make_spec())
    body["spec"]["workerGroupSpecs"][0]["replicas"] = "two"
    body["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["cpu"] = "1"
    with pytest.raises(KubeRayRequestError) as e:
        client.create_raycluster(body)
    assert e.value.status == 422 and "'two' is not of type 'integer'" in str(e.value)
    assert "'cpu' was unexpected" in str(e.value) and not fake.clusters
    with pytest.raises(KubeRayRequestError) as e:  # V1: gRPC-gateway's InvalidArgument
        client.create_compute_template({"name": "t", "namespace": NS, "cpu": 1, "memory": 2, "mem": 1})
    assert e.value.status == 400 and "'mem' was unexpected" in str(e.value)


@pytest.mark.parametrize("version", VERSIONS)
def test_list_by_labels_for_the_sweep(fake, version):
    p = make_provider(fake, version)
    for i in range(5):
        p.create(make_spec(f"pl-c{i}", labels={LABEL_RUN: "r1" if i < 3 else "r2", LABEL_STAGE: "s"}))
    if version == "v2":
        foreign = raycluster_body(make_spec("pl-foreign", labels={LABEL_RUN: "r1"}))
        del foreign["metadata"]["labels"][LABEL_MANAGED]
        p.client.create_raycluster(foreign)
    assert sorted(c.name for c in p.list(labels={LABEL_RUN: "r1"})) == ["pl-c0", "pl-c1", "pl-c2"]
    assert len(p.list()) == 5 and p.list(labels={LABEL_RUN: "r3"}) == []
    if version == "v2":
        q = fake.calls("GET", "/rayclusters")[-1].query
        assert q["labelSelector"] == f"{LABEL_MANAGED}=true,{LABEL_RUN}=r3"
        items = p.client.list_rayclusters(NS, f"{LABEL_MANAGED}=true", limit=2)
    else:
        items = p.client.list_clusters_v1(NS, limit=2)
    assert len(items) == 5 and sum("continue" in r.query for r in fake.requests) == 2  # paginated


def test_wait_ready_timeouts_name_what_is_missing():
    with FakeKubeRay(ready_after=10**6) as f:
        p = make_provider(f)
        p.create(make_spec())
        with pytest.raises(KubeRayTimeout, match="state: pending"):
            p.wait_ready("pl-doc-id-en-1", timeout=0.2)
    with FakeKubeRay(dashboard_lag=10**6) as f:
        p = make_provider(f)
        p.create(make_spec())
        with pytest.raises(KubeRayTimeout, match="dashboard did not answer") as e:
            p.wait_ready("pl-doc-id-en-1", timeout=0.3)
        assert "connection refused" in str(e.value) and "job_access='direct'" in e.value.fix


def test_configuration_errors():
    with pytest.raises(ConfigError, match="PREPLINE_KUBERAY_SERVER"):
        KubeRayClient("kuberay-apiserver:8888")
    assert KubeRayClient("").server == "http://kuberay-apiserver-service.ray-system.svc.cluster.local:8888"  # in-cluster default
    with pytest.raises(ConfigError, match="token file"):
        KubeRayClient("http://127.0.0.1:1", token_file="/nonexistent/token")
    with pytest.raises(ConfigError, match="api_version"):
        KubeRayProvider("http://127.0.0.1:1", api_version="v3")
    with pytest.raises(ConfigError, match="job_access"):
        KubeRayProvider("http://127.0.0.1:1", job_access="proxy")
    with pytest.raises(ConfigError, match="head_url"):
        KubeRayProvider("http://127.0.0.1:1", head_url="http://head:8265")
    assert isinstance(get_provider("kuberay", server="http://127.0.0.1:1", api_version="v1"), KubeRayProvider)


# -- cluster names ---------------------------------------------------------------------------------
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
triples = st.tuples(st.text(max_size=40), st.text(max_size=30), st.text(max_size=12))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(triples, min_size=2, max_size=12, unique=True), st.sampled_from(["pl", "prepline", "X_9", "", "7up"]))
def test_cluster_name_is_valid_and_unique(ts, prefix):
    names = [cluster_name(*t, prefix=prefix) for t in ts]
    for n, t in zip(names, ts):
        assert DNS_1035.match(n) and len(n) <= 40, (t, n)
        assert cluster_name(*t, prefix=prefix) == n  # deterministic: start and exit tasks agree
        check_name(make_spec(n))  # usable by KubeRay and by ClusterSpec
    assert len(set(names)) == len(ts)


def test_cluster_name_separates_ambiguous_and_similar_triples():
    assert cluster_name("a\0b", "c") != cluster_name("a", "b\0c")
    assert cluster_name("\0", "", "") != cluster_name("", "\0", "")
    long_stage = "tokenization_stage_" + "x" * 30
    names = {cluster_name(f"run-{r}", long_stage + s, b) for r in range(20) for s in ("a", "b") for b in ("en", "ja", "de")}
    assert len(names) == 120


def test_parallel_clients_share_one_fake_safely(fake):
    """Several branches create clusters at once (one provider each, as separate KFP tasks would)."""
    errors = []

    def branch(i):
        try:
            p = make_provider(fake)
            n = cluster_name("run-7", "lang_id", f"b{i}")
            p.create(make_spec(n))
            p.wait_ready(n, timeout=10)
            p.delete(n)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=branch, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and not fake.clusters


def test_a_url_that_is_not_the_api_server_gives_a_clear_error():
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Html(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = b"<html>Kubeflow Central Dashboard</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        p = KubeRayProvider(f"http://127.0.0.1:{srv.server_address[1]}", retries=0)
        with pytest.raises(ClusterError, match="unexpected answer") as e:
            p.get("pl-x")
        assert "KubeRay API server" in e.value.fix
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_fake_operator_never_reconciles_a_name_longer_than_53(fake):
    """The CRD schema takes it (the POST succeeds), the operator does not: no status, ever."""
    body = raycluster_body(make_spec("a" * 53))
    body["metadata"]["name"] = "a" * 54
    make_provider(fake).client.create_raycluster(body)
    p = make_provider(fake)
    for _ in range(5):
        assert p.get("a" * 54).state == "pending"  # no status.state: never ready


def test_a_broken_off_error_answer_keeps_its_status(fake):
    """The V2 proxy breaks a non-2xx stream off short of its Content-Length (apiserversdk/proxy.go,
    kuberay #4060): the status still counts, so deleting a cluster that is gone answers "already gone"
    at once instead of retrying a connection error and failing the exit task."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", int(fake.url.rsplit(":", 1)[1]), timeout=10)
    conn.request("DELETE", f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/pl-gone")
    resp = conn.getresponse()
    assert resp.status == 404 and int(resp.getheader("Content-Length")) > fake.cut_short
    with pytest.raises(http.client.IncompleteRead):  # the fake breaks the stream as the proxy does
        resp.read()
    conn.close()
    p = make_provider(fake)
    p.create(make_spec())
    assert p.delete("pl-doc-id-en-1") is True
    before = len(fake.calls("DELETE"))
    assert p.delete("pl-doc-id-en-1") is False  # already gone
    assert len(fake.calls("DELETE")) == before + 1  # one request: a 404 is an answer, not a broken connection


@pytest.mark.parametrize("kuberay", ["1.3.0", "1.5.0", "1.5.1"])
@pytest.mark.parametrize("kind", ["broken", "oom", "secret"])
def test_container_errors_fail_fast_on_every_kuberay_version(kuberay, kind):
    """Before KubeRay 1.5.1 HeadPodReady says only ContainersNotReady (utils/util.go gained the container's
    waiting reason in #4196): the pods tell, read in the cluster's own namespace. ``secret``: a secret the
    Ray pods need (not optional) is missing in that namespace -> CreateContainerConfigError."""
    want = {"broken": "ImagePullBackOff", "oom": "OOMKilled", "secret": 'CreateContainerConfigError (secret "s3-creds" not found)'}[kind]
    with FakeKubeRay(kuberay_version=kuberay, secrets={("default", "s3-creds"): {"AWS_ACCESS_KEY_ID": "k"}}) as f:
        p = make_provider(f)
        name = f"pl-{kind}-1" if kind != "secret" else "pl-doc-id-1"
        p.create(make_spec(name, env_from_secrets=[{"secret": "s3-creds"}] if kind == "secret" else []))
        with pytest.raises(ClusterFailed) as e:  # not KubeRayTimeout: the reason was found
            p.wait_ready(name, timeout=120)
        assert want in str(e.value)
        reasons = {c["reason"] for c in p.client.get_raycluster(NS, name)["status"]["conditions"]}
        assert reasons == ({"ContainersNotReady"} if kuberay < "1.5.1" else {want.split()[0] if kind != "oom" else "CrashLoopBackOff"})


def test_old_kuberay_without_pod_access_says_what_would_tell():
    """KubeRay < 1.5.1 and no RBAC on pods: nothing says why; the timeout says where to look and what fixes it."""
    with FakeKubeRay(kuberay_version="1.5.0", pods_forbidden=True) as f:
        p = make_provider(f)
        p.create(make_spec("pl-broken-3"))
        with pytest.raises(KubeRayTimeout) as e:
            p.wait_ready("pl-broken-3", timeout=0.3)
        assert "ContainersNotReady" in str(e.value)
        assert "KubeRay >= 1.5.1" in e.value.fix and "get/list on pods" in e.value.fix


@pytest.mark.parametrize("version", VERSIONS)
def test_secrets_resolve_in_the_clusters_own_namespace(version):
    """The fake kubelet resolves secretKeyRefs in the pod's namespace only (pkg/kubelet/kubelet_pods.go):
    the same secret name in another namespace does not count."""
    refs = [{"name": "AWS_ACCESS_KEY_ID", "secret": "s3-creds", "key": "id"}]
    with FakeKubeRay(secrets={("default", "s3-creds"): {"id": "default-id"}, ("team-b", "s3-creds"): {"id": "team-b-id"}}) as f:
        p = make_provider(f, version)
        p.create(make_spec("pl-sec-1", env_from_secrets=refs))
        with pytest.raises(ClusterFailed, match='CreateContainerConfigError.*secret "s3-creds" not found'):
            p.wait_ready("pl-sec-1", timeout=120)
        p.create(make_spec("pl-sec-2", namespace="team-b", env_from_secrets=refs))
        assert p.wait_ready("pl-sec-2", "team-b", timeout=120).state == "ready"
        assert f.pod_env("team-b", "pl-sec-2") == {"AWS_ACCESS_KEY_ID": "team-b-id"}
