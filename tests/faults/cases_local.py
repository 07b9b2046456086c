"""Fault cases on one machine: concurrent runs, killed workers and drivers, bad input, bad parameters,
the output side (read-only, a file, disk full), the filter lock-down and the pipeline's early checks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from conftest import pool_workers

from faults.harness import (Env, Row, account, case, clear_error, first_error, fresh, ids, markers, meta, tagged_processes,
                            wait_for)

RUN = ["run"]
QUIET = ["--no-progress"]


# -- finding 1: two runs on one output ---------------------------------------------------------------
@case("race_local", "two exact_dedup runs (num_shards 64 / 32) started at once on one local output, twice (finding 1)",
      "one run writes, the other refuses (exit 7) whatever the timing; the output equals the winner's uninterrupted run")
def race_local(env: Env, row: Row) -> Row:
    refs = {n: env.reference("exact_dedup", {"num_shards": n}) for n in (64, 32)}
    outcomes = []
    for _ in range(2):
        out = fresh(env.path("race"))
        procs = {n: env.start(RUN + ["exact_dedup", "--input", str(env.corpus), "--output", str(out), "--num-shards", str(n),
                                     "--workers", "1"] + QUIET) for n in (64, 32)}
        res = {n: (p.wait(120), p.stderr.read()) for n, p in procs.items()}
        winners = [n for n, (rc, _) in res.items() if rc == 0]
        losers = [(n, rc, err) for n, (rc, err) in res.items() if rc != 0]
        row.check(len(winners) == 1, f"{len(winners)} runs succeeded: {res}")
        for n, rc, err in losers:
            row.check(rc == 7 and "fix:" in err and "Traceback" not in err, f"loser exit {rc}: {err[-400:]}")
            outcomes.append(err.split("error:")[-1].split("\n")[0].strip())
        if len(winners) == 1:
            account(row, out, refs[winners[0]])
    said = sorted({"being written by another run" if "being written" in o else o.split(": ")[-1][:40] for o in outcomes})
    return row.done(f"1 winner of 2, 2 of 2 times; losers: exit 7 ({'; '.join(said)})")


# -- finding 8 / worker loss ---------------------------------------------------------------------------
def _cpu_ticks(pid: int) -> int:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])
    except (OSError, IndexError, ValueError):
        return -1


def _claims(parent: int) -> int:
    """Tasks the pool processes of driver ``parent`` started so far (their claim files, runtime/local.py)."""
    import tempfile

    n = 0
    for d in Path(tempfile.gettempdir()).glob(f"prepline-claims-{parent}-*"):
        try:
            n += len(os.listdir(d))
        except OSError:
            pass
    return n


def _kill_a_busy_pool_worker(parent: int, stop: threading.Event, killed: list) -> None:
    """SIGKILL a pool worker while it works on a task: pool tasks were claimed and it is using CPU
    (an idle or still-starting process holds nothing: killing it would prove nothing)."""
    while not stop.is_set():
        for pid in pool_workers(parent):
            before = _cpu_ticks(pid)
            time.sleep(0.05)
            if _claims(parent) and before >= 0 and _cpu_ticks(pid) > before:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.005)


@case("pool_worker_killed", "fuzzy_dedup on 2 workers: the pool process SIGKILLed while it works on a task, --max-failed-files 1 "
      "(finding 8; issue 30: the kill must land on a task)",
      "the task runs again on a new worker (retried >= 1); success, byte-identical, no file counted as failed")
def pool_worker_killed(env: Env, row: Row) -> Row:
    ref = env.reference("fuzzy_dedup")
    for attempt in range(3):  # the kill must land while the process holds a task; a run that ends first is run again
        out = env.path("poolkill")
        p = env.start(RUN + ["fuzzy_dedup", "--input", str(env.corpus), "--output", str(out), "--workers", "2",
                             "--max-failed-files", "1"] + QUIET)
        stop, killed = threading.Event(), []
        t = threading.Thread(target=_kill_a_busy_pool_worker, args=(p.pid, stop, killed), daemon=True)
        t.start()
        rc = p.wait(300)
        stop.set()
        t.join(5)
        err = p.stderr.read()
        if killed:
            break
    row.check(bool(killed), "the fault never happened: no pool worker was seen working on a task in 3 runs")
    row.check(rc == 0, f"exit {rc}: {err[-600:]}")
    retried = 0
    if rc == 0:
        m = meta(out)
        retried = sum(ph.get("retried", 0) for ph in m["phases"].values())
        row.check(retried >= 1 and "running it again" in err, f"the killed worker's task was not run again: retried={retried}")
        row.check(not m["failures"], f"files counted as failed: {list(m['failures'])}")
        account(row, out, ref)
    return row.done(f"pool process killed at work (run {attempt + 1}); {retried} task(s) retried; success, identical")


# -- finding 9: the driver killed ---------------------------------------------------------------------
def _kill_driver(env: Env, row: Row, sig: int) -> tuple[Path, subprocess.Popen, str, float]:
    out, tag = env.path("drvkill"), uuid.uuid4().hex
    p = env.start(RUN + ["exact_dedup", "--input", str(env.corpus), "--output", str(out), "--workers", "2", "--num-shards", "64"] + QUIET,
                  extra={"PREPLINE_FAULT_TAG": tag})
    row.check(wait_for(lambda: markers(out, "hash") >= 1, 120), "the run made no progress to interrupt")
    os.kill(p.pid, sig)  # the main process only: its workers must notice on their own
    t0 = time.perf_counter()
    p.wait(60)
    gone = wait_for(lambda: not tagged_processes(tag), 10, 0.05)
    secs = time.perf_counter() - t0
    row.check(gone, f"processes outlived the run: {tagged_processes(tag)}")
    return out, p, tag, secs


@case("sigkill_driver", "SIGKILL of the main process mid-run (workers 2), then the same command again (finding 9)",
      "no worker outlives it (they watch their parent); the rerun resumes to byte-identical output, no work folder left")
def sigkill_driver(env: Env, row: Row) -> Row:
    ref = env.reference("exact_dedup", {"num_shards": 64})
    out, p, tag, secs = _kill_driver(env, row, signal.SIGKILL)
    row.check(p.returncode == -signal.SIGKILL, f"the run was not killed (exit {p.returncode})")
    r = env.cli(RUN + ["exact_dedup", "--input", str(env.corpus), "--output", str(out), "--workers", "1", "--num-shards", "64"] + QUIET)
    row.check(r.rc == 0, f"rerun exit {r.rc}: {r.err[-500:]}")
    if r.rc == 0:  # the kill landed mid-run: the rerun took the finished tasks from their markers
        row.check(meta(out)["phases"]["hash"]["resumed"] >= 1, f"nothing was resumed: {meta(out)['phases']['hash']}")
    row.check(not (out / "_prepline").exists(), "the work folder was left behind")
    account(row, out, ref)
    row.seconds = secs
    return row.done(f"workers gone {secs:.1f}s after the kill; rerun resumed, identical")


@case("sigterm_driver", "SIGTERM of the main process mid-run (workers 2), then the same command again",
      "exit 143 with error/fix, metadata.json says failed (terminated) and what was written; no orphan; rerun identical")
def sigterm_driver(env: Env, row: Row) -> Row:
    ref = env.reference("exact_dedup", {"num_shards": 64})
    out, p, tag, secs = _kill_driver(env, row, signal.SIGTERM)
    err = p.stderr.read()
    row.check(p.returncode == 143 and "fix:" in err and "Traceback" not in err, f"exit {p.returncode}: {err[-500:]}")
    m = meta(out) if (out / "metadata.json").exists() else {}
    row.check(m.get("status") == "failed" and "terminated" in m.get("error", {}).get("message", ""), f"metadata: {m.get('error')}")
    r = env.cli(RUN + ["exact_dedup", "--input", str(env.corpus), "--output", str(out), "--workers", "1", "--num-shards", "64"] + QUIET)
    row.check(r.rc == 0, f"rerun exit {r.rc}: {r.err[-500:]}")
    if r.rc == 0:  # the signal landed mid-run: the rerun took the finished tasks from their markers
        row.check(meta(out)["phases"]["hash"]["resumed"] >= 1, f"nothing was resumed: {meta(out)['phases']['hash']}")
    account(row, out, ref)
    row.seconds = secs
    return row.done(f"exit 143, metadata.json failed/terminated, no orphan after {secs:.1f}s; rerun identical")


def _work_files(out: Path) -> list[Path]:
    """What the work folder still holds besides the lock (which the run holds until it exits)."""
    return [p for p in (out / "_prepline").rglob("*") if p.is_file() and p.name != "lock"] if (out / "_prepline").exists() else []


@case("killed_in_cleanup", "a run SIGKILLed after its success metadata.json, before its cleanup ended (finding 9: 35 MB left for good)",
      "the rerun sees the complete output, nothing runs, the leftover work folder is removed; output identical")
def killed_in_cleanup(env: Env, row: Row) -> Row:
    ref = env.reference("exact_dedup", {"num_shards": 256})
    args = ["exact_dedup", "--input", str(env.corpus), "--num-shards", "256", "--workers", "1"]
    landed = False
    for attempt in range(3):  # the kill must land between metadata.json and the end of the cleanup
        out = env.path("cleanup")
        p = env.start(RUN + args + ["--output", str(out)] + QUIET)

        def success_written() -> bool:
            try:
                return meta(out)["status"] == "success"
            except (OSError, ValueError, KeyError):
                return False

        wait_for(lambda: success_written() or p.poll() is not None, 300, 0.0005)
        if p.poll() is None and (out / "_prepline").exists():
            p.kill()
        p.wait(60)
        landed = p.returncode == -signal.SIGKILL and success_written() and bool(_work_files(out))
        if landed:
            break
    row.check(landed, "the fault never happened: no run was killed during its cleanup in 3 tries")
    left = len(_work_files(out)) if landed else 0
    before = meta(out)["ended"] if landed else None
    claimed = (out / "_prepline" / "run.json").exists()  # killed before the cleanup's first step: the run is still open
    r = env.cli(RUN + args + ["--output", str(out)] + QUIET)
    row.check(r.rc == 0, f"rerun exit {r.rc}: {r.err[-300:]}")
    if r.rc == 0 and landed and not claimed:
        row.check(meta(out)["ended"] == before, "the rerun ran again instead of seeing the complete output")
    elif r.rc == 0 and landed:  # it resumes, and every task comes from its marker: nothing is computed again
        phases = meta(out)["phases"]
        row.check(all(ph["resumed"] == ph["tasks"] for ph in phases.values()), f"the rerun computed again: {phases}")
    row.check(not (out / "_prepline").exists(), "the leftover work folder is still there")
    account(row, out, ref)
    row.seconds = r.seconds
    how = "resumed from its markers, nothing computed again" if claimed else "already complete"
    return row.done(f"killed in its cleanup ({left} work files left, try {attempt + 1}); rerun: {how}, leftover deleted, identical")


# -- finding 3: duplicate ids ------------------------------------------------------------------------
@case("dup_ids_exact", "exact_dedup on input with repeated doc_id values (one file copied twice) (finding 3)",
      "refused before anything is written as success: exit 6 naming the id column and the fix (like fuzzy_dedup)")
def dup_ids_exact(env: Env, row: Row) -> Row:
    src = env.path("dupids")
    shutil.copytree(env.corpus, src, ignore=shutil.ignore_patterns("_prepline", "metadata.json"))
    first = sorted(src.rglob("*.parquet"))[0]
    shutil.copy(first, first.with_name("copy-" + first.name))
    out = env.path("dupids-out")
    r = env.cli(RUN + ["exact_dedup", "--input", str(src), "--output", str(out), "--workers", "1"] + QUIET)
    clear_error(row, r, 6, "doc_id", "doc_id first")
    row.check(not (out / "metadata.json").exists() or meta(out)["status"] == "failed", "a success was recorded")
    row.seconds = r.seconds
    return row.done(f"exit 6: {first_error(r)}")


# -- finding 5: a corrupted page -----------------------------------------------------------------------
def _corrupt_file(dst: Path) -> Path:
    """300 documents in an uncompressed file written with page checksums, one byte of one text altered."""
    texts = [f"document number {i} about alpha beta gamma" for i in range(300)]
    dst.mkdir(parents=True)
    p = dst / "part-0.parquet"
    pq.write_table(pa.table({"contents": texts, "doc_id": pa.array(range(300), pa.int64())}), p, compression="none",
                   write_page_checksum=True)
    pq.write_table(pa.table({"contents": ["a fine file"], "doc_id": pa.array([1000], pa.int64())}), dst / "part-1.parquet",
                   write_page_checksum=True)
    b = bytearray(p.read_bytes())
    i = b.index(b"document number 150")
    b[i + 9] ^= 0x20
    p.write_bytes(bytes(b))
    return p


@case("corrupt_page", "one byte altered in a data page of an uncompressed Parquet file with page checksums (finding 5)",
      "the file fails its CRC check: exit 1 naming it; with --max-failed-files 1 it is listed and its 300 documents counted")
def corrupt_page(env: Env, row: Row) -> Row:
    src = env.path("corrupt")
    bad = _corrupt_file(src)
    out = env.path("corrupt-out")
    r = env.cli(RUN + ["filter", "--input", str(src), "--output", str(out), "--criteria", "length(contents) > 0", "--workers", "1"] + QUIET)
    clear_error(row, r, 1, bad.name, "checksum")
    out2 = env.path("corrupt-tol")
    r2 = env.cli(RUN + ["filter", "--input", str(src), "--output", str(out2), "--criteria", "length(contents) > 0", "--workers", "1",
                        "--max-failed-files", "1"] + QUIET)
    row.check(r2.rc == 0, f"tolerated run exit {r2.rc}: {r2.err[-400:]}")
    row.check(b"document Number 150" in bad.read_bytes(), "the page was not corrupted")
    if r2.rc == 0:
        t = meta(out2)["totals"]
        row.check(t["files_failed"] == 1 and t["docs_in_failed_files"] == 300, f"totals: {t}")
        import collections

        got, want = ids(out2), collections.Counter([1000])  # the healthy file's one document, and nothing else
        row.lost, row.duplicated = sum((want - got).values()), sum((got - want).values())
    row.seconds = r.seconds
    return row.done("exit 1 naming part-0.parquet (CRC checksum verification failed); tolerated: listed, its 300 docs counted "
                    "in docs_in_failed_files")


# -- finding 6 and 10: parameters ------------------------------------------------------------------------
BAD_PARAMS = [
    ("fuzzy_dedup", ["--threshold", "nan"], "threshold"),
    ("fuzzy_dedup", ["--params", '{"threshold": NaN}'], "NaN"),
    ("exact_dedup", ["--num-shards", "2.5"], "num_shards"),
    ("exact_dedup", ["--params", '{"num_shards": 1e309}'], "num_shards"),
    ("exact_dedup", ["--params", '{"num_shards": 8'], "not valid JSON"),
    ("fuzzy_dedup", ["--threshold", "inf"], "threshold"),
]


@case("bad_parameters", "threshold NaN / inf, num_shards 2.5 / 1e309, malformed --params JSON (findings 6, 10)",
      "each refused before any work: exit 2, error naming the parameter + fix, no output folder written")
def bad_parameters(env: Env, row: Row) -> Row:
    from faults.harness import Result

    from prepline.cli import main

    t0 = time.perf_counter()
    for transform, args, needle in BAD_PARAMS:
        out = env.path("badparam")
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(RUN + [transform, "--input", str(env.corpus), "--output", str(out)] + args + QUIET)
        clear_error(row, Result(rc, "", err.getvalue(), 0), 2, needle)
        row.check(not out.exists(), f"{args}: the output folder was created")
    row.seconds = (time.perf_counter() - t0) / len(BAD_PARAMS)
    return row.done(f"{len(BAD_PARAMS)} of {len(BAD_PARAMS)} refused with exit 2 before any output")


# -- finding 10: the output side -----------------------------------------------------------------------
@case("output_is_file", "--output names an existing file (finding 10)", "exit 7: the output is a file, fix: choose a folder")
def output_is_file(env: Env, row: Row) -> Row:
    f = env.path("afile")
    f.write_text("not a folder")
    r = env.cli(RUN + ["doc_id", "--input", str(env.corpus), "--output", str(f), "--workers", "1"] + QUIET)
    clear_error(row, r, 7, "is a file")
    row.seconds = r.seconds
    return row.done(f"exit 7: {first_error(r)}")


def _unshare(script: str) -> list[str]:
    """Run inside a private mount namespace (a tmpfs of our own, gone with the process)."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


