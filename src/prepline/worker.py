"""The worker side of a run: one :class:`Worker` per worker process or Ray actor and phase.

A worker builds its transform once (models load once per worker), then runs the phase's tasks one
at a time: a transform's own phase method, or :func:`process_file` for the final per-file map.
Every outcome is a small JSON-able dict: a task's result, or ``{"error", "fix"}`` (never an
exception), so the driver decides what a failure means.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
from collections import Counter
from typing import Any

import pyarrow as pa

from prepline import metadata, registry
from prepline.config import REMOVED_DIR
from prepline.context import FINAL, RSS_KEY, PhaseContext, WorkerSpec, short_error, task_key
from prepline.errors import ConfigError, InputError, OutputError, PreplineError, ServiceError, os_error, user_mistake
from prepline.location import ParquetSink
from prepline.progress import Report, Sender
from prepline.transform import FileTask, Output, Transform


class Worker:
    """Runs tasks of one phase. Errors become results, never crashes."""

    def __init__(self, spec: WorkerSpec, report: Report | None = None):
        self.spec = spec
        self.transform = registry.build(spec.transform, spec.params)
        self.ctx = PhaseContext(spec, self.transform.num_shards())
        self._ready = False
        self.report = Sender(report)  # a running task's documents and bytes, to the driver's progress

    def run(self, task: Any) -> dict:
        with beating(task_key(task), self.report):
            return self._run(task)

    def _run(self, task: Any) -> dict:
        t0 = time.perf_counter()
        try:
            if self.spec.phase == FINAL:
                setup = 0.0
                if not self._ready:
                    self.transform.setup(self.ctx)  # models load here, once per worker: start-up, not work
                    self._ready, setup = True, time.perf_counter() - t0
                result = process_file(self.transform, self.ctx, task, self.report)
                if setup:
                    result["setup_seconds"] = round(setup, 4)
            else:
                phase = {p.name: p for p in self.transform.phases()}[self.spec.phase]
                method = getattr(self.transform, phase.method)
                result = (method(self.ctx) if phase.over == "once" else method(task, self.ctx)) or {}
            result["seconds"] = round(time.perf_counter() - t0, 4)
            result[RSS_KEY] = metadata.peak_rss_mib()  # the driver takes it out: the phase's worker peak
            return result
        except PreplineError as e:
            r = {"error": e.message, "fix": e.fix, "kind": error_kind(e)}
        except Exception as e:  # noqa: BLE001 - every outcome is a result
            r = _unexpected(e, task, self.spec.output)  # a bug or an unexpected library error: keep the traceback
        if r["kind"] == "input" and isinstance(task, FileTask):
            r["docs"] = _rows(self.ctx, task)  # the failed file's documents, when its footer says
        r["seconds"] = round(time.perf_counter() - t0, 4)
        return r


#: seconds between two heartbeats of a running task
BEAT_INTERVAL = 1.0


class _Heartbeats:
    """One daemon thread per process: while tasks run, every BEAT_INTERVAL seconds each one's key,
    latest counts and CPU time go to the driver (:class:`~prepline.progress.Sender`), which stops a
    task whose worker neither reads nor computes (``--task-timeout``). The first heartbeat goes at
    once: the task started. Beats stop when the process is stopped or gone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, tuple[str, Sender]] = {}  # thread id -> its task's key and sender
        self._pid = 0

    def start(self, key: str, sender: Sender) -> None:
        ident = threading.get_ident()
        with self._lock:
            self._running[ident] = (key, sender)
            if self._pid != os.getpid():  # first task of this process (a forked process has no thread of its parent's)
                self._pid = os.getpid()
                threading.Thread(target=self._loop, name="prepline-heartbeat", daemon=True).start()
        _beat(ident, key, sender)

    def stop(self) -> None:
        with self._lock:
            self._running.pop(threading.get_ident(), None)

    def _loop(self) -> None:
        while True:
            time.sleep(BEAT_INTERVAL)
            with self._lock:
                running = list(self._running.items())
            for ident, (key, sender) in running:
                _beat(ident, key, sender)


#: in a Ray actor: its heartbeats carry the task thread's CPU as the process's (Ray's own threads in
#: the actor's process use CPU whether or not the task does)
THREAD_CPU_ONLY = False


def _beat(ident: int, key: str, sender: Sender) -> None:
    try:
        thread_cpu = time.clock_gettime(time.pthread_getcpuclockid(ident))
    except (AttributeError, OSError, ValueError):  # no per-thread clock here: the process's CPU only
        thread_cpu = None
    process_cpu = thread_cpu if THREAD_CPU_ONLY and thread_cpu is not None else time.process_time()
    sender.beat(key, (os.getpid(), ident, time.monotonic(), thread_cpu, process_cpu))


_heartbeats = _Heartbeats()


@contextlib.contextmanager
def beating(key: str, sender: Sender):
    """Heartbeats for the task ``key`` while the block runs (none when nobody listens)."""
    if not sender.active:
        yield
        return
    _heartbeats.start(key, sender)
    try:
        yield
    finally:
        _heartbeats.stop()


