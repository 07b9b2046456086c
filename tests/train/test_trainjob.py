"""The cluster mode: the TrainJob manifest fits the Trainer CRD, and submit / wait / logs / delete
work against a local Kubernetes API stand-in (tests/train/fake_k8s.py, real HTTP on 127.0.0.1) that
enforces the schema and plays Complete (a real training process), Failed and a deadline; and the
fine_tune component's body."""

from __future__ import annotations

import copy
import inspect
import io
import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError
from prepline.stages import stage_output
from prepline.train.step import fine_tune, plan
from prepline.train.k8s import K8s, KubernetesError
from prepline.train.trainjob import (
    TrainJobFailed,
    TrainJobOptions,
    TrainJobTimeout,
    run_trainjob,
    trainjob_manifest,
    trainjob_name,
)

sys.path.insert(0, str(Path(__file__).parent))
from fake_k8s import FakeK8s, validate_trainjob  # noqa: E402

TRAIN = {"steps": 3, "batch_size": 4, "threads": 1, "model_dim": 32, "log_every": 1, "seq_len": 32}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    """Token shards of real English text (the docstrings of some standard-library modules)."""
    import argparse
    import collections
    import functools
    import itertools
    import textwrap

    texts = [inspect.getdoc(o) or "" for m in (argparse, collections, functools, itertools, textwrap, json, inspect)
             for _, o in inspect.getmembers(m) if inspect.isfunction(o) or inspect.isclass(o)]
    root = tmp_path_factory.mktemp("tj")
    (root / "src").mkdir()
    pq.write_table(pa.table({"contents": [t for t in texts if t]}), root / "src" / "part-0.parquet")
    run_transform("tokenization", {"vocab_size": 300},
                  RunOptions(input=str(root / "src"), output=str(root / "tokenization"), workers=1, progress=False))
    return root / "tokenization"


@pytest.fixture
def fake(tmp_path):
    with FakeK8s() as k:
        k.kc = k.kubeconfig(tmp_path)
        yield k
        assert k.trainjob_names() == [], "a TrainJob was left in the cluster"


def _opts(fake, **kw) -> TrainJobOptions:
    return TrainJobOptions(kubeconfig=fake.kc, poll_seconds=0.05, **kw)


