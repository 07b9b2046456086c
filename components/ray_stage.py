"""The four components of a stage: prepare_args, start_ray_cluster, execute_ray_job, stop_ray_cluster.

Thin, typed KFP lightweight components: each body imports prepline and calls one function of
:mod:`prepline.stages`, where the logic lives and is unit-tested without KFP. All of them run in
the launcher image (:mod:`prepline.images`; the pipelines set it from their ``launcher_image``
parameter); nothing here reads the environment at compile time.
"""


from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Markdown, Metrics, Output

from prepline.images import LAUNCHER_IMAGE

_component = dsl.component(base_image=LAUNCHER_IMAGE, install_kfp_package=False)


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
) -> NamedTuple("PreparedStage", [("config_json", str), ("input_path", str), ("output_path", str), ("cluster_name", str), ("workers", int)]):
    """Validate the stage's parameters (a bad one fails here, before any cluster starts) and compute
    its input and output paths and cluster name from the run id, the stage and the branch
    (paths from ``run_id_override`` instead when it is set: a chained child run writes under its parent's run)."""
    from collections import namedtuple

    from prepline.stages import prepare

    r = prepare(transform, params_json, work_root, run_id, stage, branch, input_path, input_stage, input_from_split,
                cluster_json, overrides_json, run_id_override)
    out = namedtuple("PreparedStage", ["config_json", "input_path", "output_path", "cluster_name", "workers"])
    return out(r["config_json"], r["input_path"], r["output_path"], r["cluster_name"], r["workers"])


@_component
def start_ray_cluster(
    provider: str, provider_json: str, cluster_json: str, overrides_json: str, run_id: str, stage: str, branch: str,
    timeout_seconds: int, ray_image: str = "", s3_secret_name: str = "",
) -> str:
    """Create the stage's Ray cluster (KubeRay, or a local Ray head) and wait until it accepts jobs; fail
    at once with the reason when it cannot start. Its pods run ``ray_image`` (unless cluster_json names
    an image) and get every key of ``s3_secret_name`` (unless cluster_json sets env_from_secrets)."""
    from prepline.stages import start

    return start(provider, provider_json, cluster_json, run_id, stage, branch, timeout_seconds, overrides_json,
                 image=ray_image, s3_secret_name=s3_secret_name)


@_component
def execute_ray_job(
    provider: str,
    provider_json: str,
    cluster_json: str,
    overrides_json: str,
    run_id: str,
    stage: str,
    branch: str,
    transform: str,
    config_json: str,
    input_path: str,
    output_path: str,
    workers: int,
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
    from prepline.stages import execute, metrics_of, summary_markdown

    meta = execute(provider, provider_json, cluster_json, run_id, stage, branch, transform, config_json, input_path,
                   output_path, workers, max_failed_files, timeout_seconds, overrides_json=overrides_json)
    with open(summary.path, "w") as f:
        f.write(summary_markdown(meta, stage + (f" ({branch})" if branch else "")))
    for k, v in metrics_of(meta).items():
        metrics.log_metric(k, v)
    return int(meta["totals"]["docs_out"])


@_component
def stop_ray_cluster(provider: str, provider_json: str, cluster_json: str, overrides_json: str, run_id: str, stage: str, branch: str):
    """Exit task: delete the stage's cluster, whatever happened before. Fails loudly if it cannot."""
    from prepline.stages import stop

    stop(provider, provider_json, cluster_json, run_id, stage, branch, overrides_json)


COMPONENTS = {c.name.replace("-", "_"): c for c in (prepare_args, start_ray_cluster, execute_ray_job, stop_ray_cluster)}
