"""filter: keep documents that meet SQL criteria, drop columns, count removals per criterion.

Criteria are DuckDB SQL boolean expressions over the table's columns, e.g.
``"doc_length > 100"`` or ``"lang = 'en' AND quality_score >= 0.5"``, combined with AND (keep
rows meeting all) or OR (keep rows meeting any). NULL counts as not met. With AND, a removed
row is counted once, under the first criterion it fails (``removed.criterion_<i>``), so the
counts add up; how many rows failed each criterion is in the counters. Where people read them
(the KFP UI, the run report, the command line) the reasons are the criteria's SQL, or the names
given in ``criteria_labels``; ``removed_sample`` keeps some removed rows per criterion to look at.

The SQL runs in a locked-down DuckDB: no file, network or extension access, configuration
locked, one statement, so a criterion cannot read ``/etc/passwd`` or a bucket. Before that, each
criterion is parsed by DuckDB's own parser (``json_serialize_sql``) and its syntax tree checked:
the only table it may name is the file's rows (``docs``, e.g. in a subquery); table functions
(``query(...)``, ``query_table``, ``read_csv``, ``duckdb_settings()``, ``pragma_database_list``,
...) and functions that read settings or the environment (``current_setting``, ``version``, ...)
are refused; comments and ``;`` outside quoted text are refused (quoted text may hold anything,
``--`` and ``/*`` included).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from prepline import hashing
from prepline.config import TransformConfig, param, removed_sample_param
from prepline.errors import ConfigError, InputError
from prepline.registry import register
from prepline.transform import FileTask, Output, Transform

TABLE = "docs"
#: scalar functions that read the session, its settings or the machine rather than the row
DENIED_FUNCTIONS = frozenset({"current_setting", "version", "getenv", "user", "session_user", "current_user", "current_role",
                              "platform", "txid_current", "in_search_path", "which_secret", "sql_auto_complete"})
DENIED_PREFIXES = ("current_", "duckdb_", "pragma_", "pg_", "has_", "read_", "parquet_", "json_serialize", "json_deserialize",
                   "query", "glob", "load_", "install_", "checkpoint", "export_", "import_", "set_", "sniff_")
_FIX_SQL = "use only the columns and plain functions (comparisons, length, regexp_matches, lower, ...) in a criterion"


def check_criterion(i: int, c: str) -> None:
    """Refuse what a criterion may not do, from DuckDB's own tokens and syntax tree (see the module doc)."""
    import json

    raw = c.encode()  # token positions are UTF-8 byte offsets
    for pos, kind in duckdb.tokenize(c):
        if kind == duckdb.token_type.comment or (kind == duckdb.token_type.operator and raw[pos:pos + 1] == b";"):
            raise ConfigError(f"filter criterion {i} `{c}` contains ';' or a comment: one SQL expression only",
                              "write a single boolean expression such as \"doc_length > 100\" (quoted text may hold anything)")
    tree = json.loads(_connection().cursor().execute("SELECT json_serialize_sql(?)", [f"SELECT ({c}) FROM {TABLE}"]).fetchone()[0])
    if tree.get("error"):
        raise ConfigError(f"filter criterion {i} `{c}` is not valid SQL: {tree.get('error_message', '')}",
                          "fix the expression (DuckDB SQL)")
    if len(tree.get("statements", [])) != 1:
        raise ConfigError(f"filter criterion {i} `{c}` is not one SQL expression", "write a single boolean expression")
    for node in _nodes(tree["statements"][0]):
        kind = node.get("type")
        if kind == "TABLE_FUNCTION":
            name = (node.get("function") or {}).get("function_name", "?")
            raise ConfigError(f"filter criterion {i} `{c}` calls table function {name}(): not allowed in a criterion", _FIX_SQL)
        if kind == "BASE_TABLE" and (node.get("table_name") != TABLE or node.get("schema_name") or node.get("catalog_name")):
            raise ConfigError(f"filter criterion {i} `{c}` reads table {node.get('table_name')!r}: not allowed, a criterion "
                              f"sees only the file's rows ({TABLE})", _FIX_SQL)
        if node.get("class") == "FUNCTION" and not node.get("is_operator"):
            name = str(node.get("function_name", "")).lower()
            if name in DENIED_FUNCTIONS or name.startswith(DENIED_PREFIXES) or node.get("schema") or node.get("catalog"):
                raise ConfigError(f"filter criterion {i} `{c}` calls {name}(): functions that read settings, the session "
                                  "or other tables are not allowed", _FIX_SQL)


def _nodes(x):
    """Every dict in a parsed statement, depth first."""
    if isinstance(x, dict):
        yield x
        for v in x.values():
            yield from _nodes(v)
    elif isinstance(x, list):
        for v in x:
            yield from _nodes(v)


_CONNECTION: duckdb.DuckDBPyConnection | None = None


def _connection() -> duckdb.DuckDBPyConnection:
    """The process's locked-down DuckDB database (:func:`prepline.hashing.connect`), opened once
    (~30 ms). Each use takes a cursor of it (a connection of its own, same settings): the parser
    of the criteria (json_serialize_sql runs nothing), the check on the driver, the map."""
    global _CONNECTION
    if _CONNECTION is None:
        _CONNECTION = hashing.connect()
    return _CONNECTION


