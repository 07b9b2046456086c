"""Task timeouts (finding 6 of issue 30): a task whose worker neither reads nor computes is noticed,
its worker stopped and the task run again elsewhere, or the run fails naming it; a task that
computes for a long time without reading is alive. Hangs here are real blocks on events the test
holds (zero CPU), never wall-clock races; timeouts are generous against a loaded machine."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from conftest import make_corpus, tree_bytes, write_parquet
from prepline.context import FINAL
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, RunFailed
from prepline.progress import Tracker, line
from prepline.runtime import dispatch as dispatch_mod
from prepline.runtime.dispatch import Liveness
from prepline.worker import Worker, beating

TIMEOUT = 4.0  # seconds without progress (tests only; the default is 300)


def _largest(src) -> str:
    return max(src.rglob("*.parquet"), key=lambda p: p.stat().st_size).relative_to(src).as_posix()


@pytest.fixture
def release():
    """An event hung tasks wait on; set at the end so their abandoned threads finish."""
    ev = threading.Event()
    yield ev
    ev.set()


def _hang(monkeypatch, rel: str, release: threading.Event, times: int) -> list:
    """The final map of ``rel`` blocks (no CPU, nothing read) on ``release``, its first ``times`` tries."""
    run, hung = Worker.run, []

    def hanging(self, task):
        if self.spec.phase == FINAL and getattr(task, "rel", None) == rel and len(hung) < times:
            hung.append(threading.get_ident())
            with beating(rel, self.report):  # what Worker.run does around a task
                release.wait()
        return run(self, task)

    monkeypatch.setattr(Worker, "run", hanging)
    return hung


@pytest.mark.slow
def test_a_hung_task_on_the_drivers_thread_runs_again_on_a_new_thread(tmp_path, monkeypatch, release, caplog):
    src = make_corpus(tmp_path / "in", files=4)
    run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "ref"), workers=1, task_timeout=0))
    rel = _largest(src)
    hung = _hang(monkeypatch, rel, release, times=1)
    meta = run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "out"), workers=1, task_timeout=TIMEOUT)).metadata
    assert len(hung) == 1  # the fault happened: the first try hung
    assert meta["status"] == "success"
    assert meta["phases"][FINAL]["retried"] == 1 and meta["phases"][FINAL]["stalled"] == 1
    assert f"{rel}: no progress for" in caplog.text and "running it again" in caplog.text
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ref")


@pytest.mark.slow
def test_a_hung_task_on_the_drivers_thread_fails_the_run_naming_it(tmp_path, monkeypatch, release):
    src = make_corpus(tmp_path / "in", files=3)
    rel = _largest(src)
    hung = _hang(monkeypatch, rel, release, times=99)
    with pytest.raises(RunFailed, match=f"{rel}: no progress for .*its worker was stopped.*2 times; retries: 1") as e:
        run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "out"), workers=1, task_retries=1, task_timeout=TIMEOUT))
    assert len(hung) == 2 and "--task-timeout" in e.value.fix
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["status"] == "failed" and meta["error"]["task"] == rel and meta["error"]["kind"] == "worker_lost"
    assert meta["error"]["stalled"] is True


@pytest.mark.slow
def test_a_task_that_computes_without_reading_is_alive(tmp_path, monkeypatch):
    src = make_corpus(tmp_path / "in", files=2)
    rel, run, computed = _largest(src), Worker.run, []

    def computing(self, task):  # 3 timeouts of pure computation before the task reads anything
        if self.spec.phase == FINAL and getattr(task, "rel", None) == rel:
            with beating(rel, self.report):  # what Worker.run does around a task
                end = time.monotonic() + 3 * TIMEOUT
                while time.monotonic() < end:
                    sum(i * i for i in range(2000))
            computed.append(True)
        return run(self, task)

    monkeypatch.setattr(Worker, "run", computing)
    meta = run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "out"), workers=1, task_timeout=TIMEOUT)).metadata
    assert computed and meta["status"] == "success"
    assert meta["phases"][FINAL]["retried"] == 0 and "stalled" not in meta["phases"][FINAL]


@pytest.mark.slow
def test_a_stopped_pool_worker_is_killed_and_its_task_runs_again(tmp_path, monkeypatch, caplog):
    """SIGSTOP of a pool process as its task starts (its first heartbeat reaches the driver; the task
    reads 150,000 documents): its heartbeats stop, the driver kills it, the task runs again, and the
    output equals an uninterrupted run's."""
    src = make_corpus(tmp_path / "in", files=4)
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    for n in (1, 2):
        docs = [" ".join(words[(i * k + n) % 8] for k in range(1, 9)) + f" {i}" for i in range(150_000)]
        write_parquet(src, f"big{n}.parquet", {"contents": docs, "len": [len(d) for d in docs]})
    run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "ref"), workers=1, task_timeout=0))
    me, stopped = os.getpid(), []
    report = Liveness.report

    def stopping(self, key, docs, nbytes, beat=None):  # on the driver, as the beat arrives
        if beat is not None and beat[0] != me and key.startswith("big") and docs == 0 and not stopped:
            os.kill(beat[0], signal.SIGSTOP)
            stopped.append(beat[0])
        return report(self, key, docs, nbytes, beat)

    monkeypatch.setattr(Liveness, "report", stopping)
    run = Worker.run

    def after_the_stop(self, task):  # the driver's own worker waits, so the pool gets a big file of its own
        deadline = time.monotonic() + 120
        while self.spec.phase == FINAL and not stopped and time.monotonic() < deadline:
            time.sleep(0.01)
        return run(self, task)

    monkeypatch.setattr(Worker, "run", after_the_stop)
    try:
        meta = run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "out"), workers=2, task_timeout=TIMEOUT)).metadata
    finally:
        for pid in stopped:  # never leave a stopped process behind, whatever happened
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert stopped, "no pool worker was seen starting a big file"
    assert meta["status"] == "success"
    assert meta["phases"][FINAL]["stalled"] == 1 and meta["phases"][FINAL]["retried"] >= 1
    assert "no progress for" in caplog.text
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ref")


