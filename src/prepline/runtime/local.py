"""Local runtime: in the driver's process for one worker; for N workers, the driver's process and
a pool of N - 1 processes.

No start-up tax: the driver's own worker (a thread of the driver's process) takes the first
(largest) task at once, while the pool's processes start and import; once it has nothing left to
do, it takes back the tasks handed to the pool that no pool process has started yet (a claim file
per task decides who runs it), so a short phase never waits for a process to start. A phase with
one task never starts the pool (but ``prepline run`` starts its processes as it begins, before it
imports the transform: :mod:`prepline.runtime.procs`). The pool lives for the whole run (all phases): each worker process keeps one
:class:`~prepline.worker.Worker` per phase spec, so models load once per process.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import shutil
import signal
import tempfile
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from prepline.context import WorkerSpec
from prepline.progress import Report
from prepline.runtime.dispatch import Liveness, OnResult, WorkerLost, dispatch
from prepline.runtime.options import usable_cpus
from prepline.runtime.procs import kill_pool, new_pool, send, take_prestarted
from prepline.worker import Worker

_current: tuple[WorkerSpec, Worker] | None = None

#: threads of this process inside a task right now (the driver's worker slot, and slots left behind
#: by a task that stalled): see :func:`tasks_running_in_threads`
_in_task: set[int] = set()
_in_task_lock = threading.Lock()


def tasks_running_in_threads() -> bool:
    """Whether a thread of this process is inside a task now. Such a thread may be in native code
    (DuckDB, Arrow) that gave up the GIL; when Python shuts down, a thread that asks for the GIL back
    is ended inside that code, and DuckDB's bindings then abort the whole process (SIGABRT, "FATAL:
    exception not rethrown"). The program leaves without the shutdown then: prepline.cli.exit_program."""
    with _in_task_lock:
        return bool(_in_task)


@contextlib.contextmanager
def running_task():
    """Marks the calling thread as inside a task while the block runs."""
    me = threading.get_ident()
    with _in_task_lock:
        _in_task.add(me)
    try:
        yield
    finally:
        with _in_task_lock:
            _in_task.discard(me)


def _run(spec: WorkerSpec, task) -> dict:
    global _current
    if _current is None or _current[0] != spec:  # one phase at a time: a new phase, a new Worker
        _current = (spec, Worker(spec, send))
    return _current[1].run(task)


