"""What the steps around a spec pipeline's stages do, as plain functions: the KFP components
(:mod:`prepline.components.pipeline_steps`) and the Elyra catalog entries
(:mod:`prepline.elyra_pipeline`) both call these. No kfp import here.
"""

from __future__ import annotations

import json

from prepline import logs
from prepline.stage_params import deep_merge


def plan_step(spec_json: str, *, input_path: str, work_root: str, run_id: str, languages: list, input_format: str,
              text_column: str, overrides_json: str, cluster_json: str, text_field: str = "") -> tuple[str, str]:
    """Resolve the spec for the run and write ``<work_root>/<run>/plan.json``; returns (its path, a Markdown table)."""
    from prepline.pipelines import spec as specs
    from prepline.pipelines.plan import make_plan, plan_markdown, write_plan
    from prepline.stages import _json

    plan = make_plan(specs.load(json.loads(spec_json)), input_path=input_path, work_root=work_root, run_id=run_id,
                     languages=languages, text_column=text_column, text_field=text_field, input_format=input_format,
                     overrides=_json("overrides_json", overrides_json, {}), cluster=_json("cluster_json", cluster_json, {}))
    from prepline.preflight import check_plan_input

    check_plan_input(plan)  # the text column or field in the input's first file, before any cluster starts
    return write_plan(plan), plan_markdown(plan)


def tokenizer_step(work_root: str, run_id: str) -> dict:
    """Train the run's shared tokenizer on the branch folders the plan names, into the folder it names
    (prepline.tokens.shared.train_shared_tokenizer); returns the record plus ``output``."""
    from prepline.pipelines.plan import read_plan
    from prepline.tokens.shared import train_shared_tokenizer

    t = read_plan(work_root, run_id)["tokenizer"]
    record = {**train_shared_tokenizer(t["inputs"], t["output"], t["params"]), "output": t["output"]}
    logs.say(None, "prepline.tokens", f"tokenizer: {record['vocab_size']:,} ids from {record['train_chars']:,} characters of "
                                      f"{', '.join(t['languages'])} -> {record['output']}")
    return record


def check_step(work_root: str, run_id: str) -> dict:
    """Account for every document of the run (conservation.json); raise RunFailed when it does not hold."""
    from prepline.pipelines.conservation import account, check, summary_lines
    from prepline.pipelines.plan import read_plan

    plan = read_plan(work_root, run_id)
    result = account(plan)
    for line in summary_lines(result):
        logs.say(None, "prepline.pipelines", line)
    return check(plan, result)


def report_step(work_root: str, run_id: str, output: str | None = None) -> str:
    """Write the run's HTML report (prepline.report) to ``<work_root>/<run>/report.html``, and to
    ``output`` too when given (a KFP HTML artifact); returns the run folder's copy."""
    from prepline.report import run_folder, write_report

    run = run_folder(work_root, run_id)
    if output:
        write_report(run, output)
    path = write_report(run)
    logs.say(None, "prepline.report", f"the run's report: {path}")
    return path


def train_params(defaults_json: str, train_params_json: str) -> str:
    """The training parameters: ``train_params_json`` merged over the spec's ``defaults_json``."""
    from prepline.stages import _json

    return json.dumps(deep_merge(_json("defaults_json", defaults_json, {}), _json("train_params_json", train_params_json, {})))
