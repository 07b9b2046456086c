"""The cluster path on real hosts: a stage's simple pipeline (the real KFP components under kfp's
local runner, on the lab's launcher host, provider ``kuberay``, namespace ``team-a``) creates its
RayCluster through the strict fake KubeRay API server, which the lab realises as real Ray nodes on
the ray hosts (tests/lab/lab_kuberay.py: the command, env and secrets a pod would get), submits the
job to the head service's real job API by its cluster DNS name, and the exit handler deletes the
cluster. Input and output on the S3 host; the S3 credentials reach the Ray nodes only through the
secret of the cluster's namespace."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from labkit import HOSTS, PRE, ROOT, Lab, lab_name, local_env, local_tree, require_lab, s3_tree, upload_sample

pytestmark = [pytest.mark.lab, pytest.mark.ray, pytest.mark.slow]

SECRET = "lab-s3"


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    require_lab()
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "clusters"))
    from fake_kuberay import FakeKubeRay
    from lab_kuberay import LabKubeRay

    d = tmp_path_factory.mktemp("labkuberay")
    lab = Lab(lab_name("kuberay"))
    realiser = fake = None
    try:
        lab.up(HOSTS)
        endpoint = lab.start_s3()
        upload_sample(endpoint, d)
        # ray-2 is a GPU node (one nvidia.com/gpu, tainted as GPU pools are): only a GPU group's pods go there
        realiser = LabKubeRay(lab, hosts=("ray-0", "ray-1", "ray-2"), gpus={"ray-2": 1})
        fake = FakeKubeRay(bind=lab.gateway, realise=realiser, dashboard_lag=0, nodes=realiser.nodes(),
                           secrets={("team-a", SECRET): Lab.s3_env(endpoint)}).start()
        yield lab, endpoint, d, fake, realiser
    finally:
        if realiser:
            realiser.close()
        if fake:
            fake.stop()
        lab.down()


def pipeline_on_launcher(lab: Lab, endpoint: str, fake, transform: str, namespace: str, run_id: str, timeout: float = 900,
                         params: tuple = (), provider_extra: dict | None = None, input_uri: str = "s3://lab/in"):
    """``prepline pipeline run <transform> --local`` on the launcher host with provider kuberay: the
    launcher's own env has the S3 credentials (the step reads metadata.json) and nothing of Ray's."""
    provider = json.dumps({"server": fake.url, "namespace": namespace, **(provider_extra or {})})
    argv = ["prepline", "pipeline", "run", transform, "--local", "--work-root", "/tmp/w", "--input", input_uri,
            "--param", "provider=kuberay", "--param", f"provider_json={provider}", "--param", "work_root=s3://lab/stages",
            "--param", f"s3_secret_name={SECRET}", "--param", f"run_id={run_id}", "--param", "start_timeout_seconds=240"]
    for p in params:
        argv += ["--param", p]
    t0 = time.time()
    r = lab.run("launcher", argv, env=Lab.s3_env(endpoint), timeout=timeout)
    return r, time.time() - t0


def ray_hosts_idle(lab: Lab) -> dict[str, int]:
    return {h: len(lab.pids(h)) for h in ("ray-0", "ray-1", "ray-2") if lab.pids(h)}


@pytest.mark.parametrize("transform", ["exact_dedup", "fuzzy_dedup"])
def test_simple_pipeline_creates_a_real_cluster_runs_on_two_hosts_and_deletes_it(plane, tmp_path, transform):
    lab, endpoint, d, fake, realiser = plane
    local = tmp_path / "local"
    subprocess.run([PRE, "run", transform, "--input", str(d / "in"), "--output", str(local)], check=True,
                   capture_output=True, env=local_env())

    before = len(fake.calls("POST", "/rayclusters"))
    r, seconds = pipeline_on_launcher(lab, endpoint, fake, transform, "team-a", f"lab-{transform.replace('_', '-')}")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-6000:], realiser.events)

    created = [c for c in fake.calls("POST", "/rayclusters")[before:] if c.status == 201]
    assert len(created) == 1 and "/namespaces/team-a/" in created[0].path, [c.path for c in created]
    name = created[0].body["metadata"]["name"]
    rec = realiser.records[("team-a", name)]
    print(f"lab kuberay {transform}: {seconds:.0f}s; nodes {rec['nodes']}; tasks per host {rec['tasks']}; jobs {rec['jobs']}")
    # Ray's own records: the stage's tasks ran on at least two hosts (the default spec: a head and one worker)
    assert "error" not in rec, rec
    assert len(rec["nodes"]) == 2 and len([h for h, n in rec["tasks"].items() if n > 0]) >= 2, rec
    assert [j["status"] for j in rec["jobs"]] == ["SUCCEEDED"], rec
    # the worker joined through the head service's cluster DNS name, as KubeRay's command says
    worker = [h for h in rec["commands"] if "--head" not in rec["commands"][h]][0]
    assert f"--address={name}-head-svc.team-a.svc.cluster.local:6379" in rec["commands"][worker]
    # the exit handler deleted the cluster: nothing left in the API or on any host
    assert [c.status for c in fake.calls("DELETE", f"/rayclusters/{name}")] == [200]
    assert not fake.clusters and not realiser.clusters and not ray_hosts_idle(lab)

    got = s3_tree(endpoint, f"stages/lab-{transform.replace('_', '-')}/{transform}")
    assert sorted(got) == sorted(local_tree(local))
    assert got == local_tree(local), "the cluster run's output differs from the local run's"


def test_a_secret_missing_in_the_clusters_namespace_gives_its_pods_no_credentials_and_the_step_says_where(plane):
    """The S3 secret exists in team-a only. The pipeline mounts it as optional (a cluster may use a
    workload identity instead), so in team-b the kubelet starts the pods without it, as it would: the
    secret of another namespace never reaches them. The job fails at its first S3 call, the step says
    which secret in which namespace, and the exit handler deletes the cluster."""
    lab, endpoint, d, fake, realiser = plane
    r, seconds = pipeline_on_launcher(lab, endpoint, fake, "exact_dedup", "team-b", "lab-no-secret", timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "no S3 credentials found" in out and "own namespace 'team-b'" in out and f"s3_secret_name" in out, out[-4000:]
    name = [c for c in fake.calls("POST", "/rayclusters") if "/namespaces/team-b/" in c.path][0].body["metadata"]["name"]
    assert [c.status for c in fake.calls("DELETE", f"/namespaces/team-b/rayclusters/{name}")] == [200]
    assert not fake.clusters and not realiser.clusters and not ray_hosts_idle(lab)
    print(f"lab kuberay, no secret in the namespace: failed with the fix in {seconds:.0f}s")


def test_a_required_secret_missing_in_the_namespace_keeps_the_head_from_starting_and_the_start_step_says_so(plane):
    """cluster_json asks for the secret without 'optional': the kubelet refuses to start the container
    (CreateContainerConfigError), nothing runs on any host, and the start step fails with that reason
    instead of waiting out its timeout."""
    lab, endpoint, d, fake, realiser = plane
    cluster = json.dumps({"env_from_secrets": [{"secret": SECRET}]})
    realised_before = len([e for e in realiser.events if "head on" in e])
    r, seconds = pipeline_on_launcher(lab, endpoint, fake, "exact_dedup", "team-b", "lab-required-secret", timeout=600,
                                      params=(f"cluster_json={cluster}",))
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert 'secret "lab-s3" not found' in out and "CreateContainerConfigError" in out, out[-4000:]
    assert not fake.clusters and not realiser.clusters and not ray_hosts_idle(lab)
    assert len([e for e in realiser.events if "head on" in e]) == realised_before, realiser.events
    assert seconds < 200, f"the start step waited {seconds:.0f}s for a head that cannot start"
    print(f"lab kuberay, required secret missing: start refused with the reason in {seconds:.0f}s")


def test_head_host_killed_mid_stage_fails_the_step_the_cluster_is_deleted_and_a_rerun_resumes(plane, tmp_path):
    """The drill of docs/reliability.md: the head's host vanishes (every process SIGKILLed, its link
    down: no TCP reset reaches anyone) while exact_dedup runs. The execute step must fail with the
    reason within 60 s, the exit handler must still delete the cluster, and rerunning the pipeline
    (same run id: same output folder) must resume to the local run's output. The host comes back
    (link up, nothing running) before the rerun, as a replaced node would."""
    import threading

    from labkit import _get

    lab, endpoint, d, fake, realiser = plane
    local = tmp_path / "local"
    subprocess.run([PRE, "run", "exact_dedup", "--input", str(d / "in"), "--output", str(local)], check=True,
                   capture_output=True, env=local_env())
    result: dict = {}

    def first_run():
        result["r"], result["seconds"] = pipeline_on_launcher(lab, endpoint, fake, "exact_dedup", "team-a", "lab-head-kill")

    t0 = time.time()
    runner = threading.Thread(target=first_run)
    runner.start()
    head = None
    while head is None:
        assert runner.is_alive(), result["r"].stderr[-3000:]
        assert time.time() - t0 < 400, "no running job"
        for (ns, name), c in list(realiser.clusters.items()):
            if ns == "team-a" and c.get("dashboard") and c["ready"]:
                try:
                    if any(j.get("status") == "RUNNING" for j in _get(f"{c['dashboard']}/api/jobs/")):
                        head = c["hosts"][0]
                except Exception:  # noqa: BLE001 - not serving yet
                    pass
        time.sleep(0.3)
    time.sleep(3)  # let it write some of its output
    t_kill = time.time()
    lab.kill_host(head)
    runner.join(timeout=900)
    t_end = time.time()
    r = result["r"]
    out = r.stdout + r.stderr
    lab.restore(head)
    print(f"drill head host killed mid exact_dedup: step failed {t_end - t_kill:.0f}s after the kill; "
          f"error: {[line for line in out.splitlines() if line.startswith('error')][-1:]}")
    assert r.returncode != 0, "a run whose head died must not succeed"
    assert "error: exact_dedup: the Ray head of cluster" in out and "stopped answering while job" in out, out[-5000:]
    assert "fix: the head's pod or its node is gone" in out and "resumes" in out, out[-5000:]
    assert t_end - t_kill < 90, f"the pipeline ended {t_end - t_kill:.0f}s after the head died"
    assert not fake.clusters and not realiser.clusters and not ray_hosts_idle(lab), "the exit handler deletes the cluster"

    r2, seconds = pipeline_on_launcher(lab, endpoint, fake, "exact_dedup", "team-a", "lab-head-kill")
    assert r2.returncode == 0, (r2.stdout[-3000:], r2.stderr[-4000:])
    print(f"drill head host killed: rerun succeeded in {seconds:.0f}s")
    got = s3_tree(endpoint, "stages/lab-head-kill/exact_dedup")
    assert got == local_tree(local), "documents lost or duplicated after the rerun"


GPU_CLUSTER = {"workers": {"replicas": 1, "cpu": "1", "memory": "2Gi"},
               "gpu_workers": {"replicas": 1, "gpu": 1, "cpu": "2", "memory": "4Gi", "node_selector": {"gpu": "lab"}}}


def upload_synth_input(d, endpoint: str, folder) -> int:
    """24 documents with ids at s3://lab/synth-in and a tiny causal LM trained on them at s3://lab/model."""
    import io
    import sys

    import pyarrow.parquet as pq

    from labkit import s3_of

    sys.path.insert(0, str(ROOT / "tests" / "transforms"))
    from tiny_lm import make_model

    s3 = s3_of(endpoint)
    t = pq.read_table(sorted((d / "in").glob("*.parquet"))[0]).slice(0, 24)
    buf = io.BytesIO()
    pq.write_table(t, buf)
    s3.put_object(Bucket="lab", Key="synth-in/part-0.parquet", Body=buf.getvalue())
    model = make_model(folder / "model", [str(x) for x in t.column("contents").to_pylist()])
    for f in sorted(model.iterdir()):
        s3.upload_file(str(f), "lab", f"model/{f.name}")
    return t.num_rows


