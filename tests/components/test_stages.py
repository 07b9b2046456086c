"""Stage logic behind the KFP components, without KFP."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prepline import stages
from prepline.errors import ConfigError, RunFailed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clusters"))


def test_prepare_paths_and_names_per_run_stage_branch(tmp_path):
    a = stages.prepare("exact_dedup", '{"num_shards": 4}', str(tmp_path), "run-1", "exact_dedup", input_path="/data/in")
    assert a["input_path"] == "/data/in" and a["output_path"] == f"{tmp_path}/run-1/exact_dedup"
    assert json.loads(a["config_json"])["num_shards"] == 4
    b = stages.prepare("filter", '{"criteria": ["1=1"]}', "s3://b/w", "run-1", "filter", branch="ja", input_stage="lang_id", input_from_split=True)
    assert b["input_path"] == "s3://b/w/run-1/lang_id/lang=ja" and b["output_path"] == "s3://b/w/run-1/lang=ja/filter"
    c = stages.prepare("filter", '{"criteria": ["1=1"]}', "s3://b/w", "run-1", "filter", branch="ja", input_stage="hap")
    assert c["input_path"] == "s3://b/w/run-1/lang=ja/hap"
    names = {stages.prepare("filter", '{"criteria": ["1=1"]}', "/w", r, "filter", branch=br, input_path="/i")["cluster_name"]
             for r in ("run-1", "run-2") for br in ("en", "ja", "fr")}
    assert len(names) == 6 and all(len(n) <= 63 for n in names)


def test_overrides_per_stage(tmp_path):
    o = json.dumps({"exact_dedup": {"params": {"num_shards": 2}, "cluster": {"workers": {"cpu": "4", "replicas": 2}}}})
    a = stages.prepare("exact_dedup", "{}", str(tmp_path), "r", "exact_dedup", input_path="/i", overrides_json=o)
    assert json.loads(a["config_json"])["num_shards"] == 2 and a["workers"] == 8  # derived from the cluster's CPUs
    a = stages.prepare("exact_dedup", "{}", str(tmp_path), "r", "exact_dedup", input_path="/i",
                       cluster_json='{"workers": {"cpu": "4", "replicas": 2}, "cpus_per_worker": 2}')
    assert a["workers"] == 4


def test_a_gpu_group_next_to_the_workers_places_one_actor_per_gpu(tmp_path):
    """cluster_json gpu_workers: a second KubeRay worker group; the stage's actors reserve gpus_per_worker
    GPUs each (default 1), so their number comes from the GPUs; asking for the group alone means one
    pod of it and no idle CPU pod; the job's command carries the placement."""
    from prepline.clusters.kuberay_bodies import raycluster_body

    model = {"model_path": "/m"}
    c = json.dumps({"gpu_workers": {"replicas": 2, "gpu": 2, "node_selector": {"gpu": "l4"}}})
    a = stages.prepare("synthesize", json.dumps(model), str(tmp_path), "r", "synthesize", input_path="/i", cluster_json=c)
    assert a["workers"] == 4
    spec = stages.cluster_spec(a["cluster_json"], a["cluster_name"], "r", "synthesize")
    assert (spec.workers.replicas, spec.gpu_workers.replicas, spec.gpu_workers.cpu, spec.gpus()) == (0, 2, "4", 4)
    body = raycluster_body(stages.with_defaults(dataclasses.replace(spec, namespace="team-a"), a["cluster_json"], image="img:1"))
    assert [g["groupName"] for g in body["spec"]["workerGroupSpecs"]] == ["gpu-workers"]
    half = json.dumps({"workers": {"replicas": 1}, "gpu_workers": {"gpu": 1}, "gpus_per_worker": 0.5, "cpus_per_worker": 2})
    b = stages.prepare("synthesize", json.dumps(model), str(tmp_path), "r", "synthesize", input_path="/i", cluster_json=half)
    spec = stages.cluster_spec(half, b["cluster_name"])
    assert b["workers"] == 2 and (spec.workers.replicas, spec.gpu_workers.replicas) == (1, 1)
    assert stages.placement(half, spec) == (2.0, 0.5)
    cmd = stages.entrypoint("synthesize", "{}", "/i", "/o", 2, 0, False, *stages.placement(half, spec))
    assert "--cpus-per-worker 2 --gpus-per-worker 0.5" in cmd
    assert "-per-worker" not in stages.entrypoint("doc_id", "{}", "/i", "/o", 2, 0)
    with pytest.raises(ConfigError, match="more than any pod has"):
        stages.placement(json.dumps({"gpu_workers": {"gpu": 1}, "gpus_per_worker": 2}), spec)
    with pytest.raises(ConfigError, match="gpu_workers must be an object"):
        stages.cluster_spec('{"gpu_workers": 2}', "pl-x-1")
    # the example of docs/cluster.md#gpu-workers, as it is written there
    doc = (Path(__file__).resolve().parents[2] / "docs" / "cluster.md").read_text().split("## GPU workers", 1)[1]
    example = doc.split("```json", 1)[1].split("```", 1)[0]
    d = stages.prepare("synthesize", json.dumps(model), str(tmp_path), "r", "synthesize", input_path="/i", cluster_json=example)
    spec = stages.cluster_spec(example, d["cluster_name"])
    assert d["workers"] == 2 and (spec.workers.replicas, spec.gpu_workers.replicas, spec.gpu_workers.cpu) == (1, 2, "8")


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(params_json='{"num_shards": 0}'), "num_shards=0 must be >= 1"),
        (dict(params_json="{not json"), "params_json is not valid JSON"),
        (dict(params_json="[1]"), "params_json must be a JSON dict"),
        (dict(cluster_json='{"wrokers": {}}'), "unknown key\\(s\\) wrokers"),
        (dict(cluster_json='{"head": {"cpus": 2}}'), "cluster_json head: .*cpus"),
        (dict(cluster_json='{"gpu_workers": {"gpu": 1}}'), "exact_dedup does not use GPUs"),
        (dict(cluster_json='{"gpus_per_worker": 1}'), "the cluster has no GPU"),
        (dict(cluster_json='{"gpu_workers": {"gpu": "1"}}'), "gpu_workers.gpu = '1' must be a whole number"),
        (dict(overrides_json='{"exact_dedup": {"parms": {}}}'), "must be an object with 'params'"),
        (dict(work_root=""), "work_root is empty"),
    ],
)
def test_bad_parameters_fail_in_prepare(kw, match):
    args = dict(transform="exact_dedup", params_json="{}", work_root="/w", run_id="r", stage="exact_dedup", input_path="/i")
    args.update(kw)
    with pytest.raises(ConfigError, match=match):
        stages.prepare(**args)


