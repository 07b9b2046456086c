"""compiled/ is what the sources compile to, byte for byte, and has the structure users rely on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from prepline import registry, stage_params
from prepline.kfp.compile import sync_compiled
from prepline.pipelines.factory import BRANCH_STAGES, GLOBAL_STAGES, default_overrides, pipelines, super_defaults, super_stages
from prepline.images import DEFAULT as DEFAULT_IMAGES
from prepline.stage_params import DEFAULT_LANGUAGES

ROOT = Path(__file__).resolve().parents[2]
COMPILED = ROOT / "compiled"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _spec(path: Path) -> pipeline_spec_pb2.PipelineSpec:
    docs = _docs(path)
    spec = pipeline_spec_pb2.PipelineSpec()
    json_format.ParseDict(docs[0], spec)  # strict: unknown fields fail
    if len(docs) > 1:
        json_format.ParseDict(docs[1], pipeline_spec_pb2.PlatformSpec())
    return spec


def test_compiled_is_up_to_date():
    assert sync_compiled(COMPILED, check=True) == [], "run `prepline compile` (scripts/compile.py) and commit compiled/"


def test_one_pipeline_per_transform_and_super():
    stems = {p.stem for p in (COMPILED / "pipelines").glob("*.yaml")}
    assert stems == set(registry.names()) | {"super", "super_chained"} == set(pipelines())


_KFP_TYPE = {str: "STRING", int: "NUMBER_INTEGER", bool: "BOOLEAN", list: "LIST"}
_JOB_ID = {"runtimeValue": {"constant": "{{$.pipeline_job_uuid}}"}}


def _root(name: str) -> dict:
    return _docs(COMPILED / "pipelines" / f"{name}.yaml")[0]


def _check_parameters(spec: dict, names: list[str], defaults: dict) -> None:
    """The pipeline's parameters: exactly ``names``, typed and defaulted as stage_params declares, described."""
    got = spec["root"]["inputDefinitions"]["parameters"]
    assert sorted(got) == sorted(names)
    for n in names:
        p = stage_params.PARAMS[n]
        d = got[n]
        assert d["parameterType"] == _KFP_TYPE[p.type] and d["description"], n
        want = defaults.get(n, p.default)
        if want is stage_params.REQUIRED:  # e.g. input_path, work_root: the user must say where
            assert "defaultValue" not in d and not d.get("isOptional"), n
            continue
        assert d["isOptional"] is True, n
        assert d["defaultValue"] == (float(want) if p.type is int else want), n  # KFP writes ints as floats


def _tasks(dag: dict) -> dict[str, dict]:
    return dag["dag"]["tasks"]


