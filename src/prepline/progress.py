"""Progress of a run: tasks, documents and bytes per phase, as a bar on a terminal and as a
timestamped log line at a steady interval everywhere else (CI, a pipe, a Ray job's log in KFP).

The driver keeps one :class:`Tracker` per phase: finished tasks count exactly (from their
results), running ones by what their workers report after each batch (:class:`Sender`, at most
once a second per worker, so the hot path pays a clock read per batch). A task that runs again
(its worker was lost) just reports again from zero: reports are cumulative per task.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, Callable

from prepline.errors import ConfigError

log = logging.getLogger("prepline.progress")

ENV_INTERVAL = "PREPLINE_PROGRESS_INTERVAL"
#: seconds between two progress lines when no terminal shows a bar
DEFAULT_INTERVAL = 10.0
#: a worker reports a running task at most this often (seconds)
SEND_INTERVAL = 1.0

#: (task key, documents so far, bytes so far) of a running task, cumulative; executors' reports may
#: carry a fourth value (a heartbeat, or on the driver's side whether the task moved since the last)
Report = Callable[..., None]
#: the progress line says "no progress for ..." instead of an ETA once nothing moved this long (s)
STALLED_AFTER = 30.0


def interval(value: float | None = None) -> float:
    """Seconds between progress lines: the argument, else PREPLINE_PROGRESS_INTERVAL, else 10."""
    raw = value if value is not None else os.environ.get(ENV_INTERVAL) or DEFAULT_INTERVAL
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(f"{ENV_INTERVAL}={raw!r} is not a number of seconds", "e.g. 10") from None
    if not v > 0:
        raise ConfigError(f"progress interval {raw!r} must be > 0 seconds", "e.g. --progress-interval 10")
    return v


class Sender:
    """Worker side: forwards a running task's cumulative counts, at most every SEND_INTERVAL seconds,
    and its worker's heartbeats (:mod:`prepline.worker`) with the latest counts."""

    __slots__ = ("_send", "_last", "_latest")

    def __init__(self, send: Report | None):
        self._send = send
        self._last = 0.0
        self._latest: tuple[str, int, int] | None = None

    def __call__(self, key: str, docs: int, nbytes: int) -> None:
        if self._send is None:
            return
        self._latest = (key, docs, nbytes)
        now = time.monotonic()
        if now - self._last >= SEND_INTERVAL:
            self._last = now
            try:
                self._send(key, docs, nbytes)
            except Exception:  # noqa: BLE001 - progress never fails a task
                self._send = None

    @property
    def active(self) -> bool:
        return self._send is not None

    def beat(self, key: str, beat: tuple) -> None:
        """A heartbeat of the task ``key``: (pid, thread id, monotonic time, thread CPU s, process CPU s)."""
        send = self._send
        if send is None:
            return
        latest = self._latest
        docs, nbytes = (latest[1], latest[2]) if latest is not None and latest[0] == key else (0, 0)
        try:
            send(key, docs, nbytes, beat)  # type: ignore[call-arg]
        except Exception:  # noqa: BLE001 - progress never fails a task
            self._send = None