def test_synthesize_runs_on_the_gpu_group_next_to_the_cpu_workers(plane, tmp_path):
    """cluster_json gpu_workers next to one CPU worker: the scheduler puts the GPU pod on the GPU host,
    KubeRay's command gives that Ray node --num-gpus=1, and every synthesize task runs there (Ray's own
    records), because each actor reserves a GPU (gpus_per_worker, default 1). The lab has no GPU device:
    the CPU engine runs, placed as it would be on a GPU node. The output conserves documents."""
    from labkit import s3_of

    lab, endpoint, d, fake, realiser = plane
    s3 = s3_of(endpoint)
    docs = upload_synth_input(d, endpoint, tmp_path)
    params = json.dumps({"model_path": "s3://lab/model", "templates": ["simple=Say simply: {text}"], "max_new_tokens": 6,
                         "max_prompt_tokens": 24, "partition_docs": 8})
    r, seconds = pipeline_on_launcher(lab, endpoint, fake, "synthesize", "team-a", "lab-gpu-synth", input_uri="s3://lab/synth-in",
                                      params=(f"cluster_json={json.dumps(GPU_CLUSTER)}", f"params_json={params}"))
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-6000:], realiser.events)
    created = [c for c in fake.calls("POST", "/rayclusters") if c.status == 201 and "synth" in c.body["metadata"]["name"]]
    body = created[-1].body
    assert [g["groupName"] for g in body["spec"]["workerGroupSpecs"]] == ["workers", "gpu-workers"]
    rec = realiser.records[("team-a", body["metadata"]["name"])]
    print(f"lab kuberay synthesize on the GPU group: {seconds:.0f}s; nodes {rec['nodes']}; transform tasks per host "
          f"{rec['worker_tasks']}; all tasks {rec['tasks']}")
    assert "error" not in rec, rec
    assert "--num-gpus=1" in rec["commands"]["ray-2"] and not any("--num-gpus" in a for h, a in rec["commands"].items() if h != "ray-2")
    assert set(rec["worker_tasks"]) == {"ray-2"} and rec["worker_tasks"]["ray-2"] >= 1, rec
    assert [j["status"] for j in rec["jobs"]] == ["SUCCEEDED"], rec
    assert not fake.clusters and not realiser.clusters and not ray_hosts_idle(lab)
    meta = json.loads(s3.get_object(Bucket="lab", Key="stages/lab-gpu-synth/synthesize/metadata.json")["Body"].read())
    tot = meta["totals"]
    assert tot["docs_in"] == docs and sum(tot["generated"].values()) > 0 and tot["docs_in"] + sum(tot["generated"].values()) == tot["docs_out"] + sum(tot["removed"].values())