def can_mount() -> bool:
    r = subprocess.run(_unshare("mount -t tmpfs -o size=64k tmpfs /mnt && umount /mnt"), capture_output=True)
    return r.returncode == 0


@case("output_read_only", "--output on a read-only file system (a tmpfs mounted ro) (finding 10)",
      "exit 7: cannot write <path>: Read-only file system, fix: a writable --output")
def output_read_only(env: Env, row: Row) -> Row:
    if not can_mount():
        return row.done("SKIPPED: cannot mount a tmpfs here (needs CAP_SYS_ADMIN or user namespaces)")
    mnt = env.path("romnt")
    mnt.mkdir()
    r = env.cli(RUN + ["doc_id", "--input", str(env.corpus), "--output", str(mnt / "out"), "--workers", "1"] + QUIET,
                prefix=_unshare(f"mount -t tmpfs -o size=1m,ro tmpfs {mnt} && exec \"$@\""))
    clear_error(row, r, 7, "read-only")
    row.seconds = r.seconds
    return row.done(f"exit 7: {first_error(r)}")


@case("disk_full", "the output's disk fills up mid-run (a 96 KiB tmpfs), then space is freed and the command rerun",
      "exit 7: No space left on device + fix; the rerun resumes to byte-identical output")
def disk_full(env: Env, row: Row) -> Row:
    if not can_mount():
        return row.done("SKIPPED: cannot mount a tmpfs here (needs CAP_SYS_ADMIN or user namespaces)")
    mnt, keep = env.path("fullmnt"), env.path("full-copy")
    mnt.mkdir()
    ref = env.reference("doc_id", src=env.raw)
    cmd = f"{shlex_join(['python', '-m', 'prepline.cli'] + RUN + ['doc_id', '--input', str(env.raw), '--output', str(mnt / 'out'), '--workers', '1'] + QUIET)}"
    script = (f"mount -t tmpfs -o size=96k tmpfs {mnt} || exit 99; PATH={Path(os.sys.executable).parent}:$PATH; "
              f"{cmd}; echo \"first=$?\" >&2; mount -o remount,size=8m {mnt}; {cmd}; echo \"second=$?\" >&2; "
              f"cp -r {mnt / 'out'} {keep}")
    r = env.cli([], prefix=_unshare(script + " #"))
    first = r.err.split("first=")[1].split()[0] if "first=" in r.err else "?"
    second = r.err.split("second=")[1].split()[0] if "second=" in r.err else "?"
    row.check(first == "7", f"first run exit {first}: {r.err[-800:]}")
    row.check("no space left on device" in r.err.lower() and "fix:" in r.err and "Traceback" not in r.err, r.err[-800:])
    row.check(second == "0", f"rerun exit {second}: {r.err[-500:]}")
    if keep.exists():
        account(row, keep, ref)
    return row.done(f"exit {first}: No space left on device; after freeing space the rerun: exit {second}, identical")


