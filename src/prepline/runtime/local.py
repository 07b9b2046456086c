"""Local runtime: in-process for one worker, a process pool for more.

The pool lives for the whole run (all phases): each worker process keeps one
:class:`~prepline.engine.Worker` per phase spec, so models load once per process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

from prepline.engine import Worker, WorkerSpec

_current: tuple[WorkerSpec, Worker] | None = None


def _run(spec: WorkerSpec, task) -> dict:
    global _current
    if _current is None or _current[0] != spec:  # one phase at a time: a new phase, a new Worker
        _current = (spec, Worker(spec))
    return _current[1].run(task)


class LocalExecutor:
    def __init__(self, workers: int = 0):
        self.workers = workers or os.cpu_count() or 1
        self._pool: ProcessPoolExecutor | None = None

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn: safe with the threads pyarrow/duckdb start; fork is not.
            self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
        return self._pool

    def run(self, spec: WorkerSpec, tasks: list, on_result) -> bool:
        if self.workers <= 1 or len(tasks) <= 1:
            worker = Worker(spec)
            for t in tasks:
                if not on_result(t, worker.run(t)):
                    return False
            return True
        pool = self._get_pool()
        queue = list(reversed(tasks))
        running: dict[Future, object] = {}
        # keep each worker busy with exactly one task: the next goes to whoever is free
        while queue and len(running) < self.workers:
            t = queue.pop()
            running[pool.submit(_run, spec, t)] = t
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                t = running.pop(fut)
                try:
                    r = fut.result()
                except Exception as e:  # the worker process died (killed, out of memory)
                    r = {
                        "error": f"{getattr(t, 'path', t)}: worker process failed: {type(e).__name__}: {e}",
                        "fix": "check memory (fewer --workers) and the logs above",
                    }
                    self.close()
                    pool = self._get_pool()
                    for f in running:
                        f.cancel()
                    queue.extend(reversed([running[f] for f in running]))
                    running.clear()
                if not on_result(t, r):
                    for f in running:
                        f.cancel()
                    return False
                while queue and len(running) < self.workers:
                    nt = queue.pop()
                    running[pool.submit(_run, spec, nt)] = nt
        return True

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
