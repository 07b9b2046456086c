"""Every step a user can run, read from the generated files themselves: each executor of every
compiled pipeline and component (``compiled/**/*.yaml``) and each component of the Elyra catalog
(``elyra_templates/components/*.yaml``, which every ``.pipeline`` node's ``op`` must name). A step is
its command and the image it declares (an image parameter's default resolves the KFP
``{{$.inputs.parameters['pipelinechannel--<x>_image']}}`` placeholder), so a step added to a pipeline
or a template is in this list without anyone writing it down; ``test_image_contents.py`` runs each
one's command, in its image's declared package set, and fails on a step it has no inputs for.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from prepline import images

_PLACEHOLDER = re.compile(r"^\{\{\$\.inputs\.parameters\['pipelinechannel--(\w+_image)'\]\}\}$")
#: the script every KFP lightweight component's container runs (kfp's own, install_kfp_package=False)
KFP_ENTRY = "python3 -m kfp.dsl.executor_main"


@dataclass
class Step:
    """One command in one image: ``key`` names what runs (``kfp <function>`` or ``<module> <subcommand>``)."""

    key: str
    kind: str  # launcher | ray | trainer
    command: list  # the container's command (KFP: sh -ec <script> <component source>)
    args: list  # its args, with KFP/v1 placeholders
    inputs: dict  # input name -> default (None: required)
    outputs: dict  # output name -> KFP artifact schema title, or "parameter" / "path"
    used_in: set = field(default_factory=set)


def image_kind(ref: str) -> str:
    kinds = {v: k for k, v in images.DEFAULT.all().items()}
    assert ref in kinds, f"image {ref!r} is none of prepline.images' ({sorted(kinds)})"
    return kinds[ref]


def _kfp_steps(path: Path, rel: str, out: dict[tuple, Step]) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    spec = docs[0]
    params = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    comps = dict(spec.get("components", {}))
    if "executorLabel" in spec.get("root", {}):  # a compiled component: root is the component
        comps["root"] = spec["root"]
    by_exec = {c["executorLabel"]: c for c in comps.values() if "executorLabel" in c}
    for label, ex in spec.get("deploymentSpec", {}).get("executors", {}).items():
        c = ex["container"]
        ref = c["image"]
        ph = _PLACEHOLDER.match(ref)
        if ph:
            ref = params[ph.group(1)]["defaultValue"]
        command, args = list(c["command"]), list(c["args"])
        assert command[:2] == ["sh", "-ec"] and KFP_ENTRY in command[2], f"{rel} {label}: not a KFP lightweight component"
        func = args[args.index("--function_to_execute") + 1]
        comp = by_exec[label]
        inputs = {n: d.get("defaultValue") for n, d in comp.get("inputDefinitions", {}).get("parameters", {}).items()}
        outs = {n: "parameter" for n in comp.get("outputDefinitions", {}).get("parameters", {})}
        outs.update({n: d["artifactType"]["schemaTitle"] for n, d in comp.get("outputDefinitions", {}).get("artifacts", {}).items()})
        kind = image_kind(ref)
        src = hashlib.sha256(command[3].encode()).hexdigest()[:12]
        s = out.setdefault((f"kfp {func}", kind, src), Step(f"kfp {func}", kind, command, args, inputs, outs))
        s.used_in.add(f"{rel}:{label}")


def _elyra_steps(folder: Path, out: dict[tuple, Step]) -> dict[str, Step]:
    """The catalog's components by file name (a .pipeline node's op hashes it)."""
    by_file = {}
    for p in sorted((folder / "components").glob("*.yaml")):
        spec = yaml.safe_load(p.read_text())
        c = spec["implementation"]["container"]
        assert c["command"][:2] == ["python", "-m"], f"{p.name}: {c['command']}"
        key = f"{c['command'][2]} {c['args'][0]}"
        inputs = {i["name"]: i.get("default") for i in spec.get("inputs", [])}
        outs = {o["name"]: "path" for o in spec.get("outputs", [])}
        kind = image_kind(c["image"])
        s = Step(key, kind, list(c["command"]), list(c["args"]), inputs, outs, {f"elyra_templates/components/{p.name}"})
        out[(key, kind, p.name)] = s
        by_file[p.name] = s
    return by_file


def all_steps(root: Path) -> list[Step]:
    """Every step of ``root/compiled`` and ``root/elyra_templates`` (a KFP function's steps that share
    its source and image are one; each Elyra catalog component is one)."""
    from prepline.elyra import CATALOG_TYPE

    out: dict[tuple, Step] = {}
    for p in sorted((root / "compiled").rglob("*.yaml")):
        _kfp_steps(p, str(p.relative_to(root)), out)
    by_file = _elyra_steps(root / "elyra_templates", out)
    ops = {f"{CATALOG_TYPE}:{hashlib.sha256(n.encode()).hexdigest()[:12]}": s for n, s in by_file.items()}
    for p in sorted((root / "elyra_templates").glob("*.pipeline")):
        for node in json.loads(p.read_text())["pipelines"][0]["nodes"]:
            if node.get("type") != "execution_node":
                continue
            assert node["op"] in ops, f"{p.name}: node {node['app_data'].get('label')} runs {node['op']}, which is no catalog component"
            ops[node["op"]].used_in.add(f"elyra_templates/{p.name}:{node['app_data'].get('label')}")
    return list(out.values())


def executor_input(step: Step, values: dict, outdir: Path) -> dict:
    """The ExecutorInput the KFP driver hands a lightweight component: its parameter values and
    where each output goes (local paths as the artifacts' URIs)."""
    params = {n: values[n] if n in values else d for n, d in step.inputs.items()}
    missing = [n for n, v in params.items() if v is None]
    assert not missing, f"{step.key}: no value for the required inputs {missing}"
    outdir.mkdir(parents=True, exist_ok=True)
    arts = {n: {"artifacts": [{"name": n, "type": {"schemaTitle": t}, "uri": str(outdir / n), "metadata": {}}]}
            for n, t in step.outputs.items() if t != "parameter"}
    outp = {n: {"outputFile": str(outdir / f"{n}.param")} for n, t in step.outputs.items() if t == "parameter"}
    return {"inputs": {"parameterValues": params}, "outputs": {"parameters": outp, "artifacts": arts,
                                                              "outputFile": str(outdir / "executor_output.json")}}


def kfp_argv(step: Step, values: dict, outdir: Path) -> list[str]:
    """The container's command and args, its ``{{$}}`` resolved: ``sh -ec <script> <source> --executor_input ...``."""
    ei = json.dumps(executor_input(step, values, outdir))
    return [*step.command, *[ei if a == "{{$}}" else a for a in step.args]]


def elyra_argv(step: Step, values: dict, outdir: Path) -> list[str]:
    """The v1 component's command and args, inputValue/outputPath resolved (Elyra's node values or the defaults)."""
    argv = list(step.command)
    for a in step.args:
        if isinstance(a, str):
            argv.append(a)
        elif "inputValue" in a:
            n = a["inputValue"]
            v = values[n] if n in values else step.inputs[n]
            assert v is not None, f"{step.key}: no value for the required input {n}"
            argv.append(str(v))
        elif "outputPath" in a:
            outdir.mkdir(parents=True, exist_ok=True)
            argv.append(str(outdir / a["outputPath"]))
        else:
            raise AssertionError(f"{step.key}: unknown placeholder {a}")
    return argv
