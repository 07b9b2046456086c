"""The realiser: the TrainJob body prepline's fine-tune step builds -> the processes Trainer's torch
runtime (kubeflow/trainer v2.3.0, torch.go / builder.go) would start, one per node."""

from __future__ import annotations

import copy
import os

import pytest

from prepline.errors import ConfigError
from prepline.train.realise import MASTER_PORT, RESERVED_ENV, TORCH_DISTRIBUTED, realise_trainjob, resolve_env
from prepline.train.train import build_args
from prepline.train.trainjob import TrainJobOptions, trainjob_manifest, trainjob_name

PARAMS = {"steps": 4, "batch_size": 4}


def _body(**opts) -> dict:
    o = TrainJobOptions(**{"num_nodes": 2, "s3_secret": "s3-creds", "env": {"OMP_NUM_THREADS": "1"}, **opts})
    return trainjob_manifest(trainjob_name("run-1"), "team-a", ["s3://b/tokenization/en"], "s3://b/ft", PARAMS, o)


def test_two_nodes_get_torchrun_with_the_pet_env_of_the_torch_plugin():
    body = _body()
    name = body["metadata"]["name"]
    nodes = realise_trainjob(body)
    assert [n.index for n in nodes] == [0, 1]
    assert [n.pod for n in nodes] == [f"{name}-node-0-0", f"{name}-node-0-1"]
    assert nodes[0].dns_name == f"{name}-node-0-0.{name}"
    for n in nodes:
        assert n.argv == ["torchrun", "-m", "prepline.train", *build_args(["s3://b/tokenization/en"], "s3://b/ft", PARAMS)]
        assert n.argv == body["spec"]["trainer"]["command"] + body["spec"]["trainer"]["args"]
        assert n.image == body["spec"]["trainer"]["image"] and n.port == MASTER_PORT == 29500
        env = n.plain_env()
        assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "1" and env["PET_NODE_RANK"] == str(n.index)
        assert env["PET_MASTER_ADDR"] == f"{name}-node-0-0.{name}" and env["PET_MASTER_PORT"] == "29500"
        assert env["JOB_COMPLETION_INDEX"] == str(n.index)
        assert env["PYTHONUNBUFFERED"] == "1" and env["OMP_NUM_THREADS"] == "1"
        # the TrainJob's env first (upserted into the runtime container's), then the PET_* (torch.go order)
        names = [e["name"] for e in n.env]
        assert names.index("OMP_NUM_THREADS") < names.index("PET_NNODES") < names.index("PET_MASTER_ADDR")
        # the S3 credentials stay secret references until the kubelet resolves them
        refs = [e for e in n.env if "valueFrom" in e]
        assert {e["name"] for e in refs} == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PREPLINE_S3_ENDPOINT"}
        assert n.resources == body["spec"]["trainer"]["resourcesPerNode"]


def test_one_node_runs_python_and_the_runtime_defaults_apply():
    body = _body(num_nodes=1)
    (node,) = realise_trainjob(body)
    assert node.argv[:3] == ["python", "-m", "prepline.train"]
    assert node.plain_env()["PET_NNODES"] == "1" and node.plain_env()["PET_NODE_RANK"] == "0"
    # no numNodes in the body: the runtime's mlPolicy.numNodes (1); no numProcPerNode: from the CPU request
    b = copy.deepcopy(body)
    del b["spec"]["trainer"]["numNodes"], b["spec"]["trainer"]["numProcPerNode"]
    b["spec"]["trainer"]["resourcesPerNode"] = {"requests": {"cpu": "1500m"}, "limits": {"cpu": "4"}}
    (node,) = realise_trainjob(b)
    assert node.plain_env()["PET_NPROC_PER_NODE"] == "2"  # Quantity.Value() rounds 1.5 up
    b["spec"]["trainer"]["resourcesPerNode"] = {"limits": {"cpu": "3", "nvidia.com/gpu": "2"}}
    assert realise_trainjob(b)[0].plain_env()["PET_NPROC_PER_NODE"] == "auto"  # a GPU: torchrun decides
    b["spec"]["trainer"]["resourcesPerNode"] = {}
    assert realise_trainjob(b)[0].plain_env()["PET_NPROC_PER_NODE"] == "1"  # max(1, 0 CPUs)
    rt = copy.deepcopy(TORCH_DISTRIBUTED)
    rt["spec"]["mlPolicy"]["numNodes"] = 3
    assert len(realise_trainjob(b, rt)) == 3


