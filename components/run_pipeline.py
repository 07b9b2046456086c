"""run_pipeline: start a pre-uploaded pipeline as a child run through the KFP API and wait for it.

The building block of SDK-chained pipelines (:mod:`prepline.pipelines.chained`), for backends
that cannot nest pipelines: each step of the parent starts one child run ("N+1 runs"), follows
it, and fails when the child fails or is canceled. A thin lightweight component in the launcher
image; the logic is :func:`prepline.kfp_client.run_child`, tested against a local fake KFP server.
"""


from kfp import dsl

from prepline.images import LAUNCHER_IMAGE

_component = dsl.component(base_image=LAUNCHER_IMAGE, install_kfp_package=False)


@_component
def run_pipeline(
    pipeline_name: str,
    parameters: dict = {},
    pipeline_version: str = "",
    parent_run_id: str = "",
    inherit_parameters: bool = True,
    run_id_parameter: str = "run_id",
    item: str = "",
    item_parameter: str = "",
    run_name: str = "",
    experiment: str = "",
    host: str = "",
    namespace: str = "",
    timeout_seconds: int = 0,
    poll_seconds: int = 10,
) -> str:
    """Start the uploaded pipeline ``pipeline_name`` (``pipeline_version``, default the newest) and
    wait for it; the step fails unless the child run SUCCEEDED. Returns the child's run id.

    The child's parameters, later ones winning: with ``parent_run_id`` (pass
    ``dsl.PIPELINE_JOB_ID_PLACEHOLDER``) and ``inherit_parameters``, the parent run's values of the
    parameters the child also declares (read through the API); ``parameters``; the parent run id as
    ``run_id_parameter``; ``item`` as ``item_parameter`` (e.g. a ParallelFor item as "branch").
    Everything is checked against the child's pipeline spec before the run is posted. The child
    goes into ``experiment`` (default: the parent's). A child of the same parent and name that
    already SUCCEEDED is not started again (retries resume). ``host``/``namespace`` default to the
    in-cluster API; the bearer token comes from $KF_PIPELINES_TOKEN or the service-account token
    file. ``timeout_seconds`` 0 waits without limit."""
    from prepline.kfp_client import KfpClient, resolve_connection, run_child

    client = KfpClient(resolve_connection(host or None, namespace or None))
    result = run_child(
        client, pipeline_name, parameters, pipeline_version=pipeline_version, parent_run_id=parent_run_id,
        inherit_parameters=inherit_parameters, run_id_parameter=run_id_parameter, item=item, item_parameter=item_parameter,
        run_name=run_name, experiment=experiment, timeout=timeout_seconds or None, poll=poll_seconds,
    )
    return result["run_id"]


COMPONENTS = {"run_pipeline": run_pipeline}
