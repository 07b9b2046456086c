"""One writer per output: the lock of a local folder (flock) and the lease of an S3 prefix (conditional
writes on the local S3 server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from prepline.data_access import open_location
from prepline.errors import OutputError, OutputLocked
from prepline.runtime.lock import LOCK, LocalLock, S3Lease, output_lock


def test_a_second_local_lock_refuses_and_names_the_holder(tmp_path):
    with LocalLock(str(tmp_path / "out")):
        with pytest.raises(OutputLocked, match=f"pid {os.getpid()}") as e:
            LocalLock(str(tmp_path / "out")).acquire()
        assert "another --output" in e.value.fix
    assert not (tmp_path / "out" / "_prepline").exists()  # released: the lock file and its folder are gone
    LocalLock(str(tmp_path / "out")).acquire().release()  # and it can be taken again


def test_a_killed_holder_leaves_no_live_lock(tmp_path):
    code = f"from prepline.runtime.lock import LocalLock; LocalLock({str(tmp_path / 'out')!r}).acquire(); print('held', flush=True); input()"
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    with pytest.raises(OutputLocked):
        LocalLock(str(tmp_path / "out")).acquire()
    p.kill()
    p.wait()
    LocalLock(str(tmp_path / "out")).acquire().release()  # the kernel released it with the process


def test_an_output_that_is_a_file_is_an_output_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="is a file"):
        LocalLock(str(tmp_path / "f")).acquire()


@pytest.mark.s3
def test_s3_lease_second_run_refuses_then_takes_over_a_stale_one(s3_bucket):
    loc = open_location(f"s3://{s3_bucket}/out")
    a = output_lock(loc).acquire()
    assert isinstance(a, S3Lease)
    c = a.c
    with pytest.raises(OutputLocked, match="being written by"):
        output_lock(loc).acquire()
    a.release()
    assert loc.read_text(LOCK) is None
    # a lease whose owner process is gone on this host is stale at once
    stale = S3Lease(c, s3_bucket, loc.key(LOCK), loc.uri)
    stale.info["pid"] = 2**22 + 12345  # no such process
    stale.acquire()
    stale._stop.set()  # it "dies": no renewal, no release
    b = output_lock(loc).acquire()
    assert json.loads(loc.read_text(LOCK))["owner"] == b.info["owner"]
    stale.check()  # (the dead one never looks again)
    b.release()


@pytest.mark.s3
def test_s3_lease_taken_over_is_noticed_by_its_holder(s3_bucket):
    from prepline.objstore import s3_client

    loc = open_location(f"s3://{s3_bucket}/out")
    a = S3Lease(s3_client(), s3_bucket, loc.key(LOCK), loc.uri, ttl=0.4)
    a.acquire()
    a.c.put_object(Bucket=s3_bucket, Key=loc.key(LOCK), Body=b'{"owner": "someone else"}')
    deadline = time.time() + 5
    while a.lost is None and time.time() < deadline:
        time.sleep(0.05)
    with pytest.raises(OutputLocked, match="taken over"):
        a.check()
    a.release()
    assert json.loads(loc.read_text(LOCK))["owner"] == "someone else"  # never deleted by the loser


@pytest.mark.s3
def test_s3_lease_on_a_missing_bucket_is_an_output_error(s3_server):
    with pytest.raises(OutputError, match="does not exist"):
        output_lock(open_location("s3://prepline-no-bucket-lease/out")).acquire()