def test_what_trainer_refuses_is_refused():
    body = _body()
    for k, v, match in (("numNodes", -1, "numNodes=-1 must be an integer >= 0"), ("numProcPerNode", 0, "greater than or equal to 1")):
        b = copy.deepcopy(body)
        b["spec"]["trainer"][k] = v
        with pytest.raises(ConfigError, match=match):
            realise_trainjob(b)
    for reserved in RESERVED_ENV:
        b = copy.deepcopy(body)
        b["spec"]["trainer"]["env"].append({"name": reserved, "value": "x"})
        with pytest.raises(ConfigError, match=f"must not have reserved envs.*{reserved}"):
            realise_trainjob(b)
    # numNodes 0 is admitted by the CRD (minimum 0, like JobSet replicas) and makes no trainer pod
    b = copy.deepcopy(body)
    b["spec"]["trainer"]["numNodes"] = 0
    assert realise_trainjob(b) == []
    b = copy.deepcopy(body)
    b["spec"]["runtimeRef"]["name"] = "mpi-distributed"
    with pytest.raises(ConfigError, match="refers to runtime"):
        realise_trainjob(b)
    rt = copy.deepcopy(TORCH_DISTRIBUTED)
    del rt["spec"]["mlPolicy"]["torch"]
    with pytest.raises(ConfigError, match="no torch mlPolicy"):
        realise_trainjob(body, rt)


def test_secret_references_resolve_in_the_jobs_namespace_only():
    (node, _) = realise_trainjob(_body())
    env = resolve_env(node.env, {"s3-creds": {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}})
    assert env["AWS_ACCESS_KEY_ID"] == "k" and "PREPLINE_S3_ENDPOINT" not in env  # optional: True, absent -> skipped
    assert "AWS_ACCESS_KEY_ID" not in resolve_env(node.env, {})
    strict = [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "X"}}}]
    with pytest.raises(ConfigError, match="CreateContainerConfigError"):
        resolve_env(strict, {})


# -- run_nodes: the JobSet's semantics on real processes ---------------------------------------
def _nodes(argvs: list[list[str]]):
    from prepline.train.realise import NodeProcess

    return [NodeProcess(i, f"j-node-0-{i}", f"j-node-0-{i}.j", "img", argv) for i, argv in enumerate(argvs)]


def test_the_first_failed_node_fails_the_job_and_stops_the_others(tmp_path):
    from prepline.train.nodes import run_nodes, local_spawn

    # node 1 starts a child in a session of its own (as torchrun starts its workers): it must go too
    marker = tmp_path / "child.pid"
    waits = ["sh", "-c", f"setsid sleep 300 & echo $! > {marker}; wait"]
    res = run_nodes(_nodes([waits, ["sh", "-c", f"while [ ! -s {marker} ]; do sleep 0.1; done; exit 3"]]), local_spawn(),
                    tmp_path / "logs", timeout=120, poll=0.1)
    assert res.condition == "Failed" and res.reason == "NodeFailed" and "j-node-0-1 exited with code 3" in res.message, res
    assert res.exit_codes["j-node-0-0"] == -9
    child = int(marker.read_text())
    assert not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_job_past_its_deadline_is_stopped(tmp_path):
    from prepline.train.nodes import run_nodes, local_spawn

    res = run_nodes(_nodes([["sleep", "300"], ["sleep", "300"]]), local_spawn(), tmp_path / "logs", timeout=1, poll=0.1)
    assert res.condition == "Failed" and res.reason == "DeadlineExceeded" and set(res.exit_codes.values()) == {-9}
    ok = run_nodes(_nodes([["true"], ["sh", "-c", 'test "$PET_NODE_RANK" = "" && test "$HOSTNAME" = j-node-0-1']]), local_spawn(),
                   tmp_path / "logs2", timeout=60, poll=0.1)
    assert ok.condition == "Complete", ok
