"""Executors: run one phase's tasks on workers and hand each result back as it arrives.

Both runtimes dispatch dynamically (the next task goes to whichever worker is free), so skewed
file sizes do not stall a run, and both build one :class:`~prepline.engine.Worker` per worker
process or actor, so models load once per worker.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from prepline.engine import RunOptions, WorkerSpec

OnResult = Callable[[Any, dict], bool]


class Executor(Protocol):
    workers: int

    def run(self, spec: WorkerSpec, tasks: list, on_result: OnResult) -> bool:
        """Run ``tasks``; call ``on_result`` for each; stop early (return False) when it says so."""

    def close(self) -> None: ...


def make_executor(options: RunOptions) -> Executor:
    if options.runtime == "ray":
        from prepline.runtime.ray import RayExecutor

        return RayExecutor(options.workers, options.cpus_per_worker, options.ray_address)
    from prepline.runtime.local import LocalExecutor

    return LocalExecutor(options.workers)