def test_a_gpu_group_no_node_can_hold_fails_the_start_step_with_the_schedulers_reason(plane, tmp_path):
    """Two GPUs per pod and no host has two: the head and the CPU worker start, the GPU pod stays
    Pending (Unschedulable), KubeRay's state stays unready; the start step reads the pods and fails
    after the grace period with the scheduler's message naming the GPU group, and the exit handler
    deletes the cluster, stopping the Ray nodes that did start."""
    lab, endpoint, d, fake, realiser = plane
    upload_synth_input(d, endpoint, tmp_path)
    cluster = {**GPU_CLUSTER, "gpu_workers": {**GPU_CLUSTER["gpu_workers"], "gpu": 2}}
    params = json.dumps({"model_path": "s3://lab/model"})
    r, seconds = pipeline_on_launcher(lab, endpoint, fake, "synthesize", "team-a", "lab-gpu-none", timeout=600,
                                      input_uri="s3://lab/synth-in", provider_extra={"pending_grace_seconds": 10, "kube": {"server": fake.kube_url}},
                                      params=(f"cluster_json={json.dumps(cluster)}", f"params_json={params}"))
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "(group gpu-workers) Unschedulable: 0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s)" in out, out[-4000:]
    assert "gpu_workers" in out and "node_selector" in out, out[-4000:]
    assert any("head on ray-0, workers on ray-1; 1 pod(s) placed nowhere" in e for e in realiser.events), realiser.events[-5:]  # two nodes did start
    assert not fake.clusters and not realiser.clusters and not ray_hosts_idle(lab), realiser.events[-5:]
    assert seconds < 200, f"the start step waited {seconds:.0f}s for a GPU pod no node can hold"
    print(f"lab kuberay, GPU group no node can hold: start refused with the scheduler's reason in {seconds:.0f}s")
