"""``prepline kfp`` against a local fake KFP API server (real HTTP on 127.0.0.1) that checks every
body against the kfp-server-api models. Verified against this fake only, not a live KFP."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from prepline.errors import ConfigError
from prepline.kfp import cli as kfp_cli, client as K, connection as C

from fake_kfp_server import FakeKfp, fake, kfp_isolated, validate  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("kfp_isolated")  # no KFP settings from this machine

ROOT = Path(__file__).resolve().parents[2]

DOC_ID = ROOT / "compiled" / "pipelines" / "doc_id.yaml"
#: the compiled pipelines have no input/work defaults (cluster-ready: no /tmp): every run passes them
REQ_VALUES = {"input_path": "s3://b/in", "work_root": "s3://b/w"}
REQ = tuple(a for k, v in REQ_VALUES.items() for a in ("--param", f"{k}={v}"))
EXACT = ROOT / "compiled" / "pipelines" / "exact_dedup.yaml"
PREPLINE = Path(sys.executable).parent / "prepline"


def kfp(capsys, *args) -> tuple[int, str, str]:
    code = kfp_cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def kfpj(capsys, *args) -> tuple[int, dict]:
    code, out, err = kfp(capsys, *args, "--json")
    assert "Traceback" not in err
    return code, json.loads(out)


def tiny_pipeline(path: Path, name: str = "tiny") -> Path:
    """A compiled pipeline with a required parameter and one of each type."""
    from kfp import compiler, dsl

    @dsl.component(base_image="python:3.11", install_kfp_package=False)
    def echo(x: str, n: int, r: float, b: bool, items: list, conf: dict) -> str:
        return x

    @dsl.pipeline(name=name)
    def p(x: str, n: int = 1, r: float = 0.5, b: bool = False, items: list = ["a"], conf: dict = {"k": 1}):
        echo(x=x, n=n, r=r, b=b, items=items, conf=conf)

    compiler.Compiler().compile(p, str(path))
    return path


# -- upload -------------------------------------------------------------------------------------


def test_upload_creates_then_is_idempotent_then_adds_versions(fake, capsys, tmp_path):
    h = ("--host", fake.url)
    code, r = kfpj(capsys, "upload", DOC_ID, *h)
    assert code == 0 and r["created_pipeline"] and r["pipeline_name"] == "doc-id" and r["version_name"] == "doc-id"
    assert len(fake.calls("POST", "/pipelines/upload$")) == 1

    code, r2 = kfpj(capsys, "upload", DOC_ID, *h)  # same content: nothing new
    assert code == 0 and not r2["created_pipeline"] and not r2["created_version"]
    assert r2["version_id"] == r["version_id"] and "same content" in r2["reason"]
    assert len(fake.calls("POST", "/pipelines/upload")) == 1 and len(fake.versions) == 1

    # other content under the same pipeline name: a new version, named after its content
    other = tmp_path / "doc_id_v2.yaml"
    docs = list(yaml.safe_load_all(DOC_ID.read_text()))
    docs[0]["root"]["inputDefinitions"]["parameters"]["work_root"]["defaultValue"] = "/elsewhere"
    other.write_text(yaml.safe_dump_all(docs))
    code, r3 = kfpj(capsys, "upload", other, *h)
    assert code == 0 and r3["created_version"] and r3["version_name"] == f"doc-id-{r3['sha256'][:12]}"
    assert len(fake.calls("POST", "/pipelines/upload_version")) == 1 and len(fake.versions) == 2
    code, r4 = kfpj(capsys, "upload", other, *h)
    assert code == 0 and not r4["created_version"] and r4["version_id"] == r3["version_id"]

    # an explicit version name: created once, then recognised
    code, r5 = kfpj(capsys, "upload", DOC_ID, "--version", "0.1.0", *h)
    assert code == 0 and not r5["created_version"]  # that content is already the first version
    docs[0]["root"]["inputDefinitions"]["parameters"]["work_root"]["defaultValue"] = "/third"
    third = tmp_path / "third.yaml"
    third.write_text(yaml.safe_dump_all(docs))
    code, r6 = kfpj(capsys, "upload", third, "--version", "0.2.0", *h)
    assert code == 0 and r6["created_version"] and r6["version_name"] == "0.2.0"
    assert kfpj(capsys, "upload", third, "--version", "0.2.0", *h)[1]["created_version"] is False
    # the same version name with other content is refused, nothing is posted
    n = len(fake.calls("POST", "/upload"))
    code, out, err = kfp(capsys, "upload", other, "--version", "0.2.0", *h)
    assert code == K.EXIT_USAGE and "already has a version 0.2.0 with other content" in err and "fix:" in err
    assert len(fake.calls("POST", "/upload")) == n


def test_upload_bad_files(fake, capsys, tmp_path):
    h = ("--host", fake.url)
    code, _, err = kfp(capsys, "upload", tmp_path / "missing.yaml", *h)
    assert code == K.EXIT_USAGE and "does not exist" in err
    notp = tmp_path / "values.yaml"
    notp.write_text("work_root: /x\n")
    code, _, err = kfp(capsys, "upload", notp, *h)
    assert code == K.EXIT_USAGE and "not a compiled pipeline" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipelineInfo: {name: x}\nroot: {dag: {tasks: {}}}\nnotAField: 1\n")
    code, _, err = kfp(capsys, "upload", bad, *h)
    assert code == K.EXIT_USAGE and "not a valid pipeline spec" in err
    assert not fake.calls("POST")


def test_upload_server_error_becomes_a_clear_error(fake, capsys):
    fake.fail_next(r"/pipelines/upload$", 500)
    code, out, err = kfp(capsys, "upload", DOC_ID, "--host", fake.url)
    assert code == K.EXIT_API and "answered 500" in err and "fix:" in err and "Traceback" not in err


# -- run ----------------------------------------------------------------------------------------


def test_run_from_file_with_flags_and_params_file(fake, capsys, tmp_path):
    pf = tmp_path / "params.yaml"
    pf.write_text("work_root: s3://bucket/work\nmax_failed_files: 2\ninput_from_split: true\n"
                  "cluster_json:\n  workers: {replicas: 2}\nparams_json: '{}'\n")
    code, r = kfpj(capsys, "run", DOC_ID, "--param", "input_path=s3://b/in", "--params-file", pf, "--param", "max_failed_files=5", "--param", "branch=en",
                   "--experiment", "ci", "--run-name", "doc-id ci", "--host", fake.url)
    assert code == 0 and r["state"] == "PENDING" and r["display_name"] == "doc-id ci"
    (post,) = fake.calls("POST", "/runs$")
    rc = post["body"]["runtime_config"]
    assert rc["parameters"] == {"input_path": "s3://b/in", "work_root": "s3://bucket/work", "max_failed_files": 5, "input_from_split": True,
                                "cluster_json": '{"workers": {"replicas": 2}}', "params_json": "{}", "branch": "en"}
    spec = post["body"]["pipeline_spec"]  # inline: the compiled file, with its platform spec
    assert spec["pipeline_spec"]["pipelineInfo"]["name"] == "doc-id" and "kubernetes" in spec["platform_spec"]["platforms"]
    exp = fake.experiments[post["body"]["experiment_id"]]
    assert exp["display_name"] == "ci"
    # the experiment is reused, not created again
    assert kfpj(capsys, "run", DOC_ID, *REQ, "--experiment", "ci", "--host", fake.url)[0] == 0
    assert len(fake.calls("POST", "/experiments$")) == 1


def test_run_uploaded_pipeline_by_name_and_version(fake, capsys, tmp_path):
    h = ("--host", fake.url)
    v1 = kfpj(capsys, "upload", DOC_ID, *h)[1]
    docs = list(yaml.safe_load_all(DOC_ID.read_text()))
    docs[0]["root"]["inputDefinitions"]["parameters"]["extra"] = {"parameterType": "STRING", "defaultValue": "", "isOptional": True}
    f2 = tmp_path / "v2.yaml"
    f2.write_text(yaml.safe_dump_all(docs))
    v2 = kfpj(capsys, "upload", f2, "--version", "v2", *h)[1]
    # newest version by default: it has "extra"
    code, r = kfpj(capsys, "run", "--pipeline", "doc-id", *REQ, "--param", "extra=1", *h)
    assert code == 0 and r["pipeline_version_id"] == v2["version_id"] and r["parameters"] == {**REQ_VALUES, "extra": "1"}
    # the first version has no "extra": checked against that version's spec
    code, out, err = kfp(capsys, "run", "--pipeline", "doc-id", *REQ, "--version", "doc-id", "--param", "extra=1", *h)
    assert code == K.EXIT_USAGE and "has no parameter extra" in err
    code, r = kfpj(capsys, "run", "--pipeline", "doc-id", *REQ, "--version", "doc-id", "--param", "timeout_seconds=60", *h)
    assert code == 0 and r["pipeline_version_id"] == v1["version_id"] and r["parameters"] == {**REQ_VALUES, "timeout_seconds": 60}
    body = fake.calls("POST", "/runs$")[-1]["body"]
    assert body["pipeline_version_reference"] == {"pipeline_id": v1["pipeline_id"], "pipeline_version_id": v1["version_id"]}
    assert "pipeline_spec" not in body
    # unknown pipeline / version
    code, out, err = kfp(capsys, "run", "--pipeline", "nope", *h)
    assert code == K.EXIT_API and "no pipeline named nope" in err and "prepline kfp upload" in err and "doc-id" in err
    code, out, err = kfp(capsys, "run", "--pipeline", "doc-id", *REQ, "--version", "v9", *h)
    assert code == K.EXIT_API and "has no version v9" in err and "v2" in err


def test_parameters_are_checked_before_posting(fake, capsys, tmp_path):
    tiny = tiny_pipeline(tmp_path / "tiny.yaml")
    h = ("--host", fake.url)
    cases = [
        (["--param", "nope=1", "--param", "x=a"], "pipeline tiny has no parameter nope", "its parameters: b, conf, items, n, r, x"),
        ([], "pipeline tiny needs parameter x", "--param x=..."),
        (["--param", "x=a", "--param", "n=1.5"], "parameter n must be an integer", None),
        (["--param", "x=a", "--param", "b=maybe"], "parameter b must be true or false", None),
        (["--param", "x=a", "--param", "items={}"], "parameter items must be a JSON list", None),
        (["--param", "x=a", "--param", "conf=[1]"], "parameter conf must be a JSON object", None),
        (["--param", "x"], "--param 'x' is not NAME=VALUE", None),
    ]
    for args, msg, fix in cases:
        code, out, err = kfp(capsys, "run", tiny, *args, *h)
        assert code == K.EXIT_USAGE and msg in err, (args, err)
        if fix:
            assert fix in err
    code, out, err = kfp(capsys, "run", *h)
    assert code == K.EXIT_USAGE and "give either a compiled pipeline file or --pipeline NAME" in err
    code, out, err = kfp(capsys, "run", tiny, "--pipeline", "tiny", *h)
    assert code == K.EXIT_USAGE and "give either" in err
    assert not fake.calls("POST", "/runs")
    code, r = kfpj(capsys, "run", tiny, "--param", "x=a", "--param", "n=3", "--param", "r=2", "--param", "b=yes",
                   "--param", "items=[1, 2]", "--param", "conf={a: 1}", *h)
    assert code == 0 and r["parameters"] == {"x": "a", "n": 3, "r": 2.0, "b": True, "items": [1, 2], "conf": {"a": 1}}


@pytest.mark.parametrize("path", sorted((ROOT / "compiled" / "pipelines").glob("*.yaml")), ids=lambda p: p.stem)
def test_no_compiled_pipeline_can_give_a_pod_an_empty_secret_name(path):
    """Every secret name of every pod (secretNameParameter, followed through the nested DAGs) comes
    from a root parameter whose default is a valid secret name, or a valid constant: the KFP driver
    copies the name as it is (kubeflow/pipelines backend/src/v2/driver/k8s.go) and Kubernetes refuses an
    empty one even for an optional secret; '' given at run time is refused before posting (below)."""
    from prepline.kfp.params import read_package, root_inputs, secret_name_sources

    docs = read_package(path)
    sources = secret_name_sources(docs)
    assert sources, "every compiled pipeline passes the S3 secret to its pods"
    inputs = root_inputs(docs)
    for executor, srcs in sources.items():
        for kind, value in srcs:
            assert kind in ("root", "constant"), (executor, value)
            name = inputs[value]["default"] if kind == "root" else value
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name or ""), (executor, kind, value, name)


@pytest.mark.parametrize("bad", ["", "  ", "Prepline_S3"])
def test_an_empty_or_invalid_secret_name_is_refused_before_posting(fake, capsys, bad):
    h = ("--host", fake.url)
    v = kfpj(capsys, "upload", DOC_ID, *h)[1]
    assert v
    for where in ((DOC_ID,), ("--pipeline", "doc-id")):
        code, out, err = kfp(capsys, "run", *where, *REQ, "--param", f"s3_secret_name={bad}", *h)
        assert code == K.EXIT_USAGE and f"s3_secret_name={bad!r} is not a Kubernetes secret name" in err, err
        assert "fix:" in err and "no-such-secret" in err and "Traceback" not in err
    assert not fake.calls("POST", "/runs")
    assert kfpj(capsys, "run", DOC_ID, *REQ, "--param", "s3_secret_name=no-such-secret", *h)[0] == 0


@pytest.mark.parametrize("name,text,msg", [
    ("p.yaml", "work_root: [unclosed\n", "is not valid YAML at line"),
    ("p.json", '{"work_root": }', "is not valid JSON: Expecting value at line 1"),
    ("p.yaml", "- a\n- b\n", "must hold a mapping of parameter names to values, got list"),
])
def test_malformed_parameters_file(fake, capsys, tmp_path, name, text, msg):
    f = tmp_path / name
    f.write_text(text)
    code, out, err = kfp(capsys, "run", DOC_ID, *REQ, "--params-file", f, "--host", fake.url)
    assert code == K.EXIT_USAGE and msg in err and "fix:" in err
    code, out, err = kfp(capsys, "run", DOC_ID, *REQ, "--params-file", tmp_path / "absent.yaml", "--host", fake.url)
    assert code == K.EXIT_USAGE and "cannot read parameters file" in err
    assert not fake.calls("POST")


# -- wait ---------------------------------------------------------------------------------------


def _start(fake, capsys, *extra) -> str:
    code, r = kfpj(capsys, "run", DOC_ID, *REQ, "--host", fake.url, *extra)
    assert code == 0
    return r["run_id"]


def test_wait_exit_codes(fake, capsys):
    h = ("--host", fake.url, "--poll", "0.01")
    ok = _start(fake, capsys)
    code, r = kfpj(capsys, "wait", ok, *h)
    assert code == 0 and r["state"] == "SUCCEEDED" and r["exit_code"] == 0
    states = [s["state"] for s in fake.run(ok)["state_history"]]
    assert states == ["PENDING", "RUNNING", "SUCCEEDED"]

    fake.outcomes["boom"] = "FAILED"
    bad = _start(fake, capsys, "--run-name", "boom")
    code, out, err = kfp(capsys, "wait", bad, *h)
    assert code == K.EXIT_FAILED and "FAILED" in out and "run error: fake: a task of this run failed" in err

    fake.outcomes["stuck"] = "HANG"
    stuck = _start(fake, capsys, "--run-name", "stuck")
    t0 = time.monotonic()
    code, r = kfpj(capsys, "wait", stuck, "--timeout", "0.3", *h)
    assert code == K.EXIT_TIMEOUT and r["timed_out"] and r["state"] == "RUNNING" and time.monotonic() - t0 < 5

    # canceled: terminate it, then wait returns at once with 3
    code, r = kfpj(capsys, "terminate", stuck, "--host", fake.url)
    assert code == 0 and r["state"] in ("CANCELING", "CANCELED")
    code, r = kfpj(capsys, "wait", stuck, "--timeout", "30", *h)
    assert code == K.EXIT_CANCELED and r["state"] in ("CANCELING", "CANCELED")

    fake.outcomes["cancelme"] = "CANCELED"
    c = _start(fake, capsys, "--run-name", "cancelme")
    t0 = time.monotonic()
    code, r = kfpj(capsys, "wait", c, *h)  # no timeout at all: must still return
    assert code == K.EXIT_CANCELED and r["state"] == "CANCELED" and time.monotonic() - t0 < 5


def test_kfp_sdk_wait_does_not_stop_on_canceled(fake, capsys):
    """Why we poll ourselves: kfp.Client.wait_for_run_completion runs into its timeout on CANCELED."""
    fake.outcomes["c"] = "CANCELED"
    rid = _start(fake, capsys, "--run-name", "c")
    kc = K.KfpClient(C.resolve_connection(fake.url))
    assert K._run_state(kc.wait(rid, poll=0.01)) == "CANCELED"
    with pytest.raises(TimeoutError):
        kc.client.wait_for_run_completion(rid, timeout=0.5, sleep_duration=0.05)


def test_wait_retries_transient_errors_and_unknown_run(fake, capsys):
    rid = _start(fake, capsys)
    fake.fail_next(r"/runs/", 503, times=2)
    code, r = kfpj(capsys, "wait", rid, "--host", fake.url, "--poll", "0.01")
    assert code == 0 and r["state"] == "SUCCEEDED"
    code, out, err = kfp(capsys, "wait", "0000-nope", "--host", fake.url)
    assert code == K.EXIT_API and "no run with id 0000-nope" in err and "prepline kfp list runs" in err


def test_run_with_wait(fake, capsys):
    fake.outcomes["bad"] = "FAILED"
    code, r = kfpj(capsys, "run", DOC_ID, *REQ, "--run-name", "bad", "--wait", "--poll", "0.01", "--host", fake.url)
    assert code == K.EXIT_FAILED and r["state"] == "FAILED" and r["exit_code"] == 1


# -- clone --------------------------------------------------------------------------------------


def test_clone_version_run_keeps_reference_and_runtime_config(fake, capsys):
    h = ("--host", fake.url)
    kfpj(capsys, "upload", DOC_ID, *h)
    code, r = kfpj(capsys, "run", "--pipeline", "doc-id", *REQ, "--param", "work_root=/w", "--param", "max_failed_files=2",
                   "--pipeline-root", "s3://b/root", "--service-account", "runner", "--run-name", "first", "--experiment", "e1", *h)
    old = fake.calls("POST", "/runs$")[-1]["body"]
    code, c = kfpj(capsys, "clone", r["run_id"], "--param", "max_failed_files=7", *h)
    assert code == 0 and c["display_name"] == "Clone of first" and c["run_id"] != r["run_id"]
    new = fake.calls("POST", "/runs$")[-1]["body"]
    assert new["pipeline_version_reference"] == old["pipeline_version_reference"] and "pipeline_spec" not in new
    assert new["runtime_config"] == {"parameters": {"input_path": "s3://b/in", "work_root": "/w", "max_failed_files": 7}, "pipeline_root": "s3://b/root"}
    assert new["experiment_id"] == old["experiment_id"] and new["service_account"] == "runner"
    # overrides are checked against the run's pipeline; nothing is posted on error
    n = len(fake.calls("POST", "/runs$"))
    code, out, err = kfp(capsys, "clone", r["run_id"], "--param", "nope=1", *h)
    assert code == K.EXIT_USAGE and "has no parameter nope" in err
    code, out, err = kfp(capsys, "clone", r["run_id"], "--param", "s3_secret_name=", *h)
    assert code == K.EXIT_USAGE and "s3_secret_name='' is not a Kubernetes secret name" in err
    code, out, err = kfp(capsys, "clone", "missing-run", *h)
    assert code == K.EXIT_API and "no run with id missing-run" in err
    assert len(fake.calls("POST", "/runs$")) == n
    # into another experiment, with a name, then waited for
    code, c2 = kfpj(capsys, "clone", r["run_id"], "--experiment", "e2", "--run-name", "again", "--wait", "--poll", "0.01", *h)
    assert code == 0 and c2["state"] == "SUCCEEDED" and fake.experiments[c2["experiment_id"]]["display_name"] == "e2"


def test_clone_inline_spec_run(fake, capsys, tmp_path):
    tiny = tiny_pipeline(tmp_path / "tiny.yaml")
    code, r = kfpj(capsys, "run", tiny, "--param", "x=a", "--param", "n=2", "--host", fake.url)
    old = fake.calls("POST", "/runs$")[-1]["body"]
    code, c = kfpj(capsys, "clone", r["run_id"], "--param", "n=9", "--host", fake.url)
    new = fake.calls("POST", "/runs$")[-1]["body"]
    assert code == 0 and new["pipeline_spec"] == old["pipeline_spec"] and "pipeline_version_reference" not in new
    assert new["runtime_config"]["parameters"] == {"x": "a", "n": 9}


# -- list / logs --------------------------------------------------------------------------------


@pytest.mark.slow
def test_list_pages(fake, capsys):
    h = ("--host", fake.url)
    ids = [_start(fake, capsys, "--run-name", f"r{i}") for i in range(5)]
    code, p1 = kfpj(capsys, "list", "runs", "--page-size", "2", *h)
    assert code == 0 and len(p1["items"]) == 2 and p1["next_page_token"] and p1["total_size"] == 5
    assert [i["display_name"] for i in p1["items"]] == ["r4", "r3"]  # newest first
    code, p2 = kfpj(capsys, "list", "runs", "--page-size", "2", "--page-token", p1["next_page_token"], *h)
    assert [i["display_name"] for i in p2["items"]] == ["r2", "r1"]
    code, allr = kfpj(capsys, "list", "runs", "--page-size", "2", "--all", *h)
    assert sorted(i["run_id"] for i in allr["items"]) == sorted(ids) and allr["next_page_token"] == ""
    assert len(fake.calls("GET", "/runs$")) == 1 + 1 + 3
    code, one = kfpj(capsys, "list", "runs", "--name", "r1", *h)
    assert [i["display_name"] for i in one["items"]] == ["r1"]
    code, out, err = kfp(capsys, "list", "runs", "--page-token", "garbage!", *h)
    assert code == K.EXIT_API and "invalid page token" in err
    kfpj(capsys, "upload", DOC_ID, *h)
    kfpj(capsys, "upload", EXACT, *h)
    code, pl = kfpj(capsys, "list", "pipelines", "--page-size", "1", "--all", *h)
    assert sorted(i["display_name"] for i in pl["items"]) == ["doc-id", "exact-dedup"]
    code, vs = kfpj(capsys, "list", "versions", "--pipeline", "exact-dedup", *h)
    assert [v["display_name"] for v in vs["items"]] == ["exact-dedup"]
    code, ex = kfpj(capsys, "list", "experiments", *h)
    assert [e["display_name"] for e in ex["items"]] == ["Default"]
    code, out, err = kfp(capsys, "list", "runs", "--experiment", "absent", *h)
    assert code == K.EXIT_API and "no experiment named absent" in err


def test_logs_lists_tasks_pods_and_errors(fake, capsys):
    fake.outcomes["bad"] = "FAILED"
    rid = _start(fake, capsys, "--run-name", "bad")
    kfp(capsys, "wait", rid, "--host", fake.url, "--poll", "0.01")
    code, r = kfpj(capsys, "logs", rid, "--host", fake.url, "--namespace", "team")
    assert code == 0 and r["state"] == "FAILED" and r["error"]
    assert [t["display_name"] for t in r["tasks"]] == ["exit-handler-1", "stop-ray-cluster"]
    assert r["tasks"][0]["error"] == "fake: task exit-handler-1 failed" and r["tasks"][0]["pods"]
    assert r["log_commands"][0] == f"kubectl logs -n team {r['tasks'][0]['pods'][0]} -c main"
    assert [s["state"] for s in r["state_history"]] == ["PENDING", "RUNNING", "FAILED"]
    code, out, err = kfp(capsys, "logs", rid, "--host", fake.url)
    assert code == 0 and "serves no log text" in out


# -- connection and auth ------------------------------------------------------------------------


def test_token_sources_and_auth_errors(capsys, tmp_path, monkeypatch):
    with FakeKfp(token="s3cret") as fake:
        code, out, err = kfp(capsys, "list", "runs", "--host", fake.url)
        assert code == K.EXIT_API and "401 Unauthorized" in err and "--token" in err and "KF_PIPELINES_TOKEN" in err
        code, out, err = kfp(capsys, "list", "runs", "--host", fake.url, "--token", "wrong")
        assert code == K.EXIT_API and "401" in err and "the token came from --token" in err
        assert kfp(capsys, "list", "runs", "--host", fake.url, "--token", "s3cret")[0] == 0
        monkeypatch.setenv(C.ENV_TOKEN, "s3cret")
        assert kfp(capsys, "list", "runs", "--host", fake.url)[0] == 0
        monkeypatch.delenv(C.ENV_TOKEN)
        tf = tmp_path / "token"
        tf.write_text("s3cret\n")
        assert kfp(capsys, "list", "runs", "--host", fake.url, "--token-file", tf)[0] == 0
        code, out, err = kfp(capsys, "list", "runs", "--host", fake.url, "--token-file", tmp_path / "none")
        assert code == K.EXIT_USAGE and "cannot read token file" in err
        # the in-cluster service-account token, re-read on each request (it rotates)
        sa = tmp_path / "sa-token"
        sa.write_text("s3cret")
        monkeypatch.setattr(C, "SA_TOKEN_PATH", str(sa))
        kc = K.KfpClient(C.resolve_connection(fake.url))
        assert kc.conn.token_file == str(sa) and kc.client.list_runs().total_size == 0
        assert fake.requests[-1]["headers"]["authorization"] == "Bearer s3cret"
        fake.token = "rotated"
        sa.write_text("rotated")
        assert kc.client.list_runs().total_size == 0
        assert fake.requests[-1]["headers"]["authorization"] == "Bearer rotated"
    with FakeKfp(forbid=("other",)) as fake:
        code, out, err = kfp(capsys, "list", "runs", "--host", fake.url, "--namespace", "other")
        assert code == K.EXIT_API and "403 Forbidden" in err and "namespace other" in err


def test_unreachable_and_not_kfp_hosts(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    code, out, err = kfp(capsys, "list", "runs", "--host", f"http://127.0.0.1:{port}")
    assert code == K.EXIT_API and "cannot reach Kubeflow Pipelines" in err and "port-forward" in err
    assert time.monotonic() - t0 < 10 and "Traceback" not in err

    class NotKfp(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html>login</html>" if self.path.startswith("/html") else b'{"error": "no such path"}'
            self.send_response(200 if self.path.startswith("/html") else 404)
            self.send_header("content-type", "text/html" if self.path.startswith("/html") else "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), NotKfp)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        code, out, err = kfp(capsys, "list", "runs", "--host", url)
        assert code == K.EXIT_API and "not a Kubeflow Pipelines v2 API" in err and "port 8888" in err
        code, out, err = kfp(capsys, "list", "runs", "--host", url + "/html")
        assert code == K.EXIT_API and "did not answer like the KFP API" in err and "HTML" in err
    finally:
        srv.shutdown()
        srv.server_close()


def test_silent_server_times_out(capsys):
    """A server that accepts and never answers: the request timeout ends it with a clear error."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(5)
        port = s.getsockname()[1]
        t0 = time.monotonic()
        code, out, err = kfp(capsys, "list", "runs", "--host", f"http://127.0.0.1:{port}", "--request-timeout", "0.5")
        assert code == K.EXIT_API and "cannot reach" in err and time.monotonic() - t0 < 10