@dataclass(frozen=True)
class FilterConfig(TransformConfig):
    criteria: list[str] = param([], "SQL boolean expressions over the columns (DuckDB dialect); repeat the option for several")
    logical_operator: str = param("AND", "keep rows meeting all (AND) or any (OR) of the criteria", choices=("AND", "OR"))
    columns_to_drop: list[str] = param([], "columns to remove from the output")
    criteria_labels: list[str] = param([], "names of the criteria in counts and reports, one per criterion (default: their SQL)")
    removed_sample: int = removed_sample_param()

    def validate(self) -> None:
        if self.criteria_labels and len(self.criteria_labels) != len(self.criteria):
            raise ConfigError(f"criteria_labels has {len(self.criteria_labels)} name(s) for {len(self.criteria)} criteria",
                              "give one name per criterion, in the same order (or none)")
        if any(not x.strip() for x in self.criteria_labels):
            raise ConfigError("criteria_labels has an empty name", "give every criterion a name, or pass no criteria_labels")
        for i, c in enumerate(self.criteria, 1):
            if not c.strip():
                raise ConfigError(f"filter criterion {i} is empty", "remove it or write an SQL expression")
            check_criterion(i, c)
        if not self.criteria and not self.columns_to_drop:
            raise ConfigError("filter needs criteria or columns_to_drop", "pass --criteria \"<SQL expression>\" or --columns-to-drop COL")


@register
class Filter(Transform):
    name = "filter"
    Config = FilterConfig
    summary = "keep rows meeting SQL criteria (AND/OR), drop columns; removals counted per criterion"
    headline = ("removed.*", "failed_criterion_*")

    def label(self, key: str) -> str:
        """``criterion_<i>`` and ``failed_criterion_<i>``: the criterion's name (its SQL, or its label)."""
        for prefix, word in (("criterion_", ""), ("failed_criterion_", "failed: ")):
            n = key.removeprefix(prefix)
            if key.startswith(prefix) and n.isdigit() and 0 < int(n) <= len(self.config.criteria):
                names = self.config.criteria_labels or self.config.criteria
                return word + names[int(n) - 1]
        return key

    def _sql(self) -> str:
        cols = ", ".join(f"coalesce(CAST(({c}) AS BOOLEAN), false) AS c{i}" for i, c in enumerate(self.config.criteria))
        return f"SELECT {cols} FROM {TABLE}"

    def check_schema(self, schema: pa.Schema, where: str) -> None:
        super().check_schema(schema, where)
        missing = [c for c in self.config.columns_to_drop if c not in schema.names]
        if missing:
            raise InputError(
                f"{where}: columns_to_drop names column(s) {', '.join(missing)} that the data does not have "
                f"(columns: {', '.join(schema.names)})",
                "remove them from columns_to_drop",
            )
        if self.config.columns_to_drop and set(schema.names) <= set(self.config.columns_to_drop):
            raise ConfigError(
                f"{where}: columns_to_drop removes every column of the data ({', '.join(schema.names)}): the output "
                "would hold no documents at all",
                "keep at least one column (drop fewer columns); to remove documents, use --criteria",
            )

    def check_on_driver(self, schema: pa.Schema, where: str) -> None:
        """Compile every criterion against an empty table of the data's schema."""
        con = _connection().cursor()  # a connection of its own: the registered table goes with it
        con.register(TABLE, schema.empty_table())
        for i, c in enumerate(self.config.criteria, 1):
            try:
                stmts = con.extract_statements(f"SELECT ({c}) FROM {TABLE}")
                if len(stmts) != 1:
                    raise duckdb.Error("more than one statement")
                types = con.sql(f"SELECT ({c}) AS v FROM {TABLE}").types
            except duckdb.Error as e:
                raise ConfigError(
                    f"filter criterion {i} `{c}` is not valid SQL for this data: {str(e).splitlines()[0]}",
                    f"fix the expression (DuckDB SQL); columns: {', '.join(schema.names)}",
                ) from None
            if str(types[0]) not in ("BOOLEAN", "NULL"):
                raise ConfigError(
                    f"filter criterion {i} `{c}` gives {types[0]}, not a boolean",
                    "write a comparison, e.g. \"doc_length > 100\"",
                )

    def setup(self, ctx) -> None:
        self._con = _connection().cursor()  # a connection of its own to the same database (the driver's thread too)

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        removed: dict[str, int] = {}
        counters: dict[str, int] = {}
        masks: dict[str, np.ndarray] = {}
        if self.config.criteria and table.num_rows:
            self._con.register(TABLE, table)
            try:
                res = self._con.sql(self._sql()).to_arrow_table()
            except duckdb.Error as e:
                raise InputError(f"{task.path}: filter criteria failed: {str(e).splitlines()[0]}", "fix the criteria for this file's columns") from None
            finally:
                self._con.unregister(TABLE)
            met = np.column_stack([res.column(i).to_numpy(zero_copy_only=False) for i in range(res.num_columns)])
            for i in range(met.shape[1]):
                counters[f"failed_criterion_{i + 1}"] = int((~met[:, i]).sum())
            if self.config.logical_operator == "AND":
                keep = met.all(axis=1)
                first_fail = np.argmin(met, axis=1)
                for i in range(met.shape[1]):
                    masks[f"criterion_{i + 1}"] = (~keep) & (first_fail == i)
            else:
                keep = met.any(axis=1)
                masks["no_criterion_met"] = ~keep
            removed = {k: int(m.sum()) for k, m in masks.items()}
            if not keep.all():  # a filter that keeps every row would copy the table for nothing
                table = table.filter(pa.array(keep))
        if self.config.columns_to_drop:
            table = table.drop_columns(list(self.config.columns_to_drop))
        return Output(parts={"": table}, removed=removed, counters=counters, removed_rows=masks)
