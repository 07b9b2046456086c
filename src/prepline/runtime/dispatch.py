"""The one dispatch loop both executors share.

A :class:`Backend` runs one task on one of its workers and reports when tasks finish; the loop
keeps every worker busy (the next task goes to whichever worker is free, so skewed file sizes do
not stall a run; a backend may queue one more per worker, as the local pool does), hands each
result to the driver as it arrives, and runs a task again when its worker died under it or a
transient fault stopped it (tasks are idempotent by design), a bounded number of times, before
reporting it as failed. A backend may shrink its capacity when workers are lost for good (a Ray
node gone) and grow it again when they come back.

With a :class:`Liveness` (``--task-timeout``), a task whose worker makes no progress (its
heartbeats say it reads nothing and uses no CPU, or they stop: a stopped or hung process) is
warned about after ``STALL_WARNING`` seconds and, after the timeout, its worker is stopped (a pool
process or Ray actor killed; the driver's own thread abandoned for a new one) and the task runs
again elsewhere, or fails the run naming it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Protocol

from prepline.context import task_key

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

    def stop(self, handle: Any, pid: int | None) -> None:
        """Stop the worker of a task that made no progress (process ``pid``, if known), so it runs again
        elsewhere: kill a pool process or Ray actor; leave the driver's own thread for a new one."""

    def wait_for_worker(self) -> None:
        """Nothing runs and ``capacity`` is 0 (workers lost with their node): block until a worker is
        back, or raise :class:`~prepline.errors.RunFailed` saying why none can come."""


#: seconds without progress after which a running task is named in a warning (at most half the timeout)
STALL_WARNING = 30.0
#: a worker "computes" when it used at least this share of one CPU between two heartbeats
CPU_SHARE = 0.01
#: how often the dispatch loop looks for stalled tasks (seconds)
CHECK_INTERVAL = 1.0


class _Live:
    __slots__ = ("moved", "counts", "beat", "warned")

    def __init__(self, now: float, counts: tuple, beat: tuple | None):
        self.moved, self.counts, self.beat, self.warned = now, counts, beat, False


class Liveness:
    """The driver's view of running tasks' progress, from their reports and heartbeats (any thread).

    A heartbeat is ``(pid, thread id, monotonic time, thread CPU s, process CPU s)``. A task moved
    when its documents or bytes changed, or its worker used CPU (at least ``CPU_SHARE`` of a core
    since its previous heartbeat): the thread's CPU on the driver's own process (the driver's other
    threads are busy too), the process's CPU in a pool process or Ray actor (whose I/O threads work
    for the task). A task is tracked from its first heartbeat (a queued task has none)."""

    def __init__(self, timeout: float, warn_after: float | None = None):
        self.timeout = timeout
        self.warn_after = min(STALL_WARNING, timeout / 2) if warn_after is None else warn_after
        self._lock = threading.Lock()
        self._tasks: dict[str, _Live] = {}
        self._dead: set[tuple[int, int]] = set()  # (pid, thread) of attempts given up on: their beats are ignored
        self._me = os.getpid()

    def report(self, key: str, docs: int, nbytes: int, beat: tuple | None = None) -> bool | None:
        """Record a report; True when the task moved, None when it came from an abandoned attempt."""
        now = time.monotonic()
        with self._lock:
            if beat is not None and (beat[0], beat[1]) in self._dead:
                return None
            s = self._tasks.get(key)
            if s is None:
                if beat is None:
                    return True  # a progress report racing its task's first heartbeat
                self._tasks[key] = _Live(now, (docs, nbytes), beat)
                return True
            moved = (docs, nbytes) != s.counts
            if beat is not None:
                prev = s.beat
                if prev is None or prev[:2] != beat[:2]:
                    moved = True  # another attempt (a new worker)
                else:
                    cpu = 3 if beat[0] == self._me and beat[3] is not None else 4
                    dt = beat[2] - prev[2]
                    if dt > 0 and beat[cpu] - prev[cpu] >= CPU_SHARE * dt:
                        moved = True
                s.beat = beat
            s.counts = (docs, nbytes)
            if moved:
                s.moved, s.warned = now, False
            return moved

    def idle(self, key: str) -> float | None:
        """Seconds since the task last moved (None: not started, or not heard of)."""
        with self._lock:
            s = self._tasks.get(key)
            return None if s is None else time.monotonic() - s.moved

    def warn_once(self, key: str) -> bool:
        with self._lock:
            s = self._tasks.get(key)
            if s is None or s.warned:
                return False
            s.warned = True
            return True

    def abandon(self, key: str) -> int | None:
        """Give up on the task's current attempt: the pid of its worker (its later beats are ignored)."""
        with self._lock:
            s = self._tasks.pop(key, None)
            if s is None or s.beat is None:
                return None
            self._dead.add((s.beat[0], s.beat[1]))
            return s.beat[0]

    def forget(self, key: str) -> None:
        with self._lock:
            self._tasks.pop(key, None)


