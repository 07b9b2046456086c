"""The steps of a spec pipeline around its stages: plan (first), train_tokenizer (between the
branches' stages and their tokenization), check_documents (after the last data stage) and
run_report (last: the run's HTML report, an ``HTML`` artifact the KFP UI shows).

Thin lightweight components in the launcher image, no Ray: their bodies call
:mod:`prepline.pipelines.plan`, :func:`prepline.tokens.shared.train_shared_tokenizer`,
:mod:`prepline.pipelines.conservation` and :mod:`prepline.report`, where the logic lives and is tested without KFP. They
talk to the stages through files in the run folder (``<work_root>/<run>/plan.json``,
``tokenizer/``, ``conservation.json``), as the stages talk to each other.
"""

from kfp import dsl
from kfp.dsl import HTML, Markdown, Metrics, Output

from prepline.images import LAUNCHER_IMAGE

_component = dsl.component(base_image=LAUNCHER_IMAGE, install_kfp_package=False)


@_component
def plan_run(
    spec_json: str,
    input_path: str,
    work_root: str,
    run_id: str,
    languages: list,
    input_format: str,
    text_column: str,
    overrides_json: str,
    cluster_json: str,
    summary: Output[Markdown],
    text_field: str = "",
) -> str:
    """Resolve the pipeline spec for this run: the input's format (ingest first when it is not
    Parquet), which stages run for which branch and what each reads, and every stage's parameters
    and cluster (the spec's, the transform's per-language defaults, overrides_json, merged; what
    the shape requires, wired). Every stage's parameters are checked here, before any cluster
    starts. Writes <work_root>/<run>/plan.json, which the stages read; returns its path."""
    from prepline.pipelines.steps import plan_step

    path, table = plan_step(spec_json, input_path=input_path, work_root=work_root, run_id=run_id, languages=languages,
                            input_format=input_format, text_column=text_column, text_field=text_field, overrides_json=overrides_json,
                            cluster_json=cluster_json)
    with open(summary.path, "w") as f:
        f.write(table)
    return path


@_component
def train_tokenizer(work_root: str, run_id: str) -> str:
    """Train the run's one tokenizer on a sample of every branch (the plan says which stage's output),
    into <work_root>/<run>/tokenizer; every branch's tokenization then loads it. A retried step
    with the same inputs returns at once. Returns the tokenizer folder."""
    from prepline.pipelines.steps import tokenizer_step

    return tokenizer_step(work_root, run_id)["output"]


@_component
def check_documents(work_root: str, run_id: str, summary: Output[Markdown], metrics: Output[Metrics]) -> str:
    """Every input document accounted for: input = final outputs + removed (by stage and reason) +
    kept aside (languages without a branch), and each stage read what the one before it wrote;
    from the stages' metadata.json. Fails the run when it does not hold. Writes
    <work_root>/<run>/conservation.json; returns its summary line."""
    from prepline.pipelines.conservation import account, summary_lines
    from prepline.pipelines.plan import read_plan
    from prepline.pipelines.steps import check_step

    result = account(read_plan(work_root, run_id))
    with open(summary.path, "w") as f:
        f.write("## documents\n\n" + "\n".join(summary_lines(result)) + "\n")
    for k in ("input", "outputs_total", "removed_total", "sinks_total"):
        metrics.log_metric(k, result[k])
    return summary_lines(check_step(work_root, run_id))[0]


@_component
def run_report(work_root: str, run_id: str, report: Output[HTML]) -> str:
    """Write the run's report (documents per stage and branch, removals by reason, the language mix,
    time per stage as work and start-up, the training loss, the accounting of every document, a
    link to every stage's metadata.json) from what the steps wrote under <work_root>/<run>: into
    the HTML artifact and next to the stages as report.html. Returns where that copy is."""
    from prepline.pipelines.steps import report_step

    return report_step(work_root, run_id, report.path)


COMPONENTS = {c.name.replace("-", "_"): c for c in (plan_run, train_tokenizer, check_documents, run_report)}