def test_liveness_counts_reads_and_cpu_not_heartbeats_alone(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(dispatch_mod.time, "monotonic", lambda: clock[0])
    live = Liveness(timeout=60)
    pid = os.getpid() + 1  # a pool process: its process CPU counts
    assert live.report("a", 0, 0, (pid, 1, 0.0, 0.0, 1.0))
    clock[0] += 50
    assert live.report("a", 0, 0, (pid, 1, 50.0, 0.0, 1.2)) is False  # 0.2 s of CPU in 50 s: below 1%
    assert live.idle("a") == 50
    assert live.report("a", 0, 0, (pid, 1, 51.0, 0.0, 1.3))  # 10% of a core: computing
    assert live.idle("a") == 0
    clock[0] += 10
    assert live.report("a", 5, 500, (pid, 1, 61.0, 0.0, 1.3))  # read a batch
    assert live.abandon("a") == pid and live.idle("a") is None
    assert live.report("a", 5, 500, (pid, 1, 62.0, 0.0, 1.3)) is None  # the abandoned attempt's beats: ignored
    me = os.getpid()  # the driver's own thread: its thread CPU counts, not the driver process's
    assert live.report("b", 0, 0, (me, 7, 0.0, 1.0, 5.0))
    clock[0] += 30
    assert live.report("b", 0, 0, (me, 7, 30.0, 1.0, 9.0)) is False
    assert live.warn_after == 30 and Liveness(4).warn_after == 2


def test_the_progress_line_says_no_progress_instead_of_an_eta():
    t = Tracker("doc_id", FINAL, 4, 1000, True, True)
    t.report("a", 10, 990)
    t.t0 -= 100
    assert "ETA" in line(t.snapshot())
    t._moved -= 45  # nothing moved for 45 s
    assert line(t.snapshot()).endswith("no progress for 45s") and "ETA" not in line(t.snapshot())
    t.report("a", 20, 995)
    assert "ETA" in line(t.snapshot())


def test_the_task_timeout_has_a_default_and_is_checked(monkeypatch):
    monkeypatch.delenv("PREPLINE_TASK_TIMEOUT", raising=False)
    assert RunOptions("i", "o").task_timeout == 300
    monkeypatch.setenv("PREPLINE_TASK_TIMEOUT", "45")
    assert RunOptions("i", "o").task_timeout == 45
    monkeypatch.setenv("PREPLINE_TASK_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="PREPLINE_TASK_TIMEOUT"):
        RunOptions("i", "o")
    with pytest.raises(ConfigError, match="task_timeout"):
        RunOptions("i", "o", task_timeout=-1)
