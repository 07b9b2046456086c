import json
import subprocess
import sys

import pytest

from prepline import registry
from prepline.cli import describe_markdown, main


def test_list_and_describe(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for n in registry.names():
        assert n in out
    assert main(["describe", "exact_dedup", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in d["parameters"]} == {"content_column", "id_column", "num_shards", "normalize", "nfkc"}
    md = describe_markdown("filter")
    assert "| `logical_operator` | str | `\"AND\"` |" in md


def test_run_help_shows_transform_parameters(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "filter", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--criteria" in out and "--logical-operator" in out and "--max-failed-files" in out


def test_errors_exit_non_zero_with_the_fix(tmp_path, corpus, capsys):
    assert main(["run", "nope", "--input", str(corpus), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "unknown transform 'nope'" in err and "fix:" in err
    assert main(["run", "exact_dedup", "--input", str(corpus), "--output", str(tmp_path / "o"), "--num-shards", "0"]) == 2
    assert "num_shards=0 must be >= 1" in capsys.readouterr().err
    assert main(["run", "doc_id", "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o")]) == 6  # InputError
    assert "does not exist" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2


def test_run_prints_a_summary_and_params_json(tmp_path, corpus):
    out = subprocess.run(
        [sys.executable, "-m", "prepline.cli", "run", "doc_id", "--input", str(corpus), "--output", str(tmp_path / "o"),
         "--params", '{"start_id": 10}', "--id-column", "my_id", "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "10 in → 10 out" in out.stdout and "docs/s" in out.stdout and "first_id 10" in out.stdout
    meta = json.loads((tmp_path / "o" / "metadata.json").read_text())
    assert meta["parameters"]["start_id"] == 10 and meta["parameters"]["id_column"] == "my_id"
    assert meta["plan"] == {"first_id": 10, "last_id": 19}


def test_run_summary_lists_stages_in_pipeline_order_with_reasons_and_failures(tmp_path, capsys):
    """The table a local pipeline run ends with, from the stages' metadata.json (no run needed)."""
    from prepline.tables import newest_run_dir as _newest_run_dir, print_run_counts as _print_run_counts

    run = tmp_path / "stages" / "run1"

    def meta(rel: str, status: str = "success", **totals) -> None:
        (run / rel).mkdir(parents=True)
        (run / rel / "metadata.json").write_text(json.dumps({"status": status, "labels": {"criterion_1": "a > 1", "criterion_2": "b"},
                                                             "totals": {"seconds": 1.0, **totals}}))

    meta("exact_dedup", docs_in=10, docs_out=8, removed={"exact_duplicate": 2})
    meta("doc_id", docs_in=10, docs_out=10, removed={})
    meta("lang_id", docs_in=8, docs_out=8, removed={}, parts={"lang=en": 5, "lang=ja": 3})
    meta("lang=en/filter", docs_in=5, docs_out=2, removed={"criterion_1": 1, "criterion_2": 2})
    meta("lang=ja/filter", "failed", docs_in=3, docs_out=0, removed={})
    m = json.loads((run / "lang=ja/filter" / "metadata.json").read_text())
    (run / "lang=ja/filter" / "metadata.json").write_text(json.dumps({**m, "failures": {"x.parquet": {"error": "bad"}}}))
    (run / "lang_id" / "_prepline").mkdir()
    (run / "lang_id" / "_prepline" / "metadata.json").write_text("{}")  # work state: not a stage
    assert _newest_run_dir(tmp_path / "stages", 0) == run
    _print_run_counts(tmp_path / "stages")
    rows = [l.split("│")[1:3] for l in capsys.readouterr().out.splitlines() if l.startswith("│ ") and l.split("│")[1].strip()]
    assert [(s.strip(), b.strip()) for s, b in rows] == [("doc_id", ""), ("exact_dedup", ""), ("lang_id", ""), ("filter", "en"),
                                                         ("filter (FAILED)", "ja")]
    _print_run_counts(tmp_path / "stages")
    out = capsys.readouterr().out
    assert "exact_duplicate: 2" in out and "split into en 5, ja 3" in out and "a > 1: 1" in out and "b: 2" in out
    assert "failed file(s): x.parquet" in out
    # a spec pipeline's run: the order of its plan, and the accounting of every document
    plan = {"entries": [{"stage": s, "branch": ""} for s in ("lang_id", "exact_dedup", "doc_id", "filter")]}
    (run / "plan.json").write_text(json.dumps(plan))
    (run / "conservation.json").write_text(json.dumps({"input": 10, "outputs": {"en": 2, "ja": 0}, "outputs_total": 2,
                                                       "removed": {}, "removed_total": 5, "sinks": [{"part": "lang=other", "docs": 3}],
                                                       "sinks_total": 3, "holds": True, "problems": []}))
    _print_run_counts(tmp_path / "stages")
    out = capsys.readouterr().out
    rows = [l.split("│")[1].strip() for l in out.splitlines() if l.startswith("│ ") and l.split("│")[1].strip()]
    assert rows[:3] == ["lang_id", "exact_dedup", "doc_id"]
    assert "documents: 10 in = 2 out (en 2, ja 0) + 5 removed + 3 kept aside (lang=other 3: languages without a branch) ✓" in out


@pytest.mark.parametrize("name", registry.names())
def test_every_transform_help_works(name, capsys):
    """`prepline run <transform> --help` prints every parameter, whatever its help text holds (a `%`
    once crashed argparse's formatting: issue 24 item 11)."""
    with pytest.raises(SystemExit) as e:
        main(["run", name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for p in registry.get(name).Config.params():
        assert "--" + p.name.replace("_", "-") in out


@pytest.mark.parametrize("name", registry.names())
def test_describe_keeps_every_character_of_the_help_text(name, capsys):
    """`prepline describe` renders Markdown; `<code>`, `<file>` in help texts used to vanish as HTML
    (issue 25 item 4)."""
    assert main(["describe", name]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for p in registry.get(name).Config.params():
        for part in __import__("re").findall(r"<[^>]+>", p.help):
            assert part in out, f"{name}.{p.name}: {part} is missing from describe"


def test_describe_ingest_id_field_reads_plainly(capsys):
    assert main(["describe", "ingest"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "('' :" not in out
    assert "<file>:<line or row>" in out