def _summary(out: Path) -> None:
    """A finished run's metrics.json (script mode runs no trainer)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps({"format": "prepline.train.metrics", "final_loss": 1.5, "steps": 3}))


# -- the manifest ------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [
    {},
    {"s3_secret": "prepline-s3", "active_deadline_seconds": 3600, "env": {"LOG_LEVEL": "debug"}},
    {"num_nodes": 2, "num_proc_per_node": 2, "resources_per_node": {"cpu": 4, "memory": "16Gi", "gpu": 1}},
    {"runtime": "my-runtime", "runtime_kind": "TrainingRuntime", "image": "registry.local/trainer:1", "labels": {"team": "nlp"},
     "annotations": {"note": "x y z"}, "resources_per_node": {"requests": {"cpu": "500m"}, "limits": {"cpu": 1}}},
])
def test_the_manifest_fits_the_trainjob_crd(kw):
    opts = TrainJobOptions(**kw)
    name = trainjob_name("a" * 200)  # a long run id still gives a valid name
    m = trainjob_manifest(name, "kubeflow", ["s3://b/w/r/lang=en/tokenization", "s3://b/w/r/lang=fr/tokenization"],
                          "s3://b/w/r/fine_tune", {"steps": 10, "lr": 0.001}, opts, {"prepline.dev/stage": "fine-tune"})
    assert validate_trainjob(m) == []
    t = m["spec"]["trainer"]
    assert m["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": opts.runtime_kind, "name": opts.runtime}
    assert t["args"][:4] == ["--input", "s3://b/w/r/lang=en/tokenization", "--input", "s3://b/w/r/lang=fr/tokenization"]
    assert json.loads(t["args"][t["args"].index("--params") + 1]) == {"steps": 10, "lr": 0.001}
    assert t["command"] == (["torchrun", "-m", "prepline.train"] if opts.num_nodes * opts.num_proc_per_node > 1 else ["python", "-m", "prepline.train"])
    assert t["numNodes"] == opts.num_nodes and t["numProcPerNode"] == opts.num_proc_per_node
    if opts.active_deadline_seconds:
        assert m["spec"]["activeDeadlineSeconds"] == opts.active_deadline_seconds
    if kw.get("resources_per_node", {}).get("gpu"):
        assert t["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "1" and t["resourcesPerNode"]["requests"]["cpu"] == "4"
    secret_refs = [e for e in t["env"] if "valueFrom" in e]
    assert [e["name"] for e in secret_refs] == (["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PREPLINE_S3_ENDPOINT"] if opts.s3_secret else [])
    assert all(e["valueFrom"]["secretKeyRef"]["name"] == "prepline-s3" for e in secret_refs)


def test_the_crd_check_is_not_vacuous():
    good = trainjob_manifest("pl-x", "default", ["/in"], "/out", {}, TrainJobOptions(s3_secret="s"))
    assert validate_trainjob(good) == []
    broken = {
        "unknown trainer field": lambda m: m["spec"]["trainer"].update(gpus=1),
        "unknown spec field": lambda m: m["spec"].update(podTemplateOverrides=[]),
        "name not RFC 1035": lambda m: m["metadata"].update(name="1-bad_name"),
        "name too long": lambda m: m["metadata"].update(name="a" * 64),
        "numProcPerNode 0": lambda m: m["spec"]["trainer"].update(numProcPerNode=0),
        "duplicate env": lambda m: m["spec"]["trainer"]["env"].append({"name": "PYTHONUNBUFFERED", "value": "0"}),
        "env from an unknown source": lambda m: m["spec"]["trainer"]["env"].append({"name": "X", "valueFrom": {"vault": {}}}),
        "no runtimeRef": lambda m: m["spec"].pop("runtimeRef"),
        "bad quantity": lambda m: m["spec"]["trainer"]["resourcesPerNode"]["limits"].update(cpu="two"),
        "bad label": lambda m: m["metadata"].update(labels={"a": "not valid!"}),
    }
    for what, change in broken.items():
        m = copy.deepcopy(good)
        change(m)
        assert validate_trainjob(m), what


def test_credentials_are_never_inlined_and_options_are_checked():
    for key in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "HF_TOKEN", "DB_PASSWORD"):
        with pytest.raises(ConfigError, match="looks like a credential"):
            TrainJobOptions(env={key: "x"})
    m = trainjob_manifest("pl-x", "default", ["/in"], "/out", {}, TrainJobOptions(s3_secret="prepline-s3"))
    assert all(set(e) == {"name", "valueFrom"} for e in m["spec"]["trainer"]["env"] if e["name"].startswith("AWS"))
    with pytest.raises(ConfigError, match="unknown key"):
        TrainJobOptions.from_json('{"nodes": 2}')
    with pytest.raises(ConfigError, match="runtime_kind"):
        TrainJobOptions(runtime_kind="Runtime")
    with pytest.raises(ConfigError, match="unknown parameter"):
        trainjob_manifest("pl-x", "default", ["/in"], "/out", {"stepz": 1}, TrainJobOptions())
    with pytest.raises(ConfigError, match="no languages"):
        plan("/w", "run", [], [])
    assert plan("/w", "run-1", ["en", "fr"], [])["inputs"] == [stage_output("/w", "run-1", "tokenization", "en"),
                                                                stage_output("/w", "run-1", "tokenization", "fr")]
    assert plan("/w", "run-1", ["en", "fr"], ["fr"])["languages"] == ["fr"]
    with pytest.raises(ConfigError, match="mode="):
        fine_tune("remote", "/w", "run", ["en"], [], "{}")


# -- submit, wait, logs, delete against the fake API server --------------------------------------------
@pytest.mark.slow
@pytest.mark.s3
def test_a_trainjob_trains_with_credentials_from_the_secret(tokens, tmp_path, s3_bucket, s3_server):
    """mode 'run': the fake starts the trainer container's command for real; the S3 credentials and
    endpoint reach it only through the secret references (its environment has none of the test's)."""
    from prepline.data_access import open_location

    work_root, run_id = f"s3://{s3_bucket}/work", "run-42"
    dst = open_location(stage_output(work_root, run_id, "tokenization", "en"))
    for p in (tokens / "tokens").rglob("*"):
        dst.write_bytes(f"tokens/{p.relative_to(tokens / 'tokens').as_posix()}", p.read_bytes())
    # the pod's own environment: nothing of the test's S3 settings; no instance-metadata lookups
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "AWS_EC2_METADATA_DISABLED": "true"}
    with FakeK8s(mode="run", pod_env=env) as k:
        k.secrets[("default", "prepline-s3")] = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                                                 "PREPLINE_S3_ENDPOINT": s3_server}
        log = io.StringIO()
        s = fine_tune("cluster", work_root, run_id, ["en"], [], json.dumps(TRAIN),
                      {"kubeconfig": k.kubeconfig(tmp_path), "poll_seconds": 0.2}, s3_secret_name="prepline-s3", timeout=300, out=log)
        assert s["steps"] == 3 and s["languages"] == ["en"] and s["model"] == f"{stage_output(work_root, run_id, 'fine_tune')}/model"
        assert "prepline.train: step 3/3" in log.getvalue() and "deleted" in log.getvalue()
        job = k.created[0]
        assert job["metadata"]["labels"]["prepline.dev/stage"] == "fine-tune" and job["metadata"]["name"] == trainjob_name("run-42")
        assert k.trainjob_names() == [] and k.deleted == [job["metadata"]["name"]]
        assert all(p.poll() is not None for p in k.processes)
        # without the credentials in the secret the trainer cannot read S3: the job fails, the error is in the log
        k.secrets[("default", "prepline-s3")] = {"PREPLINE_S3_ENDPOINT": s3_server}
        with pytest.raises(TrainJobFailed, match="exited with code 5") as e:  # no credentials: a ServiceError (exit 5)
            fine_tune("cluster", f"s3://{s3_bucket}/work", "run-43", ["en"], [], json.dumps(TRAIN),
                      {"kubeconfig": k.kubeconfig(tmp_path), "poll_seconds": 0.2}, s3_secret_name="prepline-s3", timeout=300,
                      out=(log2 := io.StringIO()))
        assert "Unable to locate credentials" in log2.getvalue() and k.trainjob_names() == [] and e.value.reason == "JobSetFailed"
    assert open_location(s["output"]).read_text("metrics.json") is not None


