"""The fine-tune's TrainJob realised on the lab's trainer hosts (scripts/lab.py): numNodes=2 torchrun
processes on trainer-0 and trainer-1 (network namespaces on a bridge, private /tmp), the rank-0 pod's
service name resolving through the lab's /etc/hosts, gloo between the hosts, tokens and checkpoints on
the S3 server of the lab's s3 host. Then the drill: trainer-1 killed (link down, every process SIGKILLed)
mid-training fails the job with a reason, and the rerun resumes from the last checkpoint on S3."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "lab"))
sys.path.insert(0, str(ROOT / "tests" / "train"))

from lab_kuberay import trainer_spawn  # noqa: E402
from labkit import Lab, lab_name, require_lab  # noqa: E402

pytestmark = [pytest.mark.lab, pytest.mark.slow]

HOSTS = ["s3", "trainer-0", "trainer-1"]


@pytest.fixture
def trainer_lab(monkeypatch):
    require_lab()
    pytest.importorskip("torch")
    the_lab = Lab(name=lab_name("trainjob"))
    try:
        the_lab.up(HOSTS)
        endpoint = the_lab.start_s3("s3")
        for k, v in Lab.s3_env(endpoint).items():  # this process (the tokenizer, the S3 poller) uses the lab's S3
            monkeypatch.setenv(k, v)
        yield the_lab, endpoint
    finally:
        the_lab.down()
        assert not the_lab.pids("trainer-0") and not the_lab.pids("trainer-1")


def test_two_trainer_hosts_train_data_parallel_and_a_killed_host_resumes_from_s3(trainer_lab, tmp_path):
    import trainjob_drill as d

    from prepline.data_access import open_location, s3_client
    from prepline.train.checkpoints import list_checkpoints
    from prepline.train.nodes import local_spawn

    lab, endpoint = trainer_lab
    s3_client().create_bucket(Bucket="lab")
    tokens = d.make_tokens("lab", tmp_path)
    secrets = {d.SECRET: {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "PREPLINE_S3_ENDPOINT": endpoint}}

    def on_hosts(job: dict) -> object:
        """Place node i on trainer-i; the pods' names and their service names resolve to their hosts."""
        return trainer_spawn(lab, job)

    # one node (this machine, as the local mode would) and two nodes on the two trainer hosts
    one, two = "s3://lab/ft-1", "s3://lab/ft-2"
    r1 = d.run(d.body(tokens, one, 1, "one"), local_spawn(), tmp_path / "logs-1", secrets, timeout=900)
    job2 = d.body(tokens, two, 2, "two")
    r2 = d.run(job2, on_hosts(job2), tmp_path / "logs-2", secrets, base_env={}, timeout=900)
    assert r1.condition == "Complete", (r1, Path(next(iter(r1.logs.values()))).read_text()[-3000:])
    assert r2.condition == "Complete", (r2, [Path(p).read_text()[-3000:] for p in r2.logs.values()])
    s1, s2 = d.summary(one), d.summary(two)
    assert s2["world_size"] == 2
    assert [(r["rank"], r["node_rank"], r["host"], r["steps"]) for r in s2["ranks"]] == [
        (i, i, f"{job2['metadata']['name']}-node-0-{i}", d.PARAMS["steps"]) for i in (0, 1)]
    assert s2["initial_loss"] == pytest.approx(s1["initial_loss"], abs=1e-4)
    assert s2["final_loss"] <= 0.85 * s2["initial_loss"]
    assert abs(s2["final_loss"] - s1["final_loss"]) <= 0.05 * s1["final_loss"], (s1["final_loss"], s2["final_loss"])
    # the master address went through the lab's /etc/hosts to trainer-0 (gloo's peers: the hosts' addresses)
    log0 = Path(r2.logs[f"{job2['metadata']['name']}-node-0-0"]).read_text()
    assert "world size 2" in log0
    print(f"\nlab: 1 node {s1['initial_loss']:.4f} -> {s1['final_loss']:.4f} in {r1.seconds:.1f} s; "
          f"2 hosts {s2['initial_loss']:.4f} -> {s2['final_loss']:.4f} in {r2.seconds:.1f} s")
    print("loss curves (step: 1 node, 2 hosts):", [(i + 1, a, b) for i, (a, b) in enumerate(zip(d.losses(one), d.losses(two)))
                                                   if (i + 1) % 20 == 0 or i == 0])

    # the drill, through the fine-tune step's own client (run_trainjob) against the Kubernetes API stand-in
    # (tests/train/fake_k8s.py, mode 'nodes': it realises the TrainJob on the trainer hosts): trainer-1 dies
    # (link down, every process killed) once the step-20 checkpoint is on S3
    import threading
    import time

    from fake_k8s import FakeK8s

    from prepline.train.trainjob import TrainJobFailed, TrainJobOptions, run_trainjob, trainjob_name

    cut = "s3://lab/ft-cut"
    name = trainjob_name("drill")
    killed_at: list[float] = []
    with FakeK8s(mode="nodes") as k:
        k.spawn_for, k.node_base_env, k.log_dir = on_hosts, {}, tmp_path / "k8s-nodes"
        k.secrets[("team-a", d.SECRET)] = secrets[d.SECRET]
        opts = TrainJobOptions(namespace="team-a", num_nodes=2, s3_secret=d.SECRET, env={"OMP_NUM_THREADS": "1"},
                               kubeconfig=k.kubeconfig(tmp_path), poll_seconds=0.2)

        def killer() -> None:
            d.wait_for_checkpoint(cut, 20, {}, timeout=600)
            lab.kill_host("trainer-1")
            killed_at.append(time.monotonic())

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        with pytest.raises(TrainJobFailed) as e:
            run_trainjob([tokens], cut, d.PARAMS, opts, name, timeout=900, out=io.StringIO())
        failed_after = time.monotonic() - killed_at[0]
        t.join(10)
        assert e.value.reason == "FailedJobs" and f"first failed job: {name}-node-0" in e.value.message, e.value.message
        assert f"{name}-node-0-1 was killed by signal 9" in e.value.message
        assert not lab.pids("trainer-0") and not lab.pids("trainer-1")  # the survivor was stopped, not left in a collective
        assert k.trainjob_names("team-a") == [] and k.deleted == [name]
        last = list_checkpoints(open_location(cut))[-1]
        assert d.summary_or_none(cut) is None and 20 <= last < d.PARAMS["steps"]
        lab.restore("trainer-1")  # the host is back (the pod rescheduled)
        log = io.StringIO()
        s = run_trainjob([tokens], cut, d.PARAMS, opts, name, timeout=900, out=log)
    assert f"resuming from the checkpoint at step {last}" in log.getvalue()
    assert s["resumed_from"] == last and [r["steps"] for r in s["ranks"]] == [d.PARAMS["steps"] - last] * 2
    assert d.losses(cut) == d.losses(two)  # the resumed curve is the uninterrupted 2-host run's
    print(f"drill: {e.value.message}; TrainJobFailed {failed_after:.1f} s after the kill; resumed from step {last}")
