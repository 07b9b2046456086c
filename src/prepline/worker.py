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
from prepline.errors import PreplineError
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
