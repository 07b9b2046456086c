"""Object-store faults, injected by the fault proxy (faults/proxy.py) in front of the local S3 server:
5xx answers, throttling, resets, bodies cut short, stalls, a server that goes away (and comes back),
a frozen server, refused or missing credentials, and two runs on one S3 output."""

from __future__ import annotations

import threading
import time

from faults.harness import (S3_WORST_CASE, Env, Result, Row, account, case, clear_error, first_error, meta)
from faults.proxy import FaultProxy

S3 = ("s3",)
QUIET = ["--no-progress"]


def _run(env: Env, row: Row, faults, max_failed: int = 0, output_on_s3: bool = True, extra: dict | None = None,
         during=None, args: tuple = ()) -> tuple[Result, str, FaultProxy]:
    """doc_id from S3 (through the proxy) to S3 (or a local folder), with ``faults(proxy)`` set up first
    and ``during(proxy)`` run in a thread while prepline runs."""
    bucket = env.bucket()
    src = env.upload(env.raw, bucket, "in")
    out = f"s3://{bucket}/out" if output_on_s3 else str(env.path("s3out"))
    proxy = FaultProxy(env.s3())
    try:
        faults(proxy)
        t = threading.Thread(target=during, args=(proxy,), daemon=True) if during else None
        if t:
            t.start()
        r = env.cli(["run", "doc_id", "--input", src, "--output", out, "--workers", "1", "--max-failed-files", str(max_failed),
                     *args] + QUIET, extra={**env.s3_env(proxy.url), **(extra or {})})
        if t:
            t.join(60)
    finally:
        proxy.close()
    return r, out, proxy


def _identical(env: Env, row: Row, r: Result, out: str, injected: int | None = None) -> None:
    """Success, byte-identical to an uninterrupted run, no file counted as failed; and the fault happened
    (``injected``: how many requests the proxy broke, at least one)."""
    if injected is not None:
        row.check(injected >= 1, "the fault never happened: the proxy broke no request")
    row.check(r.rc == 0, f"exit {r.rc}: {r.err[-700:]}")
    row.check("not a readable Parquet" not in r.err and "corrupt or truncated" not in r.err, "a transient fault was taken for bad input")
    if r.rc == 0:
        local = env.download(out) if out.startswith("s3://") else out
        account(row, local, env.reference("doc_id", src=env.raw))
        row.check(meta(local)["totals"]["files_failed"] == 0, "a file was counted as failed")
    row.seconds = r.seconds


def _transient(kind: str, times: int, match: str = "", seconds: float = 0.0):
    def setup(p: FaultProxy) -> None:
        p.inject(kind, times=times, match=match, seconds=seconds)
    return setup


@case("s3_5xx", "S3 answers 500 InternalError / 503 ServiceUnavailable to 6 requests, 2 in a row (lookups, reads, writes)",
      "retried within the budget; success, byte-identical", S3)
def s3_5xx(env: Env, row: Row) -> Row:
    def faults(p):
        p.inject("500", times=2)
        p.inject("503", times=2, match=r"^GET /[^?]+/in/f0")
        p.inject("503", times=2, match="^PUT")
    r, out, p = _run(env, row, faults)
    _identical(env, row, r, out, sum(p.stats.injected.values()))
    row.check(sum(p.stats.injected.values()) == 6, f"injected: {p.stats.injected}")
    return row.done(f"{sum(p.stats.injected.values())} errors injected, all retried; success, identical")


@case("s3_throttle", "S3 throttles (503 SlowDown) 2 requests in a row", "retried with backoff; success, byte-identical", S3)
def s3_throttle(env: Env, row: Row) -> Row:
    r, out, p = _run(env, row, _transient("throttle", 2))
    _identical(env, row, r, out, p.stats.injected.get("throttle", 0))
    return row.done(f"{p.stats.injected.get('throttle', 0)} SlowDown answers retried; success, identical")


@case("s3_reset", "connections reset (TCP RST) before the answer, 4 times (GET and PUT)",
      "retried; success, byte-identical", S3)
def s3_reset(env: Env, row: Row) -> Row:
    def faults(p):
        p.inject("reset", times=2, match="^GET /[^?]+/in/")
        p.inject("reset", times=2, match="^PUT")
    r, out, p = _run(env, row, faults)
    _identical(env, row, r, out, p.stats.injected.get("reset", 0))
    return row.done(f"{p.stats.injected.get('reset', 0)} resets retried; success, identical")


@case("s3_cut_body", "a download cut halfway (headers promise more bytes) for one file, --max-failed-files 3 (finding 4)",
      "the read is retried, not taken for a bad file; success with 0 files failed, byte-identical", S3)