def _claim(token: str) -> bool:
    """Take a task's claim file: True for the one process that creates it first. A removed claims
    folder (the phase is over) counts as taken."""
    try:
        os.close(os.open(token, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except (FileExistsError, FileNotFoundError):
        return False


def _run_claimed(spec: WorkerSpec, task, token: str) -> dict:
    """A pool task: run it unless the driver took it back while this process was starting."""
    if not _claim(token):
        return {"taken_back": True}  # never read: the driver reports the task's own result
    return _run(spec, task)


class _Inline:
    """One worker: a thread of the driver's process runs the tasks one at a time (so the driver can
    see a task that makes no progress, and leave its thread for a new one)."""

    capacity = 1
    lost_fix = ""

    def __init__(self, spec: WorkerSpec, report: Report | None = None):
        self._spec, self._report = spec, report
        self._driver = _DriverWorker(spec, report)

    def submit(self, task) -> Future:
        return self._driver.submit(task)

    def wait(self, handles: list, timeout: float | None = None) -> list:
        return list(wait(handles, timeout=timeout, return_when=FIRST_COMPLETED)[0])

    def result(self, fut: Future) -> dict:
        return fut.result()

    def cancel(self, handles: list) -> None:
        for f in handles:
            f.cancel()

    def stop(self, fut: Future, pid: int | None) -> None:
        """The task made no progress: its thread is left (a daemon) and a new one takes the next task."""
        self._driver.close()
        self._driver = _DriverWorker(self._spec, self._report)

    def close(self) -> None:
        self._driver.close()

    def wait_for_worker(self) -> None:  # capacity never drops: unreachable
        raise RuntimeError("the inline worker is always there")


class _DriverWorker:
    """The driver's own worker slot among several: its tasks run one at a time in a thread of the
    driver's process, so the dispatch loop stays free to hand the pool's results on and keep the
    pool busy. The thread is a daemon: an interrupted run does not wait for its task (whose output,
    written under a temporary name and without a completion marker, a rerun redoes)."""

    def __init__(self, spec: WorkerSpec, report: Report | None = None):
        self._spec, self._report = spec, report
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
                with running_task():
                    worker = worker or Worker(self._spec, self._report)
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
        self._generation: dict[Future, int] = {}

    def submit(self, task, token: str) -> Future:
        try:
            fut = self.ex._get_pool().submit(_run_claimed, self.spec, task, token)
        except BrokenProcessPool:  # broken under tasks the driver took back (their results are never read)
            self.ex.close()
            fut = self.ex._get_pool().submit(_run_claimed, self.spec, task, token)
        self._generation[fut] = self.ex._pool_generation
        self.ex._wanted.add(fut)
        return fut

    def forget(self, fut: Future) -> None:
        self._generation.pop(fut, None)
        self.ex._wanted.discard(fut)

    def result(self, fut: Future) -> dict:
        self.ex._wanted.discard(fut)
        gen = self._generation.pop(fut)
        try:
            return fut.result()
        except BrokenProcessPool as e:
            if gen == self.ex._pool_generation:  # the first of its tasks to tell: rebuild the pool
                self.ex.close()
            raise WorkerLost(f"worker process died ({type(e).__name__})") from None

    def wait_for_worker(self) -> None:  # a broken pool is rebuilt at once: capacity never drops
        raise RuntimeError("the process pool always has workers")


_CLAIMS_PREFIX = "prepline-claims-"


def _claims_dir() -> str:
    """A fresh folder for one phase's claim files, named after this process; the folders of
    processes that are gone (a driver killed with SIGKILL cleans nothing up) are removed first."""
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        if name.startswith(_CLAIMS_PREFIX):
            pid = name[len(_CLAIMS_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{_CLAIMS_PREFIX}{os.getpid()}-")


class _Handle:
    """A running task: on the driver, or in the pool (with its claim file) until the driver takes it back."""

    __slots__ = ("task", "pool_future", "token", "current")

    def __init__(self, task, current: Future, pool_future: Future | None = None, token: str | None = None):
        self.task, self.current, self.pool_future, self.token = task, current, pool_future, token

    @property
    def on_driver(self) -> bool:
        return self.current is not self.pool_future


class _DriverAndPool:
    """N workers: the driver's worker and a pool of N - 1 processes. The driver's slot is filled
    first, so the first task starts at once while the pool's processes are still starting; an idle
    driver takes back a pool task that has not started."""

    lost_fix = _Pool.lost_fix

    def __init__(self, executor: "LocalExecutor", spec: WorkerSpec, report: Report | None = None):
        self.pool = _Pool(executor, spec)
        # one task queued for each pool process besides the one it runs: a finished pool task's
        # result, and the next task, pass through threads of the driver's process, where they wait
        # for the GIL while the driver's own worker runs (a pool process then idled 20-100 ms
        # between files, ~15% of a 2-worker ingest). A queued task the pool has not started is
        # what an idle driver takes back, so the last files never wait behind a busy process.
        self.capacity = executor.workers + executor.pool_size
        self._spec, self._report = spec, report
        self._driver = _DriverWorker(spec, report)
        self._driver_busy = False
        self._driver_task: Future | None = None
        self._claims = _claims_dir()
        self._serial = 0

    def _on_driver(self, task) -> Future:
        self._driver_busy = True
        self._driver_task = self._driver.submit(task)
        return self._driver_task

    def submit(self, task) -> _Handle:
        if not self._driver_busy:
            return _Handle(task, self._on_driver(task))
        self._serial += 1
        token = os.path.join(self._claims, str(self._serial))
        fut = self.pool.submit(task, token)
        return _Handle(task, fut, fut, token)

    def _take_back(self, handles: list[_Handle]) -> None:
        """The idle driver runs a pool task that no pool process has claimed yet (the latest first)."""
        for h in reversed(handles):
            if h.token is None or h.on_driver or h.current.done():
                continue
            if _claim(h.token):
                h.current = self._on_driver(h.task)
                return
            h.token = None  # a pool process has it

    def wait(self, handles: list[_Handle], timeout: float | None = None) -> list[_Handle]:
        if not self._driver_busy:
            self._take_back(handles)
        by_future = {h.current: h for h in handles}
        return [by_future[f] for f in wait(list(by_future), timeout=timeout, return_when=FIRST_COMPLETED)[0]]

    def stop(self, h: _Handle, pid: int | None) -> None:
        """A task that made no progress: on the driver, its thread is left (a daemon) for a new one; in
        the pool, its process is killed (the pool breaks and is rebuilt; its other tasks run again)."""
        if h.on_driver:
            self._driver.close()
            self._driver = _DriverWorker(self._spec, self._report)
            self._driver_busy, self._driver_task = False, None
            if h.pool_future is not None:
                self.pool.forget(h.pool_future)
            return
        self.pool.forget(h.current)
        if pid is not None and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def result(self, h: _Handle) -> dict:
        if h.on_driver:
            self._driver_busy = False
            if h.pool_future is not None:
                self.pool.forget(h.pool_future)  # its pool copy ends without running it
            return h.current.result()
        r = self.pool.result(h.current)
        if r.get("taken_back"):  # neither ran it: its claim folder vanished (a temp cleaner): run it again
            raise WorkerLost("the task's claim file could not be created")
        return r

    def cancel(self, handles: list[_Handle]) -> None:
        for h in handles:
            h.current.cancel()
            if h.pool_future is not None:
                h.pool_future.cancel()

    def wait_for_worker(self) -> None:
        self.pool.wait_for_worker()

    def close(self, wait_for_task: bool = True) -> None:
        """Stop the driver's worker: after its task (a run stopped by a failure), or at once (a signal)."""
        self._driver.close()
        if wait_for_task and self._driver_task is not None:
            wait([self._driver_task])
        shutil.rmtree(self._claims, ignore_errors=True)


def _reporter(on_progress: Report | None, live: Liveness | None) -> Report:
    """What workers report to: heartbeats feed ``live``; counts go on to ``on_progress`` (with
    whether the task moved), reports of an abandoned attempt nowhere."""

    def report(key: str, docs: int, nbytes: int, beat: tuple | None = None) -> None:
        moved = live.report(key, docs, nbytes, beat) if live is not None else None
        if on_progress is not None and (live is None or moved is not None):
            on_progress(key, docs, nbytes, moved)

    return report


class LocalExecutor:
    def __init__(self, workers: int = 0, task_retries: int = 2, task_timeout: float = 0.0):
        self.workers = workers or usable_cpus()
        self.task_timeout = task_timeout
        #: processes of the pool (the driver's process is the other worker)
        self.pool_size = self.workers - 1
        self.task_retries = task_retries
        self.stats: dict = {"retried": 0, "stalled": 0}
        self._pool: ProcessPoolExecutor | None = None
        self._pool_generation = 0
        #: pool tasks whose results are still to be read (not taken back by the driver)
        self._wanted: set[Future] = set()
        self._on_progress: Report | None = None
        self._queue: "mp.Queue | None" = None
        self._drain: threading.Thread | None = None

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # the processes the command line started early, else new ones (with the run's queue)
            early = take_prestarted(self.pool_size) if self._queue is None else None
            self._pool, q = early or new_pool(self.pool_size, self._queue)
            if self._queue is None:
                self._queue = q
                self._drain = threading.Thread(target=self._forward, args=(self._queue,), name="prepline-progress-in", daemon=True)
                self._drain.start()
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
        live = Liveness(self.task_timeout) if self.task_timeout > 0 else None
        self._on_progress = report = _reporter(on_progress, live)
        try:
            if self.workers <= 1 or len(tasks) <= 1:
                inline = _Inline(spec, report)
                try:
                    return dispatch(inline, tasks, on_result, self.task_retries, self.stats, live)
                finally:
                    inline.close()
            backend = _DriverAndPool(self, spec, report)
            try:
                ok = dispatch(backend, tasks, on_result, self.task_retries, self.stats, live)
            except BaseException:
                backend.close(wait_for_task=False)
                raise
            backend.close()
            return ok
        finally:
            self._on_progress = None

    def _stop_drain(self) -> None:
        if self._queue is not None:
            self._queue.put(None)
            if self._drain is not None:
                self._drain.join(timeout=2)
            self._queue.cancel_join_thread()  # an exit never waits to push the sentinel into a pipe nobody reads
            self._queue.close()
            self._queue, self._drain = None, None

    def abort(self) -> None:
        if self._pool is not None:
            for p in kill_pool(self._pool):
                p.join(timeout=2)  # reaped: no process of the run outlives it (SIGKILL takes a moment under load)
            self._pool = None
        self._stop_drain()

    def close(self) -> None:
        """Stop the pool: wait for the tasks it still runs; processes with nothing wanted from them
        (idle, or still starting up) are killed rather than waited for."""
        if self._pool is not None:
            if any(not f.done() for f in self._wanted):
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
            else:
                self.abort()
        self._wanted.clear()
        self._stop_drain()
