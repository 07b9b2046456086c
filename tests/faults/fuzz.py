"""Property-based fuzzing (hypothesis) of the two paths that take arbitrary user bytes:

- the Parquet reading path (:func:`prepline.context.read_checked`): a valid file mutated (bytes
  flipped, overwritten, cut, inserted). Every input must either read, or fail with InputError
  naming the file; any other exception (or a crash of the process) is a bug;
- filter criteria (:class:`FilterConfig` and the locked-down DuckDB): expressions built from
  legitimate pieces, forbidden functions, comments, quotes and random text. Every criterion must
  either be refused with ConfigError, or run (or fail per file with InputError); an accepted
  criterion never calls a forbidden function.

Each runs a bounded number of inputs (``max_examples``) and reports how many it tried. Run from
the fault suite in a child process, so that a crash in a native library fails the row instead of
killing the suite.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

#: pieces of criteria: fine ones, forbidden ones, and ones that only look forbidden (inside quotes)
PIECES = [
    "length(contents) > 3", "doc_id % 2 = 0", "contents LIKE '%a%'", "lower(contents) = contents", "contents <> '--'",
    "contents <> '/* x */'", "regexp_matches(contents, '^al')", "(SELECT count(*) FROM docs) > 0",
    "current_setting('home_directory') <> ''", "(SELECT count(*) FROM duckdb_settings()) > 0", "version() <> ''",
    "(SELECT count(*) FROM pragma_database_list) > 0", "(SELECT count(*) FROM query('SELECT 1')) > 0",
    "(SELECT count(*) FROM query_table('docs')) > 0", "(SELECT count(*) FROM read_text('/etc/hostname')) > 0",
    "(SELECT count(*) FROM glob('/*')) > 0", "(SELECT 1 FROM information_schema.tables LIMIT 1) = 1", "1 = 1 -- x",
    "1 = 1; SELECT 2", "1 = 1 /* c */", "'current_setting(''x'')' <> ''", "contents = 'query_table(docs)'",
]
FORBIDDEN = ("current_setting", "duckdb_settings", "version", "pragma_database_list", "query", "query_table", "read_text",
             "glob", "tables")


def _called(c: str) -> set[str]:
    """Names used as calls or tables outside quoted text (DuckDB's own tokenizer)."""
    import duckdb

    raw = c.encode()  # token positions are UTF-8 byte offsets
    toks = duckdb.tokenize(c)
    names = set()
    for (pos, kind), nxt in zip(toks, toks[1:] + [(len(raw), None)]):
        if kind == duckdb.token_type.identifier or kind == duckdb.token_type.keyword:
            names.add(raw[pos:nxt[0]].decode("utf-8", "replace").strip().strip('"').lower())
    return names


def fuzz_filter(max_examples: int = 300) -> dict:
    import pyarrow as pa
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from prepline import registry
    from prepline.context import FileTask
    from prepline.errors import ConfigError, InputError

    table = pa.table({"contents": ["alpha beta", "--", "/* x */", ""], "doc_id": pa.array([1, 2, 3, 4], pa.int64())})
    stats = {"inputs": 0, "refused": 0, "ran": 0, "failed_per_file": 0}
    piece = st.sampled_from(PIECES)
    expr = st.recursive(piece, lambda e: st.one_of(st.tuples(e, st.sampled_from([" AND ", " OR "]), e).map("".join),
                                                   e.map(lambda x: f"NOT ({x})"), e.map(lambda x: f"({x})")), max_leaves=4)
    noisy = st.one_of(expr, st.tuples(expr, st.text(max_size=12), st.integers(0, 60)).map(lambda t: t[0][: t[2]] + t[1] + t[0][t[2]:]))

    @settings(max_examples=max_examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(noisy)
    def prop(c: str) -> None:
        stats["inputs"] += 1
        try:
            t = registry.build("filter", {"criteria": [c]})
        except ConfigError:
            stats["refused"] += 1
            return
        bad = _called(c) & set(FORBIDDEN)
        assert not bad, f"accepted a criterion calling {bad}: {c!r}"
        try:
            t.check_on_driver(table.schema, "fuzz")
            t.setup(None)
            t.transform(table, FileTask("fuzz", "fuzz", 0))
            stats["ran"] += 1
        except (ConfigError, InputError):
            stats["failed_per_file"] += 1

    prop()
    return stats


def _base_file(d: Path) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"doc {i} " + "word " * (i % 7) for i in range(200)]
    p = d / "base.parquet"
    pq.write_table(pa.table({"contents": texts, "doc_id": pa.array(range(200), pa.int64())}), p, compression="none",
                   write_page_checksum=True, row_group_size=100)
    return p.read_bytes()


def fuzz_parquet(max_examples: int = 300) -> dict:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from prepline import registry
    from prepline.context import FileTask, read_checked
    from prepline.data_access import LocalLocation
    from prepline.errors import InputError

    d = Path(tempfile.mkdtemp(prefix="prepline-fuzz-"))
    base = _base_file(d)
    n = len(base)
    transform = registry.build("exact_dedup", {})  # reads contents (string) and doc_id (int64)
    stats = {"inputs": 0, "read": 0, "refused": 0}
    (d / "x.parquet").write_bytes(base)  # the unaltered file reads
    assert read_checked(LocalLocation(str(d)), FileTask(str(d / "x.parquet"), "x.parquet", n), transform, None).num_rows == 200
    flip = st.tuples(st.just("flip"), st.integers(0, n - 1), st.integers(1, 255))
    cut = st.tuples(st.just("cut"), st.integers(0, n - 1), st.just(0))
    insert = st.tuples(st.just("insert"), st.integers(0, n), st.integers(0, 255))
    over = st.tuples(st.just("zero"), st.integers(0, n - 1), st.integers(1, 64))
    edits = st.lists(st.one_of(flip, cut, insert, over), min_size=1, max_size=4)

    @settings(max_examples=max_examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(edits)
    def prop(ops) -> None:
        b = bytearray(base)
        for op, pos, v in ops:
            pos = min(pos, len(b) - 1) if b else 0
            if op == "flip" and b:
                b[pos] ^= v
            elif op == "cut":
                del b[pos:]
            elif op == "insert":
                b[pos:pos] = bytes([v])
            elif op == "zero" and b:
                b[pos:pos + v] = bytes(len(b[pos:pos + v]))
        stats["inputs"] += 1
        (d / "x.parquet").write_bytes(bytes(b))
        try:
            read_checked(LocalLocation(str(d)), FileTask(str(d / "x.parquet"), "x.parquet", len(b)), transform, None)
            stats["read"] += 1
        except InputError as e:
            assert "x.parquet" in e.message and e.fix, e
            stats["refused"] += 1

    prop()
    return stats


if __name__ == "__main__":  # python -m faults.fuzz parquet|filter N
    t0 = time.perf_counter()
    which, n = sys.argv[1], int(sys.argv[2])
    out = (fuzz_parquet if which == "parquet" else fuzz_filter)(n)
    out["seconds"] = round(time.perf_counter() - t0, 2)
    print("FUZZ " + json.dumps(out))


# -- the fault-suite rows ------------------------------------------------------------------------------
def _fuzz_row(env, row, which: str, n: int):
    import subprocess

    from faults.harness import ROOT

    p = subprocess.run([sys.executable, "-m", "faults.fuzz", which, str(n)], cwd=ROOT / "tests", capture_output=True, text=True,
                       timeout=600, env=env.env())
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("FUZZ ")]
    row.check(p.returncode == 0 and bool(lines), f"exit {p.returncode} (a negative code is a crash): {p.stderr[-1500:]}")
    stats = json.loads(lines[-1][5:]) if lines else {}
    row.seconds = stats.get("seconds", 0.0)
    return stats


def _register() -> None:
    from faults.harness import case

    @case("fuzz_parquet", "hypothesis: 300 mutated Parquet files (bytes flipped, zeroed, inserted, cut) through the checked read",
          "each reads, or fails with InputError naming the file and a fix; no other exception, no crash")
    def fuzz_parquet_case(env, row):
        s = _fuzz_row(env, row, "parquet", 300)
        return row.done(f"{s.get('inputs', 0)} inputs tried: {s.get('read', 0)} read, {s.get('refused', 0)} refused clearly")

    @case("fuzz_filter", "hypothesis: 120 filter criteria from legitimate and forbidden pieces, comments, quotes, random text",
          "each refused with ConfigError or run; no accepted criterion calls a forbidden function; no other exception")
    def fuzz_filter_case(env, row):
        s = _fuzz_row(env, row, "filter", 120)
        return row.done(f"{s.get('inputs', 0)} inputs tried: {s.get('refused', 0)} refused, {s.get('ran', 0)} ran, "
                        f"{s.get('failed_per_file', 0)} failed per file")


_register()