def test_failed_trainjob_is_a_clear_error_and_deleted(fake, tmp_path):
    fake.behaviour = {"result": "fail", "polls": 3, "log": "Traceback (most recent call last):\nRuntimeError: out of memory\n",
                      "message": "jobset failed: node-0 exited with code 1"}
    log = io.StringIO()
    with pytest.raises(TrainJobFailed, match="failed \\(JobSetFailed\\): jobset failed: node-0 exited with code 1"):
        run_trainjob(["/in"], str(tmp_path / "out"), TRAIN, _opts(fake), "pl-fail", out=log)
    assert "RuntimeError: out of memory" in log.getvalue()  # the trainer's log was streamed
    assert fake.deleted == ["pl-fail"]
    # keep_on_failure leaves it for inspection
    with pytest.raises(TrainJobFailed):
        run_trainjob(["/in"], str(tmp_path / "out"), TRAIN, _opts(fake, keep_on_failure=True), "pl-kept", out=io.StringIO())
    assert fake.trainjob_names() == ["pl-kept"]
    assert K8s(fake.kc).delete("default", "pl-kept") and fake.trainjob_names() == []


@pytest.mark.slow
def test_deadline_exceeded_kills_the_trainer_and_is_reported(tokens, tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    with FakeK8s(mode="run", pod_env=env) as k:
        opts = TrainJobOptions(kubeconfig=k.kubeconfig(tmp_path), poll_seconds=0.1, active_deadline_seconds=2)
        with pytest.raises(TrainJobFailed, match="longer than activeDeadlineSeconds=2") as e:
            run_trainjob([str(tokens)], str(tmp_path / "out"), {**TRAIN, "steps": 1_000_000}, opts, "pl-deadline", out=io.StringIO())
        assert e.value.reason == "DeadlineExceeded"
        assert k.trainjob_names() == [] and k.deleted == ["pl-deadline"]
        assert k.processes and all(p.poll() is not None for p in k.processes)


def test_client_timeout_deletes_the_trainjob(fake, tmp_path):
    fake.behaviour = {"result": "hang"}
    with pytest.raises(TrainJobTimeout, match="did not finish within 1 s"):
        run_trainjob(["/in"], str(tmp_path / "out"), TRAIN, _opts(fake), "pl-hang", timeout=1, out=io.StringIO())
    assert fake.deleted == ["pl-hang"]


def test_completed_trainjob_and_a_retried_step(fake, tmp_path):
    _summary(tmp_path / "out")
    log = io.StringIO()
    s = run_trainjob(["/in"], str(tmp_path / "out"), TRAIN, _opts(fake), "pl-ok", out=log)
    assert s["final_loss"] == 1.5 and fake.deleted == ["pl-ok"] and "training...\ndone" in log.getvalue()
    # a TrainJob of that name exists (the step is retried): it is replaced, then deleted
    m = trainjob_manifest("pl-ok", "default", ["/in"], str(tmp_path / "out"), TRAIN, TrainJobOptions())
    K8s(fake.kc).create(m)
    s = run_trainjob(["/in"], str(tmp_path / "out"), TRAIN, _opts(fake), "pl-ok", out=(log := io.StringIO()))
    assert "exists (a retried step?)" in log.getvalue() and fake.deleted == ["pl-ok", "pl-ok", "pl-ok"]
    posts = [r for r in fake.requests if r.method == "POST"]
    assert [r.status for r in posts] == [201, 201, 409, 201]
    # what the API server received is the manifest, schema-valid
    assert all(validate_trainjob(r.body) == [] for r in posts)


def test_unknown_runtime_is_a_clear_error_and_nothing_is_created(fake, tmp_path):
    with pytest.raises(ConfigError, match="runtime 'torch-nope' \\(ClusterTrainingRuntime\\) does not exist in the cluster "
                                          "\\(it has: torch-distributed\\)"):
        run_trainjob(["/in"], str(tmp_path / "out"), TRAIN, _opts(fake, runtime="torch-nope"), "pl-x", out=io.StringIO())
    with pytest.raises(ConfigError, match="does not exist in namespace default \\(it has none"):
        run_trainjob(["/in"], str(tmp_path / "out"), TRAIN, _opts(fake, runtime_kind="TrainingRuntime"), "pl-x", out=io.StringIO())
    assert not [r for r in fake.requests if r.method == "POST"]


def test_the_trainer_webhook_refuses_a_missing_runtime_and_reserved_env(fake):
    """Even without our check first, the cluster refuses (as Trainer's webhook does): the error says why."""
    k = K8s(fake.kc)
    m = trainjob_manifest("pl-x", "default", ["/in"], "/out", TRAIN, _opts(fake, runtime="torch-nope"))
    with pytest.raises(ConfigError, match="torch-nope.*must be created before the TrainJob is created"):
        k.create(m)
    m = trainjob_manifest("pl-x", "default", ["/in"], "/out", TRAIN, _opts(fake))
    m["spec"]["trainer"]["env"].append({"name": "PET_NNODES", "value": "2"})
    with pytest.raises(ConfigError, match="reserved envs"):
        k.create(m)
    assert fake.trainjob_names() == []


def test_api_server_errors_are_clear(fake, tmp_path):
    # the API server's own validation (a label value Kubernetes rejects) comes back with its message
    with pytest.raises(ConfigError, match="rejected the TrainJob: .*metadata.labels"):
        run_trainjob(["/in"], str(tmp_path / "out"), TRAIN, _opts(fake, labels={"team": "n l p"}), "pl-x", out=io.StringIO())
    fake.token = "s3cr3t"  # the kubeconfig has no token
    with pytest.raises(KubernetesError, match="HTTP 401") as e:
        run_trainjob(["/in"], str(tmp_path / "out"), TRAIN, _opts(fake), "pl-x", out=io.StringIO())
    assert "credentials were rejected" in e.value.fix


def test_no_kubernetes_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="no Kubernetes credentials"):
        run_trainjob(["/in"], str(tmp_path / "out"), TRAIN, TrainJobOptions(), "pl-x", out=io.StringIO())


