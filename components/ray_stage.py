"""The four components of a stage: prepare_args, start_ray_cluster, execute_ray_job, stop_ray_cluster.

Thin, typed KFP lightweight components: each body imports prepline and calls one function of
:mod:`prepline.stages`, where the logic lives and is unit-tested without KFP. All of them run in
the launcher image (:mod:`prepline.images`; the pipelines set it from their ``launcher_image``
parameter); nothing here reads the environment at compile time.
"""

from kfp import dsl
from kfp.dsl import Markdown, Metrics, Output

from prepline.images import LAUNCHER_IMAGE

_component = dsl.component(base_image=LAUNCHER_IMAGE, install_kfp_package=False)

#: what prepare_args returns for a stage the run's plan does not run for this branch
SKIP = "skip"


@_component
def prepare_args(
    transform: str,
    params_json: str,
    overrides_json: str,
    work_root: str,
    run_id: str,
    stage: str,
    branch: str,
    input_path: str,
    input_stage: str,
    input_from_split: bool,
    cluster_json: str,
    run_id_override: str = "",
    from_plan: bool = False,
) -> str:
    """Validate the stage's parameters (a bad one fails here, before any cluster starts) and compute
    its input and output paths, merged cluster settings and cluster name from the run id, the stage
    and the branch (paths from ``run_id_override`` instead when it is set: a chained child run
    writes under its parent's run); with ``from_plan``, all of it from the run's plan.json.
    Returns the prepared stage as JSON, or 'skip' when the plan does not run it for this branch."""
    import json

    from prepline.stages import prepare

    r = prepare(transform, params_json, work_root, run_id, stage, branch, input_path, input_stage, input_from_split,
                cluster_json, overrides_json, run_id_override, from_plan)
    if not r["run"]:
        print(f"[prepline] {stage}{' (' + branch + ')' if branch else ''}: not run: {r['reason']}", flush=True)
        return "skip"
    return json.dumps(r, sort_keys=True)


@_component
def start_ray_cluster(prepared: str, provider: str, provider_json: str, timeout_seconds: int, ray_image: str = "",
                      s3_secret_name: str = "") -> str:
    """Create the stage's Ray cluster (KubeRay, or a local Ray head) and wait until it accepts jobs; fail
    at once with the reason when it cannot start. Its pods run ``ray_image`` (unless the cluster
    settings name an image) and get every key of ``s3_secret_name`` (unless they set env_from_secrets)."""
    import json

    from prepline.stages import start

    p = json.loads(prepared)
    return start(provider, provider_json, p["cluster_json"], p["run_id"], p["stage"], p["branch"], timeout_seconds,
                 image=ray_image, s3_secret_name=s3_secret_name)


@_component
def execute_ray_job(
    prepared: str,
    provider: str,
    provider_json: str,
    max_failed_files: int,
    timeout_seconds: int,
    summary: Output[Markdown],
    metrics: Output[Metrics],
) -> int:
    """Run the transform as a Ray job, stream its logs (with its progress lines), then check its
    metadata.json: the step fails when the job fails, when files failed beyond the tolerance, or when
    the counts do not add up. The Markdown and Metrics show the documents, the removals by reason, the
    transform's own headline numbers and the time (work apart from start-up). Returns the number of
    documents written."""
    import json

    from prepline.stages import execute, metrics_of, summary_markdown

    p = json.loads(prepared)
    meta = execute(provider, provider_json, p["cluster_json"], p["run_id"], p["stage"], p["branch"], p["transform"],
                   p["config_json"], p["input_path"], p["output_path"], p["workers"], max_failed_files, timeout_seconds,
                   allow_empty_output=p.get("allow_empty_output", False))
    with open(summary.path, "w") as f:
        f.write(summary_markdown(meta, p["stage"] + (f" ({p['branch']})" if p["branch"] else "")))
    for k, v in metrics_of(meta).items():
        metrics.log_metric(k, v)
    return int(meta["totals"]["docs_out"])


@_component
def stop_ray_cluster(provider: str, provider_json: str, cluster_json: str, overrides_json: str, run_id: str, stage: str, branch: str,
                     work_root: str = "", from_plan: bool = False, run_id_override: str = ""):
    """Exit task: delete the stage's cluster, whatever happened before. Fails loudly if it cannot."""
    from prepline.stages import stop

    stop(provider, provider_json, cluster_json, run_id, stage, branch, overrides_json, work_root, from_plan, run_id_override)


COMPONENTS = {c.name.replace("-", "_"): c for c in (prepare_args, start_ray_cluster, execute_ray_job, stop_ray_cluster)}
