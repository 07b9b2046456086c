"""compiled/ is what the sources compile to, byte for byte, and has the structure users rely on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from prepline import registry
from prepline.kfp_cli import ROOT, sync_compiled
from prepline.pipelines import spec as specs
from prepline.pipelines.factory import pipelines

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


@pytest.mark.parametrize("name", sorted(set(registry.names())))
def test_simple_pipeline_structure(name):
    spec = _spec(COMPILED / "pipelines" / f"{name}.yaml")
    execs = set(spec.deployment_spec["executors"].keys())
    assert {"exec-prepare-args", "exec-start-ray-cluster", "exec-execute-ray-job", "exec-stop-ray-cluster"} <= execs
    root = spec.root.dag.tasks
    exit_tasks = [t for t in root.values() if t.trigger_policy.strategy == pipeline_spec_pb2.PipelineTaskSpec.TriggerPolicy.ALL_UPSTREAM_TASKS_COMPLETED]
    assert [t.component_ref.name for t in exit_tasks] == ["comp-stop-ray-cluster"]
    # the exit task uses only pipeline inputs and the run-id placeholder (the ExitHandler rule)
    stop = exit_tasks[0]
    assert stop.inputs.parameters["run_id"].runtime_value.constant.string_value == "{{$.pipeline_job_uuid}}"
    assert stop.inputs.parameters["stage"].runtime_value.constant.string_value == name
    assert all(p.HasField("component_input_parameter") or p.HasField("runtime_value") for p in stop.inputs.parameters.values())
    assert set(spec.root.input_definitions.parameters) >= {"input_path", "work_root", "params_json", "provider", "cluster_json",
                                                           "s3_secret_name", "from_plan"}
    # start and run only when prepare says the stage runs (a spec pipeline's plan may say it does not)
    body = spec.components["comp-exit-handler-1"].dag.tasks
    cond = [t for t in body.values() if t.trigger_policy.condition]
    assert len(cond) == 1 and "!= 'skip'" in cond[0].trigger_policy.condition


def test_super_pipeline_is_the_shipped_spec():
    """plan → ingest → global stages → ParallelFor{branch stages to filter} → train_tokenizer →
    ParallelFor{tokenization} → check_documents → fine_tune, each stage nested with its exit task."""
    spec = _spec(COMPILED / "pipelines" / "super.yaml")
    shipped = specs.shipped()
    root = spec.root.dag.tasks
    comps = set(spec.components.keys())
    for s in shipped.order():
        assert f"comp-{s.replace('_', '-')}" in comps, s
    chain, name = [], "plan-run"
    deps = {k: list(t.dependent_tasks) for k, t in root.items()}
    while True:
        chain.append(name)
        nxt = [k for k, d in deps.items() if name in d]
        if not nxt:
            break
        (name,) = nxt
    loops = [k for k in chain if k.startswith("for-loop")]
    assert chain == ["plan-run", "ingest", "doc-id", "exact-dedup", "fuzzy-dedup", "lang-id", loops[0], "train-tokenizer", loops[1],
                     "check-documents", "fine-tune"], chain
    first, second = (spec.components[root[k].component_ref.name].dag.tasks for k in loops)
    assert set(first) == {"doc-quality", "pii-redactor", "hap", "filter"} and set(second) == {"tokenization"}
    for k in loops:
        assert root[k].parameter_iterator.items.input_parameter == "pipelinechannel--languages"
    params = spec.root.input_definitions.parameters
    assert [v.string_value for v in params["languages"].default_value.list_value.values] == ["en", "ja", "fr"]
    # what a user passes merges into the spec's settings: nothing to lose in the defaults
    assert params["overrides_json"].default_value.string_value == "{}" and params["train_params_json"].default_value.string_value == "{}"
    assert params["input_format"].default_value.string_value == "auto" and params["text_column"].default_value.string_value == "contents"
    assert root["fine-tune"].inputs.parameters["defaults_json"].runtime_value.constant.string_value == json.dumps(shipped.train_params, sort_keys=True)
    assert "mixed_tokenizers" not in (COMPILED / "pipelines" / "super.yaml").read_text()
    stops = [c for c in spec.components if c.startswith("comp-stop-ray-cluster")]
    assert len(stops) == len(shipped.order())


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


def test_components_load_back():
    from kfp import components

    for path in (COMPILED / "components").glob("*.yaml"):
        comp = components.load_component_from_file(str(path))
        assert comp.name.replace("-", "_") == path.stem


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