def _meta(tmp_path, **over):
    meta = {"status": "success", "totals": {"docs_in": 10, "docs_out": 7, "removed": {"x": 3}, "files_failed": 0, "seconds": 1.0,
                                            "bytes_in": 1, "bytes_out": 1}}
    meta.update(over)
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    return tmp_path


def test_check_output_never_trusts_the_job(tmp_path):
    assert stages.check_output(str(_meta(tmp_path)), 0)["totals"]["docs_out"] == 7
    with pytest.raises(RunFailed, match="status=failed"):
        stages.check_output(str(_meta(tmp_path, status="failed")), 0)
    bad = {"docs_in": 10, "docs_out": 8, "removed": {"x": 3}, "files_failed": 0, "seconds": 1.0}
    with pytest.raises(RunFailed, match="do not add up"):
        stages.check_output(str(_meta(tmp_path, totals=bad)), 0)
    failed = {"docs_in": 10, "docs_out": 7, "removed": {"x": 3}, "files_failed": 2, "seconds": 1.0}
    with pytest.raises(RunFailed, match="2 files failed"):
        stages.check_output(str(_meta(tmp_path, totals=failed)), 1)
    with pytest.raises(RunFailed, match="wrote no metadata.json"):
        stages.check_output(str(tmp_path / "nothing"), 0)