def s3_cut_body(env: Env, row: Row) -> Row:
    r, out, p = _run(env, row, _transient("cut", 1, match=r"^GET /[^?]+/in/f04\.parquet"), max_failed=3)
    _identical(env, row, r, out)
    row.check(p.stats.injected.get("cut", 0) == 1, f"cuts injected: {p.stats.injected}")
    return row.done("the cut download retried; 0 files failed; success, identical")


@case("s3_stall", "a read that stalls past the read timeout (2 s here), once (finding 4: 'not a readable Parquet file')",
      "timed out and retried, never reported as bad input; success, byte-identical", S3)
def s3_stall(env: Env, row: Row) -> Row:
    r, out, p = _run(env, row, _transient("stall", 1, match=r"^GET /[^?]+/in/f04\.parquet", seconds=3), max_failed=3,
                     extra={"PREPLINE_S3_READ_TIMEOUT": "2"})
    _identical(env, row, r, out)
    return row.done("stalled read timed out after 2 s and was retried; success, identical")


@case("s3_away_and_back", "the S3 endpoint goes away for 2 s mid-run (connections refused) and comes back",
      "calls retried within the budget; success, byte-identical", S3)
def s3_away_and_back(env: Env, row: Row) -> Row:
    def during(p: FaultProxy) -> None:
        deadline = time.time() + 60
        while p.stats.requests < 12 and time.time() < deadline:
            time.sleep(0.01)
        p.down()
        time.sleep(2)
        p.up()
    r, out, p = _run(env, row, lambda p: None, during=during)
    row.check(p.stats.requests >= 12, "the endpoint never went away: too few requests")
    _identical(env, row, r, out)
    return row.done("outage of 2 s bridged by retries; success, identical")


@case("s3_brownout", "S3 answers 503 ServiceUnavailable to every request for 30 s mid-run (finding 6 of issue 30: a 10 s "
      "brownout failed a run)", "ridden out with the default retry budget; success, byte-identical", S3)
def s3_brownout(env: Env, row: Row) -> Row:
    window = {}

    def during(p: FaultProxy) -> None:
        deadline = time.time() + 60
        while p.stats.requests < 12 and time.time() < deadline:
            time.sleep(0.01)
        p.inject("503", times=-1)
        window["start"] = time.perf_counter()
        time.sleep(30)  # the fault's length, not a synchronisation
        p.clear()
        window["end"] = time.perf_counter()
    r, out, p = _run(env, row, lambda p: None, during=during)
    n = p.stats.injected.get("503", 0)
    row.check("end" in window and n >= 3, f"the brownout did not happen as planned: {n} answers 503, window {window}")
    _identical(env, row, r, out, n)
    row.seconds = window.get("end", 0) - window.get("start", 0)
    return row.done(f"{n} requests answered 503 over {row.seconds:.0f}s; retried within the default budget; success, identical")


def _outage(env: Env, row: Row, mode: str) -> tuple[Result, float]:
    """A fault that outlasts the retry budget mid-run; then the fault is lifted and the command rerun.
    The frozen store holds the input only (the output is local): the run's own calls then hit it once."""
    bucket = env.bucket()
    src = env.upload(env.raw, bucket, "in")
    out = f"s3://{bucket}/out" if mode == "down" else str(env.path("frozen-out"))
    p = FaultProxy(env.s3())
    hit = {}

    def during() -> None:
        deadline = time.time() + 60
        while p.stats.requests < 12 and time.time() < deadline:
            time.sleep(0.01)
        hit["t"] = time.perf_counter()
        p.freeze() if mode == "freeze" else p.down()

    args = ["run", "doc_id", "--input", src, "--output", out, "--workers", "1"] + QUIET
    try:
        t = threading.Thread(target=during, daemon=True)
        t.start()
        r = env.cli(args, extra=env.s3_env(p.url, short=True), timeout=300)
        row.check("t" in hit, "the fault never happened: the run ended before the store went away")
        secs = time.perf_counter() - hit["t"] if "t" in hit else r.seconds  # from the fault to the error
        p.clear()
        if mode == "down":
            p.up()
        r2 = env.cli(args, extra=env.s3_env(p.url))
    finally:
        p.close()
    _identical(env, row, r2, out)
    return r, secs


@case("s3_gone", "the S3 server goes away mid-run and stays away (finding 10: a traceback; 7: a hang)",
      f"exit 5 with error/fix naming the endpoint within 2 x {S3_WORST_CASE} s (the task's call, then metadata.json's); "
      "rerun once it is back: identical", S3)