def test_the_kubeflow_sdk_client(fake, tmp_path):
    """client='sdk': the same job through TrainerClient (needs the kubeflow package; a scratch venv has it)."""
    pytest.importorskip("kubeflow.trainer")
    _summary(tmp_path / "out")
    log = io.StringIO()
    opts = TrainJobOptions(kubeconfig=fake.kc, poll_seconds=1, client="sdk", s3_secret="prepline-s3", active_deadline_seconds=600)
    assert run_trainjob(["/in"], str(tmp_path / "out"), TRAIN, opts, "pl-sdk", out=log)["final_loss"] == 1.5
    (body,) = [r.body for r in fake.requests if r.method == "POST"]
    assert validate_trainjob(body) == [] and body["spec"]["trainer"]["command"] == ["python", "-m", "prepline.train"]
    patch = json.dumps(body["spec"]["runtimePatches"])
    assert '"secretKeyRef": {"key": "AWS_SECRET_ACCESS_KEY", "name": "prepline-s3", "optional": true}' in patch
    assert body["spec"]["activeDeadlineSeconds"] == 600 and fake.deleted == ["pl-sdk"] and "training..." in log.getvalue()
    fake.behaviour = {"result": "fail", "polls": 2, "log": "boom\n"}
    with pytest.raises(TrainJobFailed, match="JobSetFailed"):
        run_trainjob(["/in"], str(tmp_path / "out"), TRAIN, opts, "pl-sdk2", out=io.StringIO())
    with pytest.raises(ConfigError, match="does not exist"):
        run_trainjob(["/in"], str(tmp_path / "out"), TRAIN, TrainJobOptions(kubeconfig=fake.kc, client="sdk", runtime="nope"), "x",
                     out=io.StringIO())
    assert fake.deleted == ["pl-sdk", "pl-sdk2"]


