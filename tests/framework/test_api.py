"""The Python API (prepline.api, docs/python_api.md; its snippets run in tests/test_docs.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import prepline
from prepline.errors import ConfigError, InputError


def test_import_prepline_imports_nothing_else():
    code = "import sys; before = set(sys.modules); import prepline; print(sorted(set(sys.modules) - before))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(r.stdout.replace("'", '"')) == ["prepline"]


def test_run_and_read_metadata(tmp_path):
    pq.write_table(pa.table({"contents": ["a b", "a b", "c"]}), tmp_path / "in.parquet")
    m = prepline.run("doc_id", str(tmp_path / "in.parquet"), str(tmp_path / "ids"), params={"start_id": 5}, workers=1)
    assert m.ok and not m.resumed and m.parameters["start_id"] == 5
    read = prepline.read_metadata(str(tmp_path / "ids" / "metadata.json"))
    assert read.totals == m.totals and read.totals.docs_out == 3 and read.totals.removed_total == 0
    with pytest.raises(ConfigError, match="unknown parameter"):
        prepline.run("doc_id", str(tmp_path / "in.parquet"), str(tmp_path / "x"), no_such=1)
    with pytest.raises(InputError, match="no metadata.json"):
        prepline.read_metadata(str(tmp_path))


def test_transforms_are_listed_with_their_parameters():
    infos = {t.name: t for t in prepline.list_transforms()}
    assert "doc_id" in infos and infos["doc_id"].plugin is None
    assert infos["exact_dedup"].defaults()["num_shards"] == prepline.describe("exact_dedup").defaults()["num_shards"]


def test_pipeline_specs_load_and_compile(tmp_path):
    from pathlib import Path

    import yaml

    mine = Path(__file__).parents[1] / "pipelines" / "mine.yaml"
    spec = prepline.load_pipeline(str(mine))
    assert spec.name == "mine" and prepline.load_pipeline("super").name == "super"
    written = prepline.compile_pipeline(spec, tmp_path / "c")
    assert tmp_path / "c" / "mine.yaml" in written
    doc = next(yaml.safe_load_all((tmp_path / "c" / "mine.yaml").read_text()))  # the pipeline, then its platform spec
    assert "mine" in doc["pipelineInfo"]["name"] and "lang-id" in json.dumps(doc["root"]["dag"]["tasks"])
    with pytest.raises(ConfigError):
        prepline.load_pipeline({"name": "x", "stages": ["no_such_transform"]})


def test_run_pipeline_returns_the_run_folder(tmp_path, monkeypatch):
    """run_pipeline returns <work_root>/stages/<run id>/ (the folder the run created), not stages/ (issue 25 item 7);
    kfp's local runner is replaced by one that writes what a run's first task writes."""
    import prepline
    from prepline.kfp import local as kfp_local

    (tmp_path / "w" / "stages" / "older-run").mkdir(parents=True)  # another run's folder is not this one's

    def fake_run_local(name, args, pipeline_root, times=None, pipeline=None, verbose=False):
        run = Path(args["work_root"]) / "job-123"
        run.mkdir(parents=True)
        (run / "plan.json").write_text("{}")
        return 1.0

    monkeypatch.setattr(kfp_local, "run_local", fake_run_local)
    (tmp_path / "in").mkdir()
    got = prepline.run_pipeline(prepline.load_pipeline("super"), tmp_path / "w", input=str(tmp_path / "in"))
    assert got == (tmp_path / "w" / "stages" / "job-123").resolve()


def test_a_local_run_starts_with_a_header_and_names_its_run_folder(tmp_path, monkeypatch, capsys):
    from prepline.cli import main
    from prepline.kfp import local as kfp_local

    def fake_run_local(name, args, pipeline_root, times=None, pipeline=None, verbose=False):
        (Path(args["work_root"]) / "job-7" / "doc_id").mkdir(parents=True)
        return 1.0

    monkeypatch.setattr(kfp_local, "run_local", fake_run_local)
    (tmp_path / "in").mkdir()
    rc = main(["pipeline", "run", "doc_id", "--local", "--input", str(tmp_path / "in"), "--work-root", str(tmp_path / "w")])
    assert rc == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"pipeline doc_id (local): input {tmp_path / 'in'}"
    assert f"output: {tmp_path / 'w' / 'stages'}/<run id>/" in lines[1]
    assert f"run job-7: {tmp_path / 'w' / 'stages' / 'job-7'}/" in lines


def test_report_help_shows_the_run_folder_shape(capsys):
    from prepline.cli import main

    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "runs/pipeline/stages/<run id>" in out and "<--work-root>/stages/<run id>" in out