def test_resolve_connection():
    with pytest.raises(ConfigError, match="no Kubeflow Pipelines host"):
        C.resolve_connection(env={})
    assert C.resolve_connection(env={C.ENV_ENDPOINT: "http://kfp:8888/"}).host == "http://kfp:8888"
    assert C.resolve_connection("localhost:8888", env={}).host == "http://localhost:8888"
    assert C.resolve_connection("kubeflow.example.com/pipeline", env={}).host == "https://kubeflow.example.com/pipeline"
    c = C.resolve_connection(env={"KUBERNETES_SERVICE_HOST": "10.0.0.1", C.ENV_TOKEN: " t "}, namespace="team")
    assert c.host == C.IN_CLUSTER_HOST and c.token == "t" and c.namespace == "team" and c.token_source == "$KF_PIPELINES_TOKEN"
    assert C.resolve_connection("http://h", token="a", env={C.ENV_TOKEN: "b"}).token == "a"
    with pytest.raises(ConfigError, match="not an http"):
        C.resolve_connection("ftp://h", env={})


def test_json_errors_on_stdout(capsys):
    code, out, err = kfp(capsys, "wait", "x", "--json")
    assert code == K.EXIT_USAGE
    d = json.loads(out)
    assert d["exit_code"] == K.EXIT_USAGE and "no Kubeflow Pipelines host" in d["error"] and d["fix"]