def test_cluster_name_matches_between_start_and_exit_task():
    """The exit task gets only pipeline inputs, never start's output: stop must find the cluster that
    start created from the same run id, stage and branch (the KubeRay fake holds the clusters)."""
    from fake_kuberay import FakeKubeRay

    run_id, stage = "abc/def-0123456789-abcdef-0123456789-abcdef-0123456789", "exact_dedup"
    cluster_json = json.dumps({"image": "registry.example.com/prepline-ray:0.1.0", "workers": {"replicas": 1}})
    with FakeKubeRay(ready_after=1, dashboard_lag=0) as fake:
        provider_json = json.dumps({"server": fake.url, "poll_interval": 0.01, "backoff": 0.01, "backoff_max": 0.05, "job_access": "apiserver"})
        args = dict(provider="kuberay", provider_json=provider_json, cluster_json=cluster_json, run_id=run_id, stage=stage)
        # what prepare (its own pod, another interpreter and hash seed) names the clusters
        code = ("import json, sys; from prepline import stages; a = json.loads(sys.argv[1]); print(json.dumps({b: stages.prepare("
                "a['stage'], '{}', '/w', a['run_id'], a['stage'], branch=b, input_path='/i', cluster_json=a['cluster_json'])['cluster_name'] "
                "for b in ('en', 'ja')}))")
        r = subprocess.run([sys.executable, "-c", code, json.dumps({"stage": stage, "run_id": run_id, "cluster_json": cluster_json})],
                           capture_output=True, text=True, check=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": "7"})
        planned = json.loads(r.stdout)
        started = {b: stages.start(**args, branch=b, timeout=30) for b in ("en", "ja")}
        assert started == planned and len(set(started.values())) == 2
        assert sorted(name for _, name in fake.clusters) == sorted(started.values())
        # the exit task of the en branch, with the overrides the stage was started with (none here)
        assert stages.stop(**args, branch="en") is True
        assert [name for _, name in fake.clusters] == [started["ja"]]  # the other branch's cluster is untouched
        assert stages.stop(**args, branch="en") is False  # already gone: nothing else is deleted
        assert stages.stop(**args, branch="ja") is True and not fake.clusters


def test_summary_markdown():
    md = stages.summary_markdown({"status": "success", "totals": {"docs_in": 1000, "docs_out": 900, "removed": {"exact_duplicate": 100},
                                                                   "bytes_in": 2e6, "bytes_out": 1e6, "seconds": 3}}, "exact_dedup")
    assert "| removed: exact_duplicate | 100 |" in md and "1,000" in md


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.integration
def test_start_execute_stop_on_a_local_ray_head(tmp_path, corpus, monkeypatch):
    """The whole stage against a real local Ray head: a head that died before its job (as a
    dashboard crashing on a loaded machine does) is started again and the job submitted to it,
    job logs stream, metadata is checked, a failing job fails the step, and stop leaves nothing running."""
    monkeypatch.setenv("PREPLINE_LOCAL_CLUSTERS", str(tmp_path / "clusters"))
    from prepline.clusters.local import LocalProvider, _alive, _kill, _members

    args = dict(provider="local", provider_json='{"num_cpus": 1}', cluster_json="{}", run_id="r1", stage="doc_id", branch="")
    prep = stages.prepare("doc_id", "{}", str(tmp_path / "w"), "r1", "doc_id", input_path=str(corpus))
    name = stages.start(**args)
    dead = LocalProvider()._load(name)
    _kill(_members(dead), signal.SIGKILL)
    deadline = time.time() + 10
    while _alive(dead) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(dead)
    try:
        out = io.StringIO()
        meta = stages.execute(**args, transform="doc_id", config_json=prep["config_json"], input_path=prep["input_path"],
                              output_path=prep["output_path"], workers=1, out=out, poll=0.3)
        st = LocalProvider()._load(name)
        assert st["ports"] != dead["ports"] and _alive(st)  # a new head, on fresh ports
        assert meta["totals"]["docs_out"] == 10
        assert "doc_id: success" in out.getvalue() or "docs in" in out.getvalue()  # the job's own summary, streamed
        bad = tmp_path / "bad"
        bad.mkdir()
        (bad / "x.parquet").write_bytes(b"not parquet")
        # what `prepline run` said in the job (its error, not Ray's "exit code 1"): the file and the fix
        with pytest.raises(RunFailed, match=r"doc_id: 1 input file\(s\) failed .*x\.parquet: not a readable Parquet file") as ei:
            stages.execute(**args, transform="doc_id", config_json=prep["config_json"], input_path=str(bad),
                           output_path=str(tmp_path / "w" / "bad-out"), workers=1, out=io.StringIO(), poll=0.3)
        assert "--max-failed-files" in ei.value.fix
    finally:
        assert stages.stop(**args) is True
    assert not _members(st) and stages.stop(**args) is False


# -- the namespace of a run's clusters and the secrets they see -------------------------------------
S3_KEYS = {"AWS_ACCESS_KEY_ID": "team-a-key", "AWS_SECRET_ACCESS_KEY": "team-a-secret", "PREPLINE_S3_ENDPOINT": "http://minio.team-a:9000"}


@pytest.fixture
def in_team_a(tmp_path, monkeypatch):
    """The step runs in namespace team-a: its service account's namespace file says so (what a KFP pod
    has at /var/run/secrets/kubernetes.io/serviceaccount/namespace)."""
    from prepline.clusters import diagnose

    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "namespace").write_text("team-a\n")
    monkeypatch.setattr(diagnose, "SA_DIR", str(sa))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return tmp_path


