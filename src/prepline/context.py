"""What a worker is given: the worker spec, the phase context and the checked read of an input file.

This is the whole surface a transform sees of the engine: :class:`PhaseContext` (input, output and
work locations, the plan state, the shard count, and :meth:`PhaseContext.read_input`, the checked
read). It knows transforms only by the methods it calls on them, so the transform API
(:mod:`prepline.transform`) can name it without an import circle.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Protocol

import pyarrow as pa

from prepline.data_access import Location, open_location
from prepline.errors import InputError

#: the stage's private folder under the output: run.json, completion markers, phase work files
WORK = "_prepline"
MARKERS = f"{WORK}/markers"
#: the name of the final per-file map, after the transform's own phases
FINAL = "final"
#: the one task of a phase that runs once (its result's key in the phase results)
ONCE = "once"
#: a task result's key for its worker process's peak RSS (MiB) after the task: the engine moves it into
#: the phase's ``worker_peak_rss_mib`` (metadata.json) and never writes it into markers or per-file results
RSS_KEY = "_peak_rss_mib"

_BAD_FILE_FIX = "re-export or remove the file, or pass --max-failed-files N to skip up to N bad files"
#: the final map reads a file in batches of about this many bytes (uncompressed; PREPLINE_BATCH_MB
#: overrides it for benchmarks and tests: it changes the row groups of outputs, never their rows) ...
BATCH_BYTES = 64 * 2**20
#: ... and at most this many rows (one output row group)
BATCH_ROWS = 64 * 1024


@dataclass(frozen=True)
class FileTask:
    """One input file handed to a worker. ``extra`` carries per-file values from the plan."""

    path: str  # full path or s3:// URI
    rel: str  # path relative to the input root, '/'-separated; the output mirrors it
    size: int
    extra: dict = field(default_factory=dict)
    #: in the final map, the row of the file where the table handed to ``transform`` starts
    first_row: int = 0

    def at_row(self, first_row: int) -> "FileTask":
        return replace(self, first_row=first_row)


def task_key(item) -> str:
    """A task's key (its marker's name, its progress reports' key): the file, the shard, or ``once``."""
    if isinstance(item, FileTask):
        return item.rel
    return item if item == ONCE else f"{item:05d}"


class Checked(Protocol):
    """What a checked read needs of a transform (:class:`prepline.transform.Transform` has it)."""

    def check_schema(self, schema: pa.Schema, where: str) -> None: ...

    def input_columns(self) -> list: ...


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build its transform for one phase; picklable."""

    transform: str
    params: dict
    input: str
    output: str
    phase: str
    state: dict = field(default_factory=dict)
    #: the run's fencing token (:class:`prepline.runtime.lock.Fence`): every write to the output checks it first
    fence: Any = None


class PhaseContext:
    """What phase methods, ``Transform.setup`` and ``Transform.finish`` see."""

    def __init__(self, spec: WorkerSpec, num_shards: int = 0):
        self.spec = spec
        self.input: Location = open_location(spec.input)
        self.output: Location = open_location(spec.output)
        self.output.fence = spec.fence
        self.work: Location = self.output.sub(f"{WORK}/work")
        self.state = spec.state
        self.num_shards = num_shards
        #: rows of the input files read so far (from their footers): progress estimates bytes by them
        self.file_rows: dict[str, int] = {}

    def read_input(self, task: FileTask, transform: Checked, columns: list[str] | None) -> pa.Table:
        """Read ``columns`` of one input file (None: all), checked; ``[]`` checks the file only."""
        return read_checked(self.input, task, transform, columns)

    def iter_input(self, task: FileTask, transform: Checked, columns: list[str] | None) -> Iterator[pa.Table]:
        """The same read, one bounded batch at a time (memory does not follow the file size)."""
        return iter_checked(self.input, task, transform, columns, self.file_rows)


def _open_checked(loc: Location, task: FileTask, transform: Checked):
    """Open one input file's footer and check its schema (before any data is read)."""
    where = task.path
    if task.size == 0:
        raise InputError(f"{where}: file is empty (0 bytes), not a Parquet file", _BAD_FILE_FIX)
    try:
        pf = loc.parquet_file(task.rel, task.size)
        schema = pf.schema_arrow
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{where}: not a readable Parquet file ({short_error(e)})", _BAD_FILE_FIX) from None
    transform.check_schema(schema, where)
    return pf


def _corrupt(task: FileTask, e: BaseException) -> InputError:
    return InputError(f"{task.path}: Parquet data is corrupt or truncated ({short_error(e)})", _BAD_FILE_FIX)


def _checked(table: pa.Table, task: FileTask, transform: Checked, first_row: int = 0) -> pa.Table:
    for col in transform.input_columns():
        if col.name in table.column_names:
            _check_values(table.column(col.name), col, task.path, first_row)
    return table


def read_checked(loc: Location, task: FileTask, transform: Checked, columns: list[str] | None) -> pa.Table:
    """Read one input file: footer and schema checks first, then the data, then text checks."""
    pf = _open_checked(loc, task, transform)
    try:
        table = pf.read(columns=columns)
    except (pa.ArrowInvalid, OSError) as e:
        raise _corrupt(task, e) from None
    return _checked(table, task, transform)


def batch_rows(pf) -> int:
    """Rows per batch for a file: about BATCH_BYTES of uncompressed data, at most BATCH_ROWS."""
    md = pf.metadata
    nbytes = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    per_row = max(1, nbytes // max(1, md.num_rows))
    target = float(os.environ.get("PREPLINE_BATCH_MB") or 0) * 2**20 or BATCH_BYTES
    return int(max(1, min(BATCH_ROWS, target // per_row)))


def iter_checked(loc: Location, task: FileTask, transform: Checked, columns: list[str] | None,
                 rows: dict[str, int] | None = None) -> Iterator[pa.Table]:
    """Read one input file in order, batch by batch (each checked); an empty file gives one empty table.
    ``rows`` (if given) learns the file's row count from its footer."""
    pf = _open_checked(loc, task, transform)
    if rows is not None:
        rows[task.rel] = pf.metadata.num_rows
    names = pf.schema_arrow.names if columns is None else columns
    first_row = 0
    batches = pf.iter_batches(batch_size=batch_rows(pf), columns=columns, use_threads=False)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowInvalid, OSError) as e:
            raise _corrupt(task, e) from None
        if batch is None:
            break
        table = pa.Table.from_batches([batch])
        yield _checked(table, task, transform, first_row)
        first_row += table.num_rows
    if first_row == 0:
        yield pf.schema_arrow.empty_table().select(names)


def _check_values(arr: pa.ChunkedArray, col: Any, where: str, first_row: int = 0) -> None:
    if not col.nullable and arr.null_count:
        import pyarrow.compute as pc

        first = first_row + int(pc.index(pc.is_null(arr), True).as_py())
        raise InputError(
            f"{where}: column '{col.name}' has {arr.null_count} null value(s) (first at row {first})",
            f"fill or drop them first, e.g. prepline run filter --criteria \"{col.name} IS NOT NULL\"",
        )
    if col.kind == "string":
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid as e:
            raise InputError(
                f"{where}: column '{col.name}' holds text that is not valid UTF-8 ({short_error(e)})",
                "re-encode the text as UTF-8 before prepline (or drop those rows)",
            ) from None


def short_error(e: BaseException) -> str:
    """The first line of an exception's text (or its type), at most 300 characters."""
    s = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return s[:300]