def test_fake_validates_bodies_against_the_models(fake):
    """The fake refuses what the real protojson API would: unknown fields, wrong types, bad enums."""
    import urllib.error
    import urllib.request

    def post(body):
        req = urllib.request.Request(fake.url + "/apis/v2beta1/runs", data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
        try:
            urllib.request.urlopen(req)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        return 200, None

    code, err = post({"display_name": "x", "pipelineSpec": {}})
    assert code == 400 and "unknown field 'pipelineSpec'" in err["message"] and err["code"] == 3
    code, err = post({"display_name": 3})
    assert code == 400 and "expected a string" in err["message"]
    code, err = post({"display_name": "x", "state": "DONE"})
    assert code == 400 and "is not one of" in err["message"]
    with pytest.raises(ValueError):
        validate({"runs": [{"run_id": "a", "bogus": 1}]}, "V2beta1ListRunsResponse")
    validate({"runs": [{"run_id": "a", "state": "CANCELED", "created_at": "2026-01-01T00:00:00Z"}], "next_page_token": "x"},
             "V2beta1ListRunsResponse")


@pytest.mark.slow
def test_cli_entry_point_subprocess(fake, tmp_path):
    """The installed `prepline kfp` command: exit codes and no traceback, end to end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KF_PIPELINES")}
    env["HOME"] = str(tmp_path)
    fake.outcomes["c"] = "CANCELED"
    r = subprocess.run([str(PREPLINE), "kfp", "run", str(DOC_ID), *REQ, "--run-name", "c", "--host", fake.url, "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    rid = json.loads(r.stdout)["run_id"]
    r = subprocess.run([str(PREPLINE), "kfp", "wait", rid, "--poll", "0.05", "--host", fake.url],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 3 and "CANCELED" in r.stdout and "Traceback" not in r.stderr
    r = subprocess.run([str(PREPLINE), "kfp", "wait", rid], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "no Kubeflow Pipelines host" in r.stderr
    r = subprocess.run([str(PREPLINE), "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert "kfp" in r.stdout


def test_version_says_what_an_older_backend_cannot_run(capsys):
    from prepline.compat import FEATURES, kfp_backend_notes

    with FakeKfp(server_version="2.17.0") as fake:
        code, r = kfpj(capsys, "version", "--host", fake.url)
        assert code == 0 and r["tag_name"] == "2.17.0" and r["notes"] == []
    with FakeKfp(server_version="2.5.0") as fake:
        code, r = kfpj(capsys, "version", "--host", fake.url)
        assert code == 0 and len(r["notes"]) == 2 and "older than 2.15.0" in r["notes"][0]  # optional secrets; the UI's DAG status
        code, out, err = kfp(capsys, "upload", DOC_ID, "--host", fake.url)
        assert code == 0 and "warning: KFP backend 2.5.0 is older than 2.15.0" in err
    assert len(kfp_backend_notes("2.3.0")) == len([f for f in FEATURES if f.system == "KFP backend"])
    assert "does not report a release" in kfp_backend_notes("unknown")[0] and "2.15.0" in kfp_backend_notes(None)[0]
