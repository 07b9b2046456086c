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
from prepline.images import DEFAULT as DEFAULT_IMAGES
from prepline.kfp.compile import sync_compiled
from prepline.pipelines import spec as specs
from prepline.pipelines.factory import pipelines, spec_defaults, spec_params

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
    from prepline.pipelines import spec as specs

    recipes = {f"{n}{tail}" for n in specs.shipped_names() for tail in ("", "_chained")}
    assert recipes >= {"super", "super_chained", "fineweb", "fineweb_chained"}
    assert stems == set(registry.names()) | recipes == set(pipelines())


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


def _component(spec: dict, task: dict) -> dict:
    return spec["components"][task["componentRef"]["name"]]


def _check_stage_dag(spec: dict, comp: dict, stage: str) -> None:
    """One stage: ExitHandler{prepare → If(prepared != 'skip'){start → execute}} with stop as the
    exit task, which gets only pipeline inputs and the run-id placeholder. start and execute get
    the stage as prepare resolved it (one JSON output); a plan may say the stage does not run."""
    root = _tasks(comp)
    assert sorted(root) == ["exit-handler-1", "stop-ray-cluster"]
    stop = root["stop-ray-cluster"]
    assert stop["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED" and stop["dependentTasks"] == ["exit-handler-1"]
    assert stop["inputs"]["parameters"]["run_id"] == _JOB_ID
    assert stop["inputs"]["parameters"]["stage"] == {"runtimeValue": {"constant": stage}}
    assert all("taskOutputParameter" not in v for v in stop["inputs"]["parameters"].values())  # the ExitHandler rule
    body = _tasks(_component(spec, root["exit-handler-1"]))
    (cond_name,) = [k for k in body if k != "prepare-args"]
    prep, cond = body["prepare-args"], body[cond_name]
    assert "dependentTasks" not in prep and cond["dependentTasks"] == ["prepare-args"]
    params = prep["inputs"]["parameters"]
    assert params["run_id"] == _JOB_ID and params["stage"] == params["transform"] == {"runtimeValue": {"constant": stage}}
    channel = "pipelinechannel--prepare-args-Output"
    assert cond["triggerPolicy"]["condition"] == f"inputs.parameter_values['{channel}'] != 'skip'"
    assert cond["inputs"]["parameters"][channel] == {"taskOutputParameter": {"outputParameterKey": "Output", "producerTask": "prepare-args"}}
    run = _tasks(_component(spec, cond))
    assert sorted(run) == ["execute-ray-job", "start-ray-cluster"]
    assert "dependentTasks" not in run["start-ray-cluster"] and run["execute-ray-job"]["dependentTasks"] == ["start-ray-cluster"]
    for t in run.values():
        assert t["inputs"]["parameters"]["prepared"] == {"componentInputParameter": channel}
    for t in (prep, stop, *run.values()):
        assert t["cachingOptions"] == {}, t  # caching off: a stage's effect is its output folder


@pytest.mark.parametrize("name", sorted(set(registry.names())))
def test_simple_pipeline_structure(name):
    _spec(COMPILED / "pipelines" / f"{name}.yaml")  # parses strictly
    spec = _root(name)
    assert spec["pipelineInfo"]["name"] == name.replace("_", "-")
    _check_parameters(spec, stage_params.STAGE, stage_params.image_defaults(DEFAULT_IMAGES))
    _check_stage_dag(spec, spec["root"], name)


def _chain(tasks: dict, first: str) -> list[str]:
    """The tasks from ``first`` on, each the only one that depends on the one before."""
    chain = [first]
    while nxt := [k for k, t in tasks.items() if chain[-1] in t.get("dependentTasks", [])]:
        (one,) = nxt
        chain.append(one)
    return chain


def _check_spec_stage(spec: dict, task: dict, stage: str, branch: dict) -> None:
    """A stage task of a spec pipeline: its simple pipeline, told to read the run's plan."""
    params = task["inputs"]["parameters"]
    assert params["from_plan"] == {"runtimeValue": {"constant": True}} and params["branch"] == branch, stage
    for k in stage_params.SHARED + ["input_path"]:
        assert params[k] == {"componentInputParameter": k if "runtimeValue" in branch else f"pipelinechannel--{k}"}, (stage, k)
    _check_stage_dag(spec, _component(spec, task), stage)


def test_super_pipeline_is_the_shipped_spec():
    """plan → ingest → global stages → ParallelFor{branch stages up to filter} → train_tokenizer →
    ParallelFor{tokenization} → check_documents → fine_tune → run_report, each stage its simple pipeline."""
    _spec(COMPILED / "pipelines" / "super.yaml")  # parses strictly
    spec, shipped = _root("super"), specs.shipped()
    assert spec["pipelineInfo"]["name"] == "prepline-super"
    # what a user passes merges into the spec's settings: overrides_json and train_params_json default to {}
    _check_parameters(spec, spec_params(shipped), spec_defaults(shipped))
    root = _tasks(spec["root"])
    chain = _chain(root, "plan-run")
    assert sorted(chain) == sorted(root)  # one line, nothing beside it
    loops = [k for k in chain if "parameterIterator" in root[k]]
    glob = ["ingest"] + [s.name for s in shipped.stages]
    assert chain == ["plan-run", *(s.replace("_", "-") for s in glob), loops[0], "train-tokenizer", loops[1], "check-documents",
                     "fine-tune", "run-report"], chain
    for s in glob:
        _check_spec_stage(spec, root[s.replace("_", "-")], s, {"runtimeValue": {"constant": ""}})
    branch = [s.name for s in shipped.branch_stages]
    for loop, names in zip(loops, (branch[:-1], branch[-1:])):
        t = root[loop]
        assert t["parameterIterator"]["items"] == {"inputParameter": "pipelinechannel--languages"}
        assert t["iteratorPolicy"] == {"parallelismLimit": len(shipped.branches.languages) + 1}
        body = _tasks(_component(spec, t))
        first = names[0].replace("_", "-")
        assert _chain(body, first) == [s.replace("_", "-") for s in names] and sorted(body) == sorted(_chain(body, first))
        for s in names:
            _check_spec_stage(spec, body[s.replace("_", "-")], s, {"componentInputParameter": t["parameterIterator"]["itemInput"]})
    for step in ("plan-run", "train-tokenizer", "check-documents", "fine-tune", "run-report"):
        assert root[step]["inputs"]["parameters"]["run_id"] == _JOB_ID, step  # the run every stage wrote under
    assert root["run-report"]["inputs"]["parameters"]["work_root"] == {"componentInputParameter": "work_root"}
    plan = root["plan-run"]["inputs"]["parameters"]
    assert json.loads(plan["spec_json"]["runtimeValue"]["constant"]) == shipped.to_dict()
    ft = root["fine-tune"]["inputs"]["parameters"]
    assert json.loads(ft["defaults_json"]["runtimeValue"]["constant"]) == shipped.train_params
    assert ft["train_params_json"] == {"componentInputParameter": "train_params_json"}
    assert "mixed_tokenizers" not in (COMPILED / "pipelines" / "super.yaml").read_text()


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
