"""Local runtime: in the driver's process for one worker, a process pool for more.

The pool lives for the whole run (all phases): each worker process keeps one
:class:`~prepline.worker.Worker` per phase spec, so models load once per process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from prepline.context import WorkerSpec
from prepline.progress import Report
from prepline.runtime.dispatch import OnResult, WorkerLost, dispatch
from prepline.worker import Worker

_current: tuple[WorkerSpec, Worker] | None = None
#: in a pool worker: where running tasks' progress goes (to the driver)
_progress: "mp.Queue | None" = None


def init_worker(parent: int, progress: "mp.Queue | None" = None) -> None:
    """Pool worker initializer: tied to the driver, logging like it, progress to its queue."""
    global _progress
    from multiprocessing import util

    from prepline import logs

    die_with_parent(parent)
    logs.setup_worker()
    util.Finalize(None, logs.flush_repeats, exitpriority=10)  # the warnings it held back, said as it exits
    _progress = progress


def _send(key: str, docs: int, nbytes: int) -> None:
    if _progress is not None:
        _progress.put_nowait((key, docs, nbytes))


def die_with_parent(parent: int) -> None:
    """Pool worker initializer: never outlive the run, however it ends (even SIGKILL, which runs no
    cleanup). The kernel sends SIGKILL when the parent dies (PR_SET_PDEATHSIG, Linux); elsewhere,
    and as a second line, a thread checks every second that the parent is still there."""
    import ctypes
    import signal
    import threading
    import time

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="prepline-parent-watch", daemon=True).start()


def _run(spec: WorkerSpec, task) -> dict:
    global _current
    if _current is None or _current[0] != spec:  # one phase at a time: a new phase, a new Worker
        _current = (spec, Worker(spec, _send))
    return _current[1].run(task)


class _Done:
    """A finished task's result (a handle of the inline backend)."""

    __slots__ = ("result",)

    def __init__(self, result: dict):
        self.result = result


class _Inline:
    """One worker: the driver's own process runs each task when it is submitted."""

    capacity = 1
    lost_fix = ""

    def __init__(self, spec: WorkerSpec, report: Report | None = None):
        self._worker = Worker(spec, report)

    def submit(self, task) -> _Done:
        return _Done(self._worker.run(task))

    def wait(self, handles: list) -> list:
        return handles

    def result(self, handle: _Done) -> dict:
        return handle.result

    def cancel(self, handles: list) -> None:
        pass

    def wait_for_worker(self) -> None:  # capacity never drops: unreachable
        raise RuntimeError("the inline worker is always there")


class _Pool:
    """Several workers: a process pool. A worker process that dies breaks the whole pool (every task
    in it fails with BrokenProcessPool): the pool is rebuilt once and those tasks are run again."""

    lost_fix = "check memory (fewer --workers) and the logs above"

    def __init__(self, executor: "LocalExecutor", spec: WorkerSpec):
        self.ex, self.spec = executor, spec
        self.capacity = executor.workers
        self._generation: dict[Future, int] = {}

    def submit(self, task) -> Future:
        fut = self.ex._get_pool().submit(_run, self.spec, task)
        self._generation[fut] = self.ex._pool_generation
        return fut

    def wait(self, handles: list) -> list:
        return list(wait(handles, return_when=FIRST_COMPLETED)[0])

    def result(self, fut: Future) -> dict:
        gen = self._generation.pop(fut)
        try:
            return fut.result()
        except BrokenProcessPool as e:
            if gen == self.ex._pool_generation:  # the first of its tasks to tell: rebuild the pool
                self.ex.close()
            raise WorkerLost(f"worker process died ({type(e).__name__})") from None

    def cancel(self, handles: list) -> None:
        for f in handles:
            f.cancel()

    def wait_for_worker(self) -> None:  # a broken pool is rebuilt at once: capacity never drops
        raise RuntimeError("the process pool always has workers")


class LocalExecutor:
    def __init__(self, workers: int = 0, task_retries: int = 2):
        self.workers = workers or os.cpu_count() or 1
        self.task_retries = task_retries
        self.stats: dict = {"retried": 0}
        self._pool: ProcessPoolExecutor | None = None
        self._pool_generation = 0
        self._on_progress: Report | None = None
        self._queue: "mp.Queue | None" = None
        self._drain: threading.Thread | None = None

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            ctx = mp.get_context("spawn")  # spawn: safe with the threads pyarrow/duckdb start; fork is not.
            if self._queue is None:
                self._queue = ctx.Queue()
                self._drain = threading.Thread(target=self._forward, args=(self._queue,), name="prepline-progress-in", daemon=True)
                self._drain.start()
            self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=init_worker, initargs=(os.getpid(), self._queue))
            self._pool_generation += 1
        return self._pool

    def _forward(self, q: "mp.Queue") -> None:
        """The driver's side of the workers' progress queue (a thread)."""
        while True:
            try:
                item = q.get(timeout=1.0)
            except queue.Empty:
                continue
            except Exception:  # noqa: BLE001 - the queue was closed (or broken by a killed worker): progress stops, the run goes on
                return
            if item is None:
                return
            on = self._on_progress
            if on is not None:
                try:
                    on(*item)
                except Exception:  # noqa: BLE001 - progress never fails a run
                    pass

    def run(self, spec: WorkerSpec, tasks: list, on_result: OnResult, on_progress: Report | None = None) -> bool:
        self._on_progress = on_progress
        backend = _Inline(spec, on_progress) if self.workers <= 1 or len(tasks) <= 1 else _Pool(self, spec)
        try:
            return dispatch(backend, tasks, on_result, self.task_retries, self.stats)
        finally:
            self._on_progress = None

    def _stop_drain(self) -> None:
        if self._queue is not None:
            self._queue.put(None)
            if self._drain is not None:
                self._drain.join(timeout=2)
            self._queue.close()
            self._queue, self._drain = None, None

    def abort(self) -> None:
        if self._pool is not None:
            for p in list(getattr(self._pool, "_processes", {}).values()):  # no public way before Python 3.14
                p.kill()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._stop_drain()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._stop_drain()