def task_label(task: Any) -> str:
    return str(getattr(task, "path", None) or (f"shard {task:05d}" if isinstance(task, int) else task))


def dispatch(backend: Backend, tasks: list, on_result: OnResult, retries: int = 2, stats: dict | None = None,
             live: Liveness | None = None) -> bool:
    """Run ``tasks`` on ``backend``; call ``on_result(task, result)`` for each, in completion order.

    A task whose worker died runs again, at most ``retries`` times. Returns False as soon as
    ``on_result`` does (the tasks still running are cancelled). ``stats["retried"]`` counts the reruns;
    ``stats["worker_start_seconds"]`` is how long the first task waited for its worker (process or
    actor start) plus its worker's setup (``setup_seconds``: loading a model), not the task's own
    work, once per executor. With ``live``, a task that makes no progress for ``live.timeout``
    seconds has its worker stopped and counts as a lost worker (``stats["stalled"]``).
    """
    t0 = time.perf_counter()
    pending = list(range(len(tasks)))[::-1]  # indices: tasks need not be hashable
    tries = [0] * len(tasks)
    running: dict[Any, int] = {}

    def settle(i: int, r: dict) -> bool:
        """Hand a finished task's result on (or queue it again); False: stop the run."""
        if live is not None:
            live.forget(task_key(tasks[i]))
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
                return True
            r = {**r, "error": f"{r['error']} ({tries[i]} times; retries: {retries})"}
        if not on_result(tasks[i], r):
            backend.cancel(list(running))
            return False
        return True

    while pending or running:
        while pending and len(running) < backend.capacity:
            i = pending.pop()
            running[backend.submit(tasks[i])] = i
        if not running:  # no worker left to run the rest on: the backend waits for one or gives up
            backend.wait_for_worker()
            continue
        finished = backend.wait(list(running)) if live is None else backend.wait(list(running), CHECK_INTERVAL)
        for handle in finished:
            i = running.pop(handle)
            try:
                r = backend.result(handle)
            except WorkerLost as e:
                r = {"error": f"{task_label(tasks[i])}: {e}", "fix": backend.lost_fix, "kind": "worker_lost", "worker_lost": True}
            if not settle(i, r):
                return False
        if live is not None and not _stop_stalled(backend, tasks, running, live, settle, stats):
            return False
    return True


def _stop_stalled(backend: Backend, tasks: list, running: dict, live: Liveness, settle: Callable[[int, dict], bool],
                  stats: dict | None) -> bool:
    """Warn about running tasks that made no progress for a while; stop those past the timeout."""
    for handle, i in list(running.items()):
        key = task_key(tasks[i])
        idle = live.idle(key)
        if idle is None:
            continue
        if idle >= live.timeout:
            running.pop(handle)
            backend.stop(handle, live.abandon(key))
            if stats is not None:
                stats["stalled"] = stats.get("stalled", 0) + 1
            r = {"error": f"{task_label(tasks[i])}: no progress for {idle:.0f}s (nothing read, no CPU used by its worker: "
                          f"a hung or stopped worker, or a store that does not answer); its worker was stopped",
                 "fix": "find what the task waits for (the logs above); --task-timeout SECONDS (PREPLINE_TASK_TIMEOUT, "
                        "default 300) sets how long a task may make no progress; rerun the same command to resume",
                 "kind": "worker_lost", "worker_lost": True, "stalled": True}
            if not settle(i, r):
                return False
        elif idle >= live.warn_after and live.warn_once(key):
            log.warning("%s: no progress for %.0fs (nothing read, no CPU used by its worker); its worker is stopped "
                        "after %.0fs without progress (--task-timeout)", task_label(tasks[i]), idle, live.timeout)
    return True
