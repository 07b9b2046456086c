"""The SDK-chained super pipeline and its run_pipeline component.

Structure: the compiled YAML, parsed strictly with pipeline_spec_pb2. Behaviour: the compiled DAG
is walked the way the KFP driver would (stage order, ParallelFor items, constants, the run-id
placeholder) and each step's run_pipeline body runs against the local fake KFP server, which
records the child runs. Verified against the fake only, not a live KFP."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fake_kfp_server import FakeKfp, kfp_isolated  # noqa: F401 (a fixture)
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from prepline.components.run_pipeline import run_pipeline
from prepline.errors import ConfigError, RunFailed
from prepline.kfp import cli as kfp_cli, client as K, connection as C
from prepline.pipelines import spec as specs
from prepline.pipelines.plan import entry, make_plan, write_plan
from prepline.stages import prepare, stage_output

pytestmark = pytest.mark.usefixtures("kfp_isolated")  # no KFP settings from this machine

ROOT = Path(__file__).resolve().parents[2]

COMPILED = ROOT / "compiled" / "pipelines"
SHIPPED = specs.shipped()
GLOBAL = ["ingest"] + [s.name for s in SHIPPED.stages]
BRANCH = [s.name for s in SHIPPED.branch_stages]
CHAINED = COMPILED / "super_chained.yaml"
SHARED = {"input_path", "work_root", "overrides_json", "provider", "provider_json", "cluster_json", "max_failed_files",
          "launcher_image", "ray_image",
          "timeout_seconds", "start_timeout_seconds", "s3_secret_name"}


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d]


def _spec(path: Path) -> pipeline_spec_pb2.PipelineSpec:
    docs = _docs(path)
    spec = pipeline_spec_pb2.PipelineSpec()
    json_format.ParseDict(docs[0], spec)
    json_format.ParseDict(docs[1], pipeline_spec_pb2.PlatformSpec())
    return spec


def _order(tasks) -> list[str]:
    """Task names in dependency order (ties by name)."""
    done, out = set(), []
    while len(out) < len(tasks):
        ready = sorted(n for n, t in tasks.items() if n not in done and set(t.dependent_tasks) <= done)
        assert ready, "cycle"
        done.add(ready[0])
        out.append(ready[0])
    return out


def _const(v):
    return json_format.MessageToDict(v)


# -- compiled structure -------------------------------------------------------------------------


def test_compiled_structure_matches_the_super_pipeline():
    spec = _spec(CHAINED)
    assert spec.pipeline_info.name == "prepline-super-chained"
    root_inputs = set(spec.root.input_definitions.parameters)
    super_inputs = set(_spec(COMPILED / "super.yaml").root.input_definitions.parameters)
    assert super_inputs <= root_inputs
    assert root_inputs - super_inputs == {"kfp_host", "kfp_namespace", "kfp_experiment", "kfp_token_secret", "stage_pipeline_version"}
    defaults = spec.root.input_definitions.parameters
    assert [v.string_value for v in defaults["languages"].default_value.list_value.values] == list(SHIPPED.branches.languages)
    assert defaults["overrides_json"].default_value.string_value == "{}"  # merged into the spec's settings by the plan step

    # what children inherit = the parameters the parent and every stage pipeline share
    for s in GLOBAL + BRANCH:
        child = set(_spec(COMPILED / f"{s}.yaml").root.input_definitions.parameters)
        assert root_inputs & child == SHARED, s
        assert {"run_id", "branch", "from_plan"} <= child

    root = spec.root.dag.tasks
    order = _order(root)
    assert order[0] == "plan-run" and order[-3:] == ["check-documents", "fine-tune", "run-report"]
    stage_tasks = [n for n in order if root[n].component_ref.name.startswith("comp-run-pipeline")]
    names = [root[n].inputs.parameters["pipeline_name"].runtime_value.constant.string_value for n in stage_tasks]
    assert names == GLOBAL  # the file stems: what the KFP UI's upload dialog names the stage pipelines
    for n, s in zip(stage_tasks, GLOBAL):
        ins = root[n].inputs.parameters
        assert root[n].task_info.name == s
        assert _const(ins["parameters"].runtime_value.constant) == {"from_plan": True}  # wiring: the parent's plan.json
        assert ins["parent_run_id"].runtime_value.constant.string_value == "{{$.pipeline_job_uuid}}"
        assert ins["run_id_parameter"].runtime_value.constant.string_value == "run_id"
        assert ins["inherit_parameters"].runtime_value.constant.bool_value is True
        assert ins["host"].component_input_parameter == "kfp_host"
        assert ins["pipeline_version"].component_input_parameter == "stage_pipeline_version"
        assert not root[n].caching_options.enable_cache
    loops = [n for n in order if root[n].parameter_iterator.items.input_parameter]
    assert [root[n].task_info.name for n in loops] == ["per-language", "per-language-tokens"]
    assert list(root[loops[0]].dependent_tasks) == [stage_tasks[-1]] and list(root["train-tokenizer"].dependent_tasks) == [loops[0]]
    assert list(root[loops[1]].dependent_tasks) == ["train-tokenizer"] and list(root["check-documents"].dependent_tasks) == [loops[1]]
    cut = SHIPPED.tokenizer_split()
    for loop, group in zip(loops, (BRANCH[:cut], BRANCH[cut:])):
        inner = spec.components[root[loop].component_ref.name].dag.tasks
        item = root[loop].parameter_iterator.item_input
        assert [inner[n].inputs.parameters["pipeline_name"].runtime_value.constant.string_value for n in _order(inner)] == group
        for n in inner:
            ins = inner[n].inputs.parameters
            assert _const(ins["parameters"].runtime_value.constant) == {"from_plan": True}
            assert ins["item"].component_input_parameter == item
            assert ins["item_parameter"].runtime_value.constant.string_value == "branch"
    # robustness: no pipeline-parameter placeholder inside a struct constant (older KFP drivers leave them unresolved)
    for comp in [spec.root] + list(spec.components.values()):
        for t in comp.dag.tasks.values():
            c = t.inputs.parameters.get("parameters")
            if c is not None:
                assert "{{" not in json.dumps(_const(c.runtime_value.constant))
    # plan, train_tokenizer, check_documents, fine_tune and run_report are steps of the parent, on the parent's run id
    for n in ("plan-run", "train-tokenizer", "check-documents", "fine-tune", "run-report"):
        assert root[n].inputs.parameters["run_id"].runtime_value.constant.string_value == "{{$.pipeline_job_uuid}}"
    assert list(root["run-report"].dependent_tasks) == ["fine-tune"]  # the report last
    # the KFP token reaches every run_pipeline step from a secret named by a pipeline parameter, optionally
    platform = {k: v for k, v in _docs(CHAINED)[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"].items()
                if k.startswith("exec-run-pipeline")}
    assert len(platform) == len(GLOBAL) + len(BRANCH)
    for ex in platform.values():
        (env,) = ex["secretAsEnv"]
        assert env["secretNameParameter"]["componentInputParameter"] in ("kfp_token_secret", "pipelinechannel--kfp_token_secret")
        assert env["optional"] is True and env["keyToEnv"] == [{"envVar": "KF_PIPELINES_TOKEN", "secretKey": "KF_PIPELINES_TOKEN"}]


def test_prepare_run_id_override_moves_paths_not_the_cluster():
    base = prepare("doc_id", "{}", "s3://b/w", "child-1", "doc_id", "", "s3://b/in", "", False, "{}", "{}")
    over = prepare("doc_id", "{}", "s3://b/w", "child-1", "doc_id", "", "s3://b/in", "", False, "{}", "{}", run_id_override="parent-9")
    assert base["output_path"] == "s3://b/w/child-1/doc_id" and over["output_path"] == "s3://b/w/parent-9/doc_id"
    assert over["cluster_name"] == base["cluster_name"]  # named after the child's own run
    nxt = prepare("exact_dedup", "{}", "s3://b/w", "child-2", "exact_dedup", "", "", "doc_id", False, "{}", "{}", run_id_override="parent-9")
    assert nxt["input_path"] == over["output_path"]


# -- behaviour against the fake ------------------------------------------------------------------


def _upload_all(fake):
    for s in GLOBAL + BRANCH:
        assert kfp_cli.main(["upload", str(COMPILED / f"{s}.yaml"), "--host", fake.url]) == 0


def _start_parent(fake, *params) -> str:
    kc = K.KfpClient(C.resolve_connection(fake.url))
    values = {"kfp_host": fake.url, "input_path": "s3://bucket/in", "work_root": "s3://bucket/work", **dict(p.split("=", 1) for p in params)}
    run = kc.start(package=str(CHAINED), values=values, experiment="chained", run_name="parent")
    return run.run_id


def _walk(fake, parent_id: str, calls: list | None = None) -> list[str]:
    """Execute the compiled super_chained DAG like the KFP driver: resolve each run_pipeline task's
    inputs (constants, pipeline inputs, the loop item, the job-id placeholder) and run its body."""
    kc = K.KfpClient(C.resolve_connection(fake.url))
    params = kc.effective_parameters(kc.get_run(parent_id))
    spec = _spec(CHAINED)
    child_ids = []

    def resolve(task, item=None):
        out = {}
        for name, v in task.inputs.parameters.items():
            if name == "base_image" or name.startswith("pipelinechannel--"):
                continue  # the driver's: the task's image (set_container_image), not an argument of the body
            if v.HasField("runtime_value"):
                c = _const(v.runtime_value.constant)
                out[name] = parent_id if c == "{{$.pipeline_job_uuid}}" else c
            else:
                src = v.component_input_parameter
                if src.endswith("-loop-item"):
                    out[name] = item
                else:
                    out[name] = params[src.removeprefix("pipelinechannel--")]
        return out

    def run_dag(tasks, item=None):
        for n in _order(tasks):
            t = tasks[n]
            if t.parameter_iterator.items.input_parameter:
                items = params[t.parameter_iterator.items.input_parameter.removeprefix("pipelinechannel--")]
                for it in items:
                    run_dag(spec.components[t.component_ref.name].dag.tasks, it)
                continue
            if not t.component_ref.name.startswith("comp-run-pipeline"):
                continue  # plan, train_tokenizer, check_documents, fine_tune: steps of the parent itself, not child runs
            inputs = resolve(t, item)
            if calls is not None:
                calls.append((t.task_info.name, inputs))
            child_ids.append(run_pipeline.python_func(**inputs, poll_seconds=0))

    run_dag(spec.root.dag.tasks)
    return child_ids


@pytest.mark.slow
def test_chain_runs_every_stage_as_a_child_under_the_parents_folder(capsys, tmp_path):
    langs = ["en", "ja"]
    work = str(tmp_path / "work")
    with FakeKfp() as fake:
        _upload_all(fake)
        parent = _start_parent(fake, f"work_root={work}", "input_path=s3://bucket/in", f"languages={json.dumps(langs)}",
                               "max_failed_files=2", "input_format=jsonl")
        calls: list = []
        children = _walk(fake, parent, calls)
        assert len(children) == len(GLOBAL) + len(BRANCH) * len(langs)
        posts = [c["body"] for c in fake.calls("POST", "/runs$")][1:]  # after the parent's
        assert len(posts) == len(children)
        parent_exp = fake.run(parent)["experiment_id"]
        cut = SHIPPED.tokenizer_split()
        expected_names = GLOBAL + [f"{s}-{lg}" for lg in langs for s in BRANCH[:cut]] + [f"{s}-{lg}" for lg in langs for s in BRANCH[cut:]]
        assert [p["display_name"] for p in posts] == [f"{n} (child of {parent})" for n in expected_names]
        assert all(fake.run(c)["state"] == "SUCCEEDED" for c in children)

        # the parent's plan step (its body runs here) writes the plan the children read
        write_plan(make_plan(SHIPPED, input_path="s3://bucket/in", work_root=work, run_id=parent, languages=langs, input_format="jsonl"))
        for lg in langs:  # what lang_id's split wrote (a branch's prepare refuses a language it found no document of)
            (Path(work) / parent / "lang_id" / f"lang={lg}").mkdir(parents=True)
            (Path(work) / parent / "lang_id" / f"lang={lg}" / "part-0.parquet").write_bytes(b"x")
        for body, (task_name, _) in zip(posts, calls):
            ps = body["runtime_config"]["parameters"]
            assert body["experiment_id"] == parent_exp and body["pipeline_version_reference"]
            assert ps["run_id"] == parent and ps["work_root"] == work and ps["input_path"] == "s3://bucket/in"
            assert ps["max_failed_files"] == 2 and ps["overrides_json"] == "{}" and ps["from_plan"] is True
            assert set(ps) == SHARED | {"run_id", "from_plan"} | ({"branch"} if "branch" in ps else set())
            # what the child's prepare_args computes: the plan's entry, under the parent's id
            r = prepare(task_name, "{}", ps["work_root"], "child-own-id", task_name, ps.get("branch", ""), ps["input_path"], "",
                        False, ps["cluster_json"], ps["overrides_json"], run_id_override=ps["run_id"], from_plan=True)
            if r["run"]:
                e = entry(json.loads((Path(work) / parent / "plan.json").read_text()), task_name, ps.get("branch", ""))
                assert r["output_path"] == stage_output(work, parent, task_name, ps.get("branch", "")) == e["output"]
                assert r["input_path"] == e["input"]
            else:  # hap outside English
                assert (task_name, ps["branch"]) == ("hap", "ja")
        out = capsys.readouterr().out
        # looked up under the file stem (the UI's name), found under the compiled name `prepline kfp upload` gives it
        assert f"started ingest (ingest) as run {children[0]}" in out and "SUCCEEDED" in out


@pytest.mark.slow
def test_failed_or_canceled_child_fails_the_step_and_a_retry_resumes():
    with FakeKfp() as fake:
        _upload_all(fake)
        parent = _start_parent(fake, "work_root=/w")
        fake.outcomes["exact-dedup"] = "FAILED"
        with pytest.raises(RunFailed, match=r"child run exact_dedup \(child of .*\) .* ended FAILED: fake: a task of this run failed"):
            _walk(fake, parent)
        assert [c["body"]["display_name"].split(" ")[0] for c in fake.calls("POST", "/runs$")[1:]] == ["ingest", "doc_id", "exact_dedup"]
        # the parent is retried: doc_id is not started again, exact_dedup is
        fake.outcomes["exact-dedup"] = "CANCELED"
        t0 = time.monotonic()
        with pytest.raises(K.ChildRunFailed, match="ended CANCELED"):
            _walk(fake, parent)
        assert time.monotonic() - t0 < 10
        assert [c["body"]["display_name"].split(" ")[0] for c in fake.calls("POST", "/runs$")[1:]] == ["ingest", "doc_id", "exact_dedup",
                                                                                                 "exact_dedup"]
        del fake.outcomes["exact-dedup"]
        children = _walk(fake, parent)
        names = [c["body"]["display_name"].split(" ")[0] for c in fake.calls("POST", "/runs$")[1:]]
        assert names.count("ingest") == names.count("doc_id") == 1 and names.count("exact_dedup") == 4 - 1
        assert len(children) == len(set(children))


def test_run_pipeline_errors():
    with FakeKfp() as fake:
        # no such pipeline uploaded
        with pytest.raises(K.KfpNotFound, match="no pipeline named doc-id") as e:
            run_pipeline.python_func(pipeline_name="doc-id", host=fake.url, poll_seconds=0)
        assert "prepline kfp upload" in e.value.fix
        # an old upload whose spec has no run_id parameter: refused before posting
        docs = _docs(COMPILED / "doc_id.yaml")
        del docs[0]["root"]["inputDefinitions"]["parameters"]["run_id"]
        old = Path(os.environ.get("TMPDIR", "/tmp")) / f"old-doc-id-{os.getpid()}.yaml"
        old.write_text(yaml.safe_dump_all(docs))
        try:
            assert kfp_cli.main(["upload", str(old), "--name", "doc-id", "--host", fake.url]) == 0
        finally:
            old.unlink()
        parent = _start_parent(fake)
        with pytest.raises(ConfigError, match="has no parameter run_id to receive the parent's run id"):
            run_pipeline.python_func(pipeline_name="doc-id", parent_run_id=parent, host=fake.url, poll_seconds=0)
        # bad parameters and an unknown parent
        with pytest.raises(ConfigError, match="pipeline doc-id has no parameter bogus"):
            run_pipeline.python_func(pipeline_name="doc-id", parameters={"bogus": 1}, host=fake.url, poll_seconds=0)
        with pytest.raises(ConfigError, match="s3_secret_name='' is not a Kubernetes secret name"):  # every pod would be rejected
            run_pipeline.python_func(pipeline_name="doc-id", parameters={"input_path": "/i", "work_root": "/x", "s3_secret_name": ""},
                                     host=fake.url, poll_seconds=0)
        with pytest.raises(K.KfpNotFound, match="no run with id nope"):
            run_pipeline.python_func(pipeline_name="doc-id", parent_run_id="nope", run_id_parameter="", host=fake.url, poll_seconds=0)
        assert len(fake.calls("POST", "/runs$")) == 1  # only the parent
        # without a parent: explicit parameters only, a timestamped name, the Default experiment
        rid = run_pipeline.python_func(pipeline_name="doc-id", parameters={"input_path": "/i", "work_root": "/x", "max_failed_files": "3"},
                                       host=fake.url, poll_seconds=0)
        body = fake.calls("POST", "/runs$")[-1]["body"]
        assert fake.run(rid)["state"] == "SUCCEEDED"
        assert body["runtime_config"]["parameters"] == {"input_path": "/i", "work_root": "/x", "max_failed_files": 3}
        assert fake.experiments[body["experiment_id"]]["display_name"] == "Default"


@pytest.mark.slow
def test_sigterm_on_the_step_terminates_the_child(tmp_path):
    """The parent is stopped (its step pod gets SIGTERM): the child run is terminated too."""
    with FakeKfp() as fake:
        assert kfp_cli.main(["upload", str(COMPILED / "doc_id.yaml"), "--host", fake.url]) == 0
        fake.outcomes["doc-id"] = "HANG"
        code = ("from prepline.components.run_pipeline import run_pipeline; "
                f"run_pipeline.python_func(pipeline_name='doc-id', host='{fake.url}', poll_seconds=0, "
                "parameters={'input_path': '/i', 'work_root': '/w'})")
        env = {**os.environ, "HOME": str(tmp_path)}
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline = time.monotonic() + 60
            while not fake.runs and time.monotonic() < deadline:
                time.sleep(0.1)
            assert fake.runs, "the child run was not started"
            time.sleep(0.3)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        (rid,) = fake.runs
        assert proc.returncode != 0 and f"terminated child run {rid}" in out
        assert fake.calls("POST", f"/runs/{rid}:terminate")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:You may be attemping to run a task")  # the launcher image is not used locally
def test_component_runs_under_kfp_local(tmp_path):
    """The compiled-to-be component body, executed by kfp.local's runner, drives the fake server."""
    import kfp.local
    from kfp import dsl

    with FakeKfp() as fake:
        assert kfp_cli.main(["upload", str(COMPILED / "doc_id.yaml"), "--host", fake.url]) == 0

        @dsl.pipeline(name="drive")
        def drive(host: str, work_root: str):
            run_pipeline(pipeline_name="doc-id", parameters={"max_failed_files": 1, "input_path": "/i", "work_root": work_root}, host=host,
                         poll_seconds=1, inherit_parameters=False, run_id_parameter="")

        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"), raise_on_error=True)
        drive(host=fake.url, work_root="/w")
        (rid,) = fake.runs
        assert fake.run(rid)["state"] == "SUCCEEDED"
        assert fake.calls("POST", "/runs$")[0]["body"]["runtime_config"]["parameters"] == {"max_failed_files": 1, "input_path": "/i",
                                                                                          "work_root": "/w"}
        fake.outcomes["doc-id"] = "FAILED"
        with pytest.raises(RuntimeError):
            drive(host=fake.url, work_root="/w")
        assert sorted(r.state for r in fake.runs.values()) == ["FAILED", "SUCCEEDED"]


def test_stage_pipelines_are_found_under_the_ui_name_and_the_compiled_name():
    """The KFP UI's upload dialog names a pipeline after its file (doc_id), `prepline kfp upload` after
    its compiled name (doc-id: KFP pipeline names take no '_'); the chained pipeline asks for the file stem."""
    with FakeKfp() as fake:
        params = {"input_path": "/i", "work_root": "/w"}
        assert kfp_cli.main(["upload", str(COMPILED / "doc_id.yaml"), "--name", "doc_id", "--host", fake.url]) == 0  # as the UI does
        rid = run_pipeline.python_func(pipeline_name="doc_id", parameters=params, host=fake.url, poll_seconds=0)
        assert fake.run(rid)["state"] == "SUCCEEDED"
        assert kfp_cli.main(["upload", str(COMPILED / "exact_dedup.yaml"), "--host", fake.url]) == 0  # named exact-dedup
        rid = run_pipeline.python_func(pipeline_name="exact_dedup", parameters=params, host=fake.url, poll_seconds=0)
        assert fake.run(rid)["state"] == "SUCCEEDED"