def _kuberay_args(fake, **provider):
    provider_json = json.dumps({"server": fake.url, "head_url": fake.head_url, "kube": {"server": fake.kube_url}, "poll_interval": 0.01,
                                "backoff": 0.01, "backoff_max": 0.05, **provider})
    return dict(provider="kuberay", provider_json=provider_json, cluster_json="{}", run_id="run-team-a-1", stage="doc_id")


def _execute(args, tmp_path, **kw):
    out = _meta(tmp_path / "out") if (tmp_path / "out").mkdir() is None else None
    return stages.execute(**args, branch="", transform="doc_id", config_json="{}", input_path="s3://corpus/in", output_path=str(out),
                          workers=1, poll=0.01, timeout=60, out=io.StringIO(), **kw)


def test_a_run_in_team_a_gets_its_cluster_and_the_secret_of_team_a(in_team_a):
    """No namespace in provider_json or cluster_json: the RayCluster goes to the step's own namespace
    and its pods get team-a's S3 secret (default holds a secret of the same name that must not be used)."""
    from fake_kuberay import FakeKubeRay

    secrets = {("team-a", "prepline-s3"): S3_KEYS, ("default", "prepline-s3"): {"AWS_ACCESS_KEY_ID": "default-key"}}
    with FakeKubeRay(ready_after=1, dashboard_lag=0, secrets=secrets) as fake:
        args = _kuberay_args(fake)
        name = stages.start(**args, timeout=30, image="registry.example.com/prepline-ray:0.1.0", s3_secret_name="prepline-s3")
        assert list(fake.clusters) == [("team-a", name)]
        assert [r.path for r in fake.calls("POST")] == ["/apis/ray.io/v1/namespaces/team-a/rayclusters"]
        assert fake.pod_env("team-a", name)["AWS_ACCESS_KEY_ID"] == "team-a-key"
        meta = _execute(args, in_team_a)
        assert meta["totals"]["docs_out"] == 7
        (job,) = fake.jobs.values()
        assert job["env"]["AWS_SECRET_ACCESS_KEY"] == "team-a-secret"
        assert stages.stop(**args) is True and not fake.clusters


