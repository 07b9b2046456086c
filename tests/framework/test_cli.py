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
    assert {p["name"] for p in d["parameters"]} == {"content_column", "id_column", "num_shards", "normalize"}
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
    assert main(["run", "doc_id", "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2


def test_run_prints_a_summary_and_params_json(tmp_path, corpus):
    out = subprocess.run(
        [sys.executable, "-m", "prepline.cli", "run", "doc_id", "--input", str(corpus), "--output", str(tmp_path / "o"),
         "--params", '{"start_id": 10}', "--id-column", "my_id", "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "docs in" in out.stdout and "10" in out.stdout and "docs/s" in out.stdout
    meta = json.loads((tmp_path / "o" / "metadata.json").read_text())
    assert meta["parameters"]["start_id"] == 10 and meta["parameters"]["id_column"] == "my_id"
    assert meta["plan"] == {"first_id": 10, "last_id": 19}