class Tracker:
    """The counts of one phase on the driver (thread-safe: reports arrive from other threads)."""

    def __init__(self, stage: str, phase: str, tasks: int, bytes_total: int, by_files: bool, counts_docs: bool):
        self.stage, self.phase, self.tasks, self.bytes_total, self.by_files = stage, phase, tasks, bytes_total, by_files
        self.counts_docs = counts_docs  # the final map's results count documents; pre-phases' need not
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._done = {"tasks": 0, "docs": 0, "bytes": 0}
        self._resumed = {"docs": 0, "bytes": 0}
        self._running: dict[str, tuple[int, int]] = {}
        self._finished: set[str] = set()  # a report that arrives after its task's result is stale
        self.ended: float | None = None
        #: when something last moved: a task finished, documents or bytes were read, a worker used CPU
        self._moved = self.t0

    def resumed(self, n: int, docs: int, nbytes: int) -> None:
        """Tasks finished by an earlier run: done, but not part of this run's rate."""
        with self._lock:
            self._done["tasks"] += n
            self._done["docs"] += docs
            self._done["bytes"] += nbytes
            self._resumed["docs"] += docs
            self._resumed["bytes"] += nbytes

    def report(self, key: str, docs: int, nbytes: int, moved: bool | None = None) -> None:
        """A running task's counts; ``moved`` (from the executor's heartbeats): it made progress
        (None: progress if its counts changed)."""
        with self._lock:
            if self.ended is None and key not in self._finished:
                if moved or (moved is None and self._running.get(key) != (docs, nbytes)):
                    self._moved = time.monotonic()
                self._running[key] = (docs, nbytes)

    def finished(self, key: str, docs: int, nbytes: int) -> None:
        with self._lock:
            self._moved = time.monotonic()
            self._running.pop(key, None)
            self._finished.add(key)
            self._done["tasks"] += 1
            self._done["docs"] += docs
            self._done["bytes"] += nbytes

    def end(self) -> None:
        with self._lock:
            self._running.clear()
            self.ended = time.monotonic()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            docs = self._done["docs"] + sum(d for d, _ in self._running.values())
            nbytes = min(self.bytes_total, self._done["bytes"] + sum(b for _, b in self._running.values()))
            s = {"stage": self.stage, "phase": self.phase, "by_files": self.by_files, "tasks_done": self._done["tasks"], "tasks": self.tasks,
                 "running": len(self._running), "docs": docs, "bytes": nbytes, "bytes_total": self.bytes_total}
            new_docs, new_bytes = docs - self._resumed["docs"], nbytes - self._resumed["bytes"]
            moved = self._moved
        now = time.monotonic()
        elapsed = (self.ended or now) - self.t0
        s["idle_s"] = round(now - moved, 1) if self.ended is None and s["tasks_done"] < self.tasks else 0.0
        s["elapsed_s"] = round(elapsed, 1)
        s["docs_per_s"] = round(new_docs / elapsed, 1) if elapsed > 0 and self.counts_docs else None
        if not self.counts_docs:
            s["docs"] = None
        s["mb_per_s"] = round(new_bytes / 1e6 / elapsed, 2) if elapsed > 0 else None
        if self.by_files and self.bytes_total:
            s["fraction"] = nbytes / self.bytes_total
            s["eta_s"] = round((self.bytes_total - nbytes) * elapsed / new_bytes, 1) if new_bytes > 0 else None
        else:
            s["fraction"] = s["tasks_done"] / self.tasks if self.tasks else 1.0
            new_tasks = s["tasks_done"]
            s["eta_s"] = round((self.tasks - new_tasks) * elapsed / new_tasks, 1) if new_tasks else None
        return s


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def line(s: dict, final: bool = False) -> str:
    """One progress line, e.g. ``filter final: 3/8 files, 12,345 docs, 45.2/120.0 MB (38%), 3,210 docs/s, 1.2 MB/s, ETA 1m12s``."""
    parts = [f"{s['tasks_done']}/{s['tasks']} {'files' if s['by_files'] else 'shards'}"]
    if not final and not s["tasks_done"] and not s["running"] and s["tasks"]:
        return f"{s['stage']} {s['phase']}: " + ", ".join(parts + [f"waiting for the workers' first results ({duration(s['elapsed_s'])})"])
    if s["by_files"]:
        if s.get("docs") is not None:
            parts.append(f"{s['docs']:,} docs")
        parts.append(f"{s['bytes'] / 1e6:,.1f}/{s['bytes_total'] / 1e6:,.1f} MB ({100 * s['fraction']:.0f}%)")
        if s["mb_per_s"] is not None:
            parts.append((f"{s['docs_per_s']:,.0f} docs/s, " if s.get("docs") is not None else "") + f"{s['mb_per_s']:,.2f} MB/s")
    else:
        parts.append(f"({100 * s['fraction']:.0f}%)")
    if final:
        parts.append(f"done in {duration(s['elapsed_s'])}")
    elif s.get("idle_s", 0.0) >= STALLED_AFTER:  # an ETA from the rate so far would be a lie
        parts.append(f"no progress for {duration(s['idle_s'])}")
    else:
        parts.append(f"ETA {duration(s['eta_s'])}")
    return f"{s['stage']} {s['phase']}: " + ", ".join(parts)


class LogView:
    """A progress line through the ``prepline.progress`` logger every ``every`` seconds (on a steady
    schedule, not drifting), and one when the phase ends."""

    def __init__(self, tracker: Tracker, every: float):
        self.t, self.every = tracker, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="prepline-progress", daemon=True)
        self._thread.start()

    def _emit(self, final: bool = False) -> None:
        s = {**self.t.snapshot(), "final": final}
        log.info("%s", line(s, final), extra={"fields": {"progress": {k: v for k, v in s.items() if k not in ("stage", "phase")},
                                                          "stage": s["stage"], "phase": s["phase"]}})

    def _loop(self) -> None:
        k = 1
        while not self._stop.wait(max(0.0, self.t.t0 + k * self.every - time.monotonic())):
            self._emit()
            k = max(k + 1, int((time.monotonic() - self.t.t0) // self.every) + 1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.t.end()
        self._emit(final=True)


class BarView:
    """A rich bar per phase on a terminal, refreshed from the tracker."""

    def __init__(self, progress, tracker: Tracker):
        self.p, self.t = progress, tracker
        self.task = progress.add_task(f"{tracker.phase:>8}", total=1.0, info="")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="prepline-progress-bar", daemon=True)
        self._thread.start()

    def _update(self) -> None:
        s = self.t.snapshot()
        info = line(s).split(": ", 1)[1]
        self.p.update(self.task, completed=s["fraction"], info=info)

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self._update()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.t.end()
        self._update()


class Progress:
    """What the CLI hands the engine: a view per phase (a bar on a terminal, else log lines)."""

    def __init__(self, every: float | None = None, tty: bool | None = None):
        self.every = interval(every)
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._p = None

    def __enter__(self) -> "Progress":
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._p = RichProgress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                                   TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True), transient=False)
            self._p.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._p is not None:
            self._p.__exit__(*exc)

    def __call__(self, tracker: Tracker):
        return BarView(self._p, tracker) if self._p is not None else LogView(tracker, self.every)
