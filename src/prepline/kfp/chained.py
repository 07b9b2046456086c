"""Chaining: start a pre-uploaded pipeline as a child run and wait for it (the ``run_pipeline``
component behind :mod:`prepline.pipelines.chained`, the "N+1 runs" super pipeline)."""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import sys

from prepline import logs
from prepline.errors import ConfigError
from prepline.kfp.client import TERMINAL_STATES, ChildRunFailed, KfpClient, KfpError, _run_state
from prepline.kfp.params import check_parameters, check_secret_names, root_inputs

def child_run_name(pipeline_name: str, parent_run_id: str, item: str = "") -> str:
    return f"{pipeline_name}{'-' + item if item else ''} (child of {parent_run_id})"


def run_child(
    client: KfpClient,
    pipeline_name: str,
    parameters: dict | None = None,
    *,
    pipeline_version: str = "",
    parent_run_id: str = "",
    inherit_parameters: bool = True,
    run_id_parameter: str = "run_id",
    item: str = "",
    item_parameter: str = "",
    run_name: str = "",
    experiment: str = "",
    timeout: float | None = None,
    poll: float = 10.0,
    out=None,
) -> dict:
    """Start ``pipeline_name`` (uploaded; ``pipeline_version`` or the newest) and wait for it.

    Parameters of the child, later ones winning: the parent run's parameter values that the child
    also declares (``inherit_parameters``, read from the parent run through the API, so nothing
    depends on placeholder resolution inside struct inputs); ``parameters``; ``parent_run_id`` as
    ``run_id_parameter``; ``item`` as ``item_parameter`` (a ParallelFor item). All are checked
    against the child's root inputs before the run is posted. With a parent, a child run of the same
    name that SUCCEEDED is reused and one still going is waited for (so a retried step or a retried
    parent run does not start a stage twice). Raises ChildRunFailed unless the child SUCCEEDED."""
    out = out if out is not None else sys.stdout
    p = client.pipeline(pipeline_name)
    v = client.version(p, pipeline_version)
    spec = client.version_spec(v)
    if spec is None:
        raise KfpError(f"the server returned no pipeline spec for {pipeline_name}/{v.display_name}", "re-upload the pipeline")
    inputs = root_inputs(spec)
    params: dict = {}
    parent = client.get_run(parent_run_id) if parent_run_id else None
    if parent is not None and inherit_parameters:
        params.update({k: val for k, val in client.effective_parameters(parent).items() if k in inputs})
    params.update(parameters or {})
    if parent_run_id and run_id_parameter:
        if run_id_parameter not in inputs:
            raise ConfigError(f"pipeline {pipeline_name} ({v.display_name}) has no parameter {run_id_parameter} to receive the parent's run id",
                              "upload the pipeline compiled by this prepline version (prepline kfp upload compiled/pipelines/...), or pass run_id_parameter=''")
        params[run_id_parameter] = parent_run_id
    if item_parameter:
        params[item_parameter] = item
    params = check_parameters(pipeline_name, inputs, params)
    check_secret_names(pipeline_name, spec, params)
    exp_id = client.experiment(experiment).experiment_id if experiment else (parent.experiment_id if parent else client.experiment("Default").experiment_id)
    name = run_name or (child_run_name(pipeline_name, parent_run_id, item) if parent_run_id else
                        f"{pipeline_name}{'-' + item if item else ''} {dt.datetime.now().strftime('%Y-%m-%d %H-%M-%S')}")

    run = None
    if parent_run_id:
        existing, _, _ = client.list_runs(name=name, page_size=20)
        existing = [r for r in existing if r.display_name == name and r.experiment_id == exp_id]
        for r in existing:
            if _run_state(r) == "SUCCEEDED":
                logs.say(out, "prepline.kfp", f"{name}: run {r.run_id} already SUCCEEDED; not started again")
                return {"run_id": r.run_id, "state": "SUCCEEDED", "reused": True, "url": f"{client.conn.ui}/#/runs/details/{r.run_id}"}
        going = [r for r in existing if _run_state(r) not in TERMINAL_STATES]
        if going:
            run = going[0]
            logs.say(out, "prepline.kfp", f"{name}: waiting for run {run.run_id} ({_run_state(run)}) started earlier")
    if run is None:
        run = client.create_run(experiment_id=exp_id, display_name=name, parameters=params, pipeline_id=p.pipeline_id,
                                version_id=v.pipeline_version_id)
        logs.say(out, "prepline.kfp", f"started {pipeline_name} ({v.display_name}) as run {run.run_id}: "
                                      f"{client.conn.ui}/#/runs/details/{run.run_id}")
    url = f"{client.conn.ui}/#/runs/details/{run.run_id}"

    def report(r):
        logs.say(out, "prepline.kfp", f"{name}: {_run_state(r)}")

    def on_term(signum, frame):  # the parent step is being stopped: stop the child too
        try:
            client.terminate(run.run_id)
            logs.say(out, "prepline.kfp", f"terminated child run {run.run_id}")
        finally:
            raise KeyboardInterrupt

    old_handler = None
    with contextlib.suppress(ValueError):  # only the main thread may set signal handlers
        old_handler = signal.signal(signal.SIGTERM, on_term)
    try:
        final = client.wait(run.run_id, timeout=timeout, poll=poll, on_change=report)
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
    state = _run_state(final)
    if state != "SUCCEEDED":
        why = final.error.message if final.error and final.error.message else "see the child run"
        raise ChildRunFailed(f"child run {name} ({run.run_id}) of pipeline {pipeline_name} ended {state}: {why}", f"open {url}")
    return {"run_id": run.run_id, "state": state, "reused": False, "url": url}

