"""The local pool's processes: how each one starts (tied to the driver, logging like it, progress to
the driver's queue), and starting them early.

Only the standard library is imported here, so the command line can start the pool before it
imports pyarrow and the transform: a spawned process takes ~0.4 s to start and import, which then
overlaps the driver's own imports and planning instead of following them (:func:`prestart`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor

#: in a pool worker: where running tasks' progress goes (to the driver)
_progress: "mp.Queue | None" = None
#: a pool started by :func:`prestart` and not yet taken by an executor: (pool, its queue, size)
_early: "tuple[ProcessPoolExecutor, mp.Queue, int] | None" = None


def init_worker(parent: int, progress: "mp.Queue | None" = None) -> None:
    """Pool worker initializer: tied to the driver, logging like it, progress to its queue."""
    global _progress
    import signal
    from multiprocessing import util

    from prepline import logs

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked process has the driver's handler
    die_with_parent(parent)
    logs.setup_worker()
    util.Finalize(None, logs.flush_repeats, exitpriority=10)  # the warnings it held back, said as it exits
    _progress = progress


def send(key: str, docs: int, nbytes: int, beat: "tuple | None" = None) -> None:
    """In a pool worker: a running task's progress or heartbeat, to the driver (best effort)."""
    if _progress is not None:
        _progress.put_nowait((key, docs, nbytes, beat))


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


def new_pool(size: int, progress: "mp.Queue | None" = None, method: str = "spawn") -> "tuple[ProcessPoolExecutor, mp.Queue]":
    """A pool of ``size`` processes reporting progress to ``progress`` (a new queue if None).
    Spawned: the driver runs threads (pyarrow's, DuckDB's, its own), which fork does not copy
    safely. Only :func:`prestart` forks, from a driver that has no other thread yet."""
    ctx = mp.get_context(method)
    q = progress if progress is not None else ctx.Queue()
    return ProcessPoolExecutor(size, mp_context=ctx, initializer=init_worker, initargs=(os.getpid(), q)), q


def _warm(transform: str) -> None:
    """In a pool worker started early: import the transform's module while the driver plans."""
    from prepline import registry
    try:
        registry.get(transform).warm()
    except Exception:  # noqa: BLE001 - an unknown name is the driver's error to report; a failed warm-up, the task's
        pass


def prestart(workers: int, transform: str) -> None:
    """Start the processes of the pool a local run on ``workers`` workers (0: one per CPU) will use,
    now. The next executor with that pool size takes them (:func:`take_prestarted`); a run that
    never needs them (a resumed run, an error) has them stopped by :func:`drop_prestarted`."""
    global _early
    size = (workers or _cpus()) - 1
    if size < 1 or _early is not None:
        return
    import threading

    # Forked while the driver has one thread and only the standard library imported: a process in a
    # few milliseconds instead of a new interpreter's ~0.4 s. A fork pool starts all its processes
    # at the first submit, before it starts its own manager thread.
    fork = threading.active_count() == 1 and "fork" in mp.get_all_start_methods()
    pool, q = new_pool(size, method="fork" if fork else "spawn")
    for _ in range(size):  # (spawn: each submit starts one process, none being idle yet)
        pool.submit(_warm, transform)
    _early = (pool, q, size)


def _cpus() -> int:
    """As prepline.runtime.options.usable_cpus (which this module does not import)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def take_prestarted(size: int) -> "tuple[ProcessPoolExecutor, mp.Queue] | None":
    """The pool :func:`prestart` started, if it has ``size`` processes (it is then the caller's)."""
    global _early
    if _early is None or _early[2] != size:
        return None
    pool, q, _ = _early
    _early = None
    return pool, q


def drop_prestarted() -> None:
    """Stop a prestarted pool no executor took."""
    global _early
    if _early is None:
        return
    pool, q, _ = _early
    _early = None
    for p in kill_pool(pool):
        p.join(timeout=5)
    q.cancel_join_thread()
    q.close()


def kill_pool(pool: ProcessPoolExecutor) -> list:
    """SIGKILL the pool's processes and shut it down without waiting; the processes it had."""
    started = list(getattr(pool, "_processes", {}).values())  # no public way before Python 3.14
    for p in started:
        p.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    return started