def s3_gone(env: Env, row: Row) -> Row:
    r, secs = _outage(env, row, "down")
    clear_error(row, r, 5, "did not answer")
    row.check(secs <= 2 * S3_WORST_CASE + 5, f"{secs:.0f}s to the error")
    row.seconds = secs
    return row.done(f"exit 5 after {secs:.0f}s: {first_error(r)}; rerun identical")


@case("s3_frozen", "the S3 server freezes mid-run: connections accepted, nothing answered (finding 7: no error after 410 s)",
      f"exit 5 within 2 x {S3_WORST_CASE} s (two calls' read timeouts and retries); rerun once it answers: identical", S3)
def s3_frozen(env: Env, row: Row) -> Row:
    r, secs = _outage(env, row, "freeze")
    clear_error(row, r, 5, "did not answer")
    row.check(secs <= 2 * S3_WORST_CASE + 5, f"{secs:.0f}s to the error")
    row.seconds = secs
    return row.done(f"exit 5 after {secs:.0f}s: {first_error(r)}; rerun identical")


@case("s3_dead_port", "PREPLINE_S3_ENDPOINT names a port nobody listens on (finding 10)",
      f"exit 5: did not answer, naming the endpoint, within {S3_WORST_CASE} s", S3)
def s3_dead_port(env: Env, row: Row) -> Row:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = env.cli(["run", "doc_id", "--input", "s3://nobody/in", "--output", str(env.path("dead")), "--workers", "1"] + QUIET,
                extra=env.s3_env(f"http://127.0.0.1:{port}", short=True))
    clear_error(row, r, 5, f"127.0.0.1:{port}")
    row.check(r.seconds <= S3_WORST_CASE + 5, f"took {r.seconds:.0f}s")
    row.seconds = r.seconds
    return row.done(f"exit 5: {first_error(r)}")


@case("s3_credentials_refused", "the store refuses the credentials: 403 InvalidAccessKeyId (unknown key; a wrong secret "
      "answers 403 SignatureDoesNotMatch, the same path) (finding 10)", "exit 5 at once (not retried): access denied, fix: the credentials", S3)
def s3_credentials_refused(env: Env, row: Row) -> Row:
    r, _, _ = _run(env, row, _transient("auth", -1), output_on_s3=False)
    clear_error(row, r, 5, "access denied", "AWS_SECRET_ACCESS_KEY")
    row.check(r.seconds < 20, f"took {r.seconds:.0f}s")
    row.seconds = r.seconds
    return row.done(f"exit 5: {first_error(r)}")


@case("s3_no_credentials", "no S3 credentials anywhere (no AWS_* variables, no files, no instance role) (finding 10)",
      "exit 5: no S3 credentials found, fix: set AWS_ACCESS_KEY_ID ...", S3)
def s3_no_credentials(env: Env, row: Row) -> Row:
    extra = {"PREPLINE_S3_ENDPOINT": env.s3(), "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
             "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}
    r = env.cli(["run", "doc_id", "--input", "s3://any/in", "--output", str(env.path("nocred")), "--workers", "1"] + QUIET,
                extra=extra, drop=("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"))
    clear_error(row, r, 5, "no S3 credentials")
    row.seconds = r.seconds
    return row.done(f"exit 5: {first_error(r)}")


@case("race_s3", "two exact_dedup runs (num_shards 8 / 4) started at once on one S3 output (finding 1 on S3)",
      "one writes, the other refuses (exit 7): the lease is a conditional write (If-None-Match)", S3)
def race_s3(env: Env, row: Row) -> Row:
    bucket = env.bucket()
    out = f"s3://{bucket}/out"
    e = env.s3_env(env.s3())
    procs = {n: env.start(["run", "exact_dedup", "--input", str(env.corpus), "--output", out, "--num-shards", str(n), "--workers", "1"]
                          + QUIET, extra=e) for n in (8, 4)}
    res = {n: (p.wait(120), p.stderr.read()) for n, p in procs.items()}
    winners = [n for n, (rc, _) in res.items() if rc == 0]
    row.check(len(winners) == 1, f"{len(winners)} winners: {res}")
    for n, (rc, err) in res.items():
        if rc != 0:
            row.check(rc == 7 and "fix:" in err and "Traceback" not in err, f"loser exit {rc}: {err[-400:]}")
    if len(winners) == 1:
        account(row, env.download(out), env.reference("exact_dedup", {"num_shards": winners[0]}))
    return row.done("1 winner of 2; the loser: exit 7")