def test_provider_json_namespace_overrides_the_steps_namespace(in_team_a):
    from fake_kuberay import FakeKubeRay

    with FakeKubeRay(ready_after=1, dashboard_lag=0, secrets={("team-b", "prepline-s3"): S3_KEYS}) as fake:
        args = _kuberay_args(fake, namespace="team-b")
        name = stages.start(**args, timeout=30, image="registry.example.com/prepline-ray:0.1.0", s3_secret_name="prepline-s3")
        assert list(fake.clusters) == [("team-b", name)]
        assert stages.stop(**args) is True and not fake.clusters


def test_an_optional_secret_missing_in_the_clusters_namespace_shows_as_missing_credentials(in_team_a):
    """The S3 secret exists only in default: the Ray pods of team-a start without it (optional) and the
    job that reads s3:// fails for want of credentials, as it would on a real cluster."""
    from fake_kuberay import FakeKubeRay

    with FakeKubeRay(ready_after=1, dashboard_lag=0, secrets={("default", "prepline-s3"): S3_KEYS}) as fake:
        args = _kuberay_args(fake)
        name = stages.start(**args, timeout=30, image="registry.example.com/prepline-ray:0.1.0", s3_secret_name="prepline-s3")
        assert "AWS_ACCESS_KEY_ID" not in fake.pod_env("team-a", name)
        with pytest.raises(RunFailed, match="Unable to locate credentials"):
            _execute(args, in_team_a)
        assert stages.stop(**args) is True


def test_a_job_that_ray_fails_in_runtime_env_setup_is_submitted_again(in_team_a, monkeypatch):
    """Ray ends a job FAILED with RUNTIME_ENV_SETUP_FAILURE when its supervisor actor's runtime env
    cannot be set up (seen once in CI on a loaded 2-core machine, runtime env agent busy): nothing of the
    job ran, so the step submits it again under a new id instead of failing the run."""
    from fake_kuberay import FakeKubeRay

    monkeypatch.setattr(stages, "SETUP_RETRY_WAIT_S", 0)
    said: list[str] = []
    monkeypatch.setattr(stages.log, "warning", lambda msg, *a, **k: said.append(msg % a))
    with FakeKubeRay(ready_after=1, dashboard_lag=0, secrets={("team-a", "prepline-s3"): S3_KEYS}) as fake:
        fake.ray.setup_failures = 1
        args = _kuberay_args(fake)
        stages.start(**args, timeout=30, image="registry.example.com/prepline-ray:0.1.0", s3_secret_name="prepline-s3")
        meta = _execute(args, in_team_a)
        assert meta["totals"]["docs_out"] == 7
        first, second = fake.jobs.values()  # in submission order
        assert (first["status"], first["error_type"], second["status"]) == ("FAILED", "RUNTIME_ENV_SETUP_FAILURE", "SUCCEEDED")
        assert meta["job"]["id"] == second["submission_id"] != first["submission_id"]
        assert any("could not start job" in m and "submitting it again (1 of 2)" in m for m in said), said
        assert stages.stop(**args) is True


def test_a_job_that_never_gets_its_runtime_env_fails_the_step_after_the_retries(in_team_a, monkeypatch):
    from fake_kuberay import FakeKubeRay

    monkeypatch.setattr(stages, "SETUP_RETRY_WAIT_S", 0)
    with FakeKubeRay(ready_after=1, dashboard_lag=0, secrets={("team-a", "prepline-s3"): S3_KEYS}) as fake:
        fake.ray.setup_failures = 99
        args = _kuberay_args(fake)
        stages.start(**args, timeout=30, image="registry.example.com/prepline-ray:0.1.0", s3_secret_name="prepline-s3")
        with pytest.raises(RunFailed, match=r"FAILED 3 times before it started: runtime_env setup failed") as e:
            _execute(args, in_team_a)
        assert "runtime_env_agent.log" in e.value.fix and "resumes" in e.value.fix
        assert len(fake.jobs) == 3
        assert stages.stop(**args) is True