def shlex_join(args: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(a) for a in args)


@case("duplicate_columns", "an input file with two columns named contents (finding 10: a misleading KeyError)",
      "exit 6: the column name appears more than once, fix: unique names")
def duplicate_columns(env: Env, row: Row) -> Row:
    src = env.path("dupcol")
    src.mkdir()
    t = pa.Table.from_arrays([pa.array(["a", "b"]), pa.array(["c", "d"])], names=["contents", "contents"])
    pq.write_table(t, src / "x.parquet")
    r = env.cli(RUN + ["doc_id", "--input", str(src), "--output", str(env.path("dupcol-out")), "--workers", "1"] + QUIET)
    clear_error(row, r, 6, "more than once")
    row.seconds = r.seconds
    return row.done(f"exit 6: {first_error(r)}")


# -- finding 11: the pipeline's parameters, checked before its first step -----------------------------------
@case("pipeline_bad_overrides", "super pipeline: an unknown filter parameter, an overrides_json stage that does not exist, "
      "an unknown --param (findings 10, 11)", "refused before any stage runs: exit 2 naming the stage/parameter, in seconds")
def pipeline_bad_overrides(env: Env, row: Row) -> Row:
    from prepline.stages import prepare

    from faults.harness import Result

    t0 = time.perf_counter()
    bad = [({"filter": {"params": {"criterias": ["x > 1"]}}}, "criterias"), ({"lang_idd": {"params": {}}}, "lang_idd")]
    for o, needle in bad:  # the first stage's prepare step checks every stage's overrides
        try:
            prepare("doc_id", "{}", str(env.root / "work"), "run-1", "doc_id", input_path=str(env.corpus), overrides_json=json.dumps(o))
            row.check(False, f"prepare accepted {o}")
        except Exception as e:  # noqa: BLE001
            row.check(type(e).__name__ == "ConfigError" and needle in str(e), f"{o}: {type(e).__name__}: {e}")
    prep_s = time.perf_counter() - t0
    for args, needle in ((["--param", 'overrides_json={"lang_idd": {}}'], "lang_idd"), (["--param", "nope=1"], "nope")):
        r = env.cli(["pipeline", "run", "super", "--local", "--input", str(env.corpus), "--work-root", str(env.path("pw"))] + args,
                    timeout=120)
        clear_error(row, Result(r.rc, r.out, r.err, r.seconds), 2, needle)
        row.check(r.seconds < 60, f"took {r.seconds:.0f}s")
    row.seconds = prep_s / len(bad)
    return row.done(f"first step refuses in {row.seconds:.2f}s; `prepline pipeline run` refuses before kfp starts (exit 2)")


