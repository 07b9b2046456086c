"""The local executor with several workers: the driver works as one of them, takes back the tasks a
pool process has not started, and never waits for a pool that has nothing to do."""

from __future__ import annotations

import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor

from conftest import make_corpus, tree_bytes
from prepline.engine import RunOptions, run_transform
from prepline.runtime import local


def _slow_starting_pool(self) -> ProcessPoolExecutor:
    """A pool whose process needs 30 s to start (a machine under heavy load, a slow import)."""
    if self._pool is None:
        self._pool = ProcessPoolExecutor(self.pool_size, mp_context=mp.get_context("spawn"), initializer=time.sleep, initargs=(30,))
        self._pool_generation += 1
    return self._pool


def test_a_run_never_waits_for_a_pool_process_that_is_still_starting(tmp_path, monkeypatch):
    src = make_corpus(tmp_path / "in", files=4)
    run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "ref"), workers=1))
    monkeypatch.setattr(local.LocalExecutor, "_get_pool", _slow_starting_pool)
    t0 = time.perf_counter()
    meta = run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "out"), workers=2)).metadata
    assert time.perf_counter() - t0 < 20  # the driver ran every task, took back the one handed to the pool, and did not wait
    assert meta["status"] == "success" and meta["phases"]["final"]["workers"] == 2
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ref")


def test_a_pool_task_the_driver_took_back_does_not_run_in_the_pool(tmp_path):
    token = str(tmp_path / "1")
    assert local._claim(token) and not local._claim(token)  # one process wins the claim
    assert local._run_claimed(None, None, token) == {"taken_back": True}
    assert not local._claim(str(tmp_path / "gone" / "2"))  # the phase is over: nothing may run


def test_each_pool_process_has_its_next_task_queued_and_every_task_runs_once(tmp_path, monkeypatch):
    """A pool process finds its next task waiting when it finishes one: it does not wait for the
    driver's process, whose threads hand results and tasks on only when they get the GIL from the
    driver's own busy worker. A queued task is still the driver's to take back, and none runs twice."""
    src = make_corpus(tmp_path / "in", files=7)
    run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "ref"), workers=1))
    outstanding: list[int] = []
    submit = local._Pool.submit

    def counting_submit(self, task, token):
        fut = submit(self, task, token)
        outstanding.append(sum(1 for f in self._generation if not f.done()))
        return fut

    monkeypatch.setattr(local._Pool, "submit", counting_submit)
    meta = run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "out"), workers=2)).metadata
    assert max(outstanding) == 2  # the one its process runs and the next (pool of 1 process)
    assert meta["status"] == "success" and meta["totals"]["docs_in"] == sum(f["docs_in"] for f in meta["files"].values())
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ref")  # every file once, same bytes


_EXIT_WHILE_HASHING = """
import contextlib, sys, threading, time
import pyarrow as pa
from prepline import cli, hashing
from prepline.runtime import local

texts = pa.array([f"document {i} " * 20 for i in range(200_000)])
inside = threading.Event()


def task():  # a task of the driver's worker slot: DuckDB hashing, the GIL released
    con = hashing.connect()
    with local.running_task() if sys.argv[1] == "marked" else contextlib.nullcontext():
        inside.set()
        while True:
            hashing.sha256_hex(con, texts)


threading.Thread(target=task, daemon=True).start()
inside.wait()
time.sleep(0.3)
print("recorded", flush=False)  # what a run prints last (its summary or error), still buffered
cli.exit_program(143)
"""


def test_a_run_stopped_while_its_driver_thread_hashes_exits_with_its_code_not_an_abort(tmp_path):
    """CI saw ``exit -6 … FATAL: exception not rethrown`` after SIGTERM: Python's shutdown ends a thread
    that asks for the GIL back inside DuckDB, which aborts the process. Without the thread marked as
    in a task (the old exit), this script aborted 9 runs of 9 on an idle machine (under load, DuckDB
    sometimes raises in the thread instead); marked, the process leaves with its code every time."""
    import subprocess
    import sys

    script = tmp_path / "exit_while_hashing.py"
    script.write_text(_EXIT_WHILE_HASHING)
    for _ in range(3):
        marked = subprocess.run([sys.executable, str(script), "marked"], capture_output=True, text=True, timeout=120)
        assert (marked.returncode, marked.stdout) == (143, "recorded\n"), (marked.returncode, marked.stderr[-300:])
