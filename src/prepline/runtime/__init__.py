"""Executors: run one phase's tasks on workers and hand each result back as it arrives.

Both runtimes share one dispatch loop (:mod:`prepline.runtime.dispatch`: the next task goes to
whichever worker is free, so skewed file sizes do not stall a run; a task whose worker died runs
again) and build one :class:`~prepline.worker.Worker` per worker process or actor, so models load
once per worker.
"""

from __future__ import annotations

from typing import Protocol

from prepline.context import WorkerSpec
from prepline.progress import Report
from prepline.runtime.dispatch import OnResult
from prepline.runtime.options import RunOptions

__all__ = ["Executor", "OnResult", "RunOptions", "make_executor"]


class Executor(Protocol):
    workers: int
    #: {"retried": tasks run again after a lost worker or a transient fault}
    stats: dict

    def run(self, spec: WorkerSpec, tasks: list, on_result: OnResult, on_progress: Report | None = None) -> bool:
        """Run ``tasks``; call ``on_result`` for each; stop early (return False) when it says so.
        ``on_progress(task key, docs, bytes)`` hears from running tasks (any thread, best effort)."""

    def close(self) -> None:
        """Stop the workers once their tasks are done."""

    def abort(self) -> None:
        """Stop the workers now (the run was interrupted)."""


def make_executor(options: RunOptions) -> Executor:
    if options.runtime == "ray":
        from prepline.runtime.ray import RayExecutor

        return RayExecutor(options.workers, options.cpus_per_worker, options.ray_address, options.task_retries, options.task_timeout,
                           options.gpus_per_worker)
    from prepline.runtime.local import LocalExecutor

    return LocalExecutor(options.workers, options.task_retries, options.task_timeout)
