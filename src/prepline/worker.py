"""The worker side of a run: one :class:`Worker` per worker process or Ray actor and phase.

A worker builds its transform once (models load once per worker), then runs the phase's tasks one
at a time: a transform's own phase method, or :func:`process_file` for the final per-file map.
Every outcome is a small JSON-able dict: a task's result, or ``{"error", "fix"}`` (never an
exception), so the driver decides what a failure means.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from prepline import metadata, registry
from prepline.context import FINAL, PhaseContext, WorkerSpec, short_error
from prepline.errors import InputError, OutputError, PreplineError, ServiceError, os_error
from prepline.transform import FileTask, Transform


class Worker:
    """Runs tasks of one phase. Errors become results, never crashes."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.transform = registry.build(spec.transform, spec.params)
        self.ctx = PhaseContext(spec, self.transform.num_shards())
        self._ready = False

    def run(self, task: Any) -> dict:
        t0 = time.perf_counter()
        try:
            if self.spec.phase == FINAL:
                if not self._ready:
                    self.transform.setup(self.ctx)
                    self._ready = True
                result = process_file(self.transform, self.ctx, task)
            else:
                phase = {p.name: p for p in self.transform.phases()}[self.spec.phase]
                result = getattr(self.transform, phase.method)(task, self.ctx) or {}
            result["seconds"] = round(time.perf_counter() - t0, 4)
            return result
        except PreplineError as e:
            r = {"error": e.message, "fix": e.fix, "kind": error_kind(e)}
        except Exception as e:  # noqa: BLE001 - every outcome is a result
            r = _unexpected(e, task, self.spec.output)  # a bug or an unexpected library error: keep the traceback
        if r["kind"] == "input" and isinstance(task, FileTask):
            r["docs"] = _rows(self.ctx, task)  # the failed file's documents, when its footer says
        r["seconds"] = round(time.perf_counter() - t0, 4)
        return r


def _unexpected(e: Exception, task: Any, output: str) -> dict:
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
    return "error"


def _rows(ctx: PhaseContext, task: FileTask) -> int | None:
    try:
        return ctx.input.parquet_file(task.rel).metadata.num_rows
    except Exception:  # noqa: BLE001 - unreadable footer: unknown
        return None


def process_file(transform: Transform, ctx: PhaseContext, task: FileTask) -> dict:
    """The final map of one file: read (checked), transform, write each part; counts checked."""
    table = ctx.read_input(task, transform, transform.read_columns())
    out = transform.transform(table, task)
    written, parts = [], {}
    bytes_out = docs_out = 0
    for sub, t in sorted(out.parts.items()):
        rel_out = f"{sub}/{task.rel}" if sub else task.rel
        bytes_out += ctx.output.write_parquet(rel_out, t)
        written.append(rel_out)
        parts[sub] = t.num_rows
        docs_out += t.num_rows
    stats = {
        "docs_in": table.num_rows,
        "docs_out": docs_out,
        "removed": {k: int(v) for k, v in sorted(out.removed.items()) if v},
        "counters": {k: int(v) for k, v in sorted(out.counters.items())},
        "bytes_in": task.size,
        "bytes_out": bytes_out,
        "outputs": written,
        "parts": parts,
    }
    metadata.check_file_counts(task.rel, stats)
    return stats