# -- the KFP component's body ------------------------------------------------------------------------
@pytest.mark.slow
def test_the_component_body_in_local_mode(tokens, tmp_path):
    import shutil

    from kfp.dsl import Markdown, Metrics, Model

    from prepline.components.fine_tune import fine_tune as component

    work, run_id = str(tmp_path / "work"), "run-7"
    shutil.copytree(tokens, stage_output(work, run_id, "tokenization", "en"))
    model, metrics, summary = (Model(name="model", uri=str(tmp_path / "art" / "model"), metadata={}),
                               Metrics(name="metrics", uri=str(tmp_path / "art" / "metrics"), metadata={}),
                               Markdown(name="summary", uri=str(tmp_path / "art" / "summary"), metadata={}))
    r = component.python_func(mode="local", work_root=work, run_id=run_id, languages=["en", "fr"], train_languages=["en"],
                              train_params_json=json.dumps(TRAIN), trainjob_json="{}", s3_secret_name="", timeout_seconds=600,
                              model=model, metrics=metrics, summary=summary)
    assert r.model_uri == f"{stage_output(work, run_id, 'fine_tune')}/model" and r.final_loss > 0
    assert {p.name for p in Path(model.path).iterdir()} == {"config.json", "model.pt", "tokenizer.json"}
    assert model.metadata["languages"] == "en" and metrics.metadata["final_loss"] == r.final_loss
    assert metrics.metadata["tokens_seen"] == 3 * 4 * 32 and "| tokens/s |" in Path(summary.path).read_text()
