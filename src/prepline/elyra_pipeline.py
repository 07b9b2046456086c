"""Elyra's generated tree (``elyra_templates/``, :func:`sync`): the catalog, a pipeline spec as a
``.pipeline`` template (the shipped super pipeline's, and ``doc_id``'s as the simple example), and the
catalog entries of the steps around a spec's stages (plan, train_tokenizer, check_documents,
fine_tune, run_report) with their entrypoint. The transforms' entries, nodes and documents come from
:mod:`prepline.elyra`.

The template has the nested KFP pipeline's steps as nodes: ``plan`` first (it writes the run's
plan.json), ``ingest`` and the global stages, one chain of branch stages per language of the spec
(a stage that runs only for some languages has nodes for those only), ``train_tokenizer`` after
every branch's chain, each branch's ``tokenization``, ``check_documents``, ``fine_tune``, then
``run_report``.
Stage nodes run with ``from_plan=true``: their input, parameters and cluster come from the plan
(so ingest passes when the input is Parquet), and their own transform values are not used.
Elyra's templates are static: the branches are the spec's languages (a node value of plan and
fine_tune, not a pipeline parameter).

    python -m prepline.elyra_pipeline plan --spec-json '{...}' --input-path ... --work-root ... --run-id r1
    python scripts/gen_elyra.py [--check]        # (re)generate elyra_templates/
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from prepline import logs, registry, s3_credentials, stage_params
from prepline.elyra import (CATALOG_SUBDIR, CATALOG_TYPE, RUN_ID_PLACEHOLDER, STAGE_INPUTS, _KFP_TYPE, _inputs_values, _parse_list, _yaml,
                            component_file, component_spec, document, raw_node, stage_inputs, stage_node)
from prepline.errors import PreplineError, exit_code
from prepline.gentree import sync_tree, write_files
from prepline.images import DEFAULT as DEFAULT_IMAGES
from prepline.images import ImageSet
from prepline.pipelines import spec as specs

_P = stage_params.PARAMS
_CREDS = ("s3_credentials", "String", s3_credentials.DEFAULT_PATH, True, dict((n, h) for n, *_, h in STAGE_INPUTS)["s3_credentials"])


def _pp(name: str, required: bool = False, pipeline: bool = True, default: Any = None) -> tuple:
    """(name, KFP type, default, pipeline parameter?, help) of a stage_params parameter."""
    p = _P[name]
    d = None if required else (default if default is not None else json.dumps(p.default) if p.type is list else p.default)
    return (name, _KFP_TYPE[p.type], d, pipeline, p.help)


_RUN = [_pp("work_root", required=True), ("run_id", "String", RUN_ID_PLACEHOLDER, False,
                                           "Run id shared by the steps of one run; the default is KFP's run uuid."), _CREDS]
#: step name -> (image kind, inputs, description)
STEPS: dict[str, tuple[str, list[tuple], str]] = {
    "plan": ("launcher", [("spec_json", "String", "{}", False, "The pipeline spec as JSON (set by the template)."),
                          _pp("input_path", required=True), *_RUN, _pp("languages", pipeline=False), _pp("input_format"),
                          _pp("text_column"), _pp("text_field"), _pp("overrides_json"), _pp("cluster_json")],
             "Resolve the pipeline spec for the run (input format, stages per branch, every stage's parameters) and write "
             "<work_root>/<run>/plan.json, which the stage nodes read."),
    "train_tokenizer": ("launcher", list(_RUN), "Train the run's one tokenizer on a sample of every branch (<work_root>/<run>/tokenizer)."),
    "check_documents": ("launcher", list(_RUN), "Check that every input document is accounted for (output, removed by reason, or "
                                                "kept aside); fail otherwise. Writes <work_root>/<run>/conservation.json."),
    "fine_tune": ("trainer", [*_RUN, _pp("languages", pipeline=False), _pp("train_languages"), _pp("train_mode"),
                              _pp("train_params_json"), ("defaults_json", "String", "{}", False,
                                                         "The pipeline spec's training parameters (train_params_json wins)."),
                              _pp("trainjob_json"), _pp("train_timeout_seconds"), _pp("s3_secret_name")],
                  "Fine-tune a causal LM on every branch's token output (locally in the node's pod, or as a Kubeflow TrainJob)."),
    "run_report": ("launcher", list(_RUN), "Write the run's HTML report (documents, removals, languages, time per stage, the "
                                           "training loss; charts) to <work_root>/<run>/report.html."),
}
RESULT = ("result", "String", "What the step produced (a path, or the accounting).")


def step_id(step: str) -> str:
    import hashlib

    return f"{CATALOG_TYPE}:{hashlib.sha256(component_file(step).encode()).hexdigest()[:12]}"


def step_spec(step: str, images: ImageSet = DEFAULT_IMAGES) -> dict:
    """The KFP v1 component.yaml of one step."""
    kind, inputs, desc = STEPS[step]
    args: list[Any] = [step]
    for n, *_ in inputs:
        args += ["--" + n.replace("_", "-"), {"inputValue": n}]
    args += ["--result-file", {"outputPath": RESULT[0]}]
    return {
        "name": f"prepline {step}",
        "description": f"{desc} Generated from prepline: do not edit.",
        "inputs": [{"name": n, "type": t, "description": h, **({} if v is None else {"default": str(v), "optional": True})}
                   for n, t, v, _, h in inputs],
        "outputs": [{"name": RESULT[0], "type": RESULT[1], "description": RESULT[2]}],
        "implementation": {"container": {"image": images.image(kind), "command": ["python", "-m", "prepline.elyra_pipeline"],
                                         "args": args}},
    }


# ----------------------------------------------------------------------------------------------
# the entrypoint


def run_step(step: str, a: dict[str, str]) -> str:
    from prepline.pipelines import steps

    if step == "plan":
        path, table = steps.plan_step(a["spec_json"], input_path=a["input_path"], work_root=a["work_root"], run_id=a["run_id"],
                                      languages=_parse_list("languages", a["languages"]), input_format=a["input_format"],
                                      text_column=a["text_column"], text_field=a.get("text_field", ""), overrides_json=a["overrides_json"],
                                      cluster_json=a["cluster_json"])
        print(table, flush=True)
        return path
    if step == "train_tokenizer":
        return steps.tokenizer_step(a["work_root"], a["run_id"])["output"]
    if step == "check_documents":
        from prepline.pipelines.conservation import summary_lines

        return summary_lines(steps.check_step(a["work_root"], a["run_id"]))[0]
    if step == "run_report":
        return steps.report_step(a["work_root"], a["run_id"])
    from prepline.train.step import fine_tune

    s = fine_tune(a["train_mode"], a["work_root"], a["run_id"], _parse_list("languages", a["languages"]),
                  _parse_list("train_languages", a["train_languages"]), steps.train_params(a["defaults_json"], a["train_params_json"]),
                  a["trainjob_json"], a["s3_secret_name"], float(a["train_timeout_seconds"]))
    return s["model"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m prepline.elyra_pipeline", description="Run one step of a prepline spec pipeline (Elyra).")
    sub = ap.add_subparsers(dest="step", required=True)
    for step, (_, inputs, desc) in STEPS.items():
        r = sub.add_parser(step, help=desc)
        for n, _, v, _, h in inputs:
            r.add_argument("--" + n.replace("_", "-"), dest=n, default="" if v is None else str(v), help=h)
        r.add_argument("--result-file", default="", help="write the step's result here (KFP output)")
    a = ap.parse_args(argv)
    logs.setup()
    args = vars(a)
    try:
        if "{{" in args.get("run_id", "") or not args.get("run_id"):
            from prepline.errors import ConfigError

            raise ConfigError(f"run_id {args.get('run_id')!r} is empty or an unresolved placeholder", "run the step under KFP or pass --run-id")
        s3_credentials.apply(a.s3_credentials if a.s3_credentials != s3_credentials.DEFAULT_PATH else None)
        result = run_step(a.step, args)
    except PreplineError as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_code(e)
    if a.result_file:
        Path(a.result_file).parent.mkdir(parents=True, exist_ok=True)
        Path(a.result_file).write_text(result)
    return 0


# ----------------------------------------------------------------------------------------------
# the template


def _step_node(tpl: str, step: str, pos: tuple[int, int], parents, values: dict) -> dict:
    params = _inputs_values(STEPS[step][1], values)
    params[f"output_{RESULT[0]}"] = ""
    return raw_node(tpl, step_id(step), step, pos, parents, params, f"prepline {step}: {STEPS[step][2]}")


def spec_template(spec=None, images: ImageSet = DEFAULT_IMAGES) -> dict:
    """The Elyra template of a pipeline spec (default: the shipped super pipeline); see the module doc."""
    from prepline.pipelines.spec import INGEST

    spec = spec or specs.shipped()
    tpl = spec.name
    langs = list(spec.branches.languages) if spec.branches else []
    plan = _step_node(tpl, "plan", (80, 80), None, {"spec_json": spec.to_json(), "languages": json.dumps(langs)})
    nodes, col, used = [plan], 1, ["plan"]

    def add(s: str, branch: str, parents, row: int, col: int) -> str:
        label = f"{s}-{branch}" if branch else s
        n = stage_node(tpl, s, label, (80 + 220 * col, 80 + 160 * row), parents, {"from_plan": "true", "branch": branch}, {})
        nodes.append(n)
        return n["id"]

    last: list[str] = [plan["id"]]
    for s in ([INGEST] if INGEST in registry.names() else []) + [s.name for s in spec.stages]:
        last, col = [add(s, "", last, 0, col)], col + 1
    names = [s.name for s in spec.branch_stages]
    cut = spec.tokenizer_split()
    for gi, group in enumerate([names[:cut], names[cut:]] if cut is not None else [names]):
        if gi == 1:
            nodes.append(_step_node(tpl, "train_tokenizer", (80 + 220 * col, 80), last, {}))
            last, col = [nodes[-1]["id"]], col + 1
            used.append("train_tokenizer")
        ends, width = [], 0
        for row, lang in enumerate(langs):
            prev, c = last, col
            for s in group:
                if spec.stage(s).runs_for(lang):
                    prev, c = [add(s, lang, prev, row, c)], c + 1
            width = max(width, c - col)
            ends += prev
        last, col = ends, col + width
    nodes.append(_step_node(tpl, "check_documents", (80 + 220 * col, 80), last, {}))
    used.append("check_documents")
    if spec.train:
        nodes.append(_step_node(tpl, "fine_tune", (80 + 220 * (col + 1), 80), [nodes[-1]["id"]],
                                {"languages": json.dumps(langs), "defaults_json": json.dumps(spec.train_params, sort_keys=True)}))
        used.append("fine_tune")
    nodes.append(_step_node(tpl, "run_report", (80 + 220 * (col + 1 + bool(spec.train)), 80), [nodes[-1]["id"]], {}))
    used.append("run_report")
    inputs = stage_inputs(images) + [i for st in used for i in STEPS[st][1]]
    return document(tpl, spec.kfp_name(), spec.summary(), nodes, images, inputs)


# ----------------------------------------------------------------------------------------------
# the generated tree


def simple_template(transform: str, images: ImageSet = DEFAULT_IMAGES) -> dict:
    node = stage_node(transform, transform, transform, (80, 80), None, {}, {})
    return document(transform, f"prepline-{transform.replace('_', '-')}",
                    f"prepline {transform}: {registry.get(transform).summary}", [node], images)


TEMPLATE_TRANSFORM = "doc_id"


def generate(images: ImageSet = DEFAULT_IMAGES) -> dict[str, str]:
    """Every generated file of elyra_templates/ by its relative path."""
    files = {f"{CATALOG_SUBDIR}/{component_file(t)}": _yaml(component_spec(t, images)) for t in registry.names()}
    files.update({f"{CATALOG_SUBDIR}/{component_file(s)}": _yaml(step_spec(s, images)) for s in STEPS})
    if TEMPLATE_TRANSFORM in registry.names():
        files[f"{TEMPLATE_TRANSFORM}.pipeline"] = json.dumps(simple_template(TEMPLATE_TRANSFORM, images), indent=2) + "\n"
    for shipped in map(specs.shipped, specs.shipped_names()):
        files[f"{shipped.name}.pipeline"] = json.dumps(spec_template(shipped, images), indent=2, ensure_ascii=False) + "\n"
    return files


def sync(target: Path, check: bool = False, images: ImageSet = DEFAULT_IMAGES, plugins: bool = False) -> list[str]:
    """Compare the generated files of ``target`` (*.yaml under the catalog folder and *.pipeline)
    with :func:`generate`; unless ``check``, write the differences. Returns them. The repository's
    elyra_templates/ hold the built-ins only; ``plugins`` adds a catalog entry per installed plug-in."""
    with registry.scope(plugins):
        files = generate(images)
    return sync_tree(write_files(files), target, [f"{CATALOG_SUBDIR}/*.yaml", "*.pipeline"], check=check)


if __name__ == "__main__":
    sys.exit(main())
