"""prepline's logging: its own loggers (``prepline.*``) with time and level, as text or JSON lines;
other libraries' loggers keep their names and are quiet (warnings and worse only), and a warning
that repeats word for word is shown once, then counted.

One handler on stderr serves the ``prepline`` logger (which does not propagate, so a library that
replaces the root logger's handlers, as kfp.local does, leaves prepline's lines alone) and the root
logger (every other library). The format comes from ``--log-format`` or ``PREPLINE_LOG_FORMAT``
(``text`` or ``json``); :func:`setup` writes it back into the environment so that worker processes,
KFP task subprocesses and Ray jobs started from here log the same way (:func:`setup_worker`).

Text: ``2026-01-31T12:00:00Z INFO prepline.engine: message``. JSON: one object per line with
``time``, ``level``, ``logger``, ``message`` and any structured fields a record carries
(``extra={"fields": {...}}``; the progress lines carry theirs).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from typing import TextIO

from prepline.errors import ConfigError

ENV_FORMAT = "PREPLINE_LOG_FORMAT"
FORMATS = ("text", "json")
#: a warning repeated more often than this is summed up at least this often (seconds)
REPEAT_REPORT_SECONDS = 60.0
#: a line of prepline's text format (optionally behind Ray's "(actor pid=N) " prefix)
TEXT_LINE = re.compile(r"^(\(\S+ pid=\d+(?:, ip=\S+)?\) )?\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (DEBUG|INFO|WARNING|ERROR|CRITICAL) prepline[.:]")


def log_format(value: str | None = None) -> str:
    """The format asked for (argument, else ``PREPLINE_LOG_FORMAT``, else text); checked."""
    fmt = (value or os.environ.get(ENV_FORMAT) or "text").strip().lower()
    if fmt not in FORMATS:
        src = "--log-format" if value else ENV_FORMAT
        raise ConfigError(f"{src}={fmt!r} is not a log format", f"use one of: {', '.join(FORMATS)}")
    return fmt


def _iso(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_iso(record.created)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        d = {"time": _iso(record.created), "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            d.update({k: v for k, v in fields.items() if k not in d})
        if record.exc_info:
            d["exception"] = self.formatException(record.exc_info)
        return json.dumps(d, ensure_ascii=False, default=str)


def line(logger: str, message: str, level: int = logging.INFO) -> str:
    """One line as prepline's loggers write it, in this process's format (text or JSON)."""
    try:
        fmt = log_format()
    except ConfigError:
        fmt = "text"
    record = logging.LogRecord(logger, level, "", 0, message, None, None)
    return (JsonFormatter() if fmt == "json" else TextFormatter()).format(record)


def say(out: TextIO | None, logger: str, message: str, level: int = logging.INFO) -> None:
    """Write one prepline log line to ``out`` (default stdout): for steps whose output is a stream
    handed in (a fine-tune step, a chained child run), so their lines read like every other
    prepline line, and ``pipeline run --local`` shows them."""
    print(line(logger, message, level), file=out or sys.stdout, flush=True)


def is_prepline_line(line: str) -> bool:
    """True for a line prepline's own loggers wrote (either format)."""
    s = line.lstrip()
    if s.startswith("{"):
        try:
            return str(json.loads(s).get("logger", "")).startswith("prepline")
        except (ValueError, AttributeError):
            return False
    return bool(TEXT_LINE.match(s))


class Repeats(logging.Filter):
    """Shows a warning the first time; the same text again (same logger and level) is counted and
    summed up in one line: when it repeats after REPEAT_REPORT_SECONDS, and on :meth:`flush`."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: dict[tuple, list] = {}  # key -> [suppressed count, last report time, a record]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or getattr(record, "_prepline_summary", False):
            return True
        key = (record.name, record.levelno, record.getMessage())
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                self._seen[key] = [0, record.created, record]
                return True
            seen[0] += 1
            due = record.created - seen[1] >= REPEAT_REPORT_SECONDS
        if due:
            self._report(key)
        return False

    def _report(self, key: tuple) -> None:
        with self._lock:
            n, _, rec = self._seen[key]
            self._seen[key][0], self._seen[key][1] = 0, time.time()
        if n:
            logging.getLogger(rec.name).log(rec.levelno, "(the warning %r repeated %d more time(s))", rec.getMessage()[:200], n,
                                            extra={"_prepline_summary": True, "fields": {"repeated": n}})

    def flush(self) -> None:
        for key in list(self._seen):
            self._report(key)


class _State:
    handler: logging.Handler | None = None
    repeats: Repeats | None = None


def setup(fmt: str | None = None, debug: bool = False, verbose: bool = False, stream: TextIO | None = None,
          take_root: bool = True) -> str:
    """Configure logging for this process (idempotent); returns the format. ``verbose``: other
    libraries' info lines too; ``debug``: prepline's debug lines. Without ``take_root`` other
    libraries' logging is left as the program set it up."""
    fmt = log_format(fmt)
    if fmt != "text" or os.environ.get(ENV_FORMAT):  # what children (workers, tasks, jobs) inherit
        os.environ[ENV_FORMAT] = fmt
    h = logging.StreamHandler(stream or sys.stderr)
    h.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    reps = Repeats()
    h.addFilter(reps)
    root, own = logging.getLogger(), logging.getLogger("prepline")
    for lg in (root, own) if take_root else (own,):
        if _State.handler is not None and _State.handler in lg.handlers:
            lg.removeHandler(_State.handler)
        lg.addHandler(h)
    _State.handler, _State.repeats = h, reps
    own.propagate = False
    own.setLevel(logging.DEBUG if debug else logging.INFO)
    if not take_root:
        return fmt
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    # a connection error is reported once, with its fix: not also as urllib3's retry warnings
    logging.getLogger("urllib3.connectionpool").setLevel(logging.INFO if verbose else logging.ERROR)
    return fmt


def setup_worker() -> None:
    """In a worker process (pool process, Ray actor): the driver's format, once."""
    if _State.handler is None:
        setup(os.environ.get(ENV_FORMAT) or "text")


def ensure() -> None:
    """Where prepline runs inside another program (a KFP step, a notebook): prepline's own lines in
    its format, once; the program's own logging set-up is left alone."""
    if _State.handler is None:
        setup(take_root=False)


def flush_repeats() -> None:
    """Sum up the warnings held back (end of a run, of a worker)."""
    if _State.repeats is not None:
        _State.repeats.flush()
