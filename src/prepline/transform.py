"""The transform API.

A transform is a small class over Arrow tables with a frozen config dataclass::

    @register
    class DocId(Transform):
        name = "doc_id"
        Config = DocIdConfig

        def input_columns(self):
            return [Column(self.config.content_column, "string")]

        def transform(self, table, task):
            ...
            return Output(table)

Columns it needs are declared and checked against each file's schema before a single batch is
read. Global transforms (dedup) add :class:`Phase` s that run before the final per-file map:
a map over files or a reduce over shards, each writing its state into the stage's work folder
so that it can resume. The engine (:mod:`prepline.engine`) runs all of it on any runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Literal

import pyarrow as pa

from prepline.config import TransformConfig
from prepline.context import ONCE, FileTask, PhaseContext
from prepline.errors import InputError

__all__ = ["ONCE", "Column", "FileTask", "Output", "Phase", "PhaseContext", "Plan", "Transform", "UniqueIds", "require_unique_ids"]

ColumnKind = Literal["string", "int64", "integer", "float", "list", "any"]


@dataclass(frozen=True)
class Column:
    """A column a transform reads: its name, the kind of Arrow type it must have, nulls allowed."""

    name: str
    kind: ColumnKind = "string"
    nullable: bool = False
    fix: str | None = None  # what to tell the user when the column is missing

    def check(self, schema: pa.Schema, where: str, param_hint: str | None = None) -> None:
        if self.name not in schema.names:
            hint = f" or set {param_hint} to the column that holds it" if param_hint else ""
            raise InputError(
                f"{where}: column '{self.name}' is missing (columns: {', '.join(schema.names) or 'none'})",
                self.fix or f"add the column{hint}",
            )
        t = schema.field(self.name).type
        ok = {
            "string": pa.types.is_string(t) or pa.types.is_large_string(t),
            "int64": pa.types.is_int64(t),
            "integer": pa.types.is_integer(t),
            "float": pa.types.is_floating(t),
            "list": pa.types.is_list(t) or pa.types.is_large_list(t),
            "any": True,
        }[self.kind]
        if not ok:
            fix = "store the text as a UTF-8 string column" if self.kind == "string" else f"cast it to {self.kind}"
            raise InputError(f"{where}: column '{self.name}' has type {t}, expected {self.kind}", fix)


@dataclass
class Output:
    """What a per-table transform returns.

    ``parts`` maps a sub-folder ('' for none, e.g. 'lang=en') to the table written there.
    ``removed`` counts documents dropped, by reason: docs_in == docs_out + sum(removed).
    ``generated`` counts the output's documents that were not in the input (a rephrasing stage's
    new documents), by kind: then docs_in + sum(generated) == docs_out + sum(removed).
    ``counters`` are extra per-file numbers summed into metadata.json (e.g. detected entities).
    ``removed_rows`` says which rows were removed, by reason: boolean masks (numpy or Arrow) over
    ``removed_from`` (default: the table handed to ``transform``). A transform that removes rows sets
    them (it has the masks anyway); the worker writes a bounded sample of those rows when the config
    asks for one (``removed_sample``), and ignores them otherwise.
    """

    parts: dict[str, pa.Table]
    removed: dict[str, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    removed_rows: dict[str, Any] = field(default_factory=dict)
    removed_from: pa.Table | None = None
    generated: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, table: pa.Table, removed: dict[str, int] | None = None, counters: dict[str, int] | None = None,
           removed_rows: dict[str, Any] | None = None, removed_from: pa.Table | None = None,
           generated: dict[str, int] | None = None) -> "Output":
        return cls({"": table}, dict(removed or {}), dict(counters or {}), dict(removed_rows or {}), removed_from, dict(generated or {}))


@dataclass(frozen=True)
class Phase:
    """A step of a global transform that runs before the final per-file map.

    ``over="files"``: ``Transform.<method>(task: FileTask, ctx)`` runs once per input file.
    ``over="shards"``: ``Transform.<method>(shard: int, ctx)`` runs once per shard.
    ``over="once"``: ``Transform.<method>(ctx)`` runs once (e.g. connected components of all
    edges, training a tokenizer on the samples of all files).
    Each returns a small JSON-able dict; the engine records it (the phase's completion marker)
    and hands all results to :meth:`Transform.plan` (a ``once`` phase's under the key ``ONCE``).
    Phases talk through files in ``ctx.work``: :mod:`prepline.sharded` writes and reads them.
    """

    name: str
    over: Literal["files", "shards", "once"]
    method: str
    #: cheap tasks (e.g. reading Parquet footers): the driver runs them itself, in its own process,
    #: on any runtime; starting workers for them would cost more than the work
    on_driver: bool = False


@dataclass
class Plan:
    """Driver-side result of the pre-phases: per-file extras (by rel path) and shared state."""

    file_extras: dict[str, dict] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


class Transform:
    """Base class of all transforms. Subclasses set ``name``, ``Config`` and ``transform``."""

    name: ClassVar[str]
    Config: ClassVar[type[TransformConfig]]
    #: one line shown by ``prepline list``
    summary: ClassVar[str] = ""
    #: optional extra the transform needs (``pip install 'prepline[<extra>]'``)
    extra: ClassVar[str | None] = None
    #: file name endings taken from the input folder (a transform that reads other formats says
    #: which, and overrides :meth:`read_batches`)
    input_suffixes: ClassVar[tuple[str, ...]] = (".parquet",)
    #: True when ``transform`` needs a whole file at once (default: bounded batches of rows)
    whole_file: ClassVar[bool] = False
    #: the numbers that say what this transform did, shown in the KFP UI (the step's Markdown and
    #: Metrics) and the run report: keys of metadata.json's ``totals.counters`` (``fnmatch`` patterns,
    #: e.g. ``"pii_*"``), or ``removed.<reason>``, ``generated.<kind>``, ``plan.<key>`` (:meth:`plan_summary`), ``finish.<key>``
    headline: ClassVar[tuple[str, ...]] = ()
    #: True when the plan counts on every file that went into it reaching the output (dedup: a file
    #: may hold the kept copies of other files' duplicates): a file that fails after the first phase
    #: read it then fails the run, even under --max-failed-files
    plan_needs_every_file: ClassVar[bool] = False
    #: True when its workers can use a GPU: on a cluster with a GPU group each actor then reserves
    #: ``gpus_per_worker`` GPUs (Ray places it on a GPU pod); a stage that does not use one refuses a GPU group
    uses_gpu: ClassVar[bool] = False

    @classmethod
    def warm(cls) -> None:
        """Load what every worker of this transform needs whatever its parameters (e.g. its compiled
        passes from numba's cache), ahead of its first task: a local run's pool processes do it while
        the driver plans, and the driver in a thread while it lists and checks the input."""

    def __init__(self, config: TransformConfig):
        if not isinstance(config, self.Config):
            raise TypeError(f"{self.name} needs a {self.Config.__name__}, got {type(config).__name__}")
        self.config = config

    @classmethod
    def branch_params(cls, branch: str) -> dict:
        """Parameters this transform should get in a pipeline's branch for language ``branch``
        (e.g. the PII language), under the pipeline spec's and the user's (docs/pipelines.md).
        ``branch`` may be ``other`` (every language without a branch of its own)."""
        return {}

    # -- contract --------------------------------------------------------------------------
    def input_columns(self) -> list[Column]:
        """Columns read from every input file."""
        return []

    def added_columns(self) -> list[str]:
        """Columns this transform adds; they must not already exist."""
        return []

    def read_columns(self) -> list[str] | None:
        """Columns the final map reads (None: all of them, since output keeps every column)."""
        return None

    def check_schema(self, schema: pa.Schema, where: str) -> None:
        """Check one file's schema before reading its data. Extend for transform-specific rules."""
        dups = sorted({n for n in schema.names if schema.names.count(n) > 1})
        if dups:
            raise InputError(f"{where}: column name(s) {', '.join(dups)} appear more than once",
                             "give every column its own name (Parquet allows repeats; prepline needs unique names)")
        for col in self.input_columns():
            col.check(schema, where, _param_for(self.config, col.name))
        for name in self.added_columns():
            if name in schema.names:
                raise InputError(
                    f"{where}: column '{name}' that {self.name} adds already exists",
                    f"drop it first (filter's columns_to_drop) or choose another name for it in the {self.name} parameters",
                )

    def check_on_driver(self, schema: pa.Schema, where: str) -> None:
        """Extra checks run once on the driver with the first file's schema (e.g. compile SQL)."""

    def check_resources(self) -> None:
        """Quick checks (about a second, no input data read) that what the parameters name exists and
        loads: a tokenizer, a model file. The pipeline's plan step runs it for every stage before the
        first one starts, so a wrong path fails the run at once instead of when its stage is reached;
        raise a ConfigError with the fix."""

    # -- global transforms -----------------------------------------------------------------
    def phases(self) -> list[Phase]:
        return []

    def num_shards(self) -> int:
        return 0

    def plan(self, results: dict[str, dict[str, dict]], files: list[FileTask]) -> Plan:
        """Combine pre-phase results (phase -> task key -> result) into a plan for the final map."""
        return Plan()

    def plan_summary(self, results: dict[str, dict[str, dict]]) -> dict:
        """A few numbers about the pre-phases for metadata.json (e.g. duplicate groups)."""
        return {}

    def finish(self, results: dict[str, dict[str, dict]], ctx: PhaseContext) -> dict:
        """Driver-side step after every file succeeded, before metadata.json is written.

        For outputs that need all files (e.g. fixed-length token shards with an index). It must be
        idempotent (a rerun may do it again); what it returns lands in metadata.json's ``finish``.
        """
        return {}

    # -- per-worker ------------------------------------------------------------------------
    def setup(self, ctx: PhaseContext) -> None:
        """Load models or shared state once per worker, before its first final-map task."""

    def read_batches(self, task: FileTask, ctx: PhaseContext) -> Iterator[pa.Table]:
        """The tables of one input file for the final map, in file order: the checked Parquet read,
        batch by batch (bounded memory), or whole when ``whole_file``. Every table is handed to
        :meth:`transform` with ``task.first_row`` set to where it starts in the file."""
        if self.whole_file:
            yield ctx.read_input(task, self, self.read_columns())
        else:
            yield from ctx.iter_input(task, self, self.read_columns())

    def output_rel(self, rel: str) -> str:
        """Where the output of input file ``rel`` goes (the output tree mirrors the input tree)."""
        return rel

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        raise NotImplementedError

    def label(self, key: str) -> str:
        """What a removal reason or a counter is called where people read it (e.g. a filter's SQL)."""
        return key

    def empty_output_fix(self, reason: str) -> str:
        """What to do when removal ``reason`` removed every document (the run fails unless an empty
        output is allowed). Transforms name the parameter that usually explains it."""
        see = " (removed_sample=N writes some of them to _removed/<reason>/ to look at)" if hasattr(self.config, "removed_sample") else ""
        return f"check {self.name}'s parameters against the data{see}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"


def _param_for(config: TransformConfig, column: str) -> str | None:
    for p in config.params():
        if p.type is str and getattr(config, p.name) == column and p.name.endswith("_column"):
            return p.name
    return None


def require_unique_ids(ids, where: str, column: str) -> None:
    """Refuse a file whose id column repeats a value: keep rules by smallest id need unique ids."""
    import numpy as np

    if len(ids) > 1:
        s = np.sort(ids)
        dup = s[1:][s[1:] == s[:-1]]
        if len(dup):
            raise _not_unique(where, column, int(dup[0]))


def _not_unique(where: str, column: str, id_: int) -> InputError:
    return InputError(
        f"{where}: id column '{column}' is not unique (e.g. id {id_} appears more than once)",
        "run doc_id first (it numbers every document), or set id_column to a unique int64 column",
    )


class UniqueIds:
    """:func:`require_unique_ids` for a file read batch by batch: :meth:`add` each batch's ids,
    then :meth:`check`. Dense ids (doc_id's are consecutive) are kept as one byte per id of the
    range seen, not 8 bytes per id plus a sort at the end: a 2 GB file's 3.5M ids cost 3.5 MB. Ids
    spread more thinly than one in eight of their range are kept as they are (checked at the end)."""

    def __init__(self, where: str, column: str):
        import numpy as np

        self.where, self.column = where, column
        self.lo, self.seen = 0, np.zeros(0, dtype=bool)  # seen[i]: id lo + i was in an earlier batch
        self.count = 0
        self.sparse: list | None = None  # the ids themselves, once the range is too thin for the map

    def add(self, ids) -> None:
        import numpy as np

        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) == 0:
            return
        require_unique_ids(ids, self.where, self.column)  # within the batch (bounded)
        self.count += len(ids)
        if self.sparse is not None:
            self.sparse.append(ids)
            return
        lo, hi = int(ids.min()), int(ids.max())
        if len(self.seen):
            lo, hi = min(lo, self.lo), max(hi, self.lo + len(self.seen) - 1)
        if hi - lo + 1 > 8 * self.count:  # thinner than one id in 8: the ids take less memory
            self.sparse = [self.lo + np.flatnonzero(self.seen), ids]
            self.seen = np.zeros(0, dtype=bool)
            return
        if not len(self.seen) or lo < self.lo or hi >= self.lo + len(self.seen):
            # grow, with room (twice the size) on the side that grows: consecutive batches copy rarely
            room = max(hi - lo + 1, 2 * len(self.seen))
            start = hi + 1 - room if len(self.seen) and lo < self.lo else lo
            grown = np.zeros(room, dtype=bool)
            grown[self.lo - start: self.lo - start + len(self.seen)] = self.seen
            self.lo, self.seen = start, grown
        at = ids - self.lo
        again = self.seen[at]
        if again.any():
            raise _not_unique(self.where, self.column, int(ids[again].min()))
        self.seen[at] = True

    def check(self) -> None:
        import numpy as np

        if self.sparse is not None:
            require_unique_ids(np.concatenate(self.sparse), self.where, self.column)
