"""The worker side of a run: one :class:`Worker` per worker process or Ray actor and phase.

A worker builds its transform once (models load once per worker), then runs the phase's tasks one
at a time: a transform's own phase method, or :func:`process_file` for the final per-file map.
Every outcome is a small JSON-able dict: a task's result, or ``{"error", "fix"}`` (never an
exception), so the driver decides what a failure means.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections import Counter
from typing import Any

from prepline import metadata, registry
from prepline.context import FINAL, PhaseContext, WorkerSpec, short_error
from prepline.errors import PreplineError
from prepline.location import ParquetSink
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
                method = getattr(self.transform, phase.method)
                result = (method(self.ctx) if phase.over == "once" else method(task, self.ctx)) or {}
            result["seconds"] = round(time.perf_counter() - t0, 4)
            return result
        except PreplineError as e:
            return {"error": e.message, "fix": e.fix, "seconds": round(time.perf_counter() - t0, 4)}
        except Exception as e:  # a bug or an unexpected library error: keep the traceback
            return {
                "error": f"{getattr(task, 'path', task)}: {type(e).__name__}: {short_error(e)}",
                "fix": "see the traceback in the logs; report it if the input looks fine",
                "traceback": traceback.format_exc(limit=8),
                "seconds": round(time.perf_counter() - t0, 4),
            }


def process_file(transform: Transform, ctx: PhaseContext, task: FileTask) -> dict:
    """The final map of one file, batch by batch: read (checked), transform, and append each part
    to its own Parquet writer; every output appears at once when the file is done (none on error)."""
    writers: dict[str, ParquetSink] = {}
    removed: Counter = Counter()
    counters: Counter = Counter()
    docs_in = 0
    with contextlib.ExitStack() as outputs:
        for table in transform.read_batches(task, ctx):
            out = transform.transform(table, task.at_row(docs_in))
            docs_in += table.num_rows
            for sub, t in sorted(out.parts.items()):
                if sub not in writers:
                    writers[sub] = outputs.enter_context(ctx.output.parquet_writer(_out_rel(transform, sub, task), t.schema))
                writers[sub].write(t)
            removed.update(out.removed)
            counters.update(out.counters)
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
    metadata.check_file_counts(task.rel, stats)
    return stats


def _out_rel(transform: Transform, sub: str, task: FileTask) -> str:
    rel = transform.output_rel(task.rel)
    return f"{sub}/{rel}" if sub else rel