def _check_stage_dag(spec: dict, comp: dict, stage: str) -> None:
    """One stage: ExitHandler{prepare → start → execute (fed by prepare's outputs)} with stop as the
    exit task, which gets only pipeline inputs and the run-id placeholder."""
    root = _tasks(comp)
    assert sorted(root) == ["exit-handler-1", "stop-ray-cluster"]
    stop = root["stop-ray-cluster"]
    assert stop["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED" and stop["dependentTasks"] == ["exit-handler-1"]
    assert stop["inputs"]["parameters"]["run_id"] == _JOB_ID
    assert stop["inputs"]["parameters"]["stage"] == {"runtimeValue": {"constant": stage}}
    assert all("taskOutputParameter" not in v for v in stop["inputs"]["parameters"].values())  # the ExitHandler rule
    body = _tasks(spec["components"][root["exit-handler-1"]["componentRef"]["name"]])
    assert sorted(body) == ["execute-ray-job", "prepare-args", "start-ray-cluster"]
    assert "dependentTasks" not in body["prepare-args"]
    assert body["start-ray-cluster"]["dependentTasks"] == ["prepare-args"]
    assert sorted(body["execute-ray-job"]["dependentTasks"]) == ["prepare-args", "start-ray-cluster"]
    ex = body["execute-ray-job"]["inputs"]["parameters"]
    fed = {k: v["taskOutputParameter"] for k, v in ex.items() if "taskOutputParameter" in v}
    assert fed == {k: {"outputParameterKey": k, "producerTask": "prepare-args"} for k in ("config_json", "input_path", "output_path", "workers")}
    for t in ("prepare-args", "start-ray-cluster", "execute-ray-job"):
        params = body[t]["inputs"]["parameters"]
        assert params["run_id"] == _JOB_ID and params["stage"] == {"runtimeValue": {"constant": stage}}, t
        assert body[t]["cachingOptions"] == {}, t  # caching off: a stage's effect is its output folder
    assert body["execute-ray-job"]["inputs"]["parameters"]["transform"] == {"runtimeValue": {"constant": stage}}


@pytest.mark.parametrize("name", sorted(set(registry.names())))
def test_simple_pipeline_structure(name):
    _spec(COMPILED / "pipelines" / f"{name}.yaml")  # parses strictly
    spec = _root(name)
    assert spec["pipelineInfo"]["name"] == name.replace("_", "-")
    _check_parameters(spec, stage_params.STAGE, stage_params.image_defaults(DEFAULT_IMAGES))
    _check_stage_dag(spec, spec["root"], name)


def test_super_pipeline_nests_every_stage_with_a_per_language_loop():
    _spec(COMPILED / "pipelines" / "super.yaml")
    spec = _root("super")
    _check_parameters(spec, stage_params.SUPER, super_defaults())
    glob, branch = super_stages()
    assert glob == GLOBAL_STAGES and branch == BRANCH_STAGES  # every stage is registered
    root = _tasks(spec["root"])
    # the global stages in order, each reading the previous one's output
    prev = None
    for s in glob:
        t = root[s.replace("_", "-")]
        assert t.get("dependentTasks") == ([prev.replace("_", "-")] if prev else None), s
        assert t["inputs"]["parameters"]["input_stage"] == {"runtimeValue": {"constant": prev or ""}}, s
        _check_stage_dag(spec, spec["components"][t["componentRef"]["name"]], s)
        prev = s
    # one ParallelFor over the languages parameter, after lang_id
    (loop_name,) = [k for k, t in root.items() if "parameterIterator" in t]
    loop = root[loop_name]
    assert loop["dependentTasks"] == ["lang-id"] and loop["iteratorPolicy"] == {"parallelismLimit": len(DEFAULT_LANGUAGES)}
    assert loop["parameterIterator"]["items"] == {"inputParameter": "pipelinechannel--languages"}
    item = loop["parameterIterator"]["itemInput"]
    body = _tasks(spec["components"][loop["componentRef"]["name"]])
    assert sorted(body) == sorted(s.replace("_", "-") for s in branch)
    prev = "lang_id"
    for i, s in enumerate(branch):
        t = body[s.replace("_", "-")]
        params = t["inputs"]["parameters"]
        assert t.get("dependentTasks") == (None if i == 0 else [prev.replace("_", "-")]), s
        assert params["input_stage"] == {"runtimeValue": {"constant": prev}}, s
        assert params["input_from_split"] == {"runtimeValue": {"constant": i == 0}}, s  # only the first reads lang_id's split
        assert params["branch"] == {"componentInputParameter": item}, s
        _check_stage_dag(spec, spec["components"][t["componentRef"]["name"]], s)
        prev = s
    # the fan-in: fine_tune after the whole loop, reading the run's token shards by path
    ft = root["fine-tune"]
    assert ft["dependentTasks"] == [loop_name] and ft["inputs"]["parameters"]["run_id"] == _JOB_ID
    # the run's HTML report last, after fine_tune, from the run's folder (pipeline inputs and the job id)
    rep = root["run-report"]
    assert rep["dependentTasks"] == ["fine-tune"] and rep["inputs"]["parameters"]["run_id"] == _JOB_ID
    assert rep["inputs"]["parameters"]["work_root"] == {"componentInputParameter": "work_root"}
    assert sorted(root) == sorted([s.replace("_", "-") for s in glob] + [loop_name, "fine-tune", "run-report"])
    assert json.loads(spec["root"]["inputDefinitions"]["parameters"]["overrides_json"]["defaultValue"]) == default_overrides()


def test_secret_name_is_a_parameter_and_no_credentials_anywhere():
    for path in COMPILED.rglob("*.yaml"):
        text = path.read_text()
        assert not re.search(r"AKIA[0-9A-Z]{16}", text), path  # AWS access key ids
        assert not re.search(r"(?i)(secret_access_key|password|token)\s*[:=]\s*['\"]?[A-Za-z0-9/+]{16,}", text), path
        assert "/work/" not in text and "/root/" not in text, f"{path}: a machine path leaked into the YAML"
    platform = _docs(COMPILED / "pipelines" / "doc_id.yaml")[1]
    ks = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for ex in ("exec-execute-ray-job", "exec-start-ray-cluster", "exec-stop-ray-cluster"):
        env = ks[ex]["secretAsEnv"][0]
        assert env["secretNameParameter"]["componentInputParameter"] in ("s3_secret_name", "pipelinechannel--s3_secret_name")
        assert env["optional"] is True


def test_components_load_back_with_their_interface():
    """Each compiled component loads back with the inputs (types, defaults), outputs, image and
    command of the Python component it was compiled from."""
    from kfp import components

    from prepline.components import catalog

    source = catalog()
    assert sorted(p.stem for p in (COMPILED / "components").glob("*.yaml")) == sorted(source)
    for name, comp in source.items():
        back = components.load_component_from_file(str(COMPILED / "components" / f"{name}.yaml")).component_spec
        spec = comp.component_spec
        assert back.name.replace("-", "_") == name
        assert {k: (v.type, v.default, v.optional) for k, v in back.inputs.items()} == \
            {k: (v.type, v.default, v.optional) for k, v in spec.inputs.items()}, name
        assert {k: v.type for k, v in (back.outputs or {}).items()} == {k: v.type for k, v in (spec.outputs or {}).items()}, name
        c, b = spec.implementation.container, back.implementation.container
        assert (b.image, b.command, b.args) == (c.image, c.command, c.args), name


def test_compiled_defaults_are_for_a_cluster():
    """No provider default of local and no /tmp default anywhere in compiled/: input_path and work_root
    are required, the provider is kuberay at the API server's in-cluster address."""
    import json

    from prepline.stage_params import DEFAULT_KUBERAY_SERVER

    for p in sorted(COMPILED.rglob("*.yaml")):
        text = p.read_text()
        assert "/tmp" not in text, p
        params = next(yaml.safe_load_all(text)).get("root", {}).get("inputDefinitions", {}).get("parameters", {})
        # (train_mode's 'local' is not a provider: it trains in the fine_tune step's own pod, trainer image)
        assert params.get("provider", {}).get("defaultValue") != "local", p
        if "provider" in params and p.parent.name == "pipelines":
            assert params["provider"]["defaultValue"] == "kuberay", p
            assert json.loads(params["provider_json"]["defaultValue"])["server"] == DEFAULT_KUBERAY_SERVER, p
            assert "defaultValue" not in params["work_root"] and not params["work_root"].get("isOptional"), p
        if "input_path" in params and p.parent.name == "pipelines":
            assert "defaultValue" not in params["input_path"], p