# -- finding 12: the filter lock-down ------------------------------------------------------------------
LOCKED = ["current_setting('home_directory') <> ''", "(SELECT count(*) FROM duckdb_settings()) > 0",
          "(SELECT count(*) FROM pragma_database_list) > 0", "(SELECT count(*) FROM query('SELECT 1')) > 0",
          "(SELECT count(*) FROM query_table('docs')) > 0", "(SELECT count(*) FROM read_csv('/etc/passwd')) > 0"]


@case("filter_lockdown", "filter criteria reading settings or running nested queries; quoted '--' and '/*' (finding 12)",
      "the 6 refused (exit 2, naming the function); a criterion with '--' and '/*' inside quotes runs")
def filter_lockdown(env: Env, row: Row) -> Row:
    import contextlib
    import io

    from faults.harness import Result

    from prepline.cli import main

    for c in LOCKED:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(RUN + ["filter", "--input", str(env.corpus), "--output", str(env.path("lock")), "--criteria", c] + QUIET)
        clear_error(row, Result(rc, "", err.getvalue(), 0), 2, "not allowed")
    out = env.path("quoted")
    r = env.cli(RUN + ["filter", "--input", str(env.corpus), "--output", str(out), "--workers", "1",
                       "--criteria", "contents NOT LIKE '%--%' AND contents <> '/* x */'"] + QUIET)
    row.check(r.rc == 0, f"quoted -- and /*: exit {r.rc}: {r.err[-300:]}")
    if r.rc == 0:  # measured: the documents the criterion keeps (computed here) against the files written
        import collections

        want = collections.Counter()
        for f in sorted(env.corpus.rglob("*.parquet")):
            if "_prepline" not in f.parts:
                t = pq.read_table(f, columns=["contents", "doc_id"]).to_pylist()
                want.update(d["doc_id"] for d in t if "--" not in d["contents"] and d["contents"] != "/* x */")
        got = ids(out)
        row.lost, row.duplicated = sum((want - got).values()), sum((got - want).values())
    row.seconds = r.seconds
    return row.done(f"{len(LOCKED)} of {len(LOCKED)} refused (exit 2); quoted '--' '/*' accepted")
