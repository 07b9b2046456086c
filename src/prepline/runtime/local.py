"""Local runtime: in the driver's process for one worker; for N workers, the driver's process and
a pool of N - 1 processes.

No start-up tax: the driver's own worker (a thread of the driver's process) takes the first
(largest) task at once, while the pool's processes start and import; a phase with one task never
starts the pool. The pool lives for the whole run (all phases): each worker process keeps one
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
from prepline.runtime.dispatch import OnResult, WorkerLost, dispatch
from prepline.worker import Worker

_current: tuple[WorkerSpec, Worker] | None = None


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
        _current = (spec, Worker(spec))
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

    def __init__(self, spec: WorkerSpec):
        self._worker = Worker(spec)

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


class _DriverWorker:
    """The driver's own worker slot among several: its tasks run one at a time in a thread of the
    driver's process, so the dispatch loop stays free to hand the pool's results on and keep the
    pool busy. The thread is a daemon: an interrupted run does not wait for its task (whose output,
    written under a temporary name and without a completion marker, a rerun redoes)."""

    def __init__(self, spec: WorkerSpec):
        self._spec = spec
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="prepline-driver-worker", daemon=True).start()

    def submit(self, task) -> Future:
        fut: Future = Future()
        self._queue.put((fut, task))
        return fut

    def _loop(self) -> None:
        worker = None
        while (item := self._queue.get()) is not None:
            fut, task = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                worker = worker or Worker(self._spec)
                fut.set_result(worker.run(task))
            except BaseException as e:  # noqa: BLE001 - handed to the dispatch loop (a bug: Worker.run returns errors)
                fut.set_exception(e)

    def close(self) -> None:
        self._queue.put(None)


class _Pool:
    """Several workers: a process pool. A worker process that dies breaks the whole pool (every task
    in it fails with BrokenProcessPool): the pool is rebuilt once and those tasks are run again."""

    lost_fix = "check memory (fewer --workers) and the logs above"

    def __init__(self, executor: "LocalExecutor", spec: WorkerSpec):
        self.ex, self.spec = executor, spec
        self.capacity = executor.pool_size
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


class _DriverAndPool:
    """N workers: the driver's worker and a pool of N - 1 processes. The driver's slot is filled
    first, so the first task starts at once while the pool's processes are still starting."""

    lost_fix = _Pool.lost_fix

    def __init__(self, executor: "LocalExecutor", spec: WorkerSpec):
        self.pool = _Pool(executor, spec)
        self.capacity = executor.workers
        self._driver = _DriverWorker(spec)
        self._on_driver: Future | None = None

    def submit(self, task) -> Future:
        if self._on_driver is None:
            self._on_driver = self._driver.submit(task)
            return self._on_driver
        return self.pool.submit(task)

    def wait(self, handles: list) -> list:
        return list(wait(handles, return_when=FIRST_COMPLETED)[0])

    def result(self, fut: Future) -> dict:
        if fut is self._on_driver:
            self._on_driver = None
            return fut.result()
        return self.pool.result(fut)

    def cancel(self, handles: list) -> None:
        for f in handles:
            f.cancel()

    def wait_for_worker(self) -> None:
        self.pool.wait_for_worker()

    def close(self) -> None:
        self._driver.close()


class LocalExecutor:
    def __init__(self, workers: int = 0, task_retries: int = 2):
        self.workers = workers or os.cpu_count() or 1
        #: processes of the pool (the driver's process is the other worker)
        self.pool_size = self.workers - 1
        self.task_retries = task_retries
        self.stats: dict = {"retried": 0}
        self._pool: ProcessPoolExecutor | None = None
        self._pool_generation = 0

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn: safe with the threads pyarrow/duckdb start; fork is not.
            self._pool = ProcessPoolExecutor(self.pool_size, mp_context=mp.get_context("spawn"), initializer=die_with_parent,
                                             initargs=(os.getpid(),))
            self._pool_generation += 1
        return self._pool

    def run(self, spec: WorkerSpec, tasks: list, on_result: OnResult) -> bool:
        if self.workers <= 1 or len(tasks) <= 1:
            return dispatch(_Inline(spec), tasks, on_result, self.task_retries, self.stats)
        backend = _DriverAndPool(self, spec)
        try:
            return dispatch(backend, tasks, on_result, self.task_retries, self.stats)
        finally:
            backend.close()

    def abort(self) -> None:
        if self._pool is not None:
            for p in list(getattr(self._pool, "_processes", {}).values()):  # no public way before Python 3.14
                p.kill()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
