"""filter: SQL criteria combined with AND/OR, removals counted per criterion, columns dropped."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest

from conftest import tree_bytes, write_parquet
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, InputError


def test_filter_or_and_drop_columns(tmp_path, corpus):
    m = run_transform(
        "filter", {"criteria": ["n < 2", "n > 7"], "logical_operator": "OR", "columns_to_drop": ["n"]}, RunOptions(str(corpus), str(tmp_path / "o"))
    ).metadata
    assert m["totals"]["docs_out"] == 4 and m["totals"]["removed"] == {"no_criterion_met": 6}
    assert pq.read_table(tmp_path / "o" / "a.parquet").column_names == ["contents"]
    with pytest.raises(InputError, match="columns_to_drop names column\\(s\\) zz"):
        run_transform("filter", {"columns_to_drop": ["zz"]}, RunOptions(str(corpus), str(tmp_path / "p")))


def test_filter_null_criteria_count_as_not_met(tmp_path):
    write_parquet(tmp_path / "a", "x.parquet", {"contents": ["a", "b", "c"], "score": [1.0, None, 3.0]})
    m = run_transform("filter", {"criteria": ["score > 0"]}, RunOptions(str(tmp_path / "a"), str(tmp_path / "o"))).metadata
    assert m["totals"]["docs_out"] == 2 and m["totals"]["removed"] == {"criterion_1": 1}


def test_bad_criterion_fails_before_any_output_and_names_it(tmp_path, corpus):
    with pytest.raises(ConfigError, match="nosuchcol"):
        run_transform("filter", {"criteria": ["nosuchcol > 1"]}, RunOptions(str(corpus), str(tmp_path / "o")))
    assert not (tmp_path / "o").exists() or not tree_bytes(tmp_path / "o")


@pytest.mark.parametrize("criterion, says", [
    ("current_setting('home_directory') <> ''", "current_setting()"),
    ("(SELECT count(*) FROM duckdb_settings()) > 0", "table function duckdb_settings()"),
    ("(SELECT count(*) FROM pragma_database_list) > 0", "reads table 'pragma_database_list'"),
    ("(SELECT count(*) FROM query('SELECT 1')) > 0", "table function query()"),
    ("(SELECT count(*) FROM query_table('docs')) > 0", "table function query_table()"),
    ("version() <> ''", "version()"),
    ("x > 1 -- comment", "comment"),
    ("x > 1 /* comment */", "comment"),
])
def test_settings_introspection_nested_queries_and_comments_are_refused(criterion, says):
    from prepline import registry

    with pytest.raises(ConfigError, match=re.escape(says)):
        registry.build("filter", {"criteria": [criterion]})


def test_quoted_text_may_hold_comment_markers(tmp_path):
    write_parquet(tmp_path / "in", "a.parquet", {"contents": ["a -- b", "/* c */", "plain"]})
    meta = run_transform("filter", {"criteria": ["contents NOT LIKE '%--%' AND contents <> '/* c */'"]},
                         RunOptions(str(tmp_path / "in"), str(tmp_path / "out"), workers=1)).metadata
    assert meta["totals"]["docs_out"] == 1
    assert pq.read_table(tmp_path / "out" / "a.parquet").column("contents").to_pylist() == ["plain"]
