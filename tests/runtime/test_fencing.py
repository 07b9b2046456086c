"""Fencing (issue 30 finding 4): a run that lost its output's lock (paused longer than its S3 lease,
or its local lock file replaced) writes nothing more there, not one file, marker or metadata.json.

The end-to-end cases pause a real ``prepline run`` process (SIGSTOP) at the worst moment, a file
written to its temp name and about to be committed, let a second run take the output over and
finish, then resume the first: the second run's output must be untouched, byte for byte and
timestamp for timestamp, and the first must fail with a clear error.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import make_corpus, tree_bytes
from prepline.data_access import open_location
from prepline.engine import RunOptions, run_transform
from prepline.errors import OutputLocked
from prepline.runtime.lock import LOCK, LocalLock, output_lock

# A `prepline run doc_id` (one worker: tasks run in this process) that stops right before committing
# its second output file: it says so in <sync>/waiting, then waits for <sync>/go.
PAUSING_RUN = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from prepline import cli, worker
    from prepline.location import ParquetSink

    sync = Path(sys.argv[1])
    files = [0]
    real_process, real_close = worker.process_file, ParquetSink.close
    def process_file(*a, **k):
        files[0] += 1
        return real_process(*a, **k)
    def close(self):
        real_close(self)
        if files[0] == 2:
            (sync / "waiting").write_text(str(os.getpid()))
            while not (sync / "go").exists():
                time.sleep(0.05)
    worker.process_file, ParquetSink.close = process_file, close
    sys.exit(cli.main(["run", "doc_id", "--input", sys.argv[2], "--output", sys.argv[3], "--workers", "1", "--no-progress"]))
""")


def _start_paused(tmp_path: Path, src: Path, out: str) -> tuple[subprocess.Popen, Path]:
    sync = tmp_path / "sync"
    sync.mkdir()
    env = {**os.environ, "PREPLINE_LEASE_TTL": "3"}
    p = subprocess.Popen([sys.executable, "-c", PAUSING_RUN, str(sync), str(src), out], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 180
    while not (sync / "waiting").exists():
        if p.poll() is not None or time.time() > deadline:
            p.kill()
            pytest.fail(f"the first run never reached its second file: {p.communicate()[1][-2000:]}")
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGSTOP)  # paused, as a frozen VM or a stopped process would be
    return p, sync


def _resume(p: subprocess.Popen, sync: Path) -> tuple[int, str]:
    (sync / "go").write_text("")
    os.kill(p.pid, signal.SIGCONT)
    try:
        _, err = p.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    return p.returncode, err


def _local_state(root: Path) -> dict:
    return {str(f.relative_to(root)): (hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_mtime_ns)
            for f in sorted(root.rglob("*")) if f.is_file()}


def test_a_local_fence_refuses_writes_once_the_lock_file_is_replaced(tmp_path):
    out = tmp_path / "out"
    old = LocalLock(str(out)).acquire()
    loc = open_location(str(out))
    loc.fence = old.fence()
    loc.write_bytes("a.txt", b"1")  # ours: fine
    os.unlink(out / "_prepline" / "lock")  # lost (e.g. a network file system's lock lease expired) ...
    new = LocalLock(str(out)).acquire()  # ... and taken by another run
    for write in (lambda: loc.write_bytes("b.txt", b"2"), lambda: loc.sub("w").write_bytes("c.txt", b"3"), lambda: loc.delete("a.txt")):
        with pytest.raises(OutputLocked, match="no longer holds its lock"):
            write()
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == ["a.txt", "lock"]  # no temp file left either
    old.release()  # never removes the other run's lock
    assert (out / "_prepline" / "lock").exists()
    with pytest.raises(OutputLocked):
        LocalLock(str(out)).acquire()
    new.release()


def test_a_paused_local_writer_writes_nothing_after_another_run_took_over(tmp_path):
    src = make_corpus(tmp_path / "in", files=5)
    run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "ref"), workers=1, progress=False))
    out = tmp_path / "out"
    a, sync = _start_paused(tmp_path, src, str(out))
    try:
        os.unlink(out / LOCK)  # its lock is lost while it sleeps; the next run takes the output over
        b = run_transform("doc_id", {}, RunOptions(str(src), str(out), workers=1, progress=False))
        assert b.metadata["status"] == "success"
        before = _local_state(out)
    finally:
        code, err = _resume(a, sync)
    assert _local_state(out) == before  # not one file, marker or metadata.json written or touched
    assert code == 7, err
    assert "no longer holds its lock" in err and "fix:" in err and "Traceback" not in err
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")


@pytest.mark.s3
def test_a_paused_s3_writer_writes_nothing_after_another_run_took_over_its_lease(tmp_path, s3_bucket):
    """The finding's reproduction: after a pause longer than the lease, the first run wrote 3 files and its
    failed metadata.json into the second run's finished output."""
    from prepline.data_access import s3_client

    src = make_corpus(tmp_path / "in", files=5)
    run_transform("doc_id", {}, RunOptions(str(src), str(tmp_path / "ref"), workers=1, progress=False))
    out = f"s3://{s3_bucket}/out"
    c = s3_client()

    def state() -> dict:
        return {o["Key"]: (o["ETag"], o["LastModified"]) for o in c.list_objects_v2(Bucket=s3_bucket).get("Contents", [])}

    a, sync = _start_paused(tmp_path, src, out)
    try:
        deadline = time.time() + 120
        while True:  # the paused run's lease (3 s) goes stale; then the same command takes the output over
            try:
                b = run_transform("doc_id", {}, RunOptions(str(src), out, workers=1, progress=False))
                break
            except OutputLocked:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        assert b.metadata["status"] == "success"
        before = state()
    finally:
        code, err = _resume(a, sync)
    assert state() == before  # nothing written, completed or deleted by the first run
    assert code == 7, err
    assert "no longer holds its lock" in err and "fix:" in err and "Traceback" not in err
    assert not any(k.startswith("out/_prepline/") for k in before)
    got = {k[len("out/"):]: c.get_object(Bucket=s3_bucket, Key=k)["Body"].read() for k in before if k.endswith(".parquet")}
    assert got == tree_bytes(tmp_path / "ref")
    assert c.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []  # its upload was aborted, not left open


def test_every_write_of_a_run_carries_the_fence(tmp_path):
    """The driver's output and every worker's output and work folder check the same token."""
    src = make_corpus(tmp_path / "in", files=2)
    out = tmp_path / "out"
    with output_lock(open_location(str(out))) as lock:
        f = lock.fence()
    from prepline.context import PhaseContext, WorkerSpec

    ctx = PhaseContext(WorkerSpec("doc_id", {}, str(src), str(out), "final", {}, f))
    assert ctx.output.fence == f and ctx.work.fence == f


def test_the_fence_client_follows_the_s3_environment(monkeypatch):
    """CI found a fence check answered 404 for a lease that existed: one process (a test session, a
    Python-API program) ran stages against two S3 endpoints, and the fence client cached for the
    process still asked the first. It is now one client per S3 environment."""
    from prepline.runtime import lock

    monkeypatch.setenv("PREPLINE_S3_ENDPOINT", "http://127.0.0.1:1")
    first = lock._fence_client()
    assert first.meta.endpoint_url == "http://127.0.0.1:1" and lock._fence_client() is first
    monkeypatch.setenv("PREPLINE_S3_ENDPOINT", "http://127.0.0.1:2")
    second = lock._fence_client()
    assert second.meta.endpoint_url == "http://127.0.0.1:2" and second is not first
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone-else")  # other credentials: another client
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "their-secret")
    assert lock._fence_client() is not second
