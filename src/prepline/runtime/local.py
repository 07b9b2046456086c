"""Local runtime: in-process for one worker, a process pool for more."""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

from prepline.engine import Worker, WorkerSpec

_worker: Worker | None = None


def _init(spec: WorkerSpec) -> None:
    global _worker
    _worker = Worker(spec)


def _run(task) -> dict:
    assert _worker is not None
    return _worker.run(task)


class LocalExecutor:
    def __init__(self, workers: int = 0):
        self.workers = workers or os.cpu_count() or 1

    def run(self, spec: WorkerSpec, tasks: list, on_result) -> bool:
        n = min(self.workers, len(tasks))
        if n <= 1:
            worker = Worker(spec)
            for t in tasks:
                if not on_result(t, worker.run(t)):
                    return False
            return True
        # spawn: safe with the threads pyarrow/duckdb start; fork is not.
        ctx = mp.get_context("spawn")
        with ProcessPoolExecutor(n, mp_context=ctx, initializer=_init, initargs=(spec,)) as pool:
            queue = list(reversed(tasks))
            running: dict[Future, object] = {}
            # keep each worker busy with exactly one task: the next goes to whoever is free
            while queue and len(running) < n:
                t = queue.pop()
                running[pool.submit(_run, t)] = t
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
                    if not on_result(t, r):
                        for f in running:
                            f.cancel()
                        pool.shutdown(wait=True, cancel_futures=True)
                        return False
                    if queue:
                        nt = queue.pop()
                        running[pool.submit(_run, nt)] = nt
        return True

    def close(self) -> None:
        pass
