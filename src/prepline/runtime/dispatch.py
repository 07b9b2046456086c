"""The one dispatch loop both executors share.

A :class:`Backend` runs one task on one of its workers and reports when tasks finish; the loop
keeps every worker busy (the next task goes to whichever worker is free, so skewed file sizes do
not stall a run; a backend may queue one more per worker, as the local pool does), hands each
result to the driver as it arrives, and runs a task again when its worker died under it or a
transient fault stopped it (tasks are idempotent by design), a bounded number of times, before
reporting it as failed. A backend may shrink its capacity when workers are lost for good (a Ray
node gone) and grow it again when they come back.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Protocol

log = logging.getLogger("prepline")

OnResult = Callable[[Any, dict], bool]
#: result kinds worth running the task again for (tasks are idempotent). Not "transient": a storage
#: call already retried within its own budget (prepline.retry), and retrying the task would multiply it
RETRIED = ("worker_lost",)


class WorkerLost(Exception):
    """The worker process or actor running a task died (killed, out of memory, node lost)."""


class Backend(Protocol):
    #: how many tasks it holds at once (running, or queued for a worker)
    capacity: int
    #: what to tell the user when a task keeps losing its worker
    lost_fix: str

    def submit(self, task: Any) -> Any:
        """Start ``task`` on a free worker; returns a handle."""

    def wait(self, handles: list) -> list:
        """Block until at least one of ``handles`` finished; return the finished ones."""

    def result(self, handle: Any) -> dict:
        """The task's result dict; raises :class:`WorkerLost` (after replacing the worker) if it died."""

    def cancel(self, handles: list) -> None:
        """Stop what still runs (best effort): the run is being abandoned."""

    def wait_for_worker(self) -> None:
        """Nothing runs and ``capacity`` is 0 (workers lost with their node): block until a worker is
        back, or raise :class:`~prepline.errors.RunFailed` saying why none can come."""


def task_label(task: Any) -> str:
    return str(getattr(task, "path", None) or (f"shard {task:05d}" if isinstance(task, int) else task))


def dispatch(backend: Backend, tasks: list, on_result: OnResult, retries: int = 2, stats: dict | None = None) -> bool:
    """Run ``tasks`` on ``backend``; call ``on_result(task, result)`` for each, in completion order.

    A task whose worker died runs again, at most ``retries`` times. Returns False as soon as
    ``on_result`` does (the tasks still running are cancelled). ``stats["retried"]`` counts the reruns;
    ``stats["worker_start_seconds"]`` is how long the first task waited for its worker (process or
    actor start) plus its worker's setup (``setup_seconds``: loading a model), not the task's own
    work, once per executor.
    """
    t0 = time.perf_counter()
    pending = list(range(len(tasks)))[::-1]  # indices: tasks need not be hashable
    tries = [0] * len(tasks)
    running: dict[Any, int] = {}
    while pending or running:
        while pending and len(running) < backend.capacity:
            i = pending.pop()
            running[backend.submit(tasks[i])] = i
        if not running:  # no worker left to run the rest on: the backend waits for one or gives up
            backend.wait_for_worker()
            continue
        for handle in backend.wait(list(running)):
            i = running.pop(handle)
            try:
                r = backend.result(handle)
            except WorkerLost as e:
                r = {"error": f"{task_label(tasks[i])}: {e}", "fix": backend.lost_fix, "kind": "worker_lost", "worker_lost": True}
            if stats is not None and "worker_start_seconds" not in stats and "seconds" in r:
                work = float(r["seconds"]) - float(r.get("setup_seconds", 0.0))
                stats["worker_start_seconds"] = round(max(0.0, time.perf_counter() - t0 - work), 3)
            if r.get("kind") in RETRIED:
                tries[i] += 1
                if tries[i] <= retries:
                    if stats is not None:
                        stats["retried"] = stats.get("retried", 0) + 1
                    log.warning("%s; running it again (%d of %d retries)", r["error"], tries[i], retries)
                    pending.append(i)
                    continue
                r = {**r, "error": f"{r['error']} ({tries[i]} times; retries: {retries})"}
            if not on_result(tasks[i], r):
                backend.cancel(list(running))
                return False
    return True