def _unexpected(e: Exception, task: Any, output: str) -> dict:
    if (u := user_mistake(e)) is not None:  # a setting of the user's (AWS profile, endpoint, bucket name): not a bug
        return {"error": u.message, "fix": u.fix, "kind": "usage"}
    if isinstance(e, OSError) and e.errno is not None:  # writing the output or work folder: disk full, read-only
        err = os_error(e, output)
        return {"error": err.message, "fix": err.fix, "kind": "output"}
    return {  # a bug or an unexpected library error: keep the traceback
        "error": f"{getattr(task, 'path', task)}: {type(e).__name__}: {short_error(e)}",
        "fix": "see the traceback in metadata.json 'failures'; report it if the input looks fine",
        "kind": "internal",
        "traceback": traceback.format_exc(limit=8),
    }


def error_kind(e: PreplineError) -> str:
    """What a failed task's error is about; only ``input`` (a bad input file) may be tolerated."""
    if isinstance(e, InputError):
        return "input"
    if e.transient:
        return "transient"
    if isinstance(e, ServiceError):
        return "service"
    if isinstance(e, OutputError):
        return "output"
    if isinstance(e, ConfigError):
        return "usage"
    return "error"


def _rows(ctx: PhaseContext, task: FileTask) -> int | None:
    try:
        return ctx.input.parquet_file(task.rel).metadata.num_rows
    except Exception:  # noqa: BLE001 - unreadable footer: unknown
        return None


def process_file(transform: Transform, ctx: PhaseContext, task: FileTask, report: Sender | None = None) -> dict:
    """The final map of one file, batch by batch: read (checked), transform, and append each part
    to its own Parquet writer; every output appears at once when the file is done (none on error).
    After each batch, ``report`` hears the documents done and an estimate of the bytes (the file's
    share by rows, when its footer told the read how many)."""
    writers: dict[str, ParquetSink] = {}
    removed: Counter = Counter()
    counters: Counter = Counter()
    generated: Counter = Counter()
    docs_in = 0
    with contextlib.ExitStack() as outputs:
        samples = RemovedSample(ctx, task, outputs, int(getattr(transform.config, "removed_sample", 0) or 0))
        for table in transform.read_batches(task, ctx):
            out = transform.transform(table, task.at_row(docs_in))
            docs_in += table.num_rows
            for sub, t in sorted(out.parts.items()):
                if sub not in writers:
                    writers[sub] = outputs.enter_context(ctx.output.parquet_writer(_out_rel(transform, sub, task), t.schema))
                writers[sub].write(t)
            samples.add(out, table)
            removed.update(out.removed)
            counters.update(out.counters)
            generated.update(out.generated)
            if report is not None:
                rows = ctx.file_rows.get(task.rel)
                report(task.rel, docs_in, task.size * docs_in // rows if rows else 0)
    ctx.file_rows.pop(task.rel, None)
    parts = {sub: w.rows for sub, w in sorted(writers.items())}
    stats = {
        "docs_in": docs_in,
        "docs_out": sum(parts.values()),
        "removed": {k: int(v) for k, v in sorted(removed.items()) if v},
        "counters": {k: int(v) for k, v in sorted(counters.items())},
        "bytes_in": task.size,
        "bytes_out": sum(w.bytes_written for w in writers.values()),
        "outputs": [_out_rel(transform, sub, task) for sub in parts],
        "parts": parts,
    }
    if samples.rows:
        stats["removed_sampled"] = dict(sorted(samples.rows.items()))
    if any(generated.values()):
        stats["generated"] = {k: int(v) for k, v in sorted(generated.items()) if v}
    metadata.check_file_counts(task.rel, stats)
    return stats


class RemovedSample:
    """Up to ``n`` removed rows per reason of one input file, written to ``_removed/<reason>/<file>``
    next to the output (atomically, with the file's outputs). ``n`` = 0: nothing is touched."""

    def __init__(self, ctx: PhaseContext, task: FileTask, outputs: contextlib.ExitStack, n: int):
        self.ctx, self.task, self.outputs, self.n = ctx, task, outputs, n
        self.rows: Counter = Counter()
        self._writers: dict[str, ParquetSink] = {}

    def add(self, out: Output, table: pa.Table) -> None:
        if not self.n or not out.removed_rows:
            return
        src = out.removed_from if out.removed_from is not None else table
        for reason, mask in sorted(out.removed_rows.items()):
            room = self.n - self.rows[reason]
            if room <= 0:
                continue
            picked = src.filter(pa.array(mask) if not isinstance(mask, (pa.Array, pa.ChunkedArray)) else mask).slice(0, room)
            if not picked.num_rows:
                continue
            if reason not in self._writers:
                rel = f"{REMOVED_DIR}/{safe_name(reason)}/{self.task.rel}"
                self._writers[reason] = self.outputs.enter_context(self.ctx.output.parquet_writer(rel, picked.schema))
            self._writers[reason].write(picked)
            self.rows[reason] += picked.num_rows


def safe_name(reason: str) -> str:
    """A removal reason as one folder name."""
    import re

    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", reason).strip("._") or "reason"


def _out_rel(transform: Transform, sub: str, task: FileTask) -> str:
    rel = transform.output_rel(task.rel)
    return f"{sub}/{rel}" if sub else rel
